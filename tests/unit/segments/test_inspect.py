from __future__ import annotations

from pathlib import Path

import pytest

from segments.format import FOOTER_SIZE
from segments.inspect import main
from tests.unit.segments.conftest import make_segment


def write_segment(tmp_path: Path, sizes: list[int], **kw: int) -> tuple[Path, bytes, bytes]:
    built, data = make_segment(500, sizes, **kw)
    path = tmp_path / "segment-00000000000000000500.kfs"
    path.write_bytes(data)
    path.with_suffix(".index").write_bytes(built.index)
    return path, data, built.index


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
