"""A stored entry as Pulsar's admin API answers it (``GET .../ledger/{l}/entry/{e}``, Pulsar's
getMessageById; the same shape as its peek/examine answers): the payload, decompressed (a batch
stays a batch: its ``[u32 n][SingleMessageMetadata][bytes]`` framing, which the clients split),
and the entry's metadata in ``X-Pulsar-*`` headers. Pure: bytes in, (headers, body) out.

Headers, as Pulsar writes them (pulsar-admin-go and the Java admin read these):

- ``X-Pulsar-Message-ID``: ``ledger:entry``;
- ``X-Pulsar-PROPERTY``: the properties as one JSON object (only when there are some);
- ``X-Pulsar-publish-time`` / ``X-Pulsar-event-time`` / ``X-Pulsar-deliver-at-time``:
  ISO-8601 UTC with milliseconds (``2026-09-15T16:51:11.802Z``);
- ``X-Pulsar-num-batch-message`` and ``X-Pulsar-batch-size`` (payload bytes) for a batch;
- ``X-Pulsar-Is-Encrypted``, ``X-Pulsar-producer-name``, ``X-Pulsar-sequence-id``,
  ``X-Pulsar-Base64-schema-version``, ``X-Pulsar-txn-uncommitted`` always; the key, null value,
  compression, uncompressed size, highest sequence id and chunking fields when set.

An encrypted payload is returned as stored (it cannot be decompressed here), as Pulsar does.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone

from pulsarlite.wire import pb
from pulsarlite.wire.entry import decompress, split_entry


def iso_ms(epoch_ms: int) -> str:
    """``2026-09-15T16:51:11.802Z`` (what Pulsar's DateFormatter writes for an instant in UTC)."""
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def entry_response(ledger_id: int, entry_id: int, entry: bytes) -> tuple[dict[str, str], bytes]:
    """(headers, body) of a stored ``[u32 meta_size][MessageMetadata][payload]`` entry;
    EntryFormatError if it does not parse or decompress."""
    meta, payload = split_entry(entry)
    raw = meta.raw
    headers: dict[str, str] = {"X-Pulsar-Message-ID": f"{ledger_id}:{entry_id}"}
    if raw.properties:
        headers["X-Pulsar-PROPERTY"] = json.dumps({kv.key: kv.value for kv in raw.properties},
                                                  separators=(",", ":"))
    headers["X-Pulsar-publish-time"] = iso_ms(raw.publish_time)
    if raw.HasField("event_time") and raw.event_time:
        headers["X-Pulsar-event-time"] = iso_ms(raw.event_time)
    if raw.HasField("deliver_at_time"):
        headers["X-Pulsar-deliver-at-time"] = iso_ms(raw.deliver_at_time)
    if raw.HasField("num_messages_in_batch"):
        headers["X-Pulsar-num-batch-message"] = str(raw.num_messages_in_batch)
        headers["X-Pulsar-batch-size"] = str(len(payload))
    if raw.HasField("null_value"):
        headers["X-Pulsar-null-value"] = "true" if raw.null_value else "false"
    encrypted = len(raw.encryption_keys) > 0
    headers["X-Pulsar-Is-Encrypted"] = "true" if encrypted else "false"
    headers["X-Pulsar-producer-name"] = raw.producer_name
    headers["X-Pulsar-sequence-id"] = str(raw.sequence_id)
    if raw.HasField("partition_key"):
        key = raw.partition_key
        headers["X-Pulsar-partition-key"] = key if isinstance(key, str) else base64.b64encode(key).decode()
    if raw.HasField("partition_key_b64_encoded"):
        headers["X-Pulsar-partition-key-b64-encoded"] = "true" if raw.partition_key_b64_encoded else "false"
    if raw.HasField("compression"):
        headers["X-Pulsar-compression"] = pb.CompressionType.Name(raw.compression)
    if raw.HasField("uncompressed_size"):
        headers["X-Pulsar-uncompressed-size"] = str(raw.uncompressed_size)
    if raw.HasField("highest_sequence_id"):
        headers["X-Pulsar-highest-sequence-id"] = str(raw.highest_sequence_id)
    if raw.HasField("uuid"):
        headers["X-Pulsar-uuid"] = raw.uuid
        headers["X-Pulsar-num-chunks-from-msg"] = str(raw.num_chunks_from_msg)
        headers["X-Pulsar-total-chunk-msg-size"] = str(raw.total_chunk_msg_size)
        headers["X-Pulsar-chunk-id"] = str(raw.chunk_id)
    headers["X-Pulsar-Base64-schema-version"] = (base64.b64encode(raw.schema_version).decode()
                                                 if raw.HasField("schema_version") else "")
    headers["X-Pulsar-txn-uncommitted"] = "false"
    if encrypted:
        return headers, bytes(payload)
    return headers, bytes(decompress(payload, raw.compression, raw.uncompressed_size))


__all__ = ["entry_response", "iso_ms"]
