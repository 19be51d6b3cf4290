"""The registry's logic over the metadata store (docs/registry.md).

Every broker of a cluster serves the same registry: state lives only in the metadata
store (keys in :mod:`broker.meta.schema`). Ids come from ``/registry/next-id`` by
compare-and-set, together with the schema and its fingerprint in one transaction, so two
brokers never hand out the same id and the same schema gets one id. A new subject
version is created only if its key does not exist yet (compare on create_revision): two
concurrent registrations of a subject cannot both take a version, and the compatibility
check ran against exactly the versions that were there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from broker.meta.base import Compare, Delete, KeyValue, MetaStore, Put
from broker.meta.schema import (
    REGISTRY_CONFIG_KEY,
    REGISTRY_NEXT_ID_KEY,
    REGISTRY_SUBJECTS_PREFIX,
    RegistryReference,
    RegistrySchema,
    RegistryVersion,
    entry_base,
    registry_config_json,
    registry_config_level,
    registry_fingerprint_key,
    registry_schema_key,
    registry_subject_config_key,
    registry_subject_of_key,
    registry_subject_prefix,
    registry_version_key,
    registry_versions_prefix,
)
from broker.registry import schemas
from broker.registry.schemas import InvalidSchemaError, Parsed

log = logging.getLogger(__name__)

DEFAULT_LEVEL = "BACKWARD"
MAX_ATTEMPTS = 20  # compare-and-set rounds before giving up (50002-like timeout)
_PARSED_CACHE = 1024


class RegistryError(Exception):
    """An error response: HTTP status, registry error code, message."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


def version_not_found(subject: str, version: object) -> RegistryError:
    return RegistryError(404, 40402, f"Version {version} not found for subject '{subject}'.")


def schema_not_found(what: str = "Schema not found") -> RegistryError:
    return RegistryError(404, 40403, what)


@dataclass(frozen=True, slots=True)
class VersionInfo:
    subject: str
    version: int
    schema_id: int
    schema: RegistrySchema
    deleted: bool


