"""Topics: creating, altering and deleting the cluster's topics.

The cached table and its watch are ``topic_table``; the checks of names, partition counts,
replication factors and assignments are ``topic_validation``; configs are
``topic_configs``; the removal of a deleted topic's objects is
``deletion.delete_topic_objects``. Deleting a topic also deletes every group's committed
offsets of it (``group_store.purge_topic_offsets``), as Kafka does.

Every topic is one key in the metadata store::

    /topics/{name} -> {"id": "<uuid>", "partitions": N, "configs": {"retention.ms": "..."}}

(``configs`` holds only the keys set explicitly; the ingest job reads exactly this JSON.)
``TopicManager`` keeps an in-memory copy of ``/topics/`` current through a watch
(``TopicTable``), so every broker sees topics created, altered or deleted by any other
broker; lookups are sync.
Writes are transactions guarded by ``create_revision == 0`` (create) or the key's
``mod_revision`` (alter, add partitions): two brokers racing on one topic never both win.

Deviations from Kafka, on purpose:

- Replication factor: brokers keep nothing on disk, durability is the object store's, so
  any factor in 1..3 (or -1) is accepted and nothing is stored; responses report 1, the
  number of brokers serving a partition (its owner).
- Manual replica assignments are accepted and only their partition count is used; the
  owner of a partition is chosen by rendezvous hashing over live brokers, not by them.
- ``compression.type`` is stored and described; produced batches are kept exactly as
  the producer compressed them, and only compaction re-encodes (``topic_configs``).
- Most other whitelisted configs (``segment.*``, ``flush.*``, ``min.insync.replicas``, ...)
  are accepted for client compatibility and are informational.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar, cast

from broker.compaction_policy import is_compacted
from broker.config import BrokerConfig
from broker.deletion import delete_topic_objects
from broker.group_store import purge_topic_offsets
from broker.meta.base import Compare, Delete, Get, MetaStore, MetaStoreError, Put
from broker.meta.schema import TopicInfo, topic_key, topic_logs_prefix, topic_owners_prefix
from broker.topic_configs import (
    TOPIC_CONFIGS,
    ConfigEntry,
    ResourceType,
    apply_incremental,
    broker_config_entries,
    check_combined,
    topic_config_entries,
    validate_config,
    validate_configs,
)
from broker.topic_table import TopicTable
from broker.topic_validation import (
    check_assignments,
    is_valid_topic_name,
    validate_partitions,
    validate_replication_factor,
    validate_topic_name,
)
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.validate import TimestampPolicy
from protocol.values import value
from segments.store import ObjectStore

POLICY_CACHE_MAX = 100_000  # values derived from topics' configs kept (cleared when full)
T = TypeVar("T")


@value
class ProducePolicy:
    """A topic's produce checks: ``max.message.bytes``, its timestamp rules, and whether
    records need keys (``cleanup.policy`` compact)."""

    max_bytes: int
    timestamps: TimestampPolicy
    compacted: bool


def _produce_policy(configs: dict[str, str], config: BrokerConfig) -> ProducePolicy:
    return ProducePolicy(
        int(configs.get("max.message.bytes", config.max_message_bytes)),
        TimestampPolicy.from_configs(configs),
        is_compacted(configs),
    )


log = logging.getLogger(__name__)

_CAS_ATTEMPTS = 16


class TopicManager(TopicTable):
    """The topic table of the cluster, cached from the metadata store and kept current.

    ``store``/``namespace``: where the topic's segment objects live, so ``delete`` can
    remove them (``{namespace}/{topic}/``) in the background; without a store only the
    metadata is deleted.
    """

    def __init__(
        self,
        meta: MetaStore,
        config: BrokerConfig,
        store: ObjectStore | None = None,
        namespace: str | None = None,
    ) -> None:
        super().__init__(meta)
        self._config = config
        self._defaults: tuple[BrokerConfig, dict[str, str]] | None = None
        # (name, fn) -> the TopicInfo and config it was derived from, and fn's value
        self._derived: dict[tuple[str, Callable[..., Any]], tuple[TopicInfo, BrokerConfig, Any]]
        self._derived = {}
        self._store = store
        self._namespace = config.namespace if namespace is None else namespace
        self._ensuring: dict[str, asyncio.Task[TopicInfo | None]] = {}
        self._background: set[asyncio.Task[int]] = set()  # topic-object deletions
        self._started = False

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Load ``/topics/`` and follow it with a watch. Listeners see the initial load."""
        if self._started:
            return
        revision = await self._sync()
        self._watch_task = asyncio.create_task(self._watch(revision), name="topics-watch")
        self._started = True

    async def stop(self) -> None:
        tasks = [t for t in (self._watch_task, *self._ensuring.values()) if t is not None]
        for task in tasks:
            task.cancel()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watch_task = None
        self._started = False

    async def wait_background(self) -> None:
        """Wait for background work (segment-object deletion) started so far."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    # ------------------------------------------------------------ configs

    def effective_configs(self, info: TopicInfo) -> dict[str, str]:
        """Every whitelisted config of ``info``: set values over defaults (the defaults
        depend only on the frozen BrokerConfig: computed once per config object, as this
        runs for every produced partition; docs/benchmarks.md)."""
        config = self._config
        if self._defaults is None or self._defaults[0] is not config:
            defaults = {n: spec.default_value(config) for n, spec in TOPIC_CONFIGS.items()}
            self._defaults = (config, defaults)
        out = dict(self._defaults[1])
        out.update(info.configs)
        return out

    def derived(self, info: TopicInfo, fn: Callable[[dict[str, str], BrokerConfig], T]) -> T:
        """``fn`` of ``info``'s effective configs (and the broker's config), computed once
        per version of the topic (a TopicInfo is replaced on every change) instead of for
        every produced partition or maintenance pass (docs/benchmarks.md, "Round 15").
        ``fn`` is the cache key with the topic's name: pass a module-level function."""
        key = (info.name, fn)
        hit = self._derived.get(key)
        if hit is not None and hit[0] is info and hit[1] is self._config:
            return cast(T, hit[2])
        value = fn(self.effective_configs(info), self._config)
        if len(self._derived) >= POLICY_CACHE_MAX:
            self._derived.clear()
        self._derived[key] = (info, self._config, value)
        return value

    def produce_policy(self, info: TopicInfo) -> ProducePolicy:
        """What produce checks ``info``'s batches against (``derived``)."""
        return self.derived(info, _produce_policy)

    # ------------------------------------------------------------ create / ensure

    def _check_collision(self, name: str) -> None:
        folded = name.replace(".", "_")
        for other in self._topics:
            if other != name and other.replace(".", "_") == folded:
                raise KafkaProtocolError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    f"topic {name!r} collides with existing topic {other!r} ('.' and '_' collide)",
                )

    async def create(
        self,
        name: str,
        partitions: int = -1,
        configs: Mapping[str, str | None] | None = None,
        validate_only: bool = False,
        *,
        replication_factor: int = -1,
        assignments: Mapping[int, Sequence[int]] | None = None,
    ) -> TopicInfo:
        """Create a topic; raises KafkaProtocolError (TOPIC_ALREADY_EXISTS, INVALID_*)."""
        validate_topic_name(name)
        if assignments:
            if partitions != -1 or replication_factor != -1:
                raise KafkaProtocolError(
                    ErrorCode.INVALID_REQUEST,
                    "both replica assignments and a partition count or replication factor given",
                )
            partitions = check_assignments(assignments, 0)
        elif partitions == -1:
            partitions = self._config.default_partitions
        validate_partitions(partitions)
        validate_replication_factor(replication_factor)
        clean = validate_configs(configs)
        check_combined(clean)
        if name in self._topics:
            raise KafkaProtocolError(
                ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
            )
        self._check_collision(name)
        info = TopicInfo(name, uuid.uuid4(), partitions, MappingProxyType(clean))
        if validate_only:
            return info
        key = topic_key(name)
        result = await self._meta.txn(
            [Compare(key, "create_revision", "==", 0)], [Put(key, info.to_json())], [Get(key)]
        )
        if not result.succeeded:
            if result.gets and result.gets[0]:
                self._apply_kv(result.gets[0][0])
            raise KafkaProtocolError(
                ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
            )
        self._apply(name, info, result.revision)
        log.info("created topic %s (%s partitions, id %s)", name, partitions, info.topic_id)
        return info

    async def ensure(self, name: str) -> TopicInfo | None:
        """The topic, auto-created (once, however many callers race) when allowed."""
        info = self._topics.get(name)
        if info is not None:
            return info
        if not self._config.auto_create_topics or not is_valid_topic_name(name):
            return None
        task = self._ensuring.get(name)
        if task is None:
            task = asyncio.create_task(self._auto_create(name), name=f"ensure-topic-{name}")
            self._ensuring[name] = task
            task.add_done_callback(lambda _t: self._ensuring.pop(name, None))
        return await asyncio.shield(task)

    async def _auto_create(self, name: str) -> TopicInfo | None:
        try:
            return await self.create(name)
        except KafkaProtocolError as exc:
            if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                log.info("auto-creating topic %s refused: %s", name, exc)
                return None
        return self._topics.get(name) or await self._reload(name)

    async def _reload(self, name: str) -> TopicInfo | None:
        kv = await self._meta.get(topic_key(name))
        return None if kv is None else self._apply_kv(kv)

    # ------------------------------------------------------------ delete

    async def delete(self, name: str) -> TopicInfo:
        """Delete the topic's metadata (topic, logs, owners) in one transaction, then its
        segment objects in the background. Raises UNKNOWN_TOPIC_OR_PARTITION."""
        key = topic_key(name)
        result = await self._meta.txn(
            [Compare(key, "version", ">", 0)],
            [
                Get(key),
                Delete(key),
                Delete(topic_logs_prefix(name), prefix=True),
                Delete(topic_owners_prefix(name), prefix=True),
            ],
        )
        if not result.succeeded or not result.gets or not result.gets[0]:
            raise KafkaProtocolError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
            )
        old = TopicInfo.from_json(name, result.gets[0][0].value)
        self._apply(name, None, result.revision)
        log.info("deleted topic %s (id %s)", name, old.topic_id)
        try:
            purged = await purge_topic_offsets(self._meta, name, result.revision)
        except MetaStoreError as exc:  # the topic is gone either way: say what is left
            log.warning("deleting groups' offsets of deleted topic %s failed: %s", name, exc)
        else:
            log.info("deleted %d committed offsets of topic %s", purged, name)
        if self._store is not None:
            task = asyncio.create_task(
                delete_topic_objects(self._store, self._namespace, name, old.topic_id),
                name=f"delete-topic-{name}",
            )
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return old

    # ------------------------------------------------------------ alter

    async def _update(
        self, name: str, change: Callable[[TopicInfo], TopicInfo], validate_only: bool
    ) -> TopicInfo:
        """Read-modify-write of ``/topics/{name}`` guarded by its mod_revision."""
        key = topic_key(name)
        for _ in range(_CAS_ATTEMPTS):
            kv = await self._meta.get(key)
            if kv is None:
                raise KafkaProtocolError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
                )
            current = TopicInfo.from_json(name, kv.value)
            new = change(current)
            check_combined(new.configs)
            if validate_only or new == current:
                return new
            result = await self._meta.txn(
                [Compare(key, "mod_revision", "==", kv.mod_revision)], [Put(key, new.to_json())]
            )
            if result.succeeded:
                self._apply(name, new, result.revision)
                return new
        raise KafkaProtocolError(
            ErrorCode.REQUEST_TIMED_OUT, f"topic {name!r} kept changing; retry"
        )

    async def add_partitions(
        self,
        name: str,
        total: int,
        validate_only: bool = False,
        assignments: Sequence[Sequence[int]] | None = None,
    ) -> TopicInfo:
        """Grow the topic to ``total`` partitions (INVALID_PARTITIONS unless it grows)."""

        def change(info: TopicInfo) -> TopicInfo:
            if total <= info.partitions:
                raise KafkaProtocolError(
                    ErrorCode.INVALID_PARTITIONS,
                    f"topic {name!r} has {info.partitions} partitions; "
                    f"the new count must be larger, got {total}",
                )
            validate_partitions(total)
            if assignments is not None:
                new = total - info.partitions
                check_assignments(dict(enumerate(assignments)), 0)
                if len(assignments) != new:
                    raise KafkaProtocolError(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"{len(assignments)} assignments given for {new} new partitions",
                    )
            return TopicInfo(name, info.topic_id, total, info.configs)

        return await self._update(name, change, validate_only)

    async def alter_configs(
        self,
        name: str,
        set: Mapping[str, str | None],  # noqa: A002 - the name the brief uses
        delete: Sequence[str] = (),
        validate_only: bool = False,
        *,
        replace: bool = False,
    ) -> TopicInfo:
        """Set and delete topic configs. ``replace`` (legacy AlterConfigs): every set key
        not in ``set`` reverts to its default."""
        for key in delete:
            if key not in TOPIC_CONFIGS:
                raise KafkaProtocolError(
                    ErrorCode.INVALID_CONFIG, f"unknown or unsupported topic config {key!r}"
                )
        clean = {k: validate_config(k, v) for k, v in set.items()}

        def change(info: TopicInfo) -> TopicInfo:
            configs = {} if replace else dict(info.configs)
            for key in delete:
                configs.pop(key, None)
            configs.update(clean)
            return TopicInfo(name, info.topic_id, info.partitions, MappingProxyType(configs))

        return await self._update(name, change, validate_only)

    async def incremental_alter_configs(
        self, name: str, ops: Sequence[tuple[str, int, str | None]], validate_only: bool = False
    ) -> TopicInfo:
        """IncrementalAlterConfigs: ``ops`` are (config name, ``AlterOp``, value); APPEND
        and SUBTRACT work on list configs only (else INVALID_CONFIG)."""

        def change(info: TopicInfo) -> TopicInfo:
            configs = apply_incremental(info.configs, ops, self._config)
            return TopicInfo(name, info.topic_id, info.partitions, MappingProxyType(configs))

        return await self._update(name, change, validate_only)

    # ------------------------------------------------------------ describe

    def describe_configs(
        self,
        resource_type: int,
        name: str,
        keys: Sequence[str] | None = None,
        include_synonyms: bool = False,
        include_documentation: bool = False,
    ) -> list[ConfigEntry]:
        """Configs of a topic (type 2) or of this broker (type 4), ``keys`` None = all."""
        if resource_type == ResourceType.TOPIC:
            info = self._topics.get(name)
            if info is None:
                raise KafkaProtocolError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
                )
            entries = self.topic_config_entries(info, include_synonyms, include_documentation)
        elif resource_type == ResourceType.BROKER:
            if name not in ("", str(self._config.node_id)):
                raise KafkaProtocolError(
                    ErrorCode.INVALID_REQUEST,
                    f"unexpected broker id {name!r}, this is broker {self._config.node_id}",
                )
            entries = broker_config_entries(self._config, include_synonyms, include_documentation)
        else:
            raise KafkaProtocolError(
                ErrorCode.INVALID_REQUEST, f"unsupported resource type {resource_type}"
            )
        if keys is not None:
            wanted = frozenset(keys)
            entries = [e for e in entries if e.name in wanted]
        return entries

    def topic_config_entries(
        self, info: TopicInfo, include_synonyms: bool = False, include_documentation: bool = False
    ) -> list[ConfigEntry]:
        """Every whitelisted config of ``info`` (set ones as DYNAMIC_TOPIC_CONFIG)."""
        return topic_config_entries(
            info.configs, self._config, include_synonyms, include_documentation
        )
