"""A Quix Streams application with processing_guarantee="exactly-once" for
tests/integration/test_transactions_quix.py: copies every record of SRC to DST.

usage: python eos_app.py BROKER SRC DST GROUP TIMEOUT_S
Prints "processed N" after every record (the test kills it mid-run) and runs until no
record arrived for TIMEOUT_S seconds (0: forever).
"""

from __future__ import annotations

import sys
import time

from quixstreams import Application

broker, src, dst, group, timeout = sys.argv[1:6]
app = Application(
    broker_address=broker,
    consumer_group=group,
    processing_guarantee="exactly-once",
    auto_offset_reset="earliest",
    commit_interval=0.5,
    producer_extra_config={"transaction.timeout.ms": 6000},
)
source = app.topic(src, value_deserializer="bytes", value_serializer="bytes")
sink = app.topic(dst, value_deserializer="bytes", value_serializer="bytes")
seen = 0


def tick(value: bytes) -> bytes:
    global seen
    seen += 1
    print(f"processed {seen}", flush=True)
    time.sleep(0.003)  # slow enough that a kill lands mid-run
    return value


sdf = app.dataframe(source)
sdf = sdf.apply(tick)
sdf.to_topic(sink)
app.run(timeout=float(timeout), collect=False)
