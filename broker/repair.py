"""``kafscale partitions truncate TOPIC PARTITION --to OFFSET``: cut a partition back.

For a partition that holds batches which do not decode (written before produce
validation, issue 16; ``kafscale segments inspect --verify`` finds them and prints the
offset to cut at), this removes every record at or after OFFSET, run directly against the
metadata store and the object store:

1. **Take ownership the normal way**: one transaction that compares the owner key absent
   (``create_revision == 0``) and the end key's ``mod_revision`` unchanged, and puts the
   owner key (broker -1, epoch E+1, the topic id) under a lease of this process, the end key
   at epoch E+1 and the epoch's start. A running owner is never overridden: the command
   refuses while ``/owners/{t}/{p}`` exists (stop that broker, or let clients stop so the
   partition is handed off; ``kafscale broker`` releases owner keys on SIGTERM). While
   the repair holds the key, brokers answer NOT_LEADER_OR_FOLLOWER for the partition.
2. The segment that contains OFFSET (if OFFSET is not a segment base) is rewritten with
   its batches below OFFSET to a new object under a writer-unique name of the repair's
   own epoch (docs/format.md, "Object keys"), written with a conditional PUT. OFFSET must
   be a batch boundary.
3. One transaction, comparing the owner key (our value) and the end key's revision,
   deletes the manifest entries at or after OFFSET (and the epochs that start after it),
   puts the rewritten entry, puts the end key ``next_offset = OFFSET``, and deletes the
   producer snapshot (it may name batches cut off; the next owner rebuilds the producers
   from the newest segments) and the owner key. The next owner continues at OFFSET with
   a new epoch.
4. The objects no entry names any more are left to the next owner's sweep, which deletes
   them one grace period later (docs/format.md, "Deleting objects"): nothing deletes an
   object a reader may still hold.

Without ``--execute`` it prints the plan and changes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from dataclasses import dataclass

from broker.cli import EnvParser
from broker.cycles import ChainError, chain_of
from broker.logfmt import FORMATS, setup_logging
from broker.meta.base import (
    Compare,
    Delete,
    KeyValue,
    MetaStore,
    MetaStoreError,
    Put,
    open_meta,
)
from broker.meta.schema import (
    EndValue,
    SegmentMeta,
    TopicInfo,
    cycles_prefix,
    end_json,
    owner_value,
    producers_key,
    topic_key,
)
from segments.format import iter_segment_batches, object_name, partition_prefix, segment_key
from segments.store import ObjectStore, StoreError, open_store
from segments.writer import build_segment

LEASE_TTL_S = 60


class RepairError(Exception):
    """The truncation cannot be done as asked (the message says why)."""


@dataclass(frozen=True, slots=True)
class Target:
    namespace: str
    topic: str
    partition: int

    def key(self, seg: SegmentMeta) -> str:
        prefix = partition_prefix(self.namespace, self.topic, self.partition)
        if seg.key:
            return prefix + seg.key
        return segment_key(self.namespace, self.topic, self.partition, seg.base)

    @property
    def logs(self) -> str:
        return f"/logs/{self.topic}/{self.partition}"

    @property
    def owner(self) -> str:
        return f"/owners/{self.topic}/{self.partition}"


@dataclass(frozen=True, slots=True)
class Plan:
    next_offset: int  # the committed end before
    epoch: int
    log_start: int
    drop: list[SegmentMeta]  # entries wholly at or after the cut
    cut: SegmentMeta | None  # the entry the cut falls inside
    end: KeyValue
    topic_id: uuid.UUID


async def _segments(meta: MetaStore, t: Target) -> list[SegmentMeta]:
    kvs = await meta.range(f"{t.logs}/segments/")
    return sorted(
        (SegmentMeta.from_json(int(kv.key.rsplit("/", 1)[-1]), kv.value) for kv in kvs),
        key=lambda s: s.base,
    )


async def plan(meta: MetaStore, t: Target, offset: int) -> Plan:
    topic = await meta.get(topic_key(t.topic))
    if topic is None:
        raise RepairError(f"topic {t.topic!r} does not exist")
    topic_id = TopicInfo.from_json(t.topic, topic.value).topic_id
    end = await meta.get(f"{t.logs}/end")
    if end is None:
        raise RepairError(f"{t.topic}-{t.partition} has no committed log")
    d = json.loads(end.value)
    next_offset, epoch = int(d["next_offset"]), int(d["epoch"])
    value = EndValue.decode(end.value)
    if value.broker >= 0:  # its owner commits through cycle keys: anything not folded?
        kvs = await meta.range(cycles_prefix(value.broker, value.reg))
        try:
            chain = chain_of([kv.value for kv in kvs], value, t.topic, t.partition, topic_id.hex)
        except ChainError as exc:
            raise RepairError(str(exc)) from exc
        if chain:
            raise RepairError(
                f"{t.topic}-{t.partition} has {len(chain)} acknowledged segments past its "
                f"end {next_offset} in cycle keys, not folded yet: let a broker take the "
                "partition (its take folds them) and stop it, then run this again"
            )
    segs = await _segments(meta, t)
    log_start = max(int(d.get("log_start", 0)), segs[0].base if segs else next_offset)
    if not log_start <= offset <= next_offset:
        raise RepairError(f"offset {offset} outside the log [{log_start}, {next_offset}]")
    drop = [s for s in segs if s.base >= offset]
    cut = next((s for s in segs if s.base < offset <= s.last), None)
    return Plan(next_offset, epoch, log_start, drop, cut, end, topic_id)


async def _take(meta: MetaStore, t: Target, p: Plan, lease: int) -> tuple[bytes, int]:
    owner = await meta.get(t.owner)
    if owner is not None:
        raise RepairError(
            f"{t.topic}-{t.partition} is owned ({owner.value.decode(errors='replace')}): "
            "stop its broker (or its traffic) first"
        )
    epoch = p.epoch + 1
    mine = owner_value(-1, epoch, p.topic_id)
    res = await meta.txn(
        [
            Compare(t.owner, "create_revision", "==", 0),
            Compare(f"{t.logs}/end", "mod_revision", "==", p.end.mod_revision),
        ],
        [
            Put(t.owner, mine, lease),
            Put(f"{t.logs}/end", end_json(p.next_offset, epoch, p.log_start)),
            Put(f"{t.logs}/epochs/{epoch:010d}", str(p.next_offset).encode()),
        ],
    )
    if not res.succeeded:
        raise RepairError("the partition changed or was taken meanwhile: run the command again")
    return mine, res.revision


async def _kept_batches(
    store: ObjectStore, t: Target, seg: SegmentMeta, offset: int
) -> list[memoryview]:
    """The batches of ``seg`` below ``offset``; RepairError unless it is a boundary."""
    data = await store.get(t.key(seg))
    keep: list[memoryview] = []
    for _pos, hdr, view in iter_segment_batches(data):
        if hdr.base_offset >= offset:
            break
        if hdr.last_offset >= offset:
            raise RepairError(
                f"offset {offset} is inside the batch {hdr.base_offset}..{hdr.last_offset}: "
                f"truncate to {hdr.base_offset}"
            )
        keep.append(view)
    return keep


async def _rewrite_cut(
    store: ObjectStore, t: Target, p: Plan, offset: int
) -> tuple[SegmentMeta, str]:
    assert p.cut is not None
    seg = p.cut
    keep = await _kept_batches(store, t, seg, offset)
    # a compacted segment (docs/format.md) stays one: gaps allowed, its tombstone horizons
    cut = offset - 1 if seg.cleaned else None
    built = build_segment(seg.base, keep, int(time.time() * 1000), compacted_last=cut)
    # the repair's own epoch: no other writer ever uses this name
    name = object_name(seg.base, offset - 1, p.epoch + 1, p.topic_id, 1)
    key = partition_prefix(t.namespace, t.topic, t.partition) + name
    data = b"".join(built.buffers)  # its index inside
    etag = await store.put_if_absent(key, [data], crc32c=built.crc32c)
    meta = SegmentMeta(
        seg.base,
        built.last_offset,
        built.size,
        built.record_count,
        built.max_timestamp,
        etag,
        name,
        int(time.time() * 1000),
        seg.cleaned,
        built.version,
    )
    return meta, key


async def truncate(
    meta: MetaStore, store: ObjectStore, t: Target, offset: int, *, execute: bool
) -> list[str]:
    """Cut ``t`` back to ``offset`` (see the module doc); returns what was (or would be)
    done, one line each. Raises RepairError."""
    p = await plan(meta, t, offset)
    lines = [
        f"{t.topic}-{t.partition}: log [{p.log_start}, {p.next_offset}) -> [{p.log_start}, "
        f"{offset}), epoch {p.epoch} -> {p.epoch + 1}",
        *(f"drop segment {s.base}..{s.last} ({t.key(s)})" for s in p.drop),
    ]
    if p.cut is not None:
        await _kept_batches(store, t, p.cut, offset)  # a batch boundary, before any change
        lines.append(f"rewrite segment {p.cut.base}..{p.cut.last} to end at {offset - 1}")
    if not execute:
        return [*lines, "dry run: add --execute to apply"]
    lease = await meta.grant_lease(LEASE_TTL_S)
    try:
        mine, _rev = await _take(meta, t, p, lease)
        taken = await meta.get(f"{t.logs}/end")
        assert taken is not None
        ops: list[Put | Delete] = [Delete(f"{t.logs}/segments/{s.base:020d}") for s in p.drop]
        new_key = None
        if p.cut is not None:
            cut_meta, new_key = await _rewrite_cut(store, t, p, offset)
            ops.append(Put(f"{t.logs}/segments/{p.cut.base:020d}", cut_meta.to_json()))
        epoch = p.epoch + 1
        ours = f"{t.logs}/epochs/{epoch:010d}"
        for kv in await meta.range(f"{t.logs}/epochs/"):
            if kv.key != ours and int(kv.value) > offset:
                ops.append(Delete(kv.key))
        ops += [
            Put(ours, str(offset).encode()),
            Put(f"{t.logs}/end", end_json(offset, epoch, p.log_start)),
            Delete(producers_key(t.topic, t.partition)),  # may name batches cut off
            Delete(t.owner),
        ]
        res = await meta.txn(
            [
                Compare(t.owner, "value", "==", mine),
                Compare(f"{t.logs}/end", "mod_revision", "==", taken.mod_revision),
            ],
            ops,
        )
        if not res.succeeded:
            raise RepairError("fenced while truncating (lease lost?): nothing was committed")
    finally:
        await meta.revoke_lease(lease)
    if new_key is not None:
        lines.append(f"wrote {new_key}")
    return [*lines, f"committed: {t.topic}-{t.partition} now ends at {offset}"]


def _parser() -> EnvParser:
    p = EnvParser(
        "kafscale partitions truncate",
        description="Remove every record at or after --to (docs/operations.md).",
    )
    p.parser.add_argument("topic")
    p.parser.add_argument("partition", type=int)
    p.parser.add_argument("--to", type=int, required=True, dest="offset", help="new log end")
    p.parser.add_argument("--execute", action="store_true", help="apply (default: dry run)")
    p.option("--store", "object store URL", default="file://./data")
    p.option("--meta", "metadata store URL", default="embedded")
    p.option("--meta-prefix", "key prefix in the metadata store", default="/kafscale")
    p.option("--data-dir", "directory of the embedded metadata store", default="./data")
    p.option("--namespace", "object key namespace", default="default")
    p.option("--log-format", "text or json: warnings on stderr", default="text", choices=FORMATS)
    return p


async def _run(args: argparse.Namespace) -> list[str]:
    store_url = args.store if "://" in args.store else "file://" + args.store
    async with contextlib.AsyncExitStack() as stack:
        try:
            store = open_store(store_url)
            stack.push_async_callback(store.close)
            meta = open_meta(args.meta, args.data_dir, args.meta_prefix)
            stack.push_async_callback(meta.close)
        except ValueError as exc:  # an unsupported or malformed URL
            raise RepairError(str(exc)) from exc
        t = Target(args.namespace, args.topic, args.partition)
        return await truncate(meta, store, t, args.offset, execute=args.execute)


def truncate_main(argv: list[str]) -> int:
    """``kafscale partitions truncate ...`` (``broker.cli`` dispatches here). A refused
    cut, an unsupported store URL, and a metadata or object store that cannot be reached
    (or an embedded store a running broker holds) are one line on stderr and exit 1."""
    args = _parser().parse_args(argv)
    setup_logging("WARNING", args.log_format)
    try:
        lines = asyncio.run(_run(args))
    except RepairError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (MetaStoreError, StoreError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def main(argv: list[str]) -> int:
    """``kafscale partitions truncate|...`` with the sub-command word first."""
    if not argv or argv[0] != "truncate":
        print("usage: kafscale partitions truncate TOPIC PARTITION --to N", file=sys.stderr)
        return 2
    return truncate_main(argv[1:])
