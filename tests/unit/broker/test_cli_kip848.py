"""The KIP-848 consumer-group flags of ``kafscale broker``."""

from __future__ import annotations

import pytest

from broker.cli_broker import config_from_args
from groupcoord.consumer_model import MigrationPolicy, consumer_group_config


def test_consumer_group_flags_reach_the_coordinator_config() -> None:
    cfg, _ = config_from_args(
        [
            "--group-consumer-session-timeout-ms",
            "7000",
            "--group-consumer-heartbeat-interval-ms",
            "700",
            "--group-consumer-migration-policy",
            "Upgrade",
        ]
    )
    cg = consumer_group_config(cfg)
    assert (cg.session_timeout_ms, cg.heartbeat_interval_ms) == (7000, 700)
    assert cg.migration_policy is MigrationPolicy.UPGRADE
    default = consumer_group_config(config_from_args([])[0])
    assert default.migration_policy is MigrationPolicy.BIDIRECTIONAL
    assert (default.session_timeout_ms, default.heartbeat_interval_ms) == (45_000, 5_000)


def test_unknown_migration_policy_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        config_from_args(["--group-consumer-migration-policy", "sideways"])
    assert info.value.code == 2
    assert "migration" in capsys.readouterr().err
