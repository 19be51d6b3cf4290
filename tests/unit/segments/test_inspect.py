from __future__ import annotations

from pathlib import Path

import pytest

from segments.format import FOOTER_SIZE
from segments.inspect import main
from segments.shared import SharedRange, directory, entry_name_of
from tests.unit.segments.conftest import make_segment


def write_segment(tmp_path: Path, sizes: list[int], **kw: int) -> tuple[Path, bytes, bytes]:
    """A legacy (version 1) segment with its index object beside it."""
    built, data = make_segment(500, sizes, version=1, **kw)
    path = tmp_path / "segment-00000000000000000500.kfs"
    path.write_bytes(data)
    path.with_suffix(".index").write_bytes(built.index)
    return path, data, built.index


def test_valid_segment_with_its_index_inside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    built, data = make_segment(500, [60, 60, 5], index_interval=50)
    path = tmp_path / "segment-00000000000000000500.kfs"
    path.write_bytes(data)
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "magic=KAFS version=2" in out and "records=125" in out
    assert "index:   3 entries, interval 50 records (inside the segment)" in out
    assert out.rstrip().endswith("OK: segment is valid")
    bad = bytearray(data)
    bad[len(data) - FOOTER_SIZE - len(built.index) + 1] ^= 0xFF  # the trailer's magic
    path.write_bytes(bytes(bad))
    assert main([str(path)]) == 1
    assert "CORRUPT: bad index magic" in capsys.readouterr().out


def test_valid_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _, _ = write_segment(tmp_path, [60, 60, 5], index_interval=50, compression=1)
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "magic=KAFS version=1" in out and "base_offset=500" in out and "records=125" in out
    assert "compression=gzip" in out and "last_offset=624" in out and "(ok)" in out
    assert "index:   3 entries, interval 50 records" in out
    assert "batches: 3" in out and out.count(" gzip    ok") == 3
    assert out.rstrip().endswith("OK: segment is valid")
    assert main([f"file://{path}"]) == 0


def test_corrupt_body(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, data, _ = write_segment(tmp_path, [3, 3])
    buf = bytearray(data)
    buf[len(buf) - FOOTER_SIZE - 3] ^= 0x01
    path.write_bytes(bytes(buf))
    assert main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "CORRUPT: body CRC-32C mismatch" in out
    assert "CORRUPT: batch at byte" in out and "fails its CRC-32C" in out
    assert out.count(" BAD") == 1


def test_corrupt_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _, index = write_segment(tmp_path, [3, 3])
    path.with_suffix(".index").write_bytes(index[:-4])
    assert main([str(path)]) == 1
    assert "CORRUPT: index length" in capsys.readouterr().out


def test_truncated_and_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, data, _ = write_segment(tmp_path, [3])
    path.write_bytes(data[:20])
    assert main([str(path)]) == 1
    assert "CORRUPT: segment truncated" in capsys.readouterr().out
    assert main([str(tmp_path / "absent.kfs")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_verify_finds_batches_that_do_not_decode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A batch with a valid CRC whose header claims more records than it holds (what a
    broker without produce validation stored, issue 16): plain inspect calls the segment
    valid; --verify names the batch and the offset to truncate to."""
    import struct

    from protocol.batch import crc32c
    from segments.writer import build_segment
    from tests.unit.segments.conftest import make_batch

    good = make_batch(500, 3)
    bad = make_batch(503, 2)
    struct.pack_into(">i", bad, 23, 9)  # lastOffsetDelta: 10 records claimed, 2 present
    struct.pack_into(">i", bad, 57, 10)
    struct.pack_into(">I", bad, 17, crc32c(memoryview(bad)[21:]))
    built = build_segment(500, [memoryview(good), memoryview(bad)])
    path = tmp_path / "segment-00000000000000000500.kfs"
    path.write_bytes(b"".join(bytes(p) for p in built.buffers))
    assert main([str(path)]) == 0
    capsys.readouterr()
    assert main([str(path), "--verify"]) == 1
    out = capsys.readouterr().out
    assert out.count("UNDECODABLE") == 1 and "base offset 503" in out
    assert "last good offset: 502 (truncate the partition to 503)" in out
    good_path = tmp_path / "good.kfs"
    built = build_segment(500, [memoryview(make_batch(500, 3))])
    good_path.write_bytes(b"".join(bytes(p) for p in built.buffers))
    assert main([str(good_path), "--verify"]) == 0
    assert "verify: all 1 batches decode" in capsys.readouterr().out


def test_control_batches_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from broker.meta.schema import MarkerRequest
    from broker.txn_markers import control_batch
    from protocol.batch import set_base_offset
    from protocol.records import build_batch
    from segments.writer import build_segment

    data = bytearray(build_batch([(b"k", b"v", None)] * 2, producer_id=5, producer_epoch=1,
                                 base_sequence=0, transactional=True))  # fmt: skip
    marker = bytearray(control_batch(MarkerRequest(5, 1, commit=False)))
    set_base_offset(data, 10)
    set_base_offset(marker, 12)
    built = build_segment(10, [memoryview(data), memoryview(marker)], created_ms=1)
    path = tmp_path / "segment-00000000000000000010.kfs"
    path.write_bytes(b"".join(built.buffers))
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert " txn      5/1" in out and " ABORT    5/1" in out


def test_a_segment_inside_a_shared_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A range key (docs/format.md, "Shared objects") names a segment inside a shared
    object: inspect reads that range, as a path and as a file:// URL."""
    _built, data = make_segment(500, [60, 5], index_interval=50)
    shared = tmp_path / "ns" / "@shared"
    shared.mkdir(parents=True)
    head = directory([SharedRange("t", "00" * 16, 0, 1, 500, 0, len(data))])
    (shared / "0-ab-000000000001.kfm").write_bytes(head + data + b"next segment")
    key = tmp_path / "ns" / "t" / "0" / entry_name_of("0-ab-000000000001.kfm", len(head), len(data))
    assert main([str(key)]) == 0
    out = capsys.readouterr().out
    assert "base_offset=500" in out and out.rstrip().endswith("OK: segment is valid")
    assert main([f"file://{key}"]) == 0
    short = str(key).replace(f"+{len(data)}", f"+{len(data) - 1}")
    assert main([short]) == 1  # the range cut short: its footer is not where it should be
