"""Every metadata key and value codec (docs/format.md, "Metadata keys").

Imports nothing from the server: the broker, the CLI, the ingest job and the benchmarks
build and parse metadata keys and values here and nowhere else.

    /cluster/id                            -> {id}
    /brokers/{id}                          -> BrokerRecord                       (leased)
    /topics/{topic}                        -> TopicInfo
    /owners/{topic}/{p}                    -> owner_value(broker, epoch, topic id)  (leased)
    /logs/{topic}/{p}/end                  -> EndValue
    /logs/{topic}/{p}/segments/{base:020d} -> SegmentMeta (a manifest entry)
    /logs/{topic}/{p}/epochs/{epoch:010d}  -> start offset of that leader epoch
    /logs/{topic}/{p}/producers            -> ProducerSnapshot (idempotent producers)
    /cycles/{broker}/{reg:020d}/{seq:020d} -> cycle_json (entries not folded yet)
    /groups/{group, quoted}/state          -> groupcoord.GroupRecord
    /groups/{group, quoted}/consumer       -> groupcoord.consumer_model.ConsumerGroupState
    /groups/{group, quoted}/offsets/{t}/{p}-> groupcoord.OffsetRecord
    /producers/next-id                     -> next free producer id (decimal)
    /security/scram/{user, quoted}/{mech}  -> broker.security.scram.ScramCredential JSON
    /security/acls/{sha256 of the binding} -> broker.security.acl.AclBinding JSON
    /quotas/{type=name/...}                -> QuotaRecord (client quotas, issue 12)
    /registry/next-id                      -> next free schema id (decimal)      (registry)
    /registry/schemas/{id:010d}            -> RegistrySchema (never deleted: ids not reused)
    /registry/fingerprints/{sha256}        -> schema id of that (type, schema, references)
    /registry/subjects/{s, quoted}/versions/{v:010d} -> RegistryVersion
    /registry/config                       -> {compatibilityLevel} (global)
    /registry/subjects/{s, quoted}/config  -> {compatibilityLevel} (per subject)
    /txn/..., /txn-markers/..., /logs/{t}/{p}/txn/...  -> transactions (section below)
"""

from __future__ import annotations

import json
import struct
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_str  # json.dumps of one str
from types import MappingProxyType
from typing import Any
from urllib.parse import quote, unquote

from protocol.values import value

CLUSTER_ID_KEY = "/cluster/id"
PRODUCER_ID_KEY = "/producers/next-id"
BROKERS_PREFIX = "/brokers/"
TOPICS_PREFIX = "/topics/"
OWNERS_PREFIX = "/owners/"
GROUPS_PREFIX = "/groups/"


# ---------------------------------------------------------------------------- brokers


def broker_key(node_id: int) -> str:
    return f"{BROKERS_PREFIX}{node_id}"


def broker_id_of(key: str) -> int | None:
    """The node id at the end of a ``/brokers/{id}`` key (None for anything else)."""
    node = key.rsplit("/", 1)[-1]
    return int(node) if node.isdigit() else None


@dataclass(frozen=True, slots=True)
class BrokerRecord:
    """The value of ``/brokers/{id}``: where the broker is reached, and whether it serves.

    A broker registers with ``serving`` false and marks it true once its listeners
    accept connections; it marks it false again when it stops. Other brokers count only
    serving ones when they place partitions, groups and transactions (docs/architecture.md,
    "Ownership"). A record without the field (written before it existed) is serving.
    """

    host: str
    port: int
    rack: str | None = None
    # every advertised listener: (name, host, port); empty for a plaintext-only broker
    listeners: tuple[tuple[str, str, int], ...] = ()
    serving: bool = True

    def to_json(self) -> bytes:
        d: dict[str, object] = {"host": self.host, "port": self.port, "rack": self.rack}
        if self.listeners:
            d["listeners"] = {name: [h, p] for name, h, p in self.listeners}
        d["serving"] = self.serving
        return json.dumps(d).encode()

    @classmethod
    def from_json(cls, value: bytes) -> BrokerRecord:
        """Raises ValueError for a value that is not a broker record."""
        try:
            d = json.loads(value)
            listeners = tuple(
                (str(name), str(hp[0]), int(hp[1]))
                for name, hp in dict(d.get("listeners") or {}).items()
            )
            rack = d.get("rack")
            return cls(
                str(d["host"]),
                int(d["port"]),
                None if rack is None else str(rack),
                listeners,
                bool(d.get("serving", True)),
            )
        except (KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"not a broker record: {exc}") from exc


