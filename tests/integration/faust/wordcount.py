"""A Faust word count for tests/integration/test_faust.py (runs in .venv-faust).

Words from ``{PREFIX}-in`` are repartitioned by word (``group_by``: a topic Faust creates)
and counted in a table, whose changelog is a compacted topic Faust creates; every new
count goes to ``{PREFIX}-out`` as ``"word count"``. The table lives in memory: a restarted
worker has only the changelog to restore it from.
"""

from __future__ import annotations

import os
from typing import Any

import faust

BROKER = os.environ["FAUST_BROKER"]
PREFIX = os.environ["FAUST_PREFIX"]

app = faust.App(
    PREFIX,
    broker=f"kafka://{BROKER}",
    store="memory://",
    topic_partitions=4,
    topic_replication_factor=1,
    web_enabled=False,
)
words = app.topic(f"{PREFIX}-in", value_type=bytes, value_serializer="raw")
out = app.topic(f"{PREFIX}-out", value_type=bytes, value_serializer="raw")
counts = app.Table("counts", default=int, partitions=4)


@app.agent(words)
async def count(stream: Any) -> None:
    async for word in stream.group_by(lambda w: w, name="byword"):
        w = word.decode()
        counts[w] += 1
        await out.send(value=f"{w} {counts[w]}".encode())
