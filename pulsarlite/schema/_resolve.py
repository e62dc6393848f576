"""Writer schemas of received messages: GET_SCHEMA on the client's loop, and the fastavro
writer definition resolved against the reader's."""

from __future__ import annotations

import asyncio
import json
import logging

import fastavro

from pulsarlite.schema.schemas import SchemaSerializationError, SchemaType
from pulsarlite.wire import commands as c

log = logging.getLogger(__name__)


async def fetch(client, topic: str, version: bytes):
    """The wire Schema of ``topic`` at ``version`` (a ClientError when the broker has none)."""
    conn = await client.connection_for(topic)
    rid = client.next_request_id()
    resp = await conn.request(c.get_schema(rid, topic, schema_version=bytes(version)), rid,
                              f"get schema of {topic} version {bytes(version).hex()}")
    log.info("event=writer_schema_fetched topic=%s version=%s", topic, bytes(version).hex())
    return resp.command.getSchemaResponse.schema


def fetch_blocking(client, topic: str, version: bytes, timeout_s: float):
    """``fetch`` from any thread but the client's loop thread (pulsarlite.aio prefetches
    instead: its receive() resolves the writer schema before returning the message)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is client.loop:
        raise SchemaSerializationError(
            f"the writer schema of {topic} version {bytes(version).hex()} is not known yet and "
            "cannot be fetched from the client's event loop: receive messages with "
            "pulsarlite.aio's receive()/read_next(), which fetch it")
    future = asyncio.run_coroutine_threadsafe(fetch(client, topic, version), client.loop)
    # the request itself times out after the client's operation timeout (a ClientError)
    return future.result(max(timeout_s, client.operation_timeout_s + 5))


def writer_of(schema_pb, reader_definition: dict, topic: str, version: bytes):
    """The parsed writer definition for fastavro, named like the reader's record (as the
    official client does: versions of one record may carry different names)."""
    if int(schema_pb.type) not in (int(SchemaType.AVRO), int(SchemaType.JSON)):
        raise SchemaSerializationError(
            f"schema version {bytes(version).hex()} of {topic} is of type {schema_pb.type}, "
            "not AVRO")
    try:
        writer = json.loads(schema_pb.schema_data)
        if isinstance(writer, dict) and isinstance(reader_definition, dict):
            writer["name"] = reader_definition.get("name", writer.get("name"))
            if "namespace" in reader_definition:
                writer["namespace"] = reader_definition["namespace"]
            else:
                writer.pop("namespace", None)
        return fastavro.parse_schema(writer)
    except Exception as e:
        raise SchemaSerializationError(f"schema version {bytes(version).hex()} of {topic} is "
                                       f"not a usable Avro definition: {e}") from None
