"""Log compaction policy, pure functions (no I/O): what is cleanable, when a partition is
due, the bounded key map, and which records a rewrite keeps (docs/format.md, "Compacted
segments"). ``broker.compaction`` applies them on the partition owner.

The log of a compacted partition is, from its head: a **clean** prefix of segments
written by compaction (their manifest entries carry ``cleaned``), then **dirty** segments
as the flush cycle and merges wrote them. A pass maps key -> latest offset over the
cleanable dirty segments (as many as the key map holds: several passes when it is too
small), then rewrites the head up to the end of what it mapped, keeping a record unless
a later record of its key was mapped, or it is a tombstone whose delete horizon passed.

The record filter is a chain of rules (``RecordFilter``): batch rules first (a control
batch is kept whole), then record rules. Transactions will add rules there: keep control
batches (already kept) and drop the records of aborted transactions.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from broker.meta.schema import SegmentMeta
from protocol.batch import BatchHeader, read_header
from protocol.compaction import RawRecord, rebuild_batch, record_columns, split_records
from protocol.compression import Compression

# estimated bytes per key-map entry (16-byte digest, int, dict slot): the buffer flag
# divided by this bounds the keys one pass can map
KEY_ENTRY_BYTES = 128
NO_TOMBSTONES = -1  # a ``cleaned`` time meaning "no tombstone from here on"

_CODECS = {
    "none": int(Compression.NONE),
    "uncompressed": int(Compression.NONE),
    "gzip": int(Compression.GZIP),
    "snappy": int(Compression.SNAPPY),
    "lz4": int(Compression.LZ4),
    "zstd": int(Compression.ZSTD),
}


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """A topic's compaction settings (its effective configs)."""

    compact: bool
    dirty_ratio: float = 0.5
    min_lag_ms: int = 0
    max_lag_ms: int = 2**63 - 1
    delete_retention_ms: int = 86_400_000
    codec: int | None = None  # None: keep each batch's own codec ("producer")

    @classmethod
    def from_configs(cls, configs: Mapping[str, str]) -> CompactionConfig:
        policy = configs.get("cleanup.policy", "delete").split(",")
        return cls(
            "compact" in policy,
            float(configs.get("min.cleanable.dirty.ratio", "0.5")),
            int(configs.get("min.compaction.lag.ms", "0")),
            int(configs.get("max.compaction.lag.ms", str(2**63 - 1))),
            int(configs.get("delete.retention.ms", "86400000")),
            _CODECS.get(configs.get("compression.type", "producer")),
        )


def is_compacted(configs: Mapping[str, str]) -> bool:
    return "compact" in configs.get("cleanup.policy", "delete").split(",")


def compaction_of(configs: Mapping[str, str], _config: object = None) -> CompactionConfig | None:
    """A topic's compaction settings; None when it is not compacted (``TopicManager.derived``
    calls this once per version of the topic)."""
    cfg = CompactionConfig.from_configs(configs)
    return cfg if cfg.compact else None


# ---------------------------------------------------------------- what to compact, when


def clean_count(segments: Sequence[SegmentMeta]) -> int:
    """How many head segments are clean (written by compaction)."""
    n = 0
    for seg in segments:
        if not seg.cleaned:
            break
        n += 1
    return n


def _age_ts(seg: SegmentMeta) -> int:
    return seg.retention_ts


def cleanable_count(segments: Sequence[SegmentMeta], now_ms: int, min_lag_ms: int) -> int:
    """How many head segments may be compacted: none younger than ``min_lag_ms``. (The
    log's last batch always stays whole, ``keep_log_end``: consumers reach the end.)"""
    n = 0
    for seg in segments:
        if _age_ts(seg) > now_ms - min_lag_ms:
            break
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class DirtyState:
    clean: int  # segments in the clean prefix
    end: int  # cleanable segments (clean + dirty ones that may be compacted)
    clean_bytes: int
    dirty_bytes: int
    oldest_dirty_ms: int  # write time of the oldest cleanable dirty segment (-1: none)

    @property
    def ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def dirty_state(segments: Sequence[SegmentMeta], now_ms: int, cfg: CompactionConfig) -> DirtyState:
    clean = clean_count(segments)
    end = max(clean, cleanable_count(segments, now_ms, cfg.min_lag_ms))
    dirty = segments[clean:end]
    oldest = min((_age_ts(s) for s in dirty), default=-1)
    return DirtyState(
        clean,
        end,
        sum(s.size for s in segments[:clean]),
        sum(s.size for s in dirty),
        oldest,
    )


