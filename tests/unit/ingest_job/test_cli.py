from __future__ import annotations

from pathlib import Path

import pytest

from ingest_job.cli import ingest_parser, main, maintain_parser


def test_flags_default_from_kafscale_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFSCALE_TOPICS", "a,b")
    monkeypatch.setenv("KAFSCALE_VALUE_FORMAT", "json")
    monkeypatch.setenv("KAFSCALE_MAX_RECORDS", "12")
    monkeypatch.setenv("KAFSCALE_TABLE_PER_TOPIC", "true")
    args = ingest_parser().parse_args([])
    assert args.topics == "a,b" and args.value_format == "json" and args.max_records == 12
    assert args.table_per_topic is True and args.partition_by == "day"
    args = ingest_parser().parse_args(["--topics", "c", "--value-format", "raw"])
    assert args.topics == "c" and args.value_format == "raw"  # the flag wins


def test_help_documents_env_names() -> None:
    text = ingest_parser().format_help()
    for env in ("KAFSCALE_TOPICS", "KAFSCALE_STORE", "KAFSCALE_META", "KAFSCALE_CATALOG",
                "KAFSCALE_NAMESPACE", "KAFSCALE_TABLE", "KAFSCALE_PARTITION_BY"):  # fmt: skip
        assert env in text
    assert "KAFSCALE_REMOVE_ORPHANS" in maintain_parser().format_help()


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "--topics is required" in capsys.readouterr().err
    assert main(["--topics", "a", "--table", "x", "--table-per-topic"]) == 2
    assert main(["maintain"]) == 2
    with pytest.raises(SystemExit):
        main(["--topics", "a", "--value-format", "xml"])


def test_errors_exit_1_with_a_message(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--topics", "a", "--data-dir", f"{tmp_path}/none", "--catalog", "nosuch"])
    assert code == 1
    assert "error: catalog 'nosuch' is not configured" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--store", "bogus://x"], "unsupported object store URL 'bogus://x'"),
        (["--meta", "etcd://"], "bad etcd endpoint '' in 'etcd://'"),
    ],
)
def test_store_urls_no_store_opens_are_usage_errors_before_spark(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before Spark starts: a bad --store otherwise failed inside every task,
    its Java stack trace printed before the one-line error."""
    assert main(["--topics", "a", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kafscale ingest: ") and message in err
    assert "Traceback" not in err and "at java." not in err


def test_maintain_says_when_there_is_nothing_to_maintain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A namespace without tables (the job has not run yet): one line saying so, not
    silence."""
    from ingest_job import catalog as cat

    cat.ensure_namespace(cat.open_catalog(None, str(tmp_path)), "kafscale")
    assert main(["maintain", "--compact", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "no tables to maintain in namespace 'kafscale'\n"