class Registry:
    """The Confluent Schema Registry model on a :class:`MetaStore`."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self._parsed: dict[int, Parsed] = {}

    # ------------------------------------------------------------------ reading

    async def schema_by_id(self, schema_id: int) -> RegistrySchema:
        kv = await self.meta.get(registry_schema_key(schema_id))
        if kv is None:
            raise schema_not_found(f"Schema {schema_id} not found")
        return RegistrySchema.from_json(kv.value)

    async def _versions(self, subject: str) -> dict[int, tuple[RegistryVersion, KeyValue]]:
        kvs = await self.meta.range(registry_versions_prefix(subject))
        return {entry_base(kv.key): (RegistryVersion.from_json(kv.value), kv) for kv in kvs}

    async def subjects(self, deleted: bool = False) -> list[str]:
        out: set[str] = set()
        for kv in await self.meta.range(REGISTRY_SUBJECTS_PREFIX):
            subject = registry_subject_of_key(kv.key)
            if subject is None or "/versions/" not in kv.key:
                continue
            if deleted or not RegistryVersion.from_json(kv.value).deleted:
                out.add(subject)
        return sorted(out)

    async def versions(self, subject: str, deleted: bool = False) -> list[int]:
        vers = await self._versions(subject)
        out = [v for v, (rv, _kv) in sorted(vers.items()) if deleted or not rv.deleted]
        if not out:
            raise subject_not_found(subject)
        return out

    async def version(self, subject: str, version: str, deleted: bool = False) -> VersionInfo:
        vers = await self._versions(subject)
        if not vers:
            raise subject_not_found(subject)
        num = _version_number(version)
        if num == -1:
            live = [v for v, (rv, _kv) in vers.items() if not rv.deleted]
            if not live:
                raise version_not_found(subject, version)
            num = max(live)
        found = vers.get(num)
        if found is None or (found[0].deleted and not deleted):
            raise version_not_found(subject, version)
        rv = found[0]
        return VersionInfo(
            subject, num, rv.schema_id, await self.schema_by_id(rv.schema_id), rv.deleted
        )

    async def id_versions(self, schema_id: int, deleted: bool = False) -> list[tuple[str, int]]:
        """(subject, version) pairs registered with ``schema_id``."""
        await self.schema_by_id(schema_id)
        out = []
        for kv in await self.meta.range(REGISTRY_SUBJECTS_PREFIX):
            subject = registry_subject_of_key(kv.key)
            if subject is None or "/versions/" not in kv.key:
                continue
            rv = RegistryVersion.from_json(kv.value)
            if rv.schema_id == schema_id and (deleted or not rv.deleted):
                out.append((subject, entry_base(kv.key)))
        return sorted(out)

    async def referenced_by(self, subject: str, version: str) -> list[int]:
        info = await self.version(subject, version)
        out = []
        for kv in await self.meta.range("/registry/schemas/"):
            refs = RegistrySchema.from_json(kv.value).references
            if any(r.subject == subject and r.version == info.version for r in refs):
                out.append(entry_base(kv.key))
        return sorted(out)

    # ------------------------------------------------------------------ parsing

    async def resolve_references(
        self, refs: Sequence[RegistryReference], depth: int = 0
    ) -> list[RegistrySchema]:
        """The referenced schemas, each after its own references (dependencies first)."""
        return [schema for _name, schema in await self.resolve_named(refs, depth)]

    async def resolve_named(
        self, refs: Sequence[RegistryReference], depth: int = 0
    ) -> list[tuple[str, RegistrySchema]]:
        """(reference name, schema) of the references, dependencies first."""
        if depth > 32:
            raise InvalidSchemaError("Invalid schema: references nest too deep")
        out: list[tuple[str, RegistrySchema]] = []
        for ref in refs:
            try:
                info = await self.version(ref.subject, str(ref.version), deleted=False)
            except RegistryError as exc:
                raise InvalidSchemaError(
                    f"Invalid schema: reference {ref.name} -> {ref.subject} v{ref.version}: "
                    f"{exc.message}"
                ) from exc
            out += await self.resolve_named(info.schema.references, depth + 1)
            out.append((ref.name, info.schema))
        return out

    async def serialized(self, schema: RegistrySchema) -> RegistrySchema:
        """A Protobuf schema as a base64 FileDescriptorProto (text converted, its imports
        resolved against its references and the well-known types)."""
        from broker.registry.proto_descriptor import descriptor_pool_for

        text = schema.schema.strip()
        if "{" not in text and ";" not in text:
            return schema  # already a descriptor
        named = await self.resolve_named(schema.references)
        files = [(n, s.schema) for n, s in named] + [("schema.proto", text)]
        try:
            _pool, fdp = descriptor_pool_for(files)
        except (ValueError, TypeError) as exc:
            raise InvalidSchemaError(f"Invalid schema: {exc}") from exc
        import base64

        encoded = base64.b64encode(fdp.SerializeToString()).decode("ascii")
        return RegistrySchema(schema.schema_type, encoded, schema.references)

    async def parse(self, schema: RegistrySchema) -> Parsed:
        refs = await self.resolve_references(schema.references)
        return schemas.parse(schema.schema_type, schema.schema, refs)

    async def parsed_by_id(self, schema_id: int) -> Parsed:
        got = self._parsed.get(schema_id)
        if got is None:  # ids are immutable: caching by id is safe
            got = await self.parse(await self.schema_by_id(schema_id))
            if len(self._parsed) >= _PARSED_CACHE:
                self._parsed.pop(next(iter(self._parsed)))
            self._parsed[schema_id] = got
        return got

    # ------------------------------------------------------------------ config

    async def level(self, subject: str | None, default_to_global: bool = True) -> str:
        if subject is not None:
            kv = await self.meta.get(registry_subject_config_key(subject))
            if kv is not None:
                return registry_config_level(kv.value)
            if not default_to_global:
                raise RegistryError(
                    404,
                    40408,
                    f"Subject '{subject}' does not have subject-level compatibility configured",
                )
        kv = await self.meta.get(REGISTRY_CONFIG_KEY)
        return registry_config_level(kv.value) if kv is not None else DEFAULT_LEVEL

    async def set_level(self, subject: str | None, level: str) -> str:
        level = str(level).upper()
        if level not in schemas.LEVELS:
            raise RegistryError(422, 42203, f"Invalid compatibility level {level}")
        key = REGISTRY_CONFIG_KEY if subject is None else registry_subject_config_key(subject)
        await self.meta.put(key, registry_config_json(level))
        return level

    async def delete_level(self, subject: str) -> str:
        level = await self.level(subject, default_to_global=False)
        await self.meta.delete(registry_subject_config_key(subject))
        return level

    # ------------------------------------------------------------------ writing

    async def check(self, subject: str, schema: RegistrySchema, version: str | None) -> list[str]:
        """Why ``schema`` is incompatible with the subject (one version, or per config)."""
        parsed = await self.parse(schema)
        level = await self.level(subject)
        if version is not None:
            info = await self.version(subject, version)
            level = level.removesuffix("_TRANSITIVE")  # one version: no transitivity
            return schemas.check(level, parsed, [await self.parsed_by_id(info.schema_id)])
        vers = await self._versions(subject)
        live = [rv.schema_id for _v, (rv, _kv) in sorted(vers.items()) if not rv.deleted]
        return schemas.check(level, parsed, [await self.parsed_by_id(i) for i in live])

    async def register(self, subject: str, schema: RegistrySchema) -> tuple[int, int]:
        """Register ``schema`` under ``subject``; returns (id, version)."""
        if schema.schema_type not in schemas.SCHEMA_TYPES:
            raise RegistryError(422, 42201, f"Invalid schema type {schema.schema_type}")
        parsed = await self.parse(schema)
        fp_key = registry_fingerprint_key(schemas.fingerprint(schema))
        for _attempt in range(MAX_ATTEMPTS):
            vers = await self._versions(subject)
            fp = await self.meta.get(fp_key)
            known = int(fp.value) if fp is not None else None
            live = [(v, rv) for v, (rv, _kv) in sorted(vers.items()) if not rv.deleted]
            for v, rv in live:
                if rv.schema_id == known:
                    return rv.schema_id, v
            level = await self.level(subject)
            problems = schemas.check(
                level, parsed, [await self.parsed_by_id(rv.schema_id) for _v, rv in live]
            )
            if problems:
                raise RegistryError(
                    409,
                    409,
                    f"Schema being registered is incompatible with an earlier schema for "
                    f'subject "{subject}", details: {problems}',
                )
            schema_id = known if known is not None else await self._allocate(fp_key, schema)
            if schema_id is None:
                continue
            nxt = max(vers, default=0) + 1
            key = registry_version_key(subject, nxt)
            res = await self.meta.txn(
                [Compare(key, "create_revision", "==", 0)],
                [Put(key, RegistryVersion(schema_id).to_json())],
            )
            if res.succeeded:
                log.info("registry: subject %s version %d -> schema id %d", subject, nxt, schema_id)
                return schema_id, nxt
        raise RegistryError(500, 50002, "Register operation timed out (concurrent updates)")

    async def _allocate(self, fp_key: str, schema: RegistrySchema) -> int | None:
        """A new id for ``schema`` (None: lost a race, look again)."""
        kv = await self.meta.get(REGISTRY_NEXT_ID_KEY)
        nxt = int(kv.value) if kv is not None else 1
        guard = (
            Compare(REGISTRY_NEXT_ID_KEY, "mod_revision", "==", kv.mod_revision)
            if kv is not None
            else Compare(REGISTRY_NEXT_ID_KEY, "create_revision", "==", 0)
        )
        res = await self.meta.txn(
            [guard, Compare(fp_key, "create_revision", "==", 0)],
            [
                Put(REGISTRY_NEXT_ID_KEY, str(nxt + 1).encode()),
                Put(registry_schema_key(nxt), schema.to_json()),
                Put(fp_key, str(nxt).encode()),
            ],
        )
        return nxt if res.succeeded else None

    async def lookup(self, subject: str, schema: RegistrySchema, deleted: bool) -> VersionInfo:
        """The version of ``subject`` holding ``schema`` (POST /subjects/{s})."""
        vers = await self._versions(subject)
        if not vers:
            raise subject_not_found(subject)
        fp = await self.meta.get(registry_fingerprint_key(schemas.fingerprint(schema)))
        if fp is not None:
            sid = int(fp.value)
            for v, (rv, _kv) in sorted(vers.items(), reverse=True):
                if rv.schema_id == sid and (deleted or not rv.deleted):
                    return VersionInfo(subject, v, sid, await self.schema_by_id(sid), rv.deleted)
        await self.parse(schema)  # an invalid schema is 42201, not "not found"
        raise schema_not_found()

    async def delete_version(self, subject: str, version: str, permanent: bool) -> int:
        vers = await self._versions(subject)
        if not vers:
            raise subject_not_found(subject)
        num = _version_number(version)
        if num == -1:
            live = [v for v, (rv, _kv) in vers.items() if not rv.deleted]
            num = max(live) if live else (max(vers) if permanent else 0)
        found = vers.get(num)
        if found is None:
            raise version_not_found(subject, version)
        rv, kv = found
        key = registry_version_key(subject, num)
        if permanent:
            if not rv.deleted:
                raise RegistryError(
                    404,
                    40407,
                    f"Subject '{subject}' Version {num} was not deleted first before being "
                    "permanently deleted",
                )
            await self._guarded(kv, [Delete(key)])
        else:
            if rv.deleted:
                raise RegistryError(
                    404, 40406, f"Subject '{subject}' Version {num} was soft deleted"
                )
            await self._guarded(kv, [Put(key, RegistryVersion(rv.schema_id, True).to_json())])
        return num

    async def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        vers = await self._versions(subject)
        if not vers:
            raise subject_not_found(subject)
        live = {v: x for v, x in vers.items() if not x[0].deleted}
        if permanent:
            if live:
                raise RegistryError(
                    404,
                    40405,
                    f"Subject '{subject}' was not deleted first before being permanently deleted",
                )
            await self.meta.delete(registry_subject_prefix(subject), prefix=True)
            return sorted(vers)
        if not live:
            raise RegistryError(404, 40404, f"Subject '{subject}' was soft deleted")
        for v, (rv, kv) in sorted(live.items()):
            key = registry_version_key(subject, v)
            await self._guarded(kv, [Put(key, RegistryVersion(rv.schema_id, True).to_json())])
        return sorted(live)

    async def _guarded(self, kv: KeyValue, ops: list[Put | Delete]) -> None:
        res = await self.meta.txn([Compare(kv.key, "mod_revision", "==", kv.mod_revision)], ops)
        if not res.succeeded:
            raise RegistryError(500, 50001, "Concurrent update of the subject; retry")


def _version_number(version: str) -> int:
    if version == "latest":
        return -1
    try:
        num = int(version)
    except ValueError:
        num = 0
    if num == -1:
        return -1
    if num < 1 or num > 2**31 - 1:
        raise RegistryError(
            422, 42202,
            f"The specified version '{version}' is not a valid version id. Allowed values are "
            "between [1, 2^31-1] and the string \"latest\"",
        )  # fmt: skip
    return num
