"""The ownership core: bundles, broker choice, the state table, LOOKUP decisions."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.ownership.core import (STATE_TRANSITIONS, AcquireSelf, BrokerLoad, BundleState, Connect, Fail,
                                   OwnershipTable, Redirect, SessionTrust, broker_path, bundle_boundaries,
                                   bundle_key, bundle_of, bundle_path, bundle_ranges, choose_broker,
                                   decide_lookup, is_bundle_key, parse_bundle_key, topic_hash)
from pulsarlite.errors import InvariantViolation
from pulsarlite.topic_name import TopicName

# -- bundles ---------------------------------------------------------------------------------


def test_bundle_ranges_like_pulsar():
    assert bundle_ranges(4) == ["0x00000000_0x40000000", "0x40000000_0x80000000",
                                "0x80000000_0xc0000000", "0xc0000000_0xffffffff"]
    assert bundle_ranges(1) == ["0x00000000_0xffffffff"]
    b3 = bundle_boundaries(3)
    assert b3[0] == 0 and b3[-1] == 0xFFFFFFFF and b3 == sorted(b3)
    for bad in (0, -1, 1025, True, 2.0):
        with pytest.raises(ValueError):
            bundle_ranges(bad)


def test_bundle_of_is_stable():
    """Pinned values: a change of hash function or split would move topics between brokers."""
    t = TopicName.parse("persistent://t/ns/topic")
    assert topic_hash(t) == 0x1AB830DB  # CRC32 of the full name in UTF-8
    assert bundle_of(t, 4) == "0x00000000_0x40000000"
    assert bundle_of(t, 16) == "0x10000000_0x20000000"
    assert bundle_of(TopicName.parse("t/ns/topic"), 4) == bundle_of(t, 4)
    assert bundle_key(t, 4) == "t/ns/0x00000000_0x40000000"
    my = TopicName.parse("my-topic")
    assert topic_hash(my) == 0x2BAD45F7 and bundle_of(my, 16) == "0x20000000_0x30000000"


def test_bundle_keys_and_paths():
    key = "acme/orders/0x40000000_0x80000000"
    ns, lower, upper = parse_bundle_key(key)
    assert (str(ns), lower, upper) == ("acme/orders", 0x40000000, 0x80000000)
    assert bundle_path(key) == "/namespace/acme/orders/0x40000000_0x80000000"
    assert broker_path("127.0.0.1:6650") == "/loadbalance/brokers/127.0.0.1:6650"
    for bad in ("acme/orders", "acme/orders/topic", "a/b/0x80000000_0x40000000", "a/b/0x0_0x1",
                "a!/b/0x00000000_0x40000000", "a/b/c/0x00000000_0x40000000"):
        assert not is_bundle_key(bad)
        with pytest.raises(ValueError):
            parse_bundle_key(bad)
    for bad in ("", "a/b", " x", "."):
        with pytest.raises(ValueError):
            broker_path(bad)


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.:%~é", min_size=1, max_size=30).filter(
    lambda s: s not in (".", ".."))


@given(names, names, names, st.integers(1, 64))
def test_bundle_of_within_range(tenant, ns, local, n):
    t = TopicName.parse(f"persistent://{tenant.replace('%', 'p').replace('~', 't').replace('é', 'e')}"
                        f"/{ns.replace('%', 'p').replace('~', 't').replace('é', 'e')}/{local}")
    name = bundle_of(t, n)
    assert name in bundle_ranges(n)
    assert bundle_of(TopicName.parse(str(t)), n) == name  # stable across parses
    _, lower, upper = parse_bundle_key(f"{t.namespace}/{name}")
    h = topic_hash(t)
    assert lower <= h and (h < upper or upper == 0xFFFFFFFF)


def test_bundles_spread():
    counts: dict[str, int] = {}
    for i in range(4000):
        b = bundle_of(TopicName.parse(f"t/ns/topic-{i}"), 4)
        counts[b] = counts.get(b, 0) + 1
    assert len(counts) == 4 and min(counts.values()) > 800


# -- broker choice -------------------------------------------------------------------------------
loads = st.builds(BrokerLoad, st.integers(0, 5), st.integers(0, 5))


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), loads, min_size=1), st.integers(0, 2**32))
def test_choose_broker_least_loaded(brokers, seed):
    chosen = choose_broker(brokers, random.Random(seed))
    assert chosen in brokers
    assert brokers[chosen].sort_key == min(l.sort_key for l in brokers.values())
    assert choose_broker(brokers, random.Random(seed)) == chosen  # replayable


def test_choose_broker_ties_use_rng_and_order():
    brokers = {"a": BrokerLoad(1, 9), "b": BrokerLoad(1, 2), "c": BrokerLoad(1, 2), "d": BrokerLoad(0, 50)}
    assert choose_broker(brokers, random.Random(0)) == "d"  # bundles first, then topics
    del brokers["d"]
    picks = {choose_broker(brokers, random.Random(s)) for s in range(50)}
    assert picks == {"b", "c"}
    with pytest.raises(ValueError):
        choose_broker({}, random.Random(0))


# -- state table ---------------------------------------------------------------------------------
B = BundleState


def test_acquire_release_cycle():
    t = OwnershipTable(session_id=7)
    assert t.state("x") is B.NONE and not t.owns("x")
    epoch = t.begin_acquire("x")
    assert t.state("x") is B.ACQUIRING and not t.owns("x")
    assert t.acquired("x", epoch, 7)
    assert t.owns("x") and t.owned() == {"x"} and t.held() == {"x"}
    assert t.begin_release("x") and t.state("x") is B.RELEASING and not t.owns("x")
    t.released("x")
    assert t.state("x") is B.NONE and t.held() == frozenset()
    assert not t.begin_release("x")


def test_lost_race_and_failed_release():
    t = OwnershipTable(session_id=7)
    e = t.begin_acquire("x")
    t.acquire_failed("x", e)
    assert t.state("x") is B.NONE
    e = t.begin_acquire("x")
    assert t.acquired("x", e, 7)
    t.begin_release("x")
    t.release_failed("x")
    assert t.owns("x")
    with pytest.raises(InvariantViolation):
        t.begin_acquire("x")  # already held


def test_suspended_then_reconnected_same_session():
    t = OwnershipTable(session_id=7)
    for b in ("x", "y"):
        assert t.acquired(b, t.begin_acquire(b), 7)
    assert t.on_session(SessionTrust.SUSPENDED, None) == {"x", "y"}
    assert not t.owns("x") and t.owned() == frozenset() and t.state("x") is B.SUSPECT
    assert t.held() == {"x", "y"}
    assert t.on_session(SessionTrust.CONNECTED, 7) == {"x", "y"}
    assert t.owns("x") and t.owns("y")


def test_lost_means_never_again():
    t = OwnershipTable(session_id=7)
    assert t.acquired("x", t.begin_acquire("x"), 7)
    old_epoch = t.begin_acquire("y")      # in flight when the session dies
    t.on_session(SessionTrust.SUSPENDED, None)
    assert t.on_session(SessionTrust.LOST, None) == {"x", "y"}
    assert t.held() == frozenset() and t.state("y") is B.NONE
    assert t.on_session(SessionTrust.CONNECTED, 8) == frozenset()  # new session: nothing comes back
    assert not t.owns("x")
    assert not t.acquired("y", old_epoch, 8)  # the old acquisition is void
    assert t.state("y") is B.NONE
    assert t.acquired("x", t.begin_acquire("x"), 8)  # re-acquire works
    assert t.owns("x")


def test_new_session_without_lost_is_treated_as_lost():
    t = OwnershipTable(session_id=7)
    assert t.acquired("x", t.begin_acquire("x"), 7)
    t.on_session(SessionTrust.SUSPENDED, None)
    assert t.on_session(SessionTrust.CONNECTED, 9) == {"x"}
    assert not t.owns("x") and t.session_id == 9


def test_acquired_while_suspended_is_suspect_and_other_session_is_void():
    t = OwnershipTable(session_id=7)
    e = t.begin_acquire("x")
    t.on_session(SessionTrust.SUSPENDED, None)
    assert t.acquired("x", e, 7) and t.state("x") is B.SUSPECT and not t.owns("x")
    t.on_session(SessionTrust.CONNECTED, 7)
    assert t.owns("x")
    e = t.begin_acquire("z")
    assert not t.acquired("z", e, 99) and t.state("z") is B.NONE


def test_transition_table_is_enforced():
    t = OwnershipTable(session_id=1)
    with pytest.raises(InvariantViolation):
        t._to("x", B.OWNED)  # NONE -> OWNED skips ACQUIRING
    for state, targets in STATE_TRANSITIONS.items():
        assert state not in targets


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(["acq", "ok", "fail", "rel", "reldone", "relfail",
                                           "susp", "conn", "lost", "newsess"]),
                          st.sampled_from(["x", "y"])), max_size=40))
def test_random_event_sequences_keep_invariants(events):
    """Drive the table like a shell would; owns() implies OWNED + trusted, and nothing survives
    a LOST."""
    t = OwnershipTable(session_id=1)
    session = 1
    inflight: dict[str, int] = {}
    for kind, b in events:
        if kind == "acq" and t.state(b) is B.NONE and b not in inflight:
            inflight[b] = t.begin_acquire(b)
        elif kind in ("ok", "fail") and b in inflight:
            epoch = inflight.pop(b)
            if kind == "ok":
                t.acquired(b, epoch, session)
            else:
                t.acquire_failed(b, epoch)
        elif kind == "rel":
            t.begin_release(b)
        elif kind == "reldone":
            t.released(b)
        elif kind == "relfail":
            t.release_failed(b)
        elif kind == "susp":
            t.on_session(SessionTrust.SUSPENDED, None)
        elif kind == "conn":
            t.on_session(SessionTrust.CONNECTED, session)
        elif kind in ("lost", "newsess"):
            t.on_session(SessionTrust.LOST, None)
            session += 1
            t.on_session(SessionTrust.CONNECTED, session) if kind == "newsess" else None
            assert t.held() == frozenset()
            # in-flight acquisitions may still complete: they must be void
            for name, epoch in list(inflight.items()):
                if t.state(name) is B.NONE:
                    assert not t.acquired(name, epoch, session)
                    inflight.pop(name)
        for name in ("x", "y"):
            if t.owns(name):
                assert t.state(name) is B.OWNED and t.trusted
        if not t.trusted:
            assert t.owned() == frozenset()


# -- LOOKUP decisions ----------------------------------------------------------------------------
R = random.Random(1)


def decide(**kw):
    args = dict(owner=None, owned_by_self=False, brokers={"me": BrokerLoad(), "other": BrokerLoad(5, 5)},
                self_id="me", self_trusted=True, authoritative=False, rng=R)
    args.update(kw)
    return decide_lookup(**args)


def test_decide_known_owner():
    assert decide(owner="me", owned_by_self=True) == Connect("me")
    assert decide(owner="other") == Redirect("other", authoritative=False)
    assert decide(owner="other", authoritative=True) == Redirect("other", authoritative=False)
    assert isinstance(decide(owner="me", owned_by_self=False), Fail)            # an earlier session's node
    assert isinstance(decide(owner="me", owned_by_self=True, self_trusted=False), Fail)


def test_decide_no_owner():
    assert decide() == AcquireSelf()                                          # we are least loaded
    assert decide(brokers={"me": BrokerLoad(3, 0), "other": BrokerLoad(1, 0)}) == Redirect("other", True)
    assert decide(brokers={"me": BrokerLoad(3, 0), "other": BrokerLoad(1, 0)}, authoritative=True) == AcquireSelf()
    assert isinstance(decide(brokers={}), Fail)
    assert isinstance(decide(authoritative=True, brokers={"other": BrokerLoad()}), Fail)  # not registered
    assert isinstance(decide(authoritative=True, self_trusted=False), Fail)
    assert isinstance(decide(self_trusted=False), Fail)
    assert decide(brokers={"other": BrokerLoad(9, 9)}) == Redirect("other", True)


@given(st.one_of(st.none(), st.sampled_from(["me", "b", "c"])), st.booleans(),
       st.dictionaries(st.sampled_from(["me", "b", "c"]), loads), st.booleans(), st.booleans(),
       st.integers(0, 1000))
def test_decide_properties(owner, owned, brokers, trusted, authoritative, seed):
    d = decide_lookup(owner=owner, owned_by_self=owned, brokers=brokers, self_id="me",
                      self_trusted=trusted, authoritative=authoritative, rng=random.Random(seed))
    if isinstance(d, Connect):
        assert owner == "me" and owned and trusted
    elif isinstance(d, AcquireSelf):
        assert owner is None and trusted and "me" in brokers
        if not authoritative:
            assert brokers["me"].sort_key == min(l.sort_key for l in brokers.values())
    elif isinstance(d, Redirect):
        assert d.broker_id != "me"
        assert d.broker_id == owner if owner is not None else d.broker_id in brokers
    else:
        assert isinstance(d, Fail) and d.reason
    if owner is not None and owner != "me":
        assert d == Redirect(owner, False)
