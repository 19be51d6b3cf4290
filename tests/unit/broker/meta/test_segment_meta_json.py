"""``SegmentMeta.to_json`` formats the entry directly: the very bytes the dict-based
encoding gave (probes compare stored values byte for byte, and entries written before
must read back the same)."""

from __future__ import annotations

import itertools
import json

from broker.meta.schema import SegmentMeta


def _by_dict(m: SegmentMeta) -> bytes:
    """The encoding ``to_json`` replaced."""
    d: dict[str, object] = {"base": m.base, "last": m.last, "bytes": m.size,
                            "records": m.records, "max_ts": m.max_ts, "etag": m.etag}  # fmt: skip
    if m.key:
        d["key"] = m.key
    if m.created_ms >= 0:
        d["created"] = m.created_ms
    if m.cleaned:
        d["cleaned"] = [[o, t] for o, t in m.cleaned]
    if m.version > 0:
        d["version"] = m.version
    return json.dumps(d, separators=(",", ":")).encode()


def test_to_json_is_byte_for_byte_the_dict_encoding() -> None:
    etags = ["crc32c-0a1b2c3d-1024", "9e107d9d372bb6826bd81d3542a419d6", 'odd"\\é\x01\u2028']
    keys = ["", "segment-00000000000000000000-00000000000000000099.kfs", "shared/x#0-10", "ü"]
    created = [-1, 0, 1_700_000_000_000]
    cleaned: list[tuple[tuple[int, int], ...]] = [(), ((5, 1_700_000_000_000), (9, 7))]
    seen = 0
    for etag, key, c, cl, version in itertools.product(etags, keys, created, cleaned, [0, 2]):
        m = SegmentMeta(100, 199, 4096, 100, -1 if c == 0 else c, etag, key, c, cl, version)
        assert m.to_json() == _by_dict(m)
        assert SegmentMeta.from_json(100, m.to_json()) == m
        seen += 1
    assert seen == 3 * 4 * 3 * 2 * 2
