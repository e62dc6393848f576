"""Pure parts of the admin API's compatibility with Pulsar's JSON forms (issue 32)."""

from __future__ import annotations

from broker.admin.http import lookup_data


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
