"""Helpers for the KIP-848 tests: confluent-kafka consumer members polled on threads, and
raw ConsumerGroupHeartbeat/OffsetCommit calls over TCP."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from protocol.consumer_groups import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)
from tests.integration.kafka_raw import RawConn

WAIT = 60.0


def wait_for(cond: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Poll ``cond`` (client state owned by other threads) until true, or fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Member:
    """A confluent-kafka consumer polled on its own thread."""

    bootstrap: str
    group: str
    topics: list[str]
    conf: dict[str, Any] = field(default_factory=dict)
    records: list[tuple[int, int, bytes]] = field(default_factory=list)
    assignments: list[frozenset[int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    commit_each: bool = False
    # the client's group coordinator (address, state), from librdkafka's statistics
    # (its logical "GroupCoordinator" broker), refreshed every 100 ms when asked for
    watch_coordinator: bool = False
    coordinator_seen: tuple[str, str] = ("", "")

    def start(self) -> Member:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        from confluent_kafka import Consumer

        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **self.conf,
        }
        if self.watch_coordinator:
            conf.update({"statistics.interval.ms": 100, "stats_cb": self._stats})
        c = Consumer(conf)
        c.subscribe(self.topics)
        try:
            while not self.stop.is_set():
                m = c.poll(0.1)
                current = frozenset(tp.partition for tp in c.assignment())
                with self.lock:
                    if not self.assignments or self.assignments[-1] != current:
                        self.assignments.append(current)
                if m is None:
                    continue
                if m.error() is not None:
                    with self.lock:
                        self.errors.append(str(m.error()))
                    continue
                with self.lock:
                    self.records.append((m.partition() or 0, m.offset() or 0, m.value() or b""))
                if self.commit_each:
                    c.commit(message=m, asynchronous=False)
        finally:
            c.close()

    def _stats(self, text: str) -> None:
        coord = json.loads(text).get("brokers", {}).get("GroupCoordinator", {})
        with self.lock:
            self.coordinator_seen = (str(coord.get("nodename", "")), str(coord.get("state", "")))

    def coordinator(self) -> tuple[str, str]:
        with self.lock:
            return self.coordinator_seen

    def assignment(self) -> frozenset[int]:
        with self.lock:
            return self.assignments[-1] if self.assignments else frozenset()

    def count(self) -> int:
        with self.lock:
            return len(self.records)

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(WAIT)
            assert not self.thread.is_alive(), "consumer did not close"


def heartbeat(port: int, version: int = 1, **fields: Any) -> Any:
    defaults: dict[str, Any] = {
        "group_id": "g",
        "member_id": "",
        "member_epoch": 0,
        "instance_id": None,
        "rack_id": None,
        "rebalance_timeout_ms": 30_000,
        "subscribed_topic_names": None,
        "server_assignor": None,
        "topic_partitions": [],
    }
    if version >= 1:
        defaults["subscribed_topic_regex"] = None
    defaults.update(fields)
    with RawConn(port) as conn:
        return conn.call(
            ConsumerGroupHeartbeatRequest(**defaults), ConsumerGroupHeartbeatResponse, version
        )


def describe(port: int, group: str, version: int = 1) -> Any:
    with RawConn(port) as conn:
        resp = conn.call(
            ConsumerGroupDescribeRequest(group_ids=[group], include_authorized_operations=False),
            ConsumerGroupDescribeResponse,
            version,
        )
    return resp.groups[0]


def new_member_id() -> str:
    return uuid.uuid4().hex