def expired_tombstones(
    segments: Sequence[SegmentMeta], clean: int, now_ms: int, retention_ms: int
) -> bool:
    """Whether a clean segment holds tombstones whose delete horizon passed."""
    return any(0 <= t <= now_ms - retention_ms for seg in segments[:clean] for _o, t in seg.cleaned)


def is_due(
    state: DirtyState, segments: Sequence[SegmentMeta], now_ms: int, cfg: CompactionConfig
) -> bool:
    """A pass is due when the dirty ratio reaches the threshold, when a cleanable record
    waited ``max.compaction.lag.ms``, or when tombstones are past their horizon."""
    if state.end > state.clean:
        if state.ratio >= cfg.dirty_ratio:
            return True
        if 0 <= state.oldest_dirty_ms <= now_ms - cfg.max_lag_ms:
            return True
    return expired_tombstones(segments, state.clean, now_ms, cfg.delete_retention_ms)


# ---------------------------------------------------------------- the key map


def key_digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


@dataclass(slots=True)
class KeyMap:
    """key digest -> latest offset, bounded to ``capacity_bytes`` (Kafka's dedupe buffer)."""

    capacity_bytes: int
    offsets: dict[bytes, int] = field(default_factory=dict)

    @property
    def full(self) -> bool:
        return len(self.offsets) * KEY_ENTRY_BYTES >= self.capacity_bytes

    def room_for(self, keys: int) -> bool:
        return (len(self.offsets) + keys) * KEY_ENTRY_BYTES <= self.capacity_bytes

    def add(self, records: Sequence[RawRecord]) -> None:
        offsets = self.offsets
        for rec in records:
            if rec.key is not None:
                offsets[key_digest(rec.key)] = rec.offset

    def latest(self, key: bytes) -> int | None:
        return self.offsets.get(key_digest(key))


# ---------------------------------------------------------------- tombstone horizons


def horizon_at(cleaned: Sequence[tuple[int, int]], offset: int) -> int | None:
    """The time compaction first reached ``offset`` (None: not yet, or unknown)."""
    i = bisect_right([o for o, _ in cleaned], offset)
    if i == 0:
        return None
    t = cleaned[i - 1][1]
    return None if t < 0 else t


# ---------------------------------------------------------------- the record filter

BatchRule = Callable[[BatchHeader], bool | None]  # True keep whole, False drop, None: records
RecordRule = Callable[[RawRecord], bool | None]  # True keep, False drop, None: next rule


def keep_control_batches(hdr: BatchHeader) -> bool | None:
    return True if hdr.is_control else None


def keep_log_end(log_end: int) -> BatchRule:
    """The batch holding the log's last offset stays whole: a consumer always finds a
    batch that takes it to the high watermark."""
    return lambda hdr: True if hdr.last_offset >= log_end - 1 else None


