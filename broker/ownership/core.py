"""The pure core of bundle ownership and LOOKUP (docs/protocol.md#zookeeper-layout,
docs/architecture.md#style). No I/O, no clock, no global random: the shell (``shell.py``) feeds
events and executes decisions.

**Bundles.** A namespace's 32-bit hash range is split into ``bundles_per_namespace`` ranges like
Pulsar's (``0x00000000_0x40000000``, ..., ``0xc0000000_0xffffffff``: each range holds
``[lower, upper)``, the last one also ``0xffffffff``). A topic falls in the bundle holding the
CRC32 of its full name (``persistent://t/ns/x``, UTF-8), so every partition of a partitioned topic
is placed independently. A bundle is named ``<tenant>/<ns>/<range>`` (its :func:`bundle_key`);
its owner is the ephemeral znode ``/namespace/<tenant>/<ns>/<range>``.

**Ownership states**, one per bundle, with an explicit transition table::

    NONE --acquire--> ACQUIRING --created--> OWNED --release--> RELEASING --deleted--> NONE
                      ACQUIRING --lost race / failed / session LOST--> NONE
    OWNED --SUSPENDED--> SUSPECT --CONNECTED, same session--> OWNED
    OWNED/SUSPECT/ACQUIRING/RELEASING --LOST (or a new session)--> NONE

SUSPECT means "the znode may still be ours, but we cannot know": serve nothing. Only OWNED with a
CONNECTED session counts as owning. LOST bumps the session epoch: nothing acquired under an
earlier epoch is ever trusted again; the broker must acquire again through LOOKUP.

**LOOKUP decision** (:func:`decide_lookup`), from Pulsar's semantics: a known owner answers
Connect (if it is us, with a trusted session) or Redirect to it; without an owner, an
authoritative lookup (the client was redirected here) makes us acquire, otherwise the least
loaded live broker is chosen: us -> acquire, another -> authoritative Redirect to it.
"""

from __future__ import annotations

import enum
import re
import zlib
from dataclasses import dataclass
from random import Random
from typing import Mapping, Union

from broker.errors import BrokerError
from pulsarlite import metadata_layout as layout
from pulsarlite.errors import InvariantViolation, check
from pulsarlite.topic_name import InvalidTopicNameError, NamespaceName, TopicName

HASH_RANGE_END = 0x1_0000_0000        # the hash space is [0, 2**32)
FULL_UPPER_BOUND = 0xFFFF_FFFF        # upper bound written in the last bundle's name
BUNDLES_PER_NAMESPACE_MAX = 1024

_RANGE = re.compile(r"0x([0-9a-f]{8})_0x([0-9a-f]{8})")


class OwnershipError(BrokerError):
    """A lookup or acquisition that cannot be answered now (no live broker, session not
    trusted, a stale owner node); retry later."""

    retriable = True


