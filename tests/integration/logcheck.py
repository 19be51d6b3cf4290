"""Check a partition's durable state directly: manifest in the metadata store, segment
objects in the object store (docs/format.md). Used by the recovery, S3/etcd and
multi-broker tests after real brokers wrote the data.

``Backend`` names a store + metadata pair a test starts brokers on; ``check_partition``
reads the manifest (read-only for the embedded store, so a running broker may hold it),
asserts the entries are contiguous and end at the committed log end, and validates every
listed segment object (and its index: the trailer, or a version 1 segment's index object)
with ``segments.validate.validate_segment``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from broker.meta.base import open_meta
from segments.format import (
    INDEX_SUFFIX,
    SEGMENT_SUFFIX,
    partition_prefix,
    segment_key,
)
from segments.store import StoreError, open_store
from segments.validate import validate_segment

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Backend:
    name: str
    store_url: str
    meta_url: str  # "embedded" or etcd://...
    meta_prefix: str = "/kafscale"
    data_dir: str = ""  # embedded metadata: the broker's data directory
    extra_args: tuple[str, ...] = ()

    def broker_args(self) -> tuple[str, ...]:
        args = ["--meta-prefix", self.meta_prefix]
        if self.data_dir:
            args += ["--data-dir", self.data_dir]
        return (*args, *self.extra_args)


@dataclass
class PartitionState:
    next_offset: int
    epoch: int
    segments: list[dict[str, int | str]] = field(default_factory=list)  # manifest entries
    keys: list[str] = field(default_factory=list)  # their segment object keys


async def _read_meta(backend: Backend, topic: str, partition: int) -> tuple[dict, list]:
    meta = open_meta(backend.meta_url, backend.data_dir, backend.meta_prefix, read_only=True)
    try:
        end = await meta.get(f"/logs/{topic}/{partition}/end")
        segs = await meta.range(f"/logs/{topic}/{partition}/segments/")
    finally:
        await meta.close()
    end_d = json.loads(end.value) if end is not None else {"next_offset": 0, "epoch": 0}
    entries = []
    for kv in segs:
        d = json.loads(kv.value)
        d["base"] = int(kv.key.rsplit("/", 1)[-1])
        entries.append(d)
    return end_d, sorted(entries, key=lambda d: d["base"])


async def _read_objects(store_url: str, keys: list[str]) -> list[bytes]:
    store = open_store(store_url)
    try:
        return [bytes(await store.get(k)) for k in keys]
    finally:
        await store.close()


async def _etags(store_url: str, keys: list[str]) -> list[str | None]:
    store = open_store(store_url)
    try:
        infos = [await store.head(k) for k in keys]
        return [None if i is None else i.etag for i in infos]
    finally:
        await store.close()


async def _put(store_url: str, key: str, data: bytes) -> None:
    store = open_store(store_url)
    try:
        await store.put_if_absent(key, [data])
    finally:
        await store.close()


def put_object(backend: Backend, key: str, data: bytes) -> None:
    asyncio.run(_put(backend.store_url, key, data))


def read_object(backend: Backend, key: str) -> bytes:
    return asyncio.run(_read_objects(backend.store_url, [key]))[0]


def object_key(namespace: str, topic: str, partition: int, entry: dict[str, int | str]) -> str:
    """The segment object a manifest entry names: ``segment-{base:020d}.kfs``, or the
    entry's ``key`` (merged segments: ``segment-{base:020d}-{last:020d}.kfs``)."""
    if entry.get("key"):
        return partition_prefix(namespace, topic, partition) + str(entry["key"])
    return segment_key(namespace, topic, partition, int(entry["base"]))


CHECK_ATTEMPTS = 5  # manifests read while a running owner kept changing it


def check_partition(
    backend: Backend, topic: str, partition: int, namespace: str = "default"
) -> PartitionState:
    """Manifest contiguous up to the log end; every listed segment + index validates.

    A running owner may change the manifest while this reads the objects: a merge or a
    compaction commits, then deletes the objects it replaced. So a check that fails is
    made again when the manifest, read once more, differs from the one it checked; it
    fails when the manifest held still (or kept changing for ``CHECK_ATTEMPTS`` reads)."""
    for attempt in range(1, CHECK_ATTEMPTS + 1):
        end, entries = asyncio.run(_read_meta(backend, topic, partition))
        try:
            return _check(backend, topic, partition, namespace, end, entries)
        except (AssertionError, StoreError):
            now = asyncio.run(_read_meta(backend, topic, partition))
            if attempt == CHECK_ATTEMPTS or now == (end, entries):
                raise
    raise AssertionError("unreachable")


def _check(
    backend: Backend,
    topic: str,
    partition: int,
    namespace: str,
    end: dict,
    entries: list,
) -> PartitionState:
    state = PartitionState(int(end["next_offset"]), int(end["epoch"]), entries)
    expect = entries[0]["base"] if entries else 0
    assert expect == 0, f"first segment starts at {expect}"
    for e in entries:
        assert e["base"] == expect, f"manifest gap/overlap at {e['base']} (expected {expect})"
        assert int(e["records"]) == int(e["last"]) - int(e["base"]) + 1
        expect = int(e["last"]) + 1
    assert expect == state.next_offset, (expect, state.next_offset)
    keys = [object_key(namespace, topic, partition, e) for e in entries]
    blobs = asyncio.run(_read_objects(backend.store_url, keys))
    # a version 1 segment (written by an older broker) has its index beside it; a version
    # 2 one carries it inside, and validate_segment checks that trailer itself
    v1 = [k for k, data in zip(keys, blobs, strict=True) if data[5] == 1]
    legacy = [k[: -len(SEGMENT_SUFFIX)] + INDEX_SUFFIX for k in v1]
    found = asyncio.run(_read_objects(backend.store_url, legacy))
    indexes = dict(zip(legacy, found, strict=True))
    for e, key, data in zip(entries, keys, blobs, strict=True):
        index = indexes.get(key[: -len(SEGMENT_SUFFIX)] + INDEX_SUFFIX)
        report = validate_segment(data, index)
        assert report.ok, (key, report.problems)
        assert report.header is not None and report.footer is not None
        assert report.header.base_offset == e["base"], key
        assert report.footer.last_offset == e["last"], key
        assert len(data) == int(e["bytes"]), key
    # the object is the very one the manifest committed (readers GET with If-Match)
    for e, key, etag in zip(
        entries, keys, asyncio.run(_etags(backend.store_url, keys)), strict=True
    ):
        assert etag is not None and etag.strip('"') == str(e["etag"]).strip('"'), (key, etag, e)
    state.keys = keys
    return state


def inspect_cli(target: str) -> subprocess.CompletedProcess[str]:
    """``kafscale segments inspect TARGET`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", "segments", "inspect", target],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