# ---------------------------------------------------------------------------- topics


def topic_key(name: str) -> str:
    return TOPICS_PREFIX + name


def topic_logs_prefix(name: str) -> str:
    return f"/logs/{name}/"


def topic_owners_prefix(name: str) -> str:
    return f"{OWNERS_PREFIX}{name}/"


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """One topic. ``configs`` (the explicitly set keys) is a read-only mapping."""

    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: Mapping[str, str]

    def __hash__(self) -> int:
        return hash((self.name, self.topic_id, self.partitions))

    def to_json(self) -> bytes:
        doc = {
            "id": str(self.topic_id),
            "partitions": self.partitions,
            "configs": dict(self.configs),
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @staticmethod
    def from_json(name: str, value: bytes) -> TopicInfo:
        doc = json.loads(value)
        configs = {str(k): str(v) for k, v in dict(doc.get("configs") or {}).items()}
        return TopicInfo(
            name, uuid.UUID(doc["id"]), int(doc["partitions"]), MappingProxyType(configs)
        )


# ---------------------------------------------------------------------------- groups


def group_prefix(group_id: str) -> str:
    return f"{GROUPS_PREFIX}{quote(group_id, safe='')}/"


def group_state_key(group_id: str) -> str:
    return group_prefix(group_id) + "state"


def consumer_group_key(group_id: str) -> str:
    """A KIP-848 consumer group's state (exclusive with ``group_state_key``: a group is
    classic or consumer, never both)."""
    return group_prefix(group_id) + "consumer"


def group_offset_key(group_id: str, topic: str, partition: int) -> str:
    return f"{group_prefix(group_id)}offsets/{topic}/{partition}"


def group_offset_topic(key: str) -> str | None:
    """The topic of a ``group_offset_key`` (None for any other key under ``/groups/``)."""
    parts = key[len(GROUPS_PREFIX) :].split("/") if key.startswith(GROUPS_PREFIX) else []
    return parts[2] if len(parts) == 4 and parts[1] == "offsets" else None


# ---------------------------------------------------------------------------- partition logs


def partition_logs_prefix(topic: str, partition: int) -> str:
    """Every key of one partition's log (its end, manifest entries, producers, ...)."""
    return f"{topic_logs_prefix(topic)}{partition}/"


def end_key(topic: str, partition: int) -> str:
    return f"/logs/{topic}/{partition}/end"


def owner_key(topic: str, partition: int) -> str:
    return f"/owners/{topic}/{partition}"


def segments_prefix(topic: str, partition: int) -> str:
    return f"/logs/{topic}/{partition}/segments/"


def seg_entry_key(topic: str, partition: int, base: int) -> str:
    return f"{segments_prefix(topic, partition)}{base:020d}"


def epochs_prefix(topic: str, partition: int) -> str:
    return f"/logs/{topic}/{partition}/epochs/"


def epoch_key(topic: str, partition: int, epoch: int) -> str:
    return f"{epochs_prefix(topic, partition)}{epoch:010d}"


def entry_base(key: str) -> int:
    """The base offset (or epoch) that ends a ``segments/`` or ``epochs/`` key."""
    return int(key.rsplit("/", 1)[-1])


@value
class EndValue:
    """``/logs/{t}/{p}/end``: the committed log end, the owner epoch, the log start, and
    (an owner that commits through cycle keys) the owner's node id and registration
    revision: where the take looks for the epoch's entries not folded yet
    (docs/architecture.md, "Cycle keys")."""

    next_offset: int
    epoch: int
    log_start: int = 0
    broker: int = -1
    reg: int = 0

    def encode(self) -> bytes:
        return end_json(self.next_offset, self.epoch, self.log_start, self.broker, self.reg)

    @classmethod
    def decode(cls, value: bytes) -> EndValue:
        d = json.loads(value)
        return cls(
            int(d["next_offset"]),
            int(d["epoch"]),
            int(d.get("log_start", 0)),
            int(d.get("broker", -1)),
            int(d.get("reg", 0)),
        )


def end_json(next_offset: int, epoch: int, log_start: int, broker: int = -1, reg: int = 0) -> bytes:
    """The value of ``/logs/{t}/{p}/end`` (``log_start``: docs/format.md, log start;
    ``broker``/``reg`` only from an owner that commits through cycle keys)."""
    d = {"next_offset": next_offset, "epoch": epoch, "log_start": log_start}
    if broker >= 0:
        d["broker"], d["reg"] = broker, reg
    return json.dumps(d, separators=(",", ":")).encode()


def owner_value(broker: int, epoch: int, topic_id: uuid.UUID) -> bytes:
    """The value of ``/owners/{t}/{p}``. The topic id makes it unique across incarnations
    of a topic name (a re-created topic restarts at epoch 1), so a compare on it never
    mistakes a new incarnation's owner for the old one's."""
    return json.dumps(
        {"broker": broker, "epoch": epoch, "topic_id": str(topic_id)}, separators=(",", ":")
    ).encode()


def owner_of_key(key: str) -> tuple[str, int] | None:
    """(topic, partition) of an ``/owners/{topic}/{p}`` key (None for anything else)."""
    parts = key.split("/")  # ["", "owners", topic, partition]
    if len(parts) != 4 or parts[1] != "owners" or not parts[3].isdigit():
        return None
    return parts[2], int(parts[3])


def owner_broker(value: bytes) -> int | None:
    """The broker id in an owner value (None when unreadable)."""
    try:
        return int(json.loads(value)["broker"])
    except (ValueError, KeyError, TypeError):
        return None


@value
class SegmentMeta:
    """A committed manifest entry (``/logs/{t}/{p}/segments/{base:020d}``)."""

    base: int
    last: int
    size: int
    records: int
    max_ts: int
    etag: str
    # object name under ``{ns}/{t}/{p}/`` when it is not ``segment-{base:020d}.kfs``
    # (merged segments: ``segment-{base:020d}-{last:020d}.kfs``, docs/format.md)
    key: str = ""
    # wall-clock ms when the data was written (-1: unknown); retention.ms counts from
    # the later of this and max_ts, so data produced with old timestamps is not dropped
    # the moment it lands (Kafka keeps it in its active segment; ours are small)
    created_ms: int = -1
    # compacted segments only (docs/format.md, "Compacted segments"): ascending
    # (first offset, ms) pairs, the wall-clock time compaction first reached the offsets
    # from there on (tombstones there go delete.retention.ms after it)
    cleaned: tuple[tuple[int, int], ...] = ()
    # the object's KAFS segment format version (docs/format.md, "Merged segments and the
    # log start"): 2 has its index inside, so no ``.index`` object exists beside it; 0: not
    # recorded (entries written before it was: the index object may exist)
    version: int = 0

    @property
    def has_index_object(self) -> bool:
        """Whether an ``.index`` object may exist beside the segment (version 1 or unknown)."""
        return self.version < 2

    @property
    def retention_ts(self) -> int:
        return max(self.max_ts, self.created_ms)

    def to_json(self) -> bytes:
        """The entry's JSON, formatted directly: the same bytes as ``json.dumps`` of the
        fields in this order with compact separators, in under half the time (two per
        segment on the cycle-key path; docs/benchmarks.md, "Round 14")."""
        out = b'{"base":%d,"last":%d,"bytes":%d,"records":%d,"max_ts":%d,"etag":%s' % (
            self.base,
            self.last,
            self.size,
            self.records,
            self.max_ts,
            _json_str(self.etag).encode(),
        )
        if self.key:
            out += b',"key":%s' % _json_str(self.key).encode()
        if self.created_ms >= 0:
            out += b',"created":%d' % self.created_ms
        if self.cleaned:
            pairs = [[o, t] for o, t in self.cleaned]
            out += b',"cleaned":%s' % json.dumps(pairs, separators=(",", ":")).encode()
        if self.version > 0:
            out += b',"version":%d' % self.version
        return out + b"}"

    @classmethod
    def from_json(cls, base: int, value: bytes) -> SegmentMeta:
        return cls.from_dict(json.loads(value), base)

    @classmethod
    def from_dict(cls, d: dict[str, Any], base: int | None = None) -> SegmentMeta:
        """An entry from its decoded JSON (``base`` from its key, else from ``d``)."""
        return cls(
            int(d["base"]) if base is None else base,
            int(d["last"]),
            int(d["bytes"]),
            int(d["records"]),
            int(d.get("max_ts", -1)),
            str(d.get("etag", "")),
            str(d.get("key", "")),
            int(d.get("created", -1)),
            tuple((int(o), int(t)) for o, t in d.get("cleaned", ())),
            int(d.get("version", 0)),
        )


def producers_key(topic: str, partition: int) -> str:
    return f"/logs/{topic}/{partition}/producers"


# ---------------------------------------------------------------------------- cycle keys

CYCLES_PREFIX = "/cycles/"


def cycles_prefix(broker: int, reg: int | None = None) -> str:
    """Every cycle key of ``broker`` (of one registration revision ``reg``)."""
    if reg is None:
        return f"{CYCLES_PREFIX}{broker}/"
    return f"{CYCLES_PREFIX}{broker}/{reg:020d}/"


def cycle_key(broker: int, reg: int, seq: int) -> str:
    return f"{cycles_prefix(broker, reg)}{seq:020d}"


def cycle_key_owner(key: str) -> tuple[int, int] | None:
    """(broker, registration revision) of a cycle key (None for anything else)."""
    parts = key[len(CYCLES_PREFIX) :].split("/") if key.startswith(CYCLES_PREFIX) else []
    if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


@value
class CycleEntry:
    """One partition's segment in a cycle key: committed (acknowledged) when the key
    was created, folded into the partition's own keys later (docs/format.md)."""

    topic: str
    partition: int
    topic_id: str  # hex
    epoch: int
    segment: SegmentMeta


def cycle_json(entries: Sequence[CycleEntry], *, aborted: bool = False) -> bytes:
    """A cycle key's value. ``aborted``: the tombstone a resolution puts in place of a
    cycle whose commit had an unknown outcome (its entries were never acknowledged and
    the original can no longer be created). Each entry's manifest entry is embedded as
    the very bytes ``SegmentMeta.to_json`` gives (one encoding per entry)."""
    parts = [
        b"[%s,%d,%s,%d,%s]"
        % (
            json.dumps(e.topic).encode(),
            e.partition,
            json.dumps(e.topic_id).encode(),
            e.epoch,
            e.segment.to_json(),
        )
        for e in entries
    ]
    head = b'{"aborted":true,"entries":[' if aborted else b'{"aborted":false,"entries":['
    return head + b",".join(parts) + b"]}"


def parse_cycle(value: bytes) -> tuple[bool, list[CycleEntry]]:
    """(aborted, entries) of a cycle key's value."""
    doc = json.loads(value)
    out = [
        CycleEntry(
            str(topic), int(partition), str(topic_id), int(epoch), SegmentMeta.from_dict(seg)
        )
        for topic, partition, topic_id, epoch, seg in doc["entries"]
    ]
    return bool(doc["aborted"]), out


_SNAP_MAGIC_V1 = b"KPS1"  # before producer expiry: no last write time per producer
_SNAP_MAGIC = b"KPS2"
_SNAP_HEAD = struct.Struct(">4sqI")
_SNAP_PRODUCER_V1 = struct.Struct(">qhB")
_SNAP_PRODUCER = struct.Struct(">qhBq")
_SNAP_BATCH = struct.Struct(">iiq")

SnapshotBatch = tuple[int, int, int]  # first sequence, last sequence, base offset
# id, epoch, batches, last write (ms since the epoch; -1: unknown)
SnapshotProducer = tuple[int, int, tuple[SnapshotBatch, ...], int]


@dataclass(frozen=True, slots=True)
class ProducerSnapshot:
    """``/logs/{t}/{p}/producers``: the idempotent producers of a partition as of offset
    ``upto`` (every batch below it committed), each as (producer id, epoch, its last
    batches below ``upto``, oldest first, each (first sequence, last sequence, base
    offset), the wall-clock time of its last write in ms); a rollback floor is (-1,
    sequence, -1). Binary, big-endian: magic ``KPS2``, ``upto`` (int64), a count
    (uint32), then per producer its id (int64), epoch (int16), batch count (uint8) and
    last write (int64), and 16 bytes per batch (docs/format.md, "Producer snapshots").
    ``KPS1`` values (no last write) decode with -1 there."""

    upto: int
    producers: tuple[SnapshotProducer, ...]

    def encode(self) -> bytes:
        out = bytearray(_SNAP_HEAD.pack(_SNAP_MAGIC, self.upto, len(self.producers)))
        for pid, epoch, batches, last_ms in self.producers:
            out += _SNAP_PRODUCER.pack(pid, epoch, len(batches), last_ms)
            for batch in batches:
                out += _SNAP_BATCH.pack(*batch)
        return bytes(out)

    @classmethod
    def decode(cls, value: bytes) -> ProducerSnapshot:
        """Raises ValueError for anything but a whole snapshot."""
        try:
            magic, upto, n = _SNAP_HEAD.unpack_from(value)
            if magic not in (_SNAP_MAGIC, _SNAP_MAGIC_V1):
                raise ValueError("not a producer snapshot")
            timed = magic == _SNAP_MAGIC
            head = _SNAP_PRODUCER if timed else _SNAP_PRODUCER_V1
            pos = _SNAP_HEAD.size
            producers = []
            for _ in range(n):
                pid, epoch, count, *last = head.unpack_from(value, pos)
                if count == 0:
                    raise ValueError("producer snapshot names a producer without batches")
                pos += head.size
                batches = tuple(
                    _SNAP_BATCH.unpack_from(value, pos + i * _SNAP_BATCH.size) for i in range(count)
                )
                pos += count * _SNAP_BATCH.size
                producers.append((pid, epoch, batches, last[0] if timed else -1))
        except struct.error as exc:
            raise ValueError(f"producer snapshot cut short: {exc}") from None
        if pos != len(value):
            raise ValueError("producer snapshot has trailing bytes")
        return cls(upto, tuple(producers))


# ---------------------------------------------------------------------------- security


SCRAM_PREFIX = "/security/scram/"
ACLS_PREFIX = "/security/acls/"


def scram_user_prefix(user: str) -> str:
    return f"{SCRAM_PREFIX}{quote(user, safe='')}/"


def scram_key(user: str, mechanism: str) -> str:
    """``/security/scram/{user}/{mechanism}``: one SCRAM credential (no password)."""
    return scram_user_prefix(user) + mechanism


def scram_of_key(key: str) -> tuple[str, str] | None:
    """(user, mechanism) of a ``scram_key`` (None for anything else)."""
    from urllib.parse import unquote

    rest = key[len(SCRAM_PREFIX) :] if key.startswith(SCRAM_PREFIX) else ""
    user, sep, mechanism = rest.partition("/")
    return (unquote(user), mechanism) if sep and user and mechanism else None


def acl_key(binding_json: bytes) -> str:
    """``/security/acls/{sha256}``: one ACL binding, named by its canonical JSON."""
    import hashlib

    return ACLS_PREFIX + hashlib.sha256(binding_json).hexdigest()


# ---------------------------------------------------------------------------- client quotas

QUOTAS_PREFIX = "/quotas/"
QUOTA_DEFAULT_NAME = "<default>"  # quote() never produces "<", so no name can collide

QuotaEntity = tuple[tuple[str, str | None], ...]  # sorted (entity type, name; None = default)


def quota_key(entity: QuotaEntity) -> str:
    """``/quotas/client-id=a/user=%3Cdefault%3E``-like: one key per entity, its parts
    sorted by type, names quoted, the default entity ``<default>``."""
    parts = (
        f"{quote(t, safe='')}={QUOTA_DEFAULT_NAME if n is None else quote(n, safe='')}"
        for t, n in sorted(entity, key=lambda part: part[0])
    )
    return QUOTAS_PREFIX + "/".join(parts)


@dataclass(frozen=True, slots=True)
class QuotaRecord:
    """The quotas set for one entity: quota key (``producer_byte_rate``...) -> value."""

    entity: QuotaEntity
    quotas: Mapping[str, float]

    def to_json(self) -> bytes:
        doc = {"entity": [[t, n] for t, n in self.entity], "quotas": dict(self.quotas)}
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, value: bytes) -> QuotaRecord:
        d = json.loads(value)
        parts = ((str(t), None if n is None else str(n)) for t, n in d["entity"])
        entity = tuple(sorted(parts, key=lambda part: part[0]))
        quotas = {str(k): float(v) for k, v in d["quotas"].items()}
        return cls(entity, MappingProxyType(quotas))


