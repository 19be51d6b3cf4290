"""Drive the admin handlers the way the connection does: kafka-python encodes the request,
``protocol.codec`` decodes it, the handler answers, and the response is encoded and decoded
again at the request's version, against a real TopicManager on an EmbeddedStore."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from broker.config import BrokerConfig
from broker.handlers.registry import RequestContext
from broker.meta.base import open_meta
from broker.topics import TopicManager
from protocol.codec import decode_request, response_class
from protocol.frame import RequestHeader


class AdminCaller:
    def __init__(self, topics: TopicManager, config: BrokerConfig) -> None:
        self.topics = topics
        self.config = config
        self._broker = SimpleNamespace(topics=topics, config=config)

    async def __call__(self, handler: Any, request: Any, version: int) -> Any:
        key = request.API_KEY
        body = memoryview(bytes(request.encode(version=version)))
        decoded = decode_request(key, version, body)
        header = RequestHeader(key, version, 1, "test", 0)
        ctx = RequestContext(broker=self._broker, header=header)
        response = await handler(ctx, decoded)
        raw = bytes(response.encode(version=version))
        return response_class(key).decode(raw, version=version)


@asynccontextmanager
async def admin_caller(
    tmp_path: Path, config: BrokerConfig | None = None
) -> AsyncIterator[AdminCaller]:
    config = config or BrokerConfig(default_partitions=2, node_id=1)
    meta = open_meta("embedded", data_dir=str(tmp_path))
    topics = TopicManager(meta, config)
    await topics.start()
    try:
        yield AdminCaller(topics, config)
    finally:
        await topics.stop()
        await meta.close()
