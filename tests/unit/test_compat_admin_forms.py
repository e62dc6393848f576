"""Pure parts of the admin API's compatibility with Pulsar's JSON forms (issue 32)."""

from __future__ import annotations

import json

import pytest

from broker.admin.http import lookup_data, partitioned_topic_metadata
from broker.admin.policies import BadRequestError, PreconditionFailedError


def test_lookup_data_without_tls_listeners():
    """Pulsar's LookupData through Jackson NON_NULL: no TLS URLs when there are no TLS listeners;
    nativeUrl mirrors brokerUrl; brokerUrlSsl is always the empty string."""
    assert lookup_data("pulsar://h:6650", "http://h:8080") == {
        "brokerUrl": "pulsar://h:6650", "httpUrl": "http://h:8080", "nativeUrl": "pulsar://h:6650",
        "brokerUrlSsl": ""}


def test_lookup_data_with_tls_listeners():
    data = lookup_data("pulsar://h:6650", "http://h:8080", broker_url_tls="pulsar+ssl://h:6651",
                       http_url_tls="https://h:8443")
    assert data == {"brokerUrl": "pulsar://h:6650", "brokerUrlTls": "pulsar+ssl://h:6651",
                    "httpUrl": "http://h:8080", "httpUrlTls": "https://h:8443",
                    "nativeUrl": "pulsar://h:6650", "brokerUrlSsl": ""}


def test_partitioned_topic_metadata_forms():
    """Pulsar's createPartitionedTopic: a bare integer (or a numeric string, Jackson's coercion)
    or a PartitionedTopicMetadata object (the Go admin client's form)."""
    assert partitioned_topic_metadata(3, partitions_max=10) == (3, None)
    assert partitioned_topic_metadata("3", partitions_max=10) == (3, None)
    assert partitioned_topic_metadata({"properties": None, "partitions": 3}, partitions_max=10) == (3, None)
    assert partitioned_topic_metadata({"partitions": 2, "properties": {"a": "b"}}, partitions_max=10) \
        == (2, {"a": "b"})
    assert partitioned_topic_metadata({"partitions": 2, "properties": {}}, partitions_max=10) == (2, None)


@pytest.mark.parametrize("body, error", [
    ({"properties": None}, BadRequestError), ({"partitions": "x"}, BadRequestError),
    ({"partitions": 2, "properties": {"a": 1}}, BadRequestError), ({"partitions": 2, "extra": 1}, BadRequestError),
    ([3], BadRequestError), (True, BadRequestError), (0, PreconditionFailedError),
    ({"partitions": 11}, PreconditionFailedError)])
def test_partitioned_topic_metadata_refused(body, error):
    with pytest.raises(error):
        partitioned_topic_metadata(body, partitions_max=10)


def test_policy_integers_take_numeric_strings_as_jackson_does():
    from broker.admin.policies import BacklogQuota, RetentionPolicy
    assert BacklogQuota.from_json({"limit": "10240", "policy": "producer_exception"}) == \
        BacklogQuota(limit_bytes=10240, limit_time_s=-1, policy="producer_exception")
    assert BacklogQuota.from_json({"limitSize": " -1 ", "limitTime": "3600"}).limit_time_s == 3600
    assert RetentionPolicy.from_json({"retentionTimeInMinutes": "10", "retentionSizeInMB": "1"}) == \
        RetentionPolicy.from_json({"retentionTimeInMinutes": 10, "retentionSizeInMB": 1})
    for bad in ("ten", "1.5", "0x10", "", "1e3", "99999999999999999999"):
        with pytest.raises((BadRequestError, PreconditionFailedError)):
            BacklogQuota.from_json({"limitSize": bad})


def test_entry_response_plain_and_batched():
    """Pulsar's getMessageById answer: decompressed payload (a batch keeps its framing), the
    metadata in X-Pulsar-* headers."""
    from broker.admin.messages_http import entry_response, iso_ms
    from pulsarlite.wire.entry import (Compression, Message, build_batch_entry, build_entry, peek_metadata,
                                      unpack_entry)

    assert iso_ms(1_789_491_071_802) == "2026-09-15T16:51:11.802Z"
    entry = build_entry(Message(b"hello" * 40, key="k1", properties={"a": "1", "b": "x y"}),
                        producer_name="p-1", sequence_id=7, publish_time_ms=1_789_491_071_802,
                        compression=Compression.ZSTD, schema_version=b"\0" * 8)
    headers, body = entry_response(5, 9, entry)
    assert body == b"hello" * 40
    assert headers["X-Pulsar-Message-ID"] == "5:9"
    assert json.loads(headers["X-Pulsar-PROPERTY"]) == {"a": "1", "b": "x y"}
    assert headers["X-Pulsar-publish-time"] == "2026-09-15T16:51:11.802Z"
    assert headers["X-Pulsar-producer-name"] == "p-1" and headers["X-Pulsar-sequence-id"] == "7"
    assert headers["X-Pulsar-partition-key"] == "k1" and headers["X-Pulsar-compression"] == "ZSTD"
    assert headers["X-Pulsar-Is-Encrypted"] == "false" and headers["X-Pulsar-Base64-schema-version"] == "AAAAAAAAAAA="
    assert "X-Pulsar-num-batch-message" not in headers

    batch = build_batch_entry([b"m0", b"m1", b"m2"], producer_name="p-2", sequence_id=0,
                              publish_time_ms=1000, compression=Compression.LZ4)
    headers, body = entry_response(1, 0, batch)
    assert headers["X-Pulsar-num-batch-message"] == "3" and "X-Pulsar-PROPERTY" not in headers
    assert int(headers["X-Pulsar-batch-size"]) == len(batch) - peek_metadata(batch).payload_offset
    plain = build_batch_entry([b"m0", b"m1", b"m2"], producer_name="p-2", sequence_id=0, publish_time_ms=1000)
    assert body == plain[len(plain) - len(body):]           # the uncompressed batch payload
    assert [bytes(m.payload) for m in unpack_entry(plain)[1]] == [b"m0", b"m1", b"m2"]