# ---------------------------------------------------------------------------- schema registry
# (broker/registry/, docs/registry.md)

REGISTRY_PREFIX = "/registry/"
REGISTRY_NEXT_ID_KEY = "/registry/next-id"
REGISTRY_CONFIG_KEY = "/registry/config"
REGISTRY_SUBJECTS_PREFIX = "/registry/subjects/"


def registry_schema_key(schema_id: int) -> str:
    return f"/registry/schemas/{schema_id:010d}"


def registry_fingerprint_key(fingerprint: str) -> str:
    return f"/registry/fingerprints/{fingerprint}"


def registry_subject_prefix(subject: str) -> str:
    return f"{REGISTRY_SUBJECTS_PREFIX}{quote(subject, safe='')}/"


def registry_versions_prefix(subject: str) -> str:
    return registry_subject_prefix(subject) + "versions/"


def registry_version_key(subject: str, version: int) -> str:
    return f"{registry_versions_prefix(subject)}{version:010d}"


def registry_subject_config_key(subject: str) -> str:
    return registry_subject_prefix(subject) + "config"


def registry_subject_of_key(key: str) -> str | None:
    """The subject of a ``/registry/subjects/{s}/...`` key (None for anything else)."""
    if not key.startswith(REGISTRY_SUBJECTS_PREFIX):
        return None
    quoted = key[len(REGISTRY_SUBJECTS_PREFIX) :].split("/", 1)[0]
    return unquote(quoted) if quoted else None


