"""Pure parts of the admin API's compatibility with Pulsar's JSON forms (issue 32)."""

from __future__ import annotations

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
