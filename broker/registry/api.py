"""The Confluent Schema Registry REST API on the broker's HTTP listener (docs/registry.md).

Served under :data:`PREFIX` (``http://BROKER:HTTP_PORT/registry`` is the registry URL
clients are given). Responses are ``application/vnd.schemaregistry.v1+json``; errors are
``{"error_code": N, "message": ...}`` with the registry's codes (40401 subject not found,
40402 version not found, 40403 schema not found, 409 incompatible, 42201 invalid schema,
42202 invalid version, 42203 invalid compatibility level, 50001 metadata store error).
Metadata store failures become 50001 (HTTP 500), which clients retry.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from broker.meta.base import MetaStore, MetaStoreError
from broker.meta.schema import RegistryReference, RegistrySchema
from broker.registry.schemas import SCHEMA_TYPES, InvalidSchemaError
from broker.registry.service import Registry, RegistryError

log = logging.getLogger(__name__)

PREFIX = "/registry"
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _reply(body: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(body).encode(), headers={"Content-Type": CONTENT_TYPE}
    )


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() == "true"


def _guard(fn: Handler) -> Handler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await fn(request)
        except RegistryError as exc:
            return _reply({"error_code": exc.code, "message": exc.message}, exc.status)
        except InvalidSchemaError as exc:
            return _reply({"error_code": 42201, "message": str(exc)}, 422)
        except MetaStoreError as exc:
            log.warning("registry: metadata store error: %s", exc)
            return _reply({"error_code": 50001, "message": "Error in the backend data store"}, 500)
        except Exception as exc:  # a bug or a stored value we cannot read: one line, 500
            log.warning("registry: %s %s failed: %r", request.method, request.path, exc)
            return _reply({"error_code": 50001, "message": "Internal error"}, 500)

    return wrapped


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        doc = json.loads(await request.read())
    except ValueError as exc:
        raise RegistryError(400, 400, f"Unrecognized request body: {exc}") from exc
    if not isinstance(doc, dict):
        raise RegistryError(422, 422, "The request body must be a JSON object")
    return doc


async def _schema_of(request: web.Request) -> RegistrySchema:
    doc = await _body(request)
    text = doc.get("schema")
    if not isinstance(text, str) or not text.strip():
        raise RegistryError(422, 42201, "Empty schema")
    kind = str(doc.get("schemaType") or "AVRO").upper()
    if kind not in SCHEMA_TYPES:
        raise RegistryError(422, 42201, f"Invalid schema type {kind}")
    try:
        refs = tuple(
            RegistryReference(str(r["name"]), str(r["subject"]), int(r["version"]))
            for r in doc.get("references") or ()
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RegistryError(422, 42201, f"Invalid schema references: {exc}") from exc
    return RegistrySchema(kind, text, refs)


def schema_doc(schema: RegistrySchema) -> dict[str, Any]:
    """The fields a schema adds to a response (schemaType only when not AVRO)."""
    doc: dict[str, Any] = {"schema": schema.schema}
    if schema.schema_type != "AVRO":
        doc["schemaType"] = schema.schema_type
    if schema.references:
        doc["references"] = [
            {"name": r.name, "subject": r.subject, "version": r.version} for r in schema.references
        ]
    return doc


def _id(request: web.Request) -> int:
    try:
        return int(request.match_info["id"])
    except ValueError as exc:
        raise RegistryError(404, 40403, "Schema not found") from exc


class RegistryApi:
    """Route handlers; ``add_routes(app)`` mounts them under :data:`PREFIX`."""

    def __init__(self, meta: MetaStore) -> None:
        self.registry = Registry(meta)

    def add_routes(self, app: web.Application, prefix: str = PREFIX) -> None:
        r = app.router
        p = prefix.rstrip("/")
        routes: list[tuple[str, str, Handler]] = [
            ("GET", "", self.root),
            ("GET", "/", self.root),
            ("GET", "/schemas/types", self.types),
            ("GET", "/schemas/ids/{id}", self.by_id),
            ("GET", "/schemas/ids/{id}/schema", self.by_id_raw),
            ("GET", "/schemas/ids/{id}/subjects", self.id_subjects),
            ("GET", "/schemas/ids/{id}/versions", self.id_versions),
            ("GET", "/subjects", self.subjects),
            ("POST", "/subjects/{subject}", self.lookup),
            ("DELETE", "/subjects/{subject}", self.delete_subject),
            ("GET", "/subjects/{subject}/versions", self.versions),
            ("POST", "/subjects/{subject}/versions", self.register),
            ("GET", "/subjects/{subject}/versions/{version}", self.version),
            ("DELETE", "/subjects/{subject}/versions/{version}", self.delete_version),
            ("GET", "/subjects/{subject}/versions/{version}/schema", self.version_raw),
            ("GET", "/subjects/{subject}/versions/{version}/referencedby", self.referenced_by),
            ("POST", "/compatibility/subjects/{subject}/versions/{version}", self.compat),
            ("POST", "/compatibility/subjects/{subject}/versions", self.compat),
            ("GET", "/config", self.get_config),
            ("GET", "/config/", self.get_config),
            ("PUT", "/config", self.put_config),
            ("PUT", "/config/", self.put_config),
            ("GET", "/config/{subject}", self.get_config),
            ("PUT", "/config/{subject}", self.put_config),
            ("DELETE", "/config/{subject}", self.delete_config),
            ("GET", "/mode", self.mode),
            ("GET", "/mode/{subject}", self.mode),
        ]
        for method, path, handler in routes:
            r.add_route(method, p + path if p + path else "/", _guard(handler))

    async def root(self, _request: web.Request) -> web.Response:
        return _reply({})

    async def types(self, _request: web.Request) -> web.Response:
        return _reply(sorted(SCHEMA_TYPES))

    async def by_id(self, request: web.Request) -> web.Response:
        schema = await self.registry.schema_by_id(_id(request))
        return _reply(schema_doc(await self._format(request, schema)))

    async def _format(self, request: web.Request, schema: RegistrySchema) -> RegistrySchema:
        """``?format=serialized``: Protobuf text as a base64 descriptor (what
        confluent-kafka's ProtobufDeserializer asks for)."""
        if request.query.get("format") != "serialized" or schema.schema_type != "PROTOBUF":
            return schema
        return await self.registry.serialized(schema)

    async def by_id_raw(self, request: web.Request) -> web.Response:
        schema = await self.registry.schema_by_id(_id(request))
        return web.Response(text=schema.schema, content_type="text/plain")

    async def id_subjects(self, request: web.Request) -> web.Response:
        pairs = await self.registry.id_versions(_id(request), _flag(request, "deleted"))
        return _reply(sorted({s for s, _v in pairs}))

    async def id_versions(self, request: web.Request) -> web.Response:
        pairs = await self.registry.id_versions(_id(request), _flag(request, "deleted"))
        return _reply([{"subject": s, "version": v} for s, v in pairs])

    async def subjects(self, request: web.Request) -> web.Response:
        names = await self.registry.subjects(_flag(request, "deleted"))
        prefix = request.query.get("subjectPrefix", "")
        return _reply([n for n in names if n.startswith(prefix)])

    async def versions(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        return _reply(await self.registry.versions(subject, _flag(request, "deleted")))

    async def _info(self, request: web.Request) -> dict[str, Any]:
        info = await self.registry.version(
            request.match_info["subject"], request.match_info["version"], _flag(request, "deleted")
        )
        doc = {"subject": info.subject, "version": info.version, "id": info.schema_id}
        doc.update(schema_doc(await self._format(request, info.schema)))
        if "schemaType" not in doc:
            doc["schemaType"] = "AVRO"
        return doc

    async def version(self, request: web.Request) -> web.Response:
        return _reply(await self._info(request))

    async def version_raw(self, request: web.Request) -> web.Response:
        info = await self._info(request)
        return web.Response(text=info["schema"], content_type="text/plain")

    async def referenced_by(self, request: web.Request) -> web.Response:
        subject, version = request.match_info["subject"], request.match_info["version"]
        return _reply(await self.registry.referenced_by(subject, version))

    async def register(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        schema = await _schema_of(request)
        schema_id, version = await self.registry.register(subject, schema)
        return _reply({"id": schema_id})

    async def lookup(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        schema = await _schema_of(request)
        info = await self.registry.lookup(subject, schema, _flag(request, "deleted"))
        doc = {"subject": info.subject, "version": info.version, "id": info.schema_id}
        doc.update(schema_doc(info.schema))
        return _reply(doc)

    async def delete_subject(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        return _reply(await self.registry.delete_subject(subject, _flag(request, "permanent")))

    async def delete_version(self, request: web.Request) -> web.Response:
        subject, version = request.match_info["subject"], request.match_info["version"]
        num = await self.registry.delete_version(subject, version, _flag(request, "permanent"))
        return _reply(num)

    async def compat(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        schema = await _schema_of(request)
        problems = await self.registry.check(subject, schema, request.match_info.get("version"))
        doc: dict[str, Any] = {"is_compatible": not problems}
        if _flag(request, "verbose"):
            doc["messages"] = problems
        return _reply(doc)

    async def get_config(self, request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")
        level = await self.registry.level(subject, _flag(request, "defaultToGlobal"))
        return _reply({"compatibilityLevel": level})

    async def put_config(self, request: web.Request) -> web.Response:
        doc = await _body(request)
        level = doc.get("compatibility") or doc.get("compatibilityLevel")
        subject = request.match_info.get("subject")
        set_to = await self.registry.set_level(subject, str(level))
        return _reply({"compatibility": set_to})

    async def delete_config(self, request: web.Request) -> web.Response:
        level = await self.registry.delete_level(request.match_info["subject"])
        return _reply({"compatibilityLevel": level})

    async def mode(self, _request: web.Request) -> web.Response:
        return _reply({"mode": "READWRITE"})
