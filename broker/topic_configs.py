"""Topic configs: the whitelist with validation and defaults, and the describe data.

Topic configs are a whitelist (``TOPIC_CONFIGS``); an unknown key is INVALID_CONFIG naming
it. ``cleanup.policy`` is ``delete``, ``compact`` or ``compact,delete`` (log compaction:
``broker.compaction``, docs/format.md "Compacted segments"); ``compression.type`` is the
codec compaction re-encodes with (produced batches are kept as the producer compressed
them); most ``segment.*``,
``flush.*`` and replica settings are accepted for client compatibility only. Broker configs
(resource type 4) come from ``BrokerConfig`` and are read-only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from broker.config import BrokerConfig
from protocol.errors import ErrorCode, KafkaProtocolError

_LONG_MAX = 2**63 - 1
_INT_MAX = 2**31 - 1


class ResourceType(IntEnum):
    UNKNOWN = 0
    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8


class ConfigSource(IntEnum):
    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class ConfigType(IntEnum):
    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7


class AlterOp(IntEnum):
    """IncrementalAlterConfigs operations."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One described config (the data behind DescribeConfigs / CreateTopics v5+)."""

    name: str
    value: str | None
    read_only: bool
    source: ConfigSource
    is_default: bool
    config_type: ConfigType
    documentation: str | None = None
    is_sensitive: bool = False
    synonyms: tuple[ConfigSynonym, ...] = ()


# ---------------------------------------------------------------- config whitelist


