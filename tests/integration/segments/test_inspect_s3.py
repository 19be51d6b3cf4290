"""``kafscale segments inspect`` on an s3:// URL (moto's S3 server)."""

from __future__ import annotations

import asyncio

import pytest

from segments.format import segment_key
from segments.inspect import main
from segments.s3_store import S3Store
from segments.shared import SharedRange, directory, entry_name_of
from tests.fixtures.s3 import S3Endpoint, create_bucket
from tests.unit.segments.conftest import make_segment

pytestmark = pytest.mark.integration


async def test_s3_url(moto_s3: S3Endpoint, capsys: pytest.CaptureFixture[str]) -> None:
    bucket = await asyncio.to_thread(create_bucket, moto_s3)
    built, _ = make_segment(0, [4, 4], version=1)  # legacy: its index an object beside it
    key = segment_key("default", "t", 0, 0)
    inside, _ = make_segment(8, [3])  # version 2: its index inside
    key2 = segment_key("default", "t", 0, 8)
    store = S3Store.from_url(moto_s3.store_url(bucket))
    await store.put_if_absent(key, built.buffers)
    await store.put_if_absent(key.replace(".kfs", ".index"), [built.index])
    await store.put_if_absent(key2, inside.buffers)
    await store.close()
    url = moto_s3.store_url(bucket).replace(f"s3://{bucket}/", f"s3://{bucket}/{key}")
    rc = await asyncio.to_thread(main, [url])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "index:   1 entries" in out and "batches: 2" in out
    url2 = url.replace(key, key2)
    rc = await asyncio.to_thread(main, [url2])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "index:   1 entries, interval 100 records (inside the segment)" in out
    # a segment inside a shared object: its range key, "#" as "%23" in the URL
    head = directory([SharedRange("t", "00" * 16, 0, 1, 8, 0, inside.size)])
    store = S3Store.from_url(moto_s3.store_url(bucket))
    await store.put_if_absent("default/@shared/0-ab-000000000001.kfm", [head, *inside.buffers])
    await store.close()
    ranged = "default/t/0/" + entry_name_of("0-ab-000000000001.kfm", len(head), inside.size)
    rc = await asyncio.to_thread(main, [url.replace(key, ranged.replace("#", "%23"))])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "base_offset=8" in out and "(inside the segment)" in out
    missing = url.replace("segment-0000", "segment-9999")
    assert await asyncio.to_thread(main, [missing]) == 2