@dataclass(slots=True)
class RecordFilter:
    """Decides, for one pass, which records survive. Rules are asked in order; the first
    one with an answer decides; a record no rule decides is kept."""

    keys: KeyMap
    now_ms: int
    delete_retention_ms: int
    cleaned: Sequence[tuple[int, int]] = ()  # horizons of the source segment at hand
    log_end: int = -1  # the high watermark when the pass started (-1: unknown)
    batch_rules: list[BatchRule] = field(default_factory=lambda: [keep_control_batches])
    record_rules: list[RecordRule] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.log_end >= 0:
            self.batch_rules = [keep_log_end(self.log_end), *self.batch_rules]
        self.record_rules = [self.superseded, self.expired_tombstone, *self.record_rules]

    def keep_batch(self, hdr: BatchHeader) -> bool | None:
        for rule in self.batch_rules:
            verdict = rule(hdr)
            if verdict is not None:
                return verdict
        return None

    def keep(self, rec: RawRecord) -> bool:
        for rule in self.record_rules:
            verdict = rule(rec)
            if verdict is not None:
                return verdict
        return True

    def superseded(self, rec: RawRecord) -> bool | None:
        if rec.key is None:
            return None  # produced before the topic was compacted: kept
        latest = self.keys.latest(rec.key)
        return False if latest is not None and latest > rec.offset else None

    def expired_tombstone(self, rec: RawRecord) -> bool | None:
        if not rec.tombstone:
            return None
        t = horizon_at(self.cleaned, rec.offset)
        return False if t is not None and t <= self.now_ms - self.delete_retention_ms else None

    def tombstone_time(self, rec: RawRecord) -> int:
        """The horizon a kept tombstone carries into the rewritten segment."""
        t = horizon_at(self.cleaned, rec.offset)
        return self.now_ms if t is None else t


def collapse(pairs: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Drop pairs that repeat the time of the one before (lookups stay the same)."""
    out: list[tuple[int, int]] = []
    for o, t in pairs:
        if not out or out[-1][1] != t:
            out.append((o, t))
    return tuple(out)


# ---------------------------------------------------------------- rewriting one segment


@dataclass(slots=True)
class Rewritten:
    batches: list[bytes | memoryview] = field(default_factory=list)
    tombstones: list[tuple[int, int]] = field(default_factory=list)  # (offset, horizon)
    records_in: int = 0
    records_out: int = 0
    max_ts: int = -1

    @property
    def size(self) -> int:
        return sum(len(b) for b in self.batches)


def rewrite_batches(
    batches: Iterable[tuple[BatchHeader, memoryview]],
    filt: RecordFilter,
    codec: int | None,
    producer_last: Mapping[int, int],
) -> Rewritten:
    """The batches of one source segment as a rewrite keeps them: untouched when every
    record stays (and the codec is kept), rebuilt with the survivors otherwise (offsets,
    timestamps, headers, producer fields and ``lastOffsetDelta`` preserved), an empty
    header when none survives but it is its producer's last batch (idempotent producers'
    sequence state survives rewriting), else dropped."""
    out = Rewritten()
    for hdr, view in batches:
        pid = hdr.producer_id
        last_of_producer = pid >= 0 and producer_last.get(pid) == hdr.base_offset
        if hdr.record_count == 0:  # an empty header kept by an earlier pass
            if last_of_producer:
                out.batches.append(view)
            continue
        verdict = filt.keep_batch(hdr)
        out.records_in += hdr.record_count
        if verdict is not None:
            if verdict:
                out.batches.append(view)
                out.records_out += hdr.record_count
                out.max_ts = max(out.max_ts, hdr.max_timestamp)
            continue
        records = record_columns(view)
        verdicts = [filt.keep(r) for r in records]
        for r, keep in zip(records, verdicts, strict=True):
            if keep and r.tombstone:
                out.tombstones.append((r.offset, filt.tombstone_time(r)))
        n_kept = sum(verdicts)
        out.records_out += n_kept
        if n_kept == len(records) and (codec is None or codec == hdr.compression):
            out.batches.append(view)
            out.max_ts = max(out.max_ts, hdr.max_timestamp)
        elif n_kept or last_of_producer:
            raws = split_records(view)[1] if n_kept else []
            kept = [r for r, keep in zip(raws, verdicts, strict=False) if keep]
            batch = rebuild_batch(hdr, kept, hdr.compression if codec is None else codec)
            out.batches.append(batch)
            if kept:
                out.max_ts = max(out.max_ts, read_header(batch).max_timestamp)
    return out