@dataclass(frozen=True, slots=True)
class RegistryReference:
    """A schema reference: ``name`` (import path / $ref / Avro type name) -> subject version."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True, slots=True)
class RegistrySchema:
    """``/registry/schemas/{id}``: a registered schema, as its client gave it."""

    schema_type: str  # AVRO | PROTOBUF | JSON
    schema: str
    references: tuple[RegistryReference, ...] = ()

    def to_json(self) -> bytes:
        doc = {
            "schemaType": self.schema_type,
            "schema": self.schema,
            "references": [
                {"name": r.name, "subject": r.subject, "version": r.version}
                for r in self.references
            ],
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @staticmethod
    def from_json(value: bytes) -> RegistrySchema:
        doc = json.loads(value)
        refs = tuple(
            RegistryReference(str(r["name"]), str(r["subject"]), int(r["version"]))
            for r in doc.get("references") or ()
        )
        return RegistrySchema(str(doc["schemaType"]), str(doc["schema"]), refs)


@dataclass(frozen=True, slots=True)
class RegistryVersion:
    """``/registry/subjects/{s}/versions/{v}``: the schema id of a version; soft-deleted?"""

    schema_id: int
    deleted: bool = False

    def to_json(self) -> bytes:
        return json.dumps({"id": self.schema_id, "deleted": self.deleted}).encode()

    @staticmethod
    def from_json(value: bytes) -> RegistryVersion:
        doc = json.loads(value)
        return RegistryVersion(int(doc["id"]), bool(doc.get("deleted", False)))


def registry_config_json(level: str) -> bytes:
    return json.dumps({"compatibilityLevel": level}).encode()


def registry_config_level(value: bytes) -> str:
    return str(json.loads(value)["compatibilityLevel"])


# ---------------------------------------------------------------------------- transactions
# (docs/architecture.md, "Transactions"; docs/format.md, metadata keys)
#
#     /txn/{tid, quoted}/state                    -> txncoord.TxnRecord
#     /txn/{tid, quoted}/offsets/{group, quoted}/{t}/{p} -> groupcoord.OffsetRecord (pending)
#     /txn-markers/{tid, quoted}/{t}/{p}           -> MarkerRequest
#     /logs/{t}/{p}/txn/open/{pid:020d}            -> OpenTxn
#     /logs/{t}/{p}/txn/aborted/{last:020d}        -> AbortedTxn

TXN_PREFIX = "/txn/"
TXN_MARKERS_PREFIX = "/txn-markers/"


def txn_prefix(txn_id: str) -> str:
    return f"{TXN_PREFIX}{quote(txn_id, safe='')}/"


def txn_state_key(txn_id: str) -> str:
    return txn_prefix(txn_id) + "state"


def txn_id_of_state_key(key: str) -> str | None:
    """The transactional id of a ``/txn/{tid}/state`` key (None for any other key)."""
    parts = key.split("/")  # ["", "txn", tid, "state"]
    if len(parts) != 4 or parts[1] != "txn" or parts[3] != "state":
        return None
    return unquote(parts[2])


def txn_offsets_prefix(txn_id: str) -> str:
    return txn_prefix(txn_id) + "offsets/"


def txn_offset_key(txn_id: str, group_id: str, topic: str, partition: int) -> str:
    return f"{txn_offsets_prefix(txn_id)}{quote(group_id, safe='')}/{topic}/{partition}"


def txn_offset_topic(key: str) -> str | None:
    """The topic of a ``txn_offset_key`` (None for any other key under ``/txn/``)."""
    parts = key[len(TXN_PREFIX) :].split("/") if key.startswith(TXN_PREFIX) else []
    return parts[3] if len(parts) == 5 and parts[1] == "offsets" else None


def txn_offset_target(txn_id: str, key: str) -> tuple[str, str, int]:
    """(group, topic, partition) of a pending transactional offset key."""
    group, topic, partition = key[len(txn_offsets_prefix(txn_id)) :].split("/")
    return unquote(group), topic, int(partition)


def txn_markers_prefix(txn_id: str) -> str:
    return f"{TXN_MARKERS_PREFIX}{quote(txn_id, safe='')}/"


def txn_marker_key(txn_id: str, topic: str, partition: int) -> str:
    return f"{txn_markers_prefix(txn_id)}{topic}/{partition}"


def txn_marker_target(key: str) -> tuple[str, str, int] | None:
    """(transactional id, topic, partition) of a ``/txn-markers/`` key."""
    parts = key.split("/")  # ["", "txn-markers", tid, topic, p]
    if len(parts) != 5 or parts[1] != "txn-markers" or not parts[4].isdigit():
        return None
    return unquote(parts[2]), parts[3], int(parts[4])


def partition_txn_prefix(topic: str, partition: int) -> str:
    return f"/logs/{topic}/{partition}/txn/"


def open_txn_key(topic: str, partition: int, producer_id: int) -> str:
    return f"{partition_txn_prefix(topic, partition)}open/{producer_id:020d}"


def aborted_txn_key(topic: str, partition: int, last_offset: int) -> str:
    return f"{partition_txn_prefix(topic, partition)}aborted/{last_offset:020d}"


@dataclass(frozen=True, slots=True)
class MarkerRequest:
    """A commit or abort marker the partition's owner must write (``/txn-markers/``)."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int = 0

    def to_json(self) -> bytes:
        d = {
            "pid": self.producer_id,
            "epoch": self.producer_epoch,
            "commit": self.commit,
            "coordinator_epoch": self.coordinator_epoch,
        }
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, value: bytes) -> MarkerRequest:
        d = json.loads(value)
        return cls(
            int(d["pid"]), int(d["epoch"]), bool(d["commit"]), int(d.get("coordinator_epoch", 0))
        )


@dataclass(frozen=True, slots=True)
class OpenTxn:
    """An open transaction of one producer on one partition: ``first`` is at or below
    its first offset there (the last stable offset stops at it)."""

    producer_id: int
    producer_epoch: int
    first: int
    txn_id: str

    def to_json(self) -> bytes:
        d = {
            "pid": self.producer_id,
            "epoch": self.producer_epoch,
            "first": self.first,
            "tid": self.txn_id,
        }
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, value: bytes) -> OpenTxn:
        d = json.loads(value)
        return cls(int(d["pid"]), int(d["epoch"]), int(d["first"]), str(d["tid"]))


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """An entry of the aborted-transaction index: the producer's records from ``first``
    to the abort marker at ``last`` are aborted."""

    producer_id: int
    first: int
    last: int

    def to_json(self) -> bytes:
        d = {"pid": self.producer_id, "first": self.first, "last": self.last}
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, value: bytes) -> AbortedTxn:
        d = json.loads(value)
        return cls(int(d["pid"]), int(d["first"]), int(d["last"]))
