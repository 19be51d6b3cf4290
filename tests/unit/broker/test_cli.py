"""The CLI layer (broker/cli.py): environment fallback, booleans, lazy dispatch; and the
``kafscale broker`` flags against README's configuration table (the contract)."""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from pathlib import Path

import pytest

from broker import cli
from broker.cli import EnvParser, env_name, parse_bool
from broker.cli_broker import BROKER_FLAGS, broker_parser, config_from_args
from broker.cli_groups import _parser as groups_parser
from broker.config import BrokerConfig

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _no_kafscale_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("KAFSCALE_")]:
        monkeypatch.delenv(name)


# ---------------------------------------------------------------------- booleans and env


def test_env_name() -> None:
    assert env_name("--flush-interval-ms") == "KAFSCALE_FLUSH_INTERVAL_MS"
    assert env_name("node-id") == "KAFSCALE_NODE_ID"


@pytest.mark.parametrize("text", ["1", "true", "TRUE", "Yes", "on", " true "])
def test_true_strings(text: str) -> None:
    assert parse_bool(text) is True


@pytest.mark.parametrize("text", ["0", "false", "False", "NO", "off", ""])
def test_false_strings(text: str) -> None:
    assert parse_bool(text) is False


@pytest.mark.parametrize("text", ["maybe", "2", "enabled", "tru"])
def test_other_strings_are_not_booleans(text: str) -> None:
    with pytest.raises(ValueError, match="not a boolean"):
        parse_bool(text)


def _parser() -> EnvParser:
    pp = EnvParser("prog")
    pp.option("--count", "a number", default="3", type=int)
    pp.option("--name", "a name")
    pp.option("--mode", "a mode", default="a", choices=["a", "b"])
    pp.switch("--fast", "go fast")
    return pp


def test_defaults_then_env_then_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    ns = _parser().parse_args([])
    assert (ns.count, ns.name, ns.mode, ns.fast) == (3, None, "a", False)
    monkeypatch.setenv("KAFSCALE_COUNT", "7")
    monkeypatch.setenv("KAFSCALE_NAME", "env")
    monkeypatch.setenv("KAFSCALE_MODE", "b")
    monkeypatch.setenv("KAFSCALE_FAST", "on")
    ns = _parser().parse_args([])
    assert (ns.count, ns.name, ns.mode, ns.fast) == (7, "env", "b", True)
    ns = _parser().parse_args(["--count", "9", "--name", "flag", "--mode", "a"])
    assert (ns.count, ns.name, ns.mode, ns.fast) == (9, "flag", "a", True)
    monkeypatch.setenv("KAFSCALE_FAST", "no")
    assert _parser().parse_args([]).fast is False
    assert _parser().parse_args(["--fast"]).fast is True  # the flag wins


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("KAFSCALE_COUNT", "many", "KAFSCALE_COUNT='many': invalid int value"),
        ("KAFSCALE_MODE", "c", "KAFSCALE_MODE='c': choose from a, b"),
        ("KAFSCALE_FAST", "sometimes", "KAFSCALE_FAST='sometimes': not a boolean"),
    ],
)
def test_bad_env_values_are_usage_errors_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], var: str, value: str,
    message: str,
) -> None:  # fmt: skip
    monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args([])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_help_names_every_variable() -> None:
    text = _parser().format_help()
    for var in ("KAFSCALE_COUNT", "KAFSCALE_NAME", "KAFSCALE_MODE", "KAFSCALE_FAST"):
        assert var in text


