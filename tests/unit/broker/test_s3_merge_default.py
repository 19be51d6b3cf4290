"""The store-dependent default of ``--merge-small-bytes`` (broker/cli_broker.py;
docs/operations.md, "Merging on S3"): on an S3 store segments of a full producer batch
(~1 MB) are not merged (a merge re-reads and re-writes them over the network), on a local
directory they still are; the flag (or its environment variable) always wins."""

from __future__ import annotations

import pytest

from broker.cli_broker import S3_MERGE_SMALL_BYTES, config_from_args
from broker.config import BrokerConfig
from broker.maintenance_policy import plan_merges
from broker.meta.schema import SegmentMeta

S3 = "s3://bucket/prefix?endpoint=http://127.0.0.1:1"


def test_s3_store_defaults_to_the_smaller_merge_threshold() -> None:
    assert S3_MERGE_SMALL_BYTES == 512 * 1024
    assert config_from_args(["--store", S3])[0].merge_small_bytes == S3_MERGE_SMALL_BYTES
    local = config_from_args(["--store", "/tmp/segs"])[0]
    assert local.merge_small_bytes == BrokerConfig().merge_small_bytes == 1024 * 1024
    flag = config_from_args(["--store", S3, "--merge-small-bytes", "1048576"])[0]
    assert flag.merge_small_bytes == 1024 * 1024


def test_environment_setting_wins_over_the_s3_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFSCALE_MERGE_SMALL_BYTES", "2097152")
    assert config_from_args(["--store", S3])[0].merge_small_bytes == 2097152


def test_full_batch_segments_are_merged_on_local_but_not_on_s3_thresholds() -> None:
    """Idempotent librdkafka producers write one ~1 MB batch per partition per flush cycle:
    a run of such segments is merged under the local threshold only; small ones (a paced
    producer's) still merge under both."""
    batch = 1_000_200  # a 1,000,000-byte batch plus the segment's framing
    big = [SegmentMeta(i, i, batch, 1, 0, "e") for i in range(8)]
    small = [SegmentMeta(i, i, 20_000, 1, 0, "e") for i in range(8)]
    local = BrokerConfig().merge_small_bytes
    for segs, want_local, want_s3 in ((big, 1, 0), (small, 1, 1)):
        runs_local = plan_merges(segs, lambda s: True, local, 16 << 20, 4, 127)
        runs_s3 = plan_merges(segs, lambda s: True, S3_MERGE_SMALL_BYTES, 16 << 20, 4, 127)
        assert (len(runs_local), len(runs_s3)) == (want_local, want_s3)
