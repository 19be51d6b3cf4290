"""Security benchmark: produce/consume throughput over TLS against plaintext (the ratio),
and the cost of a SCRAM login (handshakes per second).

Run ``python -m bench.security [--quick]`` from the repository root. One broker (local
store, embedded metadata) listens PLAINTEXT, SSL and SASL_PLAINTEXT/SASL_SSL, with
certificates made on the spot (``tests/fixtures/certs``). confluent-kafka produces
1 KiB values (acks=all) and consumes them back through each listener, alternating the
order per round; SCRAM logins are timed on fresh connections with kafka-python's SCRAM
client (the client's PBKDF2 runs on the same machine, so the figure is a lower bound of
the broker's rate). Prints one table; asserts nothing.
"""

from __future__ import annotations

import argparse
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka import Consumer, Producer

from tests.fixtures.broker import free_port, start_broker
from tests.fixtures.certs import make_pki
from tests.integration.kafka_raw import RawConn
from tests.integration.security.raw_sasl import login

VALUE = b"x" * 1024


def produce(conf: Mapping[str, object], topic: str, n: int) -> float:
    p = Producer({**conf, "linger.ms": 5, "batch.size": 1 << 20, "acks": "all"})
    start = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, VALUE)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(120)
    return n * len(VALUE) / (time.perf_counter() - start) / 1e6


def consume(conf: Mapping[str, object], topic: str, n: int) -> float:
    c = Consumer({**conf, "group.id": f"b-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    c.subscribe([topic])
    got, start = 0, None
    deadline = time.monotonic() + 120
    while got < n and time.monotonic() < deadline:
        for m in c.consume(1000, 1.0):
            if m.error() is None:
                start = start or time.perf_counter()
                got += 1
    elapsed = time.perf_counter() - (start or time.perf_counter())
    c.close()
    return got * len(VALUE) / max(elapsed, 1e-9) / 1e6


def scram_rate(port: int, seconds: float, tls_ctx: ssl.SSLContext | None, mech: str) -> float:
    done, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        conn = RawConn(port)
        if tls_ctx is not None:
            conn.sock = tls_ctx.wrap_socket(conn.sock, server_hostname="localhost")
        login(conn, "bench", "bench-pw", mech)
        conn.close()
        done += 1
    return done / seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.security")
    ap.add_argument("--quick", action="store_true", help="~1 minute run")
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args(argv)
    n = 30_000 if args.quick else 150_000
    rounds = args.rounds or (2 if args.quick else 3)
    secs = 5.0 if args.quick else 15.0
    tmp = Path(tempfile.mkdtemp(prefix="bench-security-"))
    pki = make_pki(tmp / "pki")
    subprocess.run([sys.executable, "-m", "broker.cli", "users", "--meta", "embedded",
                    "--data-dir", str(tmp / "b" / "data"), "create", "bench",
                    "--password", "bench-pw"], check=True, capture_output=True)  # fmt: skip
    ports = {"SSL": free_port(), "SASL_PLAINTEXT": free_port(), "SASL_SSL": free_port()}
    b = start_broker(tmp / "b", extra_args=(
        *[f"--listener={k}://127.0.0.1:{v}" for k, v in ports.items()],
        "--ssl-cert", str(pki.server.cert), "--ssl-key", str(pki.server.key)))  # fmt: skip
    try:
        confs = {
            "PLAINTEXT": {"bootstrap.servers": b.bootstrap},
            "SSL": {"bootstrap.servers": f"127.0.0.1:{ports['SSL']}",
                    "security.protocol": "SSL", "ssl.ca.location": str(pki.ca)},
        }  # fmt: skip
        res: dict[str, dict[str, list[float]]] = {k: {"produce": [], "consume": []} for k in confs}
        for r in range(rounds):
            order = list(confs) if r % 2 == 0 else list(reversed(confs))
            for name in order:
                topic = f"bench-{name.lower()}-{uuid.uuid4().hex[:6]}"
                res[name]["produce"].append(produce(confs[name], topic, n))
                res[name]["consume"].append(consume(confs[name], topic, n))
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        rates = {
            "SCRAM-SHA-256 (SASL_PLAINTEXT)": scram_rate(ports["SASL_PLAINTEXT"], secs, None,
                                                         "SCRAM-SHA-256"),
            "SCRAM-SHA-512 (SASL_PLAINTEXT)": scram_rate(ports["SASL_PLAINTEXT"], secs, None,
                                                         "SCRAM-SHA-512"),
            "SCRAM-SHA-512 (SASL_SSL, TLS handshake included)":
                scram_rate(ports["SASL_SSL"], secs, ctx, "SCRAM-SHA-512"),
            "PLAIN (SASL_PLAINTEXT)": scram_rate(ports["SASL_PLAINTEXT"], secs, None, "PLAIN"),
        }  # fmt: skip
    finally:
        b.stop()
    med = {k: {ph: statistics.median(v) for ph, v in d.items()} for k, d in res.items()}
    print(f"throughput, 1 KiB values, {n} messages, median of {rounds} rounds (MB/s)")
    print(f"{'phase':10} {'PLAINTEXT':>10} {'SSL':>10} {'SSL/PLAIN':>10}")
    for ph in ("produce", "consume"):
        p, s = med["PLAINTEXT"][ph], med["SSL"][ph]
        print(f"{ph:10} {p:10.1f} {s:10.1f} {s / p:10.2f}")
    print(f"\nlogins per second, sequential, fresh connection each ({secs:.0f} s each)")
    for k, v in rates.items():
        print(f"  {k:50} {v:8.1f}/s")
    socket.setdefaulttimeout(None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
