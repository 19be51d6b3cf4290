"""kcat (the librdkafka command line client) against a real ``kafscale broker`` over TCP."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

from tests.fixtures.broker import BrokerProcess
from tests.integration.conftest import CODECS, create_topic, unique_topic

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed"),
]


def kcat(bootstrap: str, *args: str, stdin: bytes | None = None, timeout: float = 60) -> bytes:
    proc = subprocess.run(
        ["kcat", "-b", bootstrap, "-X", "socket.timeout.ms=10000", *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout


def consume_json(bootstrap: str, topic: str, *args: str) -> list[dict[str, Any]]:
    out = kcat(bootstrap, "-C", "-t", topic, "-e", "-J", *args)
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


def test_kcat_metadata(any_broker: BrokerProcess) -> None:
    topic = unique_topic("kc-meta")
    create_topic(any_broker.bootstrap, topic, 4)
    md = json.loads(kcat(any_broker.bootstrap, "-L", "-J", "-t", topic))
    assert [(b["id"], b["name"]) for b in md["brokers"]] == [(0, any_broker.bootstrap)]
    (t,) = md["topics"]
    assert t["topic"] == topic
    assert [(p["partition"], p["leader"]) for p in t["partitions"]] == [(i, 0) for i in range(4)]
    plain = kcat(any_broker.bootstrap, "-L", "-t", topic).decode()
    assert f'topic "{topic}" with 4 partitions' in plain


@pytest.mark.parametrize("codec", CODECS)
def test_kcat_produce_consume_keys_headers(any_broker: BrokerProcess, codec: str) -> None:
    topic = unique_topic(f"kc-pc-{codec}")
    lines = [f"key{i}:value {i} " + "x" * (i % 50) for i in range(300)] + [":no key", "k:"]
    kcat(
        any_broker.bootstrap,
        "-P", "-t", topic, "-p", "0", "-K:", "-Z", "-z", codec,
        "-H", "trace=abc", "-H", "n=1",
        stdin=("\n".join(lines) + "\n").encode(),
    )  # fmt: skip
    got = consume_json(any_broker.bootstrap, topic, "-o", "beginning")
    assert [m["offset"] for m in got] == list(range(len(lines)))
    assert all(m["headers"] == ["trace", "abc", "n", "1"] for m in got)
    pairs = [(m["key"], m["payload"]) for m in got]
    want = [tuple(line.split(":", 1)) for line in lines[:-2]] + [(None, "no key"), ("k", None)]
    assert pairs == want  # -Z: empty key/value produced as NULL


def test_kcat_offsets_and_partitions(shared_broker: BrokerProcess) -> None:
    topic = unique_topic("kc-offs")
    create_topic(shared_broker.bootstrap, topic, 3)
    for part in range(3):
        data = "".join(f"p{part}-{i}\n" for i in range(10)).encode()
        kcat(shared_broker.bootstrap, "-P", "-t", topic, "-p", str(part), stdin=data)
    mid = consume_json(shared_broker.bootstrap, topic, "-p", "1", "-o", "4")
    assert [(m["offset"], m["payload"]) for m in mid] == [(i, f"p1-{i}") for i in range(4, 10)]
    tail = consume_json(shared_broker.bootstrap, topic, "-p", "2", "-o", "-3")
    assert [m["offset"] for m in tail] == [7, 8, 9]
    everything = consume_json(shared_broker.bootstrap, topic, "-o", "beginning")
    assert sorted((m["partition"], m["offset"]) for m in everything) == [
        (p, i) for p in range(3) for i in range(10)
    ]
    assert all(m["payload"] == f"p{m['partition']}-{m['offset']}" for m in everything)
    # by timestamp: everything was produced just now, so a past timestamp finds offset 0
    ts = min(m["ts"] for m in everything)
    since = consume_json(shared_broker.bootstrap, topic, "-p", "0", "-o", f"s@{ts - 60_000}")
    assert [m["offset"] for m in since] == list(range(10))
    future = consume_json(shared_broker.bootstrap, topic, "-p", "0", "-o", f"s@{ts + 3_600_000}")
    assert future == []


def test_kcat_fire_and_forget_acks0(shared_broker: BrokerProcess) -> None:
    """kcat -P with acks=0 exits as soon as it has sent: the records (and the topic they
    auto-create) must still land."""
    topic = unique_topic("kc-acks0")
    data = "".join(f"k{i}:v{i}\n" for i in range(500)).encode()
    kcat(shared_broker.bootstrap, "-P", "-t", topic, "-K:", "-X", "acks=0", "-z", "lz4", stdin=data)
    # -c stops after the count; the consumer's long poll waits for records still committing
    out = kcat(
        shared_broker.bootstrap, "-C", "-t", topic, "-o", "beginning", "-c", "500", "-J", timeout=20
    )
    got = [json.loads(line) for line in out.decode().splitlines()]
    assert [(m["offset"], m["key"], m["payload"]) for m in got] == [
        (i, f"k{i}", f"v{i}") for i in range(500)
    ]