def _number(lo: int, hi: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        n = int(value.strip())
        if not lo <= n <= hi:
            raise ValueError(f"must be in [{lo}, {hi}]")
        return str(n)

    return check


def _choice(*allowed: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value.strip() not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return value.strip()

    return check


def _boolean(value: str) -> str:
    v = value.strip().lower()
    if v not in ("true", "false"):
        raise ValueError("must be true or false")
    return v


def _cleanup_policy(value: str) -> str:
    items = split_list(value)
    if not items or any(i not in ("delete", "compact") for i in items):
        raise ValueError("must be 'delete', 'compact' or 'compact,delete'")
    return ",".join(p for p in ("compact", "delete") if p in items)


def _ratio(value: str) -> str:
    r = float(value.strip())
    if not 0.0 <= r <= 1.0:
        raise ValueError("must be in [0, 1]")
    return value.strip()


_THROTTLED_ITEM = re.compile(r"^(\*|\d+:\d+)$")


def _throttled(value: str) -> str:
    items = split_list(value)
    if any(not _THROTTLED_ITEM.match(i) for i in items) or ("*" in items and len(items) > 1):
        raise ValueError("must be '*' or a list of partition:broker")
    return ",".join(items)


_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?(-IV\d+)?$")
_NO_TIERING = "Informational (no tiered storage)."


def _message_format_version(value: str) -> str:
    v = value.strip()
    if not _VERSION.match(v):
        raise ValueError("must be a Kafka version such as 2.8 or 3.0-IV1")
    return v


def _remote_storage(value: str) -> str:
    if _boolean(value) != "false":
        raise ValueError(
            "tiered storage is not implemented: every segment already lives in the object store"
        )
    return "false"


def split_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


@dataclass(frozen=True, slots=True)
class ConfigSpec:
    name: str
    type: ConfigType
    default: str | Callable[[BrokerConfig], str]
    check: Callable[[str], str]
    doc: str
    broker_synonym: str | None = None

    def default_value(self, config: BrokerConfig) -> str:
        return self.default if isinstance(self.default, str) else self.default(config)


_WEEK_MS = str(7 * 24 * 3600 * 1000)
_LONG_MAX_S = str(_LONG_MAX)
_COMPRESSIONS = ("producer", "uncompressed", "none", "gzip", "snappy", "lz4", "zstd")
_INFO = "Informational."
_NO_REPLICAS = "Informational (no replicas: the object store is the durability)."


def _spec(
    name: str, ctype: ConfigType, default: str | Callable[[BrokerConfig], str],
    check: Callable[[str], str], doc: str, synonym: str | None = None,
) -> ConfigSpec:  # fmt: skip
    return ConfigSpec(name, ctype, default, check, doc, synonym)


_T = ConfigType
_SPECS = [
    _spec("retention.ms", _T.LONG, _WEEK_MS, _number(-1, _LONG_MAX),
          "How long records are kept (-1: forever).", "log.retention.ms"),
    _spec("retention.bytes", _T.LONG, "-1", _number(-1, _LONG_MAX),
          "Partition size kept before old segments go (-1: no limit).", "log.retention.bytes"),
    _spec("segment.bytes", _T.INT, "1073741824", _number(14, _INT_MAX),
          "Informational: segments are cut by the broker's flush cycle.", "log.segment.bytes"),
    _spec("segment.ms", _T.LONG, _WEEK_MS, _number(1, _LONG_MAX),
          "Informational: segments are cut by the broker's flush cycle.", "log.roll.ms"),
    _spec("segment.jitter.ms", _T.LONG, "0", _number(0, _LONG_MAX), _INFO, "log.roll.jitter.ms"),
    _spec("segment.index.bytes", _T.INT, "10485760", _number(4, _INT_MAX), _INFO,
          "log.index.size.max.bytes"),
    _spec("cleanup.policy", _T.LIST, "delete", _cleanup_policy,
          "delete, compact, or compact,delete (log compaction keeps the latest record per "
          "key).", "log.cleanup.policy"),
    _spec("min.cleanable.dirty.ratio", _T.DOUBLE, "0.5", _ratio,
          "Compact when the uncompacted share of the log passes this.",
          "log.cleaner.min.cleanable.ratio"),
    _spec("min.compaction.lag.ms", _T.LONG, "0", _number(0, _LONG_MAX),
          "Records younger than this are never compacted.", "log.cleaner.min.compaction.lag.ms"),
    _spec("max.compaction.lag.ms", _T.LONG, _LONG_MAX_S, _number(1, _LONG_MAX),
          "A record is compacted at the latest this long after it became cleanable.",
          "log.cleaner.max.compaction.lag.ms"),
    _spec("message.timestamp.type", _T.STRING, "CreateTime",
          _choice("CreateTime", "LogAppendTime"),
          "CreateTime keeps the producer's timestamps; LogAppendTime stamps them at commit.",
          "log.message.timestamp.type"),
    _spec("message.timestamp.difference.max.ms", _T.LONG, _LONG_MAX_S, _number(0, _LONG_MAX),
          "Largest allowed difference between record and broker time.",
          "log.message.timestamp.difference.max.ms"),
    _spec("message.timestamp.before.max.ms", _T.LONG, _LONG_MAX_S, _number(0, _LONG_MAX),
          "Largest allowed age of a record timestamp.", "log.message.timestamp.before.max.ms"),
    _spec("message.timestamp.after.max.ms", _T.LONG, _LONG_MAX_S, _number(0, _LONG_MAX),
          "Largest allowed future skew of a record timestamp.",
          "log.message.timestamp.after.max.ms"),
    _spec("max.message.bytes", _T.INT, lambda c: str(c.max_message_bytes),
          _number(0, _INT_MAX), "Largest record batch accepted.", "message.max.bytes"),
    _spec("compression.type", _T.STRING, "producer", _choice(*_COMPRESSIONS),
          "Codec of batches rewritten by compaction (producer: the original codec); "
          "produced batches are stored as the producer compressed them.",
          "compression.type"),
    _spec("min.insync.replicas", _T.INT, "1", _number(1, _INT_MAX), _NO_REPLICAS,
          "min.insync.replicas"),
    _spec("delete.retention.ms", _T.LONG, "86400000", _number(0, _LONG_MAX),
          "How long compacted tombstones stay readable.", "log.cleaner.delete.retention.ms"),
    _spec("file.delete.delay.ms", _T.LONG, "60000", _number(0, _LONG_MAX), _INFO,
          "log.segment.delete.delay.ms"),
    _spec("flush.messages", _T.LONG, _LONG_MAX_S, _number(1, _LONG_MAX),
          "Informational: the broker flushes on its own cycle.", "log.flush.interval.messages"),
    _spec("flush.ms", _T.LONG, _LONG_MAX_S, _number(0, _LONG_MAX),
          "Informational: the broker flushes on its own cycle.", "log.flush.interval.ms"),
    _spec("index.interval.bytes", _T.INT, "4096", _number(0, _INT_MAX),
          "Informational: the index is by record count.", "log.index.interval.bytes"),
    _spec("preallocate", _T.BOOLEAN, "false", _boolean, _INFO, "log.preallocate"),
    _spec("unclean.leader.election.enable", _T.BOOLEAN, "false", _boolean, _NO_REPLICAS,
          "unclean.leader.election.enable"),
    _spec("leader.replication.throttled.replicas", _T.LIST, "", _throttled, _NO_REPLICAS),
    _spec("follower.replication.throttled.replicas", _T.LIST, "", _throttled, _NO_REPLICAS),
    # Kafka 3.x/4.x configs that mean nothing here, accepted and reported (issue 12)
    _spec("message.format.version", _T.STRING, "3.0-IV1", _message_format_version,
          "Ignored, as Kafka 3.0+ ignores it: batches are always stored as v2.",
          "log.message.format.version"),
    _spec("message.downconversion.enable", _T.BOOLEAN, "true", _boolean,
          "Informational: Fetch v0-3 is not served, so nothing is ever down-converted.",
          "log.message.downconversion.enable"),
    _spec("local.retention.ms", _T.LONG, "-2", _number(-2, _LONG_MAX),
          "Informational (no tiered storage: every segment is in the object store).",
          "log.local.retention.ms"),
    _spec("local.retention.bytes", _T.LONG, "-2", _number(-2, _LONG_MAX),
          "Informational (no tiered storage: every segment is in the object store).",
          "log.local.retention.bytes"),
    _spec("remote.storage.enable", _T.BOOLEAN, "false", _remote_storage,
          "Only false: tiered storage is not implemented (segments are already in the "
          "object store)."),
    _spec("remote.log.copy.disable", _T.BOOLEAN, "false", _boolean, _NO_TIERING),
    _spec("remote.log.delete.on.disable", _T.BOOLEAN, "false", _boolean, _NO_TIERING),
]  # fmt: skip
TOPIC_CONFIGS: dict[str, ConfigSpec] = {s.name: s for s in _SPECS}


def validate_config(name: str, value: str | None) -> str:
    """The normalized value of one topic config, or INVALID_CONFIG naming what is wrong."""
    spec = TOPIC_CONFIGS.get(name)
    if spec is None:
        raise KafkaProtocolError(
            ErrorCode.INVALID_CONFIG, f"unknown or unsupported topic config {name!r}"
        )
    if value is None:
        raise KafkaProtocolError(ErrorCode.INVALID_CONFIG, f"null value for config {name!r}")
    try:
        return spec.check(value)
    except ValueError as exc:
        raise KafkaProtocolError(
            ErrorCode.INVALID_CONFIG, f"invalid value {value[:100]!r} for config {name!r}: {exc}"
        ) from None


def validate_configs(configs: Mapping[str, str | None] | None) -> dict[str, str]:
    """Validate and normalize a set of topic configs; ``None`` values are dropped."""
    out: dict[str, str] = {}
    for name, value in (configs or {}).items():
        if value is None and name in TOPIC_CONFIGS:
            continue  # null means "the default"
        out[name] = validate_config(name, value)
    return out


def check_combined(configs: Mapping[str, str]) -> None:
    """Rules across configs (Kafka's LogConfig.validate): ``min.compaction.lag.ms`` may
    not exceed ``max.compaction.lag.ms``."""
    lo = int(configs.get("min.compaction.lag.ms", "0"))
    hi = int(configs.get("max.compaction.lag.ms", str(_LONG_MAX)))
    if lo > hi:
        raise KafkaProtocolError(
            ErrorCode.INVALID_CONFIG,
            f"conflict topic config setting max.compaction.lag.ms ({hi}) < "
            f"min.compaction.lag.ms ({lo})",
        )


def apply_incremental(
    current: Mapping[str, str], ops: Iterable[tuple[str, int, str | None]], config: BrokerConfig
) -> dict[str, str]:
    """The explicitly set configs after IncrementalAlterConfigs ``ops`` (name, op, value)."""
    out = dict(current)
    for name, op, value in ops:
        spec = TOPIC_CONFIGS.get(name)
        if spec is None:
            raise KafkaProtocolError(
                ErrorCode.INVALID_CONFIG, f"unknown or unsupported topic config {name!r}"
            )
        if op == AlterOp.SET:
            out[name] = validate_config(name, value)
        elif op == AlterOp.DELETE:
            out.pop(name, None)
        elif op in (AlterOp.APPEND, AlterOp.SUBTRACT):
            if spec.type != ConfigType.LIST:
                raise KafkaProtocolError(
                    ErrorCode.INVALID_CONFIG,
                    f"APPEND/SUBTRACT need a list config; {name!r} is not one",
                )
            if value is None:
                raise KafkaProtocolError(
                    ErrorCode.INVALID_CONFIG, f"null value for config {name!r}"
                )
            items = split_list(out.get(name, spec.default_value(config)))
            given = split_list(value)
            if op == AlterOp.APPEND:
                items += [i for i in given if i not in items]
            else:
                items = [i for i in items if i not in given]
            out[name] = validate_config(name, ",".join(items))
        else:
            raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, f"unknown config operation {op}")
    return out


def broker_config_entries(
    config: BrokerConfig, include_synonyms: bool = False, include_documentation: bool = False
) -> list[ConfigEntry]:
    """This broker's configs as DescribeConfigs reports them: all read-only."""
    listener = f"PLAINTEXT://{config.listen_host}:{config.listen_port}"
    advertised = f"PLAINTEXT://{config.advertised_host}:{config.advertised_port}"
    c, t = config, ConfigType
    values: list[tuple[str, str | None, ConfigType, str]] = [
        ("broker.id", str(c.node_id), t.INT, "The broker id."),
        ("node.id", str(c.node_id), t.INT, "The node id."),
        ("broker.rack", c.rack, t.STRING, "The rack of the broker."),
        ("listeners", listener, t.LIST, "Where the broker listens."),
        ("advertised.listeners", advertised, t.LIST, "What clients are told."),
        ("auto.create.topics.enable", str(c.auto_create_topics).lower(), t.BOOLEAN,
         "Create unknown topics on Metadata/Produce."),
        ("num.partitions", str(c.default_partitions), t.INT, "Default partition count."),
        ("default.replication.factor", "1", t.SHORT, _NO_REPLICAS),
        ("message.max.bytes", str(c.max_message_bytes), t.INT, "Largest record batch accepted."),
        ("socket.request.max.bytes", str(c.max_request_bytes), t.INT, "Largest request accepted."),
        ("offsets.retention.minutes", str(c.offsets_retention_minutes), t.INT,
         "How long committed offsets of empty groups are kept."),
        ("group.min.session.timeout.ms", str(c.group_min_session_timeout_ms), t.INT,
         "Smallest session timeout accepted."),
        ("group.max.session.timeout.ms", str(c.group_max_session_timeout_ms), t.INT,
         "Largest session timeout accepted."),
        ("group.initial.rebalance.delay.ms", str(c.group_initial_rebalance_delay_ms), t.INT,
         "Delay of a new group's first rebalance."),
    ]  # fmt: skip
    for spec in TOPIC_CONFIGS.values():
        if spec.broker_synonym and spec.broker_synonym not in {v[0] for v in values}:
            values.append((spec.broker_synonym, spec.default_value(config), spec.type, spec.doc))
    out = []
    for name, value, ctype, doc in sorted(values):
        source = ConfigSource.STATIC_BROKER_CONFIG
        synonyms = (ConfigSynonym(name, value, source),) if include_synonyms else ()
        out.append(
            ConfigEntry(
                name, value, True, source, False, ctype,
                doc if include_documentation else None, False, synonyms,
            )
        )  # fmt: skip
    return out


def topic_config_entries(
    configs: Mapping[str, str],
    config: BrokerConfig,
    include_synonyms: bool = False,
    include_documentation: bool = False,
) -> list[ConfigEntry]:
    """Every whitelisted topic config: the set ones over the defaults."""
    out = []
    for name, spec in sorted(TOPIC_CONFIGS.items()):
        default = spec.default_value(config)
        value = configs.get(name)
        source = ConfigSource.DEFAULT_CONFIG if value is None else ConfigSource.DYNAMIC_TOPIC_CONFIG
        synonyms: tuple[ConfigSynonym, ...] = ()
        if include_synonyms:
            syn = [] if value is None else [ConfigSynonym(name, value, source)]
            syn.append(
                ConfigSynonym(spec.broker_synonym or name, default, ConfigSource.DEFAULT_CONFIG)
            )
            synonyms = tuple(syn)
        out.append(
            ConfigEntry(
                name, default if value is None else value, False, source, value is None,
                spec.type, spec.doc if include_documentation else None, False, synonyms,
            )
        )  # fmt: skip
    return out
