"""The embedded metadata store's snapshot encoding (``broker/meta/wal.py``): one pass
over the keyspace, byte for byte the layout the decoder reads (and older snapshots
have), every field kept."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from crc32c import crc32c

from broker.meta import wal
from broker.meta.embedded import EmbeddedStore
from broker.meta.keyspace import Entry


def _entries() -> dict[str, Entry]:
    return {
        "/a": Entry(b"", 1, 1, 1, 0),  # an empty value
        "/b/ünï": Entry("värde".encode(), 2, 9, 4, 0),  # a key beyond ASCII
        "/c/leased": Entry(b"x" * 70_000, 3, 3, 1, 7),  # a lease, a value past 64 KiB
        "/d": Entry(bytes(range(256)), 2**40, 2**40 + 5, 3, 2**33),  # large revisions
    }


def _reference(revision: int, keys: list[str], entries: dict[str, Entry]) -> bytes:
    """The layout spelled out: header, then per key its length, bytes, the value's
    length and bytes, four counters; the body's CRC-32C last (all big-endian)."""
    body = struct.pack(">4sHQI", b"KMSS", 1, revision, len(keys))
    for k in keys:
        e, raw = entries[k], k.encode()
        body += struct.pack(">H", len(raw)) + raw + struct.pack(">I", len(e.value)) + e.value
        body += struct.pack(">QQQQ", e.create_revision, e.mod_revision, e.version, e.lease)
    return body + struct.pack(">I", crc32c(body))


@pytest.mark.parametrize("count", [0, 1, 4])
def test_the_encoding_is_the_layout_byte_for_byte(count: int) -> None:
    entries = dict(list(_entries().items())[:count])
    keys = sorted(entries)
    assert wal.encode_snapshot(42, keys, entries) == _reference(42, keys, entries)


@pytest.mark.parametrize("count", [0, 1, wal.SNAP_STEP, wal.SNAP_STEP + 1, 3 * wal.SNAP_STEP])
def test_between_is_called_between_steps_and_changes_no_byte(count: int) -> None:
    """The encoding stops every ``SNAP_STEP`` entries to call ``between`` (off the loop,
    a hand-over of the GIL), never before the first or after the last."""
    entries = {f"/k/{i:05d}": Entry(b"v%d" % i, i + 1, i + 1, 1, 0) for i in range(count)}
    keys = sorted(entries)
    done: list[int] = []
    data = wal.encode_snapshot(7, keys, entries, lambda: done.append(1))
    assert data == _reference(7, keys, entries)
    assert len(done) == max(0, -(-count // wal.SNAP_STEP) - 1)


def test_every_field_comes_back_in_the_keys_order() -> None:
    entries = _entries()
    keys = sorted(entries, reverse=True)  # the order given, not the mapping's
    revision, decoded = wal.decode_snapshot(wal.encode_snapshot(2**41, keys, entries))
    assert revision == 2**41
    assert [d.key for d in decoded] == keys
    for d in decoded:
        e = entries[d.key]
        assert (d.value, d.create_revision, d.mod_revision, d.version, d.lease) == (
            e.value,
            e.create_revision,
            e.mod_revision,
            e.version,
            e.lease,
        )


async def test_a_store_reopened_from_its_snapshot_has_every_key(tmp_path: Path) -> None:
    store = EmbeddedStore(str(tmp_path), compact_bytes=1 << 30)
    for i in range(300):
        await store.put(f"k/{i:03d}", b"v%d" % i)
    await store.delete("k/007")
    await store.put("k/001", b"again")
    before = [(kv.key, kv.value, kv.mod_revision, kv.version) for kv in await store.range("k/")]
    await store.compact()
    await store.close()
    reopened = EmbeddedStore(str(tmp_path))
    after = [(kv.key, kv.value, kv.mod_revision, kv.version) for kv in await reopened.range("k/")]
    assert after == before and len(after) == 299
    assert reopened.revision == 302
    await reopened.close()
