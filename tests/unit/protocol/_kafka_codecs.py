"""Give kafka-python's record code snappy and LZ4 backends for cross-checks.

kafka-python 3.0.12 needs python-snappy / lz4 for those codecs, and neither is installed.
This plugs real codec implementations (cramjam's raw snappy and LZ4 frame with independent
blocks) into ``kafka.codec`` so kafka-python's *own* framing code (xerial blocks for snappy,
batch/message layout) runs against ours. Nothing is faked: the bytes are real compressed
data; only the library kafka-python would otherwise import is swapped.
"""

from __future__ import annotations

from types import SimpleNamespace

import cramjam
import kafka.codec as kafka_codec
import kafka.record.default_records as default_records
import kafka.record.legacy_records as legacy_records
import pytest


def _snappy_compress(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))


def _snappy_decompress(data: bytes) -> bytes:
    return bytes(cramjam.snappy.decompress_raw(data))


def lz4_frame_independent(data: bytes) -> bytes:
    c = cramjam.lz4.Compressor(block_linked=False)
    c.compress(bytes(data))
    return bytes(c.finish())


def _lz4_decompress(data: bytes) -> bytes:
    return bytes(cramjam.lz4.decompress(bytes(data)))


def install(monkeypatch: pytest.MonkeyPatch) -> None:
    snappy = SimpleNamespace(compress=_snappy_compress, decompress=_snappy_decompress)
    monkeypatch.setattr(kafka_codec, "snappy", snappy)
    monkeypatch.setattr(kafka_codec, "lz4", SimpleNamespace())
    for mod in (default_records, legacy_records):
        monkeypatch.setattr(mod, "lz4_encode", lz4_frame_independent)
        monkeypatch.setattr(mod, "lz4_decode", _lz4_decompress)
