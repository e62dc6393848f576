"""BrokerConfig's advertised listeners (Pulsar's advertisedListeners / internalListenerName and
its MultipleListenerValidator): parsing, the internal listener, refusals."""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from pulsarlite.errors import ConfigError


def test_listeners_parse_and_the_internal_one_gives_the_service_urls():
    config = BrokerConfig(advertised_listeners="internal:pulsar://10.0.0.5:6650, external:pulsar://gw.example:16650,"
                                               "external:pulsar+ssl://gw.example:16651").validate()
    assert config.listeners() == {"internal": ("pulsar://10.0.0.5:6650", ""),
                                  "external": ("pulsar://gw.example:16650", "pulsar+ssl://gw.example:16651")}
    assert config.effective_internal_listener_name == "internal"          # the first, by default
    assert config.service_url == "pulsar://10.0.0.5:6650"
    named = BrokerConfig(advertised_listeners=config.advertised_listeners, internal_listener_name="external")
    assert named.validate().service_url == "pulsar://gw.example:16650"
    assert named.service_url_tls == "pulsar+ssl://gw.example:16651"


def test_without_listeners_nothing_changes():
    config = BrokerConfig(host="127.0.0.1", port=7000).validate()
    assert config.listeners() == {} and config.effective_internal_listener_name == ""
    assert config.service_url == "pulsar://127.0.0.1:7000"


@pytest.mark.parametrize("listeners, internal, match", [
    ("internal", "", "is not name:pulsar://host:port"),
    ("internal:pulsar://h", "", "is not name:pulsar://host:port"),
    ("internal:pulsar://h:0", "", "is not name:pulsar://host:port"),
    ("in ternal:pulsar://h:1", "", "is not name:pulsar://host:port"),
    ("internal:http://h:1", "", "scheme must be pulsar or pulsar\\+ssl"),
    ("a:pulsar://h:1,a:pulsar://h:2", "", "more than one pulsar:// URL"),
    ("a:pulsar://h:1", "b", "internal_listener_name 'b' is not one of"),
    ("", "b", "internal_listener_name 'b' is not one of"),
])
def test_malformed_listeners_are_refused(listeners, internal, match):
    with pytest.raises(ConfigError, match=match):
        BrokerConfig(advertised_listeners=listeners, internal_listener_name=internal).validate()


def test_pulsar_conf_keys_map_to_the_listener_fields():
    """Pulsar's broker.conf ``advertisedListeners`` / ``internalListenerName`` (--pulsar-conf)."""
    import dataclasses

    from pulsarlite.pulsar_conf import map_pulsar_conf, parse_properties
    conf = map_pulsar_conf(parse_properties(
        "advertisedListeners=internal:pulsar://10.0.0.5:6650,external:pulsar://gw.example:16650\n"
        "internalListenerName=internal\n"))
    assert conf.unknown == ()
    config = dataclasses.replace(BrokerConfig(), **conf.overrides).validate()
    assert config.listeners()["external"] == ("pulsar://gw.example:16650", "")
    assert config.service_url == "pulsar://10.0.0.5:6650"
