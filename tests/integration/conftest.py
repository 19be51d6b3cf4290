"""Shared helpers for the client-compatibility suites (``test_clients_*.py``).

Broker processes come from ``tests/fixtures/broker.py``; these helpers only name topics
and create them through a real client (confluent-kafka's AdminClient over TCP).
"""

from __future__ import annotations

import uuid

TIMEOUT = 20.0
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def unique_topic(prefix: str) -> str:
    """A topic name no other test of the session uses (the shared broker outlives tests)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    """Create ``name`` with ``partitions`` partitions and wait for the broker's answer."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    (fut,) = admin.create_topics([NewTopic(name, partitions, 1)], request_timeout=TIMEOUT).values()
    fut.result(timeout=TIMEOUT)
    md = admin.list_topics(name, timeout=TIMEOUT)
    assert len(md.topics[name].partitions) == partitions


def payload(i: int, size: int) -> bytes:
    """``size`` bytes that differ per ``i`` and per position (so a misplaced slice shows)."""
    head = f"{i:08d}:".encode()
    body = (head * (size // len(head) + 1))[:size]
    return body
