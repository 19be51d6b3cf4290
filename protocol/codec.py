"""Server-side codec for every API body, on kafka-python 3.x's ``kafka.protocol`` classes.

Requests are decoded from the body (the bytes after the request header, see
:mod:`protocol.frame`); responses are encoded into a full frame as a list of buffers
(size prefix + response header, then the body), never joined.

Response headers: v0 (correlation id only) for non-flexible versions and always for
ApiVersions; v1 (correlation id + an empty tagged-field section) for every other flexible
version.
"""

from __future__ import annotations

import importlib
import struct
import warnings
from collections.abc import Iterator, Sequence
from functools import cache
from typing import Any

from protocol.apis import ApiKey
from protocol.apis import is_flexible as _flexible
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.frame import Buffer

_MODULES = (
    "kafka.protocol.admin",
    "kafka.protocol.consumer",
    "kafka.protocol.metadata",
    "kafka.protocol.producer",
    "kafka.protocol.sasl",
    "protocol.consumer_groups",
)


def _import_kafka_protocol() -> Any:
    """Import kafka-python's protocol modules once, quietly.

    Its schema loader calls ``importlib.resources.read_text``, deprecated in 3.11; with
    warnings as errors (the test configuration) a plain import would fail.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in _MODULES:
            importlib.import_module(name)
        return importlib.import_module("kafka.protocol.api_message").ApiMessage


ApiMessage = _import_kafka_protocol()

_PREFIX_HDR0 = struct.Struct(">ii")  # frame size, correlation id
_PREFIX_HDR1 = struct.Struct(">iiB")  # frame size, correlation id, empty tagged fields
_API_VERSION_ENTRY = struct.Struct(">hhh")
_FALLBACK_HEAD = struct.Struct(">iihi")  # size, correlation id, error code, array length


def _subclasses(cls: Any) -> Iterator[Any]:
    sub: Any
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@cache
def _classes() -> tuple[dict[int, Any], dict[int, Any]]:
    requests: dict[int, Any] = {}
    responses: dict[int, Any] = {}
    for cls in _subclasses(ApiMessage):
        if getattr(cls, "_class_version", None) is not None or getattr(cls, "_json", None) is None:
            continue
        table = requests if cls.is_request() else responses
        table.setdefault(int(cls.API_KEY), cls)
    return requests, responses


def known_request_classes() -> dict[int, Any]:
    """API key -> kafka-python request class, for every API kafka-python models."""
    return _classes()[0]


def known_response_classes() -> dict[int, Any]:
    """API key -> kafka-python response class, for every API kafka-python models."""
    return _classes()[1]


def _unknown(api_key: int) -> KafkaProtocolError:
    return KafkaProtocolError(ErrorCode.INVALID_REQUEST, f"unknown API key {api_key}")


def request_class(api_key: int) -> Any:
    """The kafka-python request class (e.g. ``MetadataRequest``); raises
    ``KafkaProtocolError(INVALID_REQUEST)`` for a key kafka-python does not model."""
    cls = known_request_classes().get(api_key)
    if cls is None:
        raise _unknown(api_key)
    return cls


def response_class(api_key: int) -> Any:
    """The kafka-python response class (e.g. ``MetadataResponse``); raises
    ``KafkaProtocolError(INVALID_REQUEST)`` for a key kafka-python does not model."""
    cls = known_response_classes().get(api_key)
    if cls is None:
        raise _unknown(api_key)
    return cls


def max_known_version(api_key: int) -> int:
    """Highest version kafka-python can decode/encode for ``api_key``; -1 if unknown."""
    cls = known_request_classes().get(api_key)
    return -1 if cls is None else int(cls.max_version)


def is_flexible(api_key: int, version: int, request: bool = True) -> bool:
    """Whether ``version`` of ``api_key`` uses the flexible encoding (``protocol.apis``
    decides; Kafka's request and response schemas of one API share their flexible
    versions)."""
    return _flexible(api_key, version)


def decode_request(api_key: int, version: int, body: memoryview) -> Any:
    """Decode a request body (the bytes after the request header) into a kafka-python
    ``ApiMessage`` of ``version``.

    Raises ``KafkaProtocolError``: ``INVALID_REQUEST`` for an unknown key,
    ``UNSUPPORTED_VERSION`` for a version kafka-python does not know, ``CORRUPT_MESSAGE``
    for a malformed or truncated body (whatever kafka-python raised is chained). Trailing
    bytes after the body are ignored, as Kafka does.

    Nullable arrays decode to ``None``: e.g. a Metadata v1+ request with a null topic list
    decodes to ``topics=None`` ("all topics"), an empty one to ``[]`` ("none"); Metadata
    v0's empty list meaning "all topics" is the handler's business. A null sent for an
    array the schema does not let be null decodes to ``[]``.
    """
    cls = request_class(api_key)
    if not 0 <= version <= cls.max_version:
        raise KafkaProtocolError(
            ErrorCode.UNSUPPORTED_VERSION, f"API {api_key} v{version} (max {cls.max_version})"
        )
    flexible = _flexible(api_key, version)
    decode = cls._struct.compiled_decode_from(
        version, compact=flexible, tagged=flexible, data_class=cls
    )
    try:
        message, pos = decode(body, 0)
    except Exception as exc:  # kafka-python raises struct.error, IndexError, ValueError...
        raise KafkaProtocolError(
            ErrorCode.CORRUPT_MESSAGE, f"API {api_key} v{version}: {type(exc).__name__}"
        ) from exc
    if pos > len(body):
        raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, f"API {api_key} v{version} truncated")
    _empty_null_arrays(message, cls._struct._fields, version)
    return message


def _empty_null_arrays(obj: Any, fields: Sequence[Any], version: int) -> None:
    """Replace null arrays the schema does not allow to be null (at ``version``) with
    empty ones, recursively: the wire can carry a null for any array, and a handler must
    see what the schema promises. Arrays that may be null (Metadata's ``topics``: all
    topics) stay ``None``."""
    for f in fields:
        if not f.is_array() or not f.for_version_q(version):
            continue
        value = getattr(obj, f.name, None)
        if value is None:
            if not f.nullable_for_version_q(version):
                setattr(obj, f.name, [])
        elif f.is_struct_array():
            for item in value:
                _empty_null_arrays(item, f._fields, version)


def buffer_size(buf: Buffer) -> int:
    """Byte length of a buffer (``nbytes`` for memoryviews of any format)."""
    return buf.nbytes if isinstance(buf, memoryview) else len(buf)


def response_header_flexible(api_key: int, version: int) -> bool:
    """True when the response uses header v1 (flexible, and not ApiVersions)."""
    return api_key != ApiKey.API_VERSIONS and is_flexible(api_key, version, request=False)


def encode_response(
    api_key: int, version: int, correlation_id: int, body: Any | Sequence[Buffer]
) -> list[Buffer]:
    """Encode a full response frame: ``[size prefix + response header, *body buffers]``.

    ``body`` is a kafka-python response ``ApiMessage`` (encoded at ``version``) or a
    sequence of pre-encoded buffers (from a fast path), which are passed through as the
    same objects, never joined or copied.
    """
    if isinstance(body, ApiMessage):
        parts: list[Buffer] = [body.encode(version=version)]
    else:
        parts = list(body)
    size = sum(buffer_size(b) for b in parts)
    if response_header_flexible(api_key, version):
        prefix = _PREFIX_HDR1.pack(size + 5, correlation_id, 0)
    else:
        prefix = _PREFIX_HDR0.pack(size + 4, correlation_id)
    return [prefix, *parts]


def api_versions_fallback(
    correlation_id: int, api_keys: list[tuple[int, int, int]]
) -> list[Buffer]:
    """The ApiVersions response for a request version above the supported range.

    v0 body layout with ``error_code = UNSUPPORTED_VERSION`` and every (key, min, max) in
    ``api_keys``, response header v0: what Java and kafka-python clients expect before
    retrying with a version both sides know.
    """
    entries = b"".join(_API_VERSION_ENTRY.pack(k, lo, hi) for k, lo, hi in api_keys)
    size = _FALLBACK_HEAD.size - 4 + len(entries)
    head = _FALLBACK_HEAD.pack(
        size, correlation_id, int(ErrorCode.UNSUPPORTED_VERSION), len(api_keys)
    )
    return [head + entries]


def error_response(api_key: int, code: ErrorCode) -> Any:
    """A response of ``api_key`` for a request the broker failed to handle: every field
    at its default (arrays empty) and, where the response has a top-level ``error_code``,
    that set to ``code``. Clients see an answer (the connection stays usable) with no
    result for the parts they asked about, and retry them."""
    cls = response_class(api_key)
    names = {f.name for f in cls._struct._fields}
    return cls(error_code=int(code)) if "error_code" in names else cls()
