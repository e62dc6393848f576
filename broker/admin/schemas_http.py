"""Pulsar's schema admin paths (``/admin/v2/schemas/{tenant}/{namespace}/{topic}/...``):

- ``GET .../schema``: the latest live version (404 when there is none);
- ``GET .../schema/{version}``: one version;
- ``GET .../schemas``: ``{"getSchemaResponses": [...]}``, every live version;
- ``POST .../schema`` with ``{"type": "AVRO", "schema": "<definition>", "properties": {}}``:
  upload (409 if the namespace's compatibility strategy refuses it, 400 if it does not parse);
- ``DELETE .../schema``: delete every version (a tombstone; the next schema starts afresh);
- ``POST .../compatibility`` with the same payload: ``{"isCompatible": bool,
  "schemaCompatibilityStrategy": "...", "reason": "..."}``.

The routes live here (registered by http.py's make_admin_app) and call the broker's
:class:`broker.schemas.SchemaRegistry`.
"""

from __future__ import annotations

from typing import Any, Callable

from aiohttp import web

from broker.admin.http_common import json_body, json_response, topic_of
from broker.admin.policies import BadRequestError, ConflictError, NotFoundError
from broker.schema_compat import CompatibilityStrategy, DEFAULT_STRATEGY, IncompatibleSchemaError, InvalidSchemaError
from broker.schemas import SchemaRegistry, schema_def_from_admin

PATH = "/admin/v2/schemas/{tenant}/{namespace}/{topic}"


def add_schema_routes(app: web.Application, registry: Callable[[], SchemaRegistry]) -> None:
    """Register the schema routes; ``registry()`` is read at request time. Requests are read with
    http_common's helpers, so errors and limits behave as on every other path."""
    r = app.router

    def parse_payload(body: Any):
        try:
            return schema_def_from_admin(body)
        except InvalidSchemaError as e:
            raise BadRequestError(str(e)) from None

    async def get_latest(request: web.Request) -> web.Response:
        topic = topic_of(request)
        found = await registry().get_stored(topic)
        if found is None:
            raise NotFoundError(f"topic {topic} has no schema")
        return json_response(found.to_admin_json())

    async def get_version(request: web.Request) -> web.Response:
        topic = topic_of(request)
        raw = request.match_info["version"]
        if not raw.isdigit() or len(raw) > 18:
            raise BadRequestError(f"schema version must be a non-negative integer, got {raw!r}")
        found = await registry().get_stored(topic, int(raw))
        if found is None:
            raise NotFoundError(f"topic {topic} has no schema version {raw}")
        return json_response(found.to_admin_json())

    async def get_all(request: web.Request) -> web.Response:
        topic = topic_of(request)
        versions = await registry().all_versions(topic)
        return json_response({"getSchemaResponses": [v.to_admin_json() for v in versions]})

    async def post_schema(request: web.Request) -> web.Response:
        topic = topic_of(request)
        name, definition = parse_payload(await json_body(request))
        try:
            version = await registry().upload(topic, name or topic, definition)
        except IncompatibleSchemaError as e:
            raise ConflictError(str(e)) from None
        except InvalidSchemaError as e:
            raise BadRequestError(str(e)) from None
        return json_response({"version": version})

    async def delete_schema(request: web.Request) -> web.Response:
        topic = topic_of(request)
        version = await registry().delete(topic)
        if version is None:
            raise NotFoundError(f"topic {topic} has no schema")
        return json_response({"version": version})

    async def compatibility(request: web.Request) -> web.Response:
        topic = topic_of(request)
        _, definition = parse_payload(await json_body(request))
        ok, reason = await registry().test_compatibility(topic, definition)
        strategy, _ = await registry().policy_lookup(str(topic).split("://", 1)[1].rsplit("/", 1)[0])
        if strategy is CompatibilityStrategy.UNDEFINED:
            strategy = DEFAULT_STRATEGY
        return json_response({"isCompatible": ok, "schemaCompatibilityStrategy": strategy.value, "reason": reason})

    r.add_get(PATH + "/schema", get_latest)
    r.add_get(PATH + "/schema/{version}", get_version)
    r.add_get(PATH + "/schemas", get_all)
    r.add_post(PATH + "/schema", post_schema)
    r.add_delete(PATH + "/schema", delete_schema)
    r.add_post(PATH + "/compatibility", compatibility)


__all__ = ["add_schema_routes"]
