"""Topic and namespace names: parsing, validation, partitions, managed-ledger names."""

from __future__ import annotations

from urllib.parse import unquote_plus

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulsarlite.errors import PulsarliteError
from pulsarlite.topic_name import (TOPIC_NAME_CHARS_MAX, InvalidTopicNameError, NamespaceName, TopicDomain,
                                   TopicName, url_encode)


def test_full_form():
    t = TopicName.parse("persistent://acme/orders/new-orders")
    assert t.domain is TopicDomain.PERSISTENT and t.is_persistent
    assert (t.tenant, t.namespace, t.local_name) == ("acme", "acme/orders", "new-orders")
    assert t.namespace_name == NamespaceName("acme", "orders")
    assert str(t) == "persistent://acme/orders/new-orders"
    assert t.partition_index == -1 and not t.is_partition
    assert t.partitioned_parent is t
    assert t.managed_ledger_name == "acme/orders/persistent/new-orders"


def test_non_persistent_is_parsed_and_marked():
    t = TopicName.parse("non-persistent://acme/orders/x")
    assert t.domain is TopicDomain.NON_PERSISTENT and not t.is_persistent
    assert str(t) == "non-persistent://acme/orders/x"


def test_short_forms():
    assert str(TopicName.parse("my-topic")) == "persistent://public/default/my-topic"
    assert str(TopicName.parse("acme/orders/t")) == "persistent://acme/orders/t"
    assert TopicName.parse("my-topic") == TopicName.parse("persistent://public/default/my-topic")
    t = TopicName.parse("x")
    assert TopicName.parse(t) is t


def test_partitions():
    t = TopicName.parse("persistent://a/b/orders-partition-3")
    assert t.partition_index == 3 and t.is_partition
    assert str(t.partitioned_parent) == "persistent://a/b/orders"
    assert t.partitioned_parent.partition(3) == t
    assert str(t.partition(7)) == "persistent://a/b/orders-partition-7"
    base = TopicName.parse("orders")
    assert [str(base.partition(i)) for i in range(2)] == [
        "persistent://public/default/orders-partition-0", "persistent://public/default/orders-partition-1"]
    assert TopicName.parse("a-partition-1-partition-2").partition_index == 2
    assert str(TopicName.parse("a-partition-1-partition-2").partitioned_parent) == \
        "persistent://public/default/a-partition-1"
    for not_a_partition in ("a-partition-", "a-partition-x", "a-partition-01", "a-partition--1",
                            "a-partition-+1", "-partition-1", "a-partition-2147483648", "a-partition-١"):
        t = TopicName.parse(not_a_partition)
        assert t.partition_index == -1, not_a_partition
        assert t.partitioned_parent is t
    with pytest.raises(InvalidTopicNameError):
        base.partition(-1)
    with pytest.raises(InvalidTopicNameError):
        base.partition(True)


def test_managed_ledger_name_encodes_like_pulsar():
    assert url_encode("a b") == "a+b"
    assert url_encode("a.b-c*d_e") == "a.b-c*d_e"
    assert url_encode("x~y%z:é") == "x%7Ey%25z%3A%C3%A9"
    t = TopicName.parse("persistent://t/ns/weird:name%é")
    assert t.managed_ledger_name == "t/ns/persistent/weird%3Aname%25%C3%A9"
    assert t.encoded_local_name == "weird%3Aname%25%C3%A9"


@pytest.mark.parametrize("bad", [
    "", "persistent://", "persistent://a/b", "persistent://a/b/c/d", "persistent://a//c",
    "persistent:///b/c", "persistent://a/b/", "a/b", "a/b/c/d", "/a/b", "a/b/",
    "kafka://a/b/c", "://a/b/c", "persistent://a b/ns/t", "persistent://a/n$s/t",
    "persistent://./ns/t", "persistent://t/../x", "persistent://t/ns/.", "persistent://t/ns/..",
    "persistent://t/ns/with space", "persistent://t/ns/tab\there", "persistent://t/ns/nul\x00",
    "persistent://t/ns/new\nline", "x" * (TOPIC_NAME_CHARS_MAX + 1),
])
def test_invalid_topic_names(bad):
    with pytest.raises(InvalidTopicNameError) as info:
        TopicName.parse(bad)
    assert isinstance(info.value, PulsarliteError) and not info.value.retriable
    assert str(info.value)  # says why


def test_invalid_constructor_and_types():
    with pytest.raises(InvalidTopicNameError, match="domain"):
        TopicName("bogus", "a", "b", "c")
    assert TopicName("persistent", "a", "b", "c").domain is TopicDomain.PERSISTENT
    with pytest.raises(InvalidTopicNameError):
        TopicName.parse(123)  # type: ignore[arg-type]


def test_namespace_name():
    ns = NamespaceName.parse("acme/orders")
    assert (ns.tenant, ns.local_name, str(ns)) == ("acme", "orders", "acme/orders")
    assert str(ns.topic("t")) == "persistent://acme/orders/t"
    for bad in ("acme", "acme/", "/orders", "a/b/c", "a!/b", "a/b c", "./b", ""):
        with pytest.raises(InvalidTopicNameError):
            NamespaceName.parse(bad)


# -- properties ------------------------------------------------------------------------------
entities = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=:.",
                   min_size=1, max_size=20).filter(lambda s: s not in (".", ".."))
local_names = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Cn", "Zl", "Zp", "Zs"), blacklist_characters="/"),
    min_size=1, max_size=40).filter(lambda s: s not in (".", "..") and not any(c.isspace() for c in s))
domains = st.sampled_from(list(TopicDomain))


@given(domains, entities, entities, local_names)
def test_round_trip(domain, tenant, ns, local):
    t = TopicName(domain, tenant, ns, local)
    full = str(t)
    assert TopicName.parse(full) == t
    assert str(TopicName.parse(full)) == full
    assert t.namespace == f"{tenant}/{ns}"
    encoded = t.managed_ledger_name.split("/")
    assert len(encoded) == 4 and encoded[:3] == [tenant, ns, domain.value]
    assert unquote_plus(encoded[3]) == local
    if domain is TopicDomain.PERSISTENT:
        assert TopicName.parse(f"{tenant}/{ns}/{local}") == t


@given(entities, entities, local_names, st.integers(0, 2**31 - 1))
def test_partition_round_trip(tenant, ns, local, index):
    t = TopicName(TopicDomain.PERSISTENT, tenant, ns, local)
    p = t.partition(index)
    assert p.partition_index == index
    assert p.partitioned_parent == t.partitioned_parent
    assert TopicName.parse(str(p)) == p
    assert p.partition(index) == p
