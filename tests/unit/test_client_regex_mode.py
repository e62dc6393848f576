"""Our client's regex_subscription_mode: ours or the official enum by member name; anything else
is refused before anything is sent."""

from __future__ import annotations

import pytest

from pulsarlite.client import InvalidConfiguration, RegexSubscriptionMode
from pulsarlite.client.common import regex_mode_of
from pulsarlite.wire import pb


def test_modes_are_the_wire_modes():
    mode = pb.CommandGetTopicsOfNamespace
    assert int(RegexSubscriptionMode.PersistentOnly) == mode.PERSISTENT
    assert int(RegexSubscriptionMode.NonPersistentOnly) == mode.NON_PERSISTENT
    assert int(RegexSubscriptionMode.AllTopics) == mode.ALL


def test_ours_names_and_the_official_enum_are_accepted():
    assert regex_mode_of(RegexSubscriptionMode.AllTopics) is RegexSubscriptionMode.AllTopics
    assert regex_mode_of("NonPersistentOnly") is RegexSubscriptionMode.NonPersistentOnly
    pulsar = pytest.importorskip("pulsar")
    assert regex_mode_of(pulsar.RegexSubscriptionMode.AllTopics) is RegexSubscriptionMode.AllTopics


@pytest.mark.parametrize("bad", ["all", 2, None, object()])
def test_anything_else_is_refused(bad):
    with pytest.raises(InvalidConfiguration, match="regex_subscription_mode"):
        regex_mode_of(bad)