def test_unknown_variables_are_warned_of_once_each(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A misspelt variable is named; a setting, a variable read directly (``ENV_ONLY``) and
    anything without the prefix are not."""
    for name, value in (
        ("KAFSCALE_COUNT", "7"),  # a setting
        ("KAFSCALE_CONUT", "8"),  # misspelt
        ("KAFSCALE_FAULT_PAUSE", "x"),  # read directly
        ("KAFSCALE", "1"),  # without the prefix's underscore
        ("OTHER_COUNT", "9"),
    ):
        monkeypatch.setenv(name, value)
    pp = _parser()
    assert pp.unknown_env() == ["KAFSCALE_CONUT"]
    with caplog.at_level(logging.WARNING):
        pp.warn_unknown_env(logging.getLogger("t"))
    assert [r.getMessage() for r in caplog.records] == [
        "KAFSCALE_CONUT is set but prog has no such setting: ignored"
    ]


def _commands_parsers() -> list[EnvParser]:
    """The parser of every command (its module's argument-less ``*parser`` functions)."""
    out = []
    for module in sorted({c.target.partition(":")[0] for c in cli.COMMANDS.values()}):
        mod = importlib.import_module(module)
        for name, func in inspect.getmembers(mod, inspect.isfunction):
            if func.__module__ == module and name.endswith("parser"):
                if not inspect.signature(func).parameters:
                    parser = func()
                    if isinstance(parser, EnvParser):
                        out.append(parser)
    return out


def test_every_variable_the_code_names_is_a_setting_or_read_directly() -> None:
    """``ENV_ONLY`` lists exactly the ``KAFSCALE_*`` variables the code reads that are no
    command's setting: the broker would warn of one left out."""
    settings = set().union(*(p.variables() for p in _commands_parsers()))
    assert {"KAFSCALE_FLUSH_INTERVAL_MS", "KAFSCALE_TOPICS"} <= settings
    named: set[str] = set()
    for package in ("protocol", "segments", "groupcoord", "txncoord", "broker", "ingest_job"):
        for path in (ROOT / package).rglob("*.py"):
            if path == ROOT / "broker" / "cli.py":
                continue  # ENV_ONLY itself
            named |= set(re.findall(r"KAFSCALE_[A-Z][A-Z0-9_]*[A-Z0-9]", path.read_text()))
    direct = named - settings
    assert direct == set(cli.ENV_ONLY) - {"KAFSCALE_NO_NATIVE"}  # the tests read that one
    assert not set(cli.ENV_ONLY) & settings


# --------------------------------------------------------------------------- kafscale broker


def _readme_broker_flags() -> list[str]:
    text = (ROOT / "README.md").read_text()
    table = text.split("## Configuration reference (`kafscale broker`)")[1].split("\n## ")[0]
    return re.findall(r"^\| `--([a-z-]+)", table, flags=re.M)


def test_every_readme_flag_exists_with_its_variable() -> None:
    flags = _readme_broker_flags()
    assert len(flags) >= 30 and "flush-interval-ms" in flags
    assert sorted(flags) == sorted(f for f, *_ in BROKER_FLAGS)
    text = broker_parser().format_help()
    for flag in flags:
        assert f"--{flag}" in text and env_name(flag) in text
    known = set(BrokerConfig.__dataclass_fields__)
    assert all(field in known for _f, field, *_ in BROKER_FLAGS if field)


def test_broker_defaults() -> None:
    config, level = config_from_args([])
    assert level == "INFO"
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 9092)
    assert (config.advertised_host, config.advertised_port) == ("127.0.0.1", 9092)
    assert config.store_url == "file://./data" and config.meta_url == "embedded"
    assert config.flush_interval_ms == 2 and config.auto_create_topics is True
    default = BrokerConfig()
    assert config.cache_bytes == default.cache_bytes
    assert config.readahead_bytes == default.readahead_bytes == 24 * 1024 * 1024
    assert config_from_args(["--readahead-bytes", "0"])[0].readahead_bytes == 0
    assert config.merge_min_segments == default.merge_min_segments == 4
    assert config.gc_thaw_interval_s == default.gc_thaw_interval_s == 3600
    assert config_from_args(["--gc-thaw-interval-s", "0"])[0].gc_thaw_interval_s == 0
    assert config.heap_trim_interval_ms == default.heap_trim_interval_ms == 5000
    assert config_from_args(["--heap-trim-interval-ms", "0"])[0].heap_trim_interval_ms == 0


def test_broker_env_fallback_and_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFSCALE_NODE_ID", "3")
    monkeypatch.setenv("KAFSCALE_STORE", "s3://bucket/prefix?endpoint=http://x:1")
    monkeypatch.setenv("KAFSCALE_AUTO_CREATE_TOPICS", "false")
    monkeypatch.setenv("KAFSCALE_LISTEN", "0.0.0.0:9999")
    monkeypatch.setenv("KAFSCALE_LOG_LEVEL", "DEBUG")
    config, level = config_from_args([])
    assert config.node_id == 3 and config.auto_create_topics is False and level == "DEBUG"
    assert config.flush_interval_ms == 5  # the S3 default
    assert (config.listen_host, config.listen_port) == ("0.0.0.0", 9999)
    assert (config.advertised_host, config.advertised_port) == ("127.0.0.1", 9999)
    config, _ = config_from_args(
        ["--node-id", "4", "--store", "/tmp/segs", "--auto-create-topics", "yes",
         "--advertised-listener", "broker-4.example"]
    )  # fmt: skip
    assert config.node_id == 4 and config.auto_create_topics is True
    assert config.store_url == "file:///tmp/segs" and config.flush_interval_ms == 2
    assert (config.advertised_host, config.advertised_port) == ("broker-4.example", 9999)


def test_broker_ipv6_listen() -> None:
    config, _ = config_from_args(["--listen", "[::1]:9192"])
    assert (config.listen_host, config.listen_port) == ("::1", 9192)


@pytest.mark.parametrize(
    "argv", [["--node-id", "x"], ["--listen", "host:port"], ["--auto-create-topics", "perhaps"]]
)
def test_broker_bad_values_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        config_from_args(argv)
    assert exc.value.code == 2


def test_groups_bootstrap_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert groups_parser().parse_args(["list"]).bootstrap == "127.0.0.1:9092"
    monkeypatch.setenv("KAFSCALE_BOOTSTRAP", "10.0.0.1:9093")
    assert groups_parser().parse_args(["list"]).bootstrap == "10.0.0.1:9093"
    ns = groups_parser().parse_args(["describe", "g", "--bootstrap", "h:1"])
    assert ns.bootstrap == "h:1" and ns.groups == ["g"]
    assert groups_parser().parse_args(["--bootstrap", "h:2", "list"]).bootstrap == "h:2"


# ------------------------------------------------------------------------------ dispatch


def test_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    for name in cli.COMMANDS:
        assert name in err
    assert cli.main(["--help"]) == 0
    assert "segments inspect" in capsys.readouterr().out
    assert cli.main(["nosuch"]) == 2
    assert "unknown command 'nosuch'" in capsys.readouterr().err
    assert cli.main(["segments"]) == 2
    assert "segments inspect" in capsys.readouterr().err


def test_every_command_resolves_to_a_function() -> None:
    for name, command in cli.COMMANDS.items():
        assert callable(cli._load(command.target)), name


def test_commands_are_dispatched_with_the_rest_of_the_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[str, list[str]]] = []
    import segments.inspect

    def inspect_main(a: list[str]) -> int:
        seen.append(("inspect", a))
        return 3

    monkeypatch.setattr(segments.inspect, "main", inspect_main)
    assert cli.main(["segments", "inspect", "x.kfs", "--flag"]) == 3
    assert seen == [("inspect", ["x.kfs", "--flag"])]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--store", "bogus://x"], "unsupported object store URL 'bogus://x'"),
        (["--store", "s3://"], "not an s3:// URL: 's3://'"),
        (["--meta", "bogus://x"], "unsupported metadata store URL 'bogus://x'"),
        (["--meta", "etcd://"], "bad etcd endpoint '' in 'etcd://'"),
        (["--meta", "etcd://h:2379,h2"], "bad etcd endpoint 'h2'"),
    ],
)
def test_broker_store_urls_no_store_opens_are_one_line_before_anything_starts(
    argv: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked with the flags (before any worker starts: not a traceback per worker,
    restarted until the supervisor gives up); nothing is created meanwhile."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        config_from_args(argv)
    assert str(exc.value.code).startswith("kafscale broker: ") and message in str(exc.value.code)
    assert list(tmp_path.iterdir()) == []
    config, _ = config_from_args(["--store", "s3://bucket/pfx?region=r", "--meta", "etcd://h:1"])
    assert (config.store_url, config.meta_url) == ("s3://bucket/pfx?region=r", "etcd://h:1")