# -- bundles ---------------------------------------------------------------------------------
def check_bundles_per_namespace(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= BUNDLES_PER_NAMESPACE_MAX:
        raise ValueError(f"bundles_per_namespace must be an int in [1, {BUNDLES_PER_NAMESPACE_MAX}], got {n!r}")
    return n


def bundle_boundaries(bundles_per_namespace: int) -> list[int]:
    """The n + 1 boundaries: ``i * (2**32 // n)``, the last one 0xffffffff (Pulsar's)."""
    n = check_bundles_per_namespace(bundles_per_namespace)
    size = HASH_RANGE_END // n
    return [i * size for i in range(n)] + [FULL_UPPER_BOUND]


def bundle_range_name(lower: int, upper: int) -> str:
    return f"0x{lower:08x}_0x{upper:08x}"


def bundle_ranges(bundles_per_namespace: int) -> list[str]:
    """Every range name of a namespace split in ``bundles_per_namespace``, in hash order."""
    b = bundle_boundaries(bundles_per_namespace)
    return [bundle_range_name(b[i], b[i + 1]) for i in range(len(b) - 1)]


def topic_hash(topic: TopicName) -> int:
    """The stable 32-bit hash that places a topic: CRC32 of its full name in UTF-8."""
    return zlib.crc32(str(topic).encode("utf-8")) & 0xFFFF_FFFF


def bundle_of(topic: TopicName, bundles_per_namespace: int) -> str:
    """The range name (e.g. ``0x40000000_0x80000000``) of the bundle holding ``topic``."""
    b = bundle_boundaries(bundles_per_namespace)
    h = topic_hash(topic)
    n = len(b) - 1
    i = min(h // (HASH_RANGE_END // n), n - 1)  # the last range absorbs the division's remainder
    return bundle_range_name(b[i], b[i + 1])


def bundle_key(topic: TopicName, bundles_per_namespace: int) -> str:
    """``tenant/ns/<range>``: the bundle's name across namespaces (Pulsar's bundle toString)."""
    return f"{topic.namespace}/{bundle_of(topic, bundles_per_namespace)}"


def parse_bundle_key(key: str) -> tuple[NamespaceName, int, int]:
    """``tenant/ns/0xLLLLLLLL_0xUUUUUUUU`` -> (namespace, lower, upper); ValueError if not one."""
    parts = key.split("/") if isinstance(key, str) else []
    match = _RANGE.fullmatch(parts[2]) if len(parts) == 3 else None
    if match is None:
        raise ValueError(f"not a bundle name (tenant/ns/0x........_0x........): {key!r}")
    lower, upper = int(match.group(1), 16), int(match.group(2), 16)
    if lower >= upper:
        raise ValueError(f"bundle {key!r}: empty range")
    try:
        ns = NamespaceName(parts[0], parts[1])
    except InvalidTopicNameError as e:
        raise ValueError(f"bundle {key!r}: {e}") from None
    return ns, lower, upper


def is_bundle_key(key: str) -> bool:
    try:
        parse_bundle_key(key)
    except ValueError:
        return False
    return True


def bundle_path(key: str) -> str:
    parse_bundle_key(key)
    return layout.bundle_path(key)


def broker_path(broker_id: str) -> str:
    check_broker_id(broker_id)
    return layout.broker_path(broker_id)


def check_broker_id(broker_id: str) -> str:
    if (not isinstance(broker_id, str) or not broker_id or "/" in broker_id or broker_id in (".", "..")
            or any(c.isspace() or ord(c) < 0x20 for c in broker_id)):
        raise ValueError(f"invalid broker id {broker_id!r}: non-empty, no '/', no whitespace")
    return broker_id


# -- broker choice ---------------------------------------------------------------------------
@dataclass(frozen=True)
class BrokerLoad:
    bundles: int = 0
    topics: int = 0

    @property
    def sort_key(self) -> tuple[int, int]:
        return (self.bundles, self.topics)


def choose_broker(brokers: Mapping[str, BrokerLoad], rng: Random) -> str:
    """The least loaded broker: fewest bundles, then fewest topics; ties broken by ``rng``
    (over the tied ids in sorted order, so a seeded rng gives a replayable choice)."""
    if not brokers:
        raise ValueError("choose_broker: no brokers")
    best = min(load.sort_key for load in brokers.values())
    tied = sorted(b for b, load in brokers.items() if load.sort_key == best)
    return tied[0] if len(tied) == 1 else rng.choice(tied)


# -- ownership states ------------------------------------------------------------------------
class BundleState(enum.Enum):
    NONE = "NONE"
    ACQUIRING = "ACQUIRING"
    OWNED = "OWNED"
    SUSPECT = "SUSPECT"        # session SUSPENDED: the znode may be ours, serve nothing
    RELEASING = "RELEASING"


B = BundleState
STATE_TRANSITIONS: Mapping[BundleState, frozenset[BundleState]] = {
    B.NONE: frozenset({B.ACQUIRING}),
    B.ACQUIRING: frozenset({B.OWNED, B.SUSPECT, B.NONE}),   # SUSPECT: created while suspended
    B.OWNED: frozenset({B.SUSPECT, B.RELEASING, B.NONE}),
    B.SUSPECT: frozenset({B.OWNED, B.RELEASING, B.NONE}),
    B.RELEASING: frozenset({B.NONE, B.OWNED, B.SUSPECT}),   # OWNED/SUSPECT: the delete failed
}


class SessionTrust(enum.Enum):
    """The core's view of the metadata session (mirrors pulsarlite.metadata.SessionState)."""

    CONNECTED = "CONNECTED"
    SUSPENDED = "SUSPENDED"
    LOST = "LOST"


class OwnershipTable:
    """Per-bundle states of one broker plus the session they depend on.

    Events return what changed, so the shell can tell its listeners. Bundles in NONE are not
    stored. ``epoch`` counts session losses: an acquisition started under an older epoch is void.
    """

    def __init__(self, session_id: int | None) -> None:
        self._states: dict[str, BundleState] = {}
        self.session = SessionTrust.CONNECTED
        self.session_id = session_id
        self.epoch = 0

    # -- queries -------------------------------------------------------------------------------
    def state(self, bundle: str) -> BundleState:
        return self._states.get(bundle, BundleState.NONE)

    @property
    def trusted(self) -> bool:
        return self.session is SessionTrust.CONNECTED

    def owns(self, bundle: str) -> bool:
        return self.trusted and self.state(bundle) is BundleState.OWNED

    def bundles_in(self, *states: BundleState) -> frozenset[str]:
        return frozenset(b for b, s in self._states.items() if s in states)

    def owned(self) -> frozenset[str]:
        """Bundles owned and served now (empty while the session is not trusted)."""
        return self.bundles_in(BundleState.OWNED) if self.trusted else frozenset()

    def held(self) -> frozenset[str]:
        """Bundles whose znode is (or may be) ours: OWNED, SUSPECT or RELEASING."""
        return self.bundles_in(BundleState.OWNED, BundleState.SUSPECT, BundleState.RELEASING)

    # -- transitions -----------------------------------------------------------------------------
    def _to(self, bundle: str, state: BundleState) -> None:
        current = self.state(bundle)
        if state is not current and state not in STATE_TRANSITIONS[current]:
            raise InvariantViolation(f"bundle {bundle}: {current.value} -> {state.value} not allowed")
        if state is BundleState.NONE:
            self._states.pop(bundle, None)
        else:
            self._states[bundle] = state

    def begin_acquire(self, bundle: str) -> int:
        """NONE -> ACQUIRING; returns the epoch to hand back to :meth:`acquired`."""
        check(self.state(bundle) is BundleState.NONE,
              f"bundle {bundle}: acquire in {self.state(bundle).value}")
        self._to(bundle, BundleState.ACQUIRING)
        return self.epoch

    def acquired(self, bundle: str, epoch: int, session_id: int | None) -> bool:
        """The ephemeral znode was created (by the session ``session_id``). True if the bundle is
        now held (OWNED, or SUSPECT when the session is suspended); False if the acquisition is
        void (the session was lost meanwhile): the shell must delete the node if it is ours."""
        if epoch != self.epoch:
            return False  # the session was lost meanwhile: LOST already cleared the bundle
        check(self.state(bundle) is BundleState.ACQUIRING,
              f"bundle {bundle}: acquired in {self.state(bundle).value}")
        if session_id is None or session_id != self.session_id:
            self._to(bundle, BundleState.NONE)
            return False
        self._to(bundle, BundleState.OWNED if self.trusted else BundleState.SUSPECT)
        return True

    def acquire_failed(self, bundle: str, epoch: int) -> None:
        """Another broker won the race, or the create failed: ACQUIRING -> NONE."""
        if epoch == self.epoch and self.state(bundle) is BundleState.ACQUIRING:
            self._to(bundle, BundleState.NONE)

    def begin_release(self, bundle: str) -> bool:
        """OWNED/SUSPECT -> RELEASING; False if there is nothing to release."""
        if self.state(bundle) not in (BundleState.OWNED, BundleState.SUSPECT):
            return False
        self._to(bundle, BundleState.RELEASING)
        return True

    def released(self, bundle: str) -> None:
        """The znode is gone: RELEASING -> NONE (no-op if LOST already cleared it)."""
        if self.state(bundle) is BundleState.RELEASING:
            self._to(bundle, BundleState.NONE)

    def release_failed(self, bundle: str) -> None:
        """The delete failed (connection trouble): held again, OWNED or SUSPECT by the session."""
        if self.state(bundle) is BundleState.RELEASING:
            self._to(bundle, BundleState.OWNED if self.trusted else BundleState.SUSPECT)

    def on_session(self, state: SessionTrust, session_id: int | None) -> frozenset[str]:
        """A session state change; returns the bundles whose serving status changed:
        SUSPENDED -> the bundles that were OWNED (now SUSPECT); CONNECTED with the same session ->
        the SUSPECT ones (OWNED again); LOST, or CONNECTED with a different session -> every held or
        acquiring bundle (now NONE, never trusted again)."""
        if state is SessionTrust.SUSPENDED:
            self.session = SessionTrust.SUSPENDED
            changed = self.bundles_in(BundleState.OWNED)
            for b in changed:
                self._to(b, BundleState.SUSPECT)
            return changed
        if state is SessionTrust.CONNECTED and session_id is not None and session_id == self.session_id:
            self.session = SessionTrust.CONNECTED
            changed = self.bundles_in(BundleState.SUSPECT)
            for b in changed:
                self._to(b, BundleState.OWNED)
            return changed
        # LOST, or a new session without LOST seen first: everything is gone
        gone = frozenset(self._states)
        for b in gone:
            self._to(b, BundleState.NONE)
        self.epoch += 1
        if state is SessionTrust.CONNECTED:
            self.session, self.session_id = SessionTrust.CONNECTED, session_id
        else:
            self.session, self.session_id = SessionTrust.LOST, None
        return gone


# -- LOOKUP decision -------------------------------------------------------------------------
@dataclass(frozen=True)
class Connect:
    """We own the bundle: the client connects here."""

    broker_id: str


@dataclass(frozen=True)
class Redirect:
    """Ask ``broker_id``; ``authoritative`` tells it to acquire without choosing again."""

    broker_id: str
    authoritative: bool


@dataclass(frozen=True)
class AcquireSelf:
    """No owner: acquire the bundle ourselves, then answer with the winner."""


@dataclass(frozen=True)
class Fail:
    reason: str


LookupDecision = Union[Connect, Redirect, AcquireSelf, Fail]


def decide_lookup(*, owner: str | None, owned_by_self: bool, brokers: Mapping[str, BrokerLoad],
                  self_id: str, self_trusted: bool, authoritative: bool, rng: Random) -> LookupDecision:
    """What to answer a LOOKUP for a bundle.

    ``owner``: the broker id in the bundle's owner znode (None: no owner); ``owned_by_self``: our
    table says OWNED; ``brokers``: live registered brokers and their loads (self included when
    registered); ``self_trusted``: our session is CONNECTED; ``authoritative``: the client was
    redirected here by a broker that chose us."""
    if owner is not None:
        if owner != self_id:
            return Redirect(owner, authoritative=False)
        if owned_by_self and self_trusted:
            return Connect(self_id)
        if not self_trusted:
            return Fail(f"broker {self_id}: metadata session not trusted (bundle ownership unknown)")
        return Fail(f"broker {self_id}: the bundle is held by an earlier session of this broker; "
                    f"retry once it expires")
    if authoritative:
        if not self_trusted or self_id not in brokers:
            return Fail(f"broker {self_id}: not registered as a live broker (session not trusted)")
        return AcquireSelf()
    if not brokers:
        return Fail("no live brokers")
    chosen = choose_broker(brokers, rng)
    if chosen == self_id:
        if not self_trusted:
            return Fail(f"broker {self_id}: metadata session not trusted")
        return AcquireSelf()
    return Redirect(chosen, authoritative=True)


__all__ = [
    "AcquireSelf", "BrokerLoad", "BundleState", "Connect", "Fail", "LookupDecision",
    "OwnershipError", "OwnershipTable", "Redirect", "STATE_TRANSITIONS", "SessionTrust",
    "broker_path", "bundle_boundaries", "bundle_key", "bundle_of", "bundle_path", "bundle_range_name",
    "bundle_ranges", "check_broker_id", "check_bundles_per_namespace", "choose_broker", "decide_lookup",
    "is_bundle_key", "parse_bundle_key", "topic_hash",
]
