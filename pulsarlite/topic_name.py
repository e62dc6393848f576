"""Topic and namespace names, parsed like Pulsar's (floor-1 base: client and broker share it).

Accepted forms (Pulsar's v2 names; the v1 form with a cluster part is rejected)::

    persistent://tenant/namespace/topic        full form
    non-persistent://tenant/namespace/topic    parsed and marked (``is_persistent`` False);
                                               pulsarlite only serves persistent topics
    tenant/namespace/topic                     short form -> persistent://tenant/namespace/topic
    topic                                      short form -> persistent://public/default/topic

Rules (what we decided, close to Pulsar):

- tenant and namespace: non-empty, only ASCII letters, digits and ``- _ = : .``
  (Pulsar's ``[-=:.\\w]``), and not ``.`` or ``..``;
- the local (topic) name: non-empty, no ``/``, no whitespace or control characters, not ``.``
  or ``..``; anything else (``%``, ``:``, ``~``, non-ASCII, ...) is allowed and URL-encoded in
  :attr:`TopicName.managed_ledger_name` exactly like Pulsar's ``encodedLocalName``
  (Java's ``URLEncoder``: letters, digits and ``. - * _`` kept, space as ``+``, every other
  UTF-8 byte as ``%XX``);
- a partition is a local name ending in ``-partition-N`` with N a canonical non-negative
  decimal below 2**31 (no sign, no leading zero) and a non-empty base name;
- a whole name is at most :data:`TOPIC_NAME_CHARS_MAX` characters.

Bad input raises :class:`InvalidTopicNameError` (not retriable) with the reason.
"""

from __future__ import annotations

import enum
import re
import unicodedata
from dataclasses import dataclass
from functools import cached_property

from pulsarlite.errors import PulsarliteError

DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"
PARTITION_SUFFIX = "-partition-"
TOPIC_NAME_CHARS_MAX = 2048
PARTITION_INDEX_MAX = 2**31 - 1

_NAMED_ENTITY = re.compile(r"[-=:.A-Za-z0-9_]+")
_URL_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-*_")


class InvalidTopicNameError(PulsarliteError, ValueError):
    """A topic or namespace name that does not parse; nothing was changed."""

    retriable = False


SUBSCRIPTION_NAME_CHARS_MAX = 1024


def subscription_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a subscription's name (None if it can): non-empty, at most
    SUBSCRIPTION_NAME_CHARS_MAX characters, no whitespace or unprintable characters. One rule for
    the binary protocol and the admin API, so every subscription created can be deleted."""
    if not name:
        return "empty subscription name"
    if len(name) > SUBSCRIPTION_NAME_CHARS_MAX:
        return f"subscription name of {len(name)} characters (at most {SUBSCRIPTION_NAME_CHARS_MAX})"
    if any(ch.isspace() or not ch.isprintable() for ch in name):
        return f"subscription name {name[:64]!r} holds whitespace or unprintable characters"
    return None


class TopicDomain(str, enum.Enum):
    PERSISTENT = "persistent"
    NON_PERSISTENT = "non-persistent"

    def __str__(self) -> str:
        return self.value


def _check_entity(what: str, value: str, whole: str) -> None:
    if not value:
        raise InvalidTopicNameError(f"invalid name {whole!r}: empty {what}")
    if value in (".", "..") or not _NAMED_ENTITY.fullmatch(value):
        raise InvalidTopicNameError(
            f"invalid name {whole!r}: {what} {value!r} may only hold letters, digits and - _ = : . "
            f"(and is not . or ..)")


def _check_local_name(value: str, whole: str) -> None:
    if not value:
        raise InvalidTopicNameError(f"invalid topic name {whole!r}: empty topic part")
    if value in (".", ".."):
        raise InvalidTopicNameError(f"invalid topic name {whole!r}: topic part may not be {value!r}")
    for ch in value:
        if ch == "/":
            raise InvalidTopicNameError(f"invalid topic name {whole!r}: topic part may not contain '/'")
        if ch.isspace() or unicodedata.category(ch) in ("Cc", "Cs", "Cn", "Zl", "Zp"):
            raise InvalidTopicNameError(
                f"invalid topic name {whole!r}: bad character {ch!r} in the topic part")


def url_encode(value: str) -> str:
    """Java's ``URLEncoder.encode(value, UTF-8)``, as Pulsar's ``Codec.encode``."""
    out = []
    for byte in value.encode("utf-8"):
        if byte in _URL_SAFE:
            out.append(chr(byte))
        elif byte == 0x20:
            out.append("+")
        else:
            out.append(f"%{byte:02X}")
    return "".join(out)


def _partition_index_of(local_name: str) -> int:
    """Pulsar's getPartitionIndex: the N of a trailing ``-partition-N``, else -1."""
    cut = local_name.rfind(PARTITION_SUFFIX)
    if cut <= 0:  # absent, or no base name before it
        return -1
    digits = local_name[cut + len(PARTITION_SUFFIX):]
    if not digits or not digits.isascii() or not digits.isdigit():
        return -1
    if digits != str(int(digits)) or int(digits) > PARTITION_INDEX_MAX:
        return -1
    return int(digits)


@dataclass(frozen=True, order=True)
class NamespaceName:
    """``tenant/namespace``. Construct with :meth:`parse` or directly (validated)."""

    tenant: str
    local_name: str

    def __post_init__(self) -> None:
        whole = f"{self.tenant}/{self.local_name}"
        _check_entity("tenant", self.tenant, whole)
        _check_entity("namespace", self.local_name, whole)

    @classmethod
    def parse(cls, name: str) -> "NamespaceName":
        if not isinstance(name, str):
            raise InvalidTopicNameError(f"namespace name must be a str, got {type(name).__name__}")
        parts = name.split("/")
        if len(parts) != 2:
            raise InvalidTopicNameError(
                f"invalid namespace name {name!r}: expected <tenant>/<namespace>, got {len(parts)} parts")
        return cls(parts[0], parts[1])

    def topic(self, local_name: str, domain: TopicDomain = TopicDomain.PERSISTENT) -> "TopicName":
        return TopicName(domain, self.tenant, self.local_name, local_name)

    def __str__(self) -> str:
        return f"{self.tenant}/{self.local_name}"


@dataclass(frozen=True, order=True)
class TopicName:
    """A parsed topic name. ``TopicName.parse(s)`` accepts the full and short forms; direct
    construction validates every part. ``str()`` is always the full form."""

    domain: TopicDomain
    tenant: str
    namespace_local_name: str
    local_name: str

    def __post_init__(self) -> None:
        if not isinstance(self.domain, TopicDomain):
            try:
                object.__setattr__(self, "domain", TopicDomain(self.domain))
            except ValueError:
                raise InvalidTopicNameError(
                    f"invalid topic domain {self.domain!r}: expected persistent or non-persistent") from None
        whole = f"{self.domain.value}://{self.tenant}/{self.namespace_local_name}/{self.local_name}"
        if len(whole) > TOPIC_NAME_CHARS_MAX:
            raise InvalidTopicNameError(
                f"invalid topic name {whole[:64]!r}...: longer than {TOPIC_NAME_CHARS_MAX} characters")
        _check_entity("tenant", self.tenant, whole)
        _check_entity("namespace", self.namespace_local_name, whole)
        _check_local_name(self.local_name, whole)

    # -- parsing -------------------------------------------------------------------------------
    @classmethod
    def parse(cls, name: "str | TopicName") -> "TopicName":
        if isinstance(name, TopicName):
            return name
        if not isinstance(name, str):
            raise InvalidTopicNameError(f"topic name must be a str, got {type(name).__name__}")
        if not name:
            raise InvalidTopicNameError("invalid topic name '': empty")
        if len(name) > TOPIC_NAME_CHARS_MAX:
            raise InvalidTopicNameError(
                f"invalid topic name {name[:64]!r}...: longer than {TOPIC_NAME_CHARS_MAX} characters")
        if "://" in name:
            domain_text, rest = name.split("://", 1)
            try:
                domain = TopicDomain(domain_text)
            except ValueError:
                raise InvalidTopicNameError(
                    f"invalid topic name {name!r}: domain {domain_text!r} is not persistent or "
                    f"non-persistent") from None
        else:
            domain, rest = TopicDomain.PERSISTENT, name
            short = name.split("/")
            if len(short) == 1:
                rest = f"{DEFAULT_TENANT}/{DEFAULT_NAMESPACE}/{name}"
            elif len(short) != 3:
                raise InvalidTopicNameError(
                    f"invalid short topic name {name!r}: expected <topic> or <tenant>/<namespace>/<topic>")
        parts = rest.split("/")
        if len(parts) != 3:
            raise InvalidTopicNameError(
                f"invalid topic name {name!r}: expected {domain.value}://<tenant>/<namespace>/<topic>, "
                f"got {len(parts)} parts after the domain")
        return cls(domain, parts[0], parts[1], parts[2])

    # -- properties ----------------------------------------------------------------------------
    @property
    def is_persistent(self) -> bool:
        return self.domain is TopicDomain.PERSISTENT

    @property
    def namespace(self) -> str:
        """``tenant/namespace``."""
        return f"{self.tenant}/{self.namespace_local_name}"

    @property
    def namespace_name(self) -> NamespaceName:
        return NamespaceName(self.tenant, self.namespace_local_name)

    @cached_property
    def partition_index(self) -> int:
        """N of a ``-partition-N`` local name, -1 for a topic that is not a partition."""
        return _partition_index_of(self.local_name)

    @property
    def is_partition(self) -> bool:
        return self.partition_index >= 0

    @property
    def partitioned_parent(self) -> "TopicName":
        """The partitioned topic this partition belongs to (itself if not a partition)."""
        index = self.partition_index
        if index < 0:
            return self
        base = self.local_name[: -(len(PARTITION_SUFFIX) + len(str(index)))]
        return TopicName(self.domain, self.tenant, self.namespace_local_name, base)

    def partition(self, index: int) -> "TopicName":
        """Partition ``index`` of this topic's partitioned parent (``t.partition(2)`` of
        ``x-partition-0`` is ``x-partition-2``)."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= PARTITION_INDEX_MAX:
            raise InvalidTopicNameError(f"partition index must be an int in [0, {PARTITION_INDEX_MAX}], got {index!r}")
        parent = self.partitioned_parent
        return TopicName(self.domain, self.tenant, self.namespace_local_name,
                         f"{parent.local_name}{PARTITION_SUFFIX}{index}")

    @property
    def encoded_local_name(self) -> str:
        return url_encode(self.local_name)

    @property
    def managed_ledger_name(self) -> str:
        """``tenant/ns/persistent/<encoded local name>`` (Pulsar's persistence naming)."""
        return f"{self.tenant}/{self.namespace_local_name}/{self.domain.value}/{self.encoded_local_name}"

    def __str__(self) -> str:
        return f"{self.domain.value}://{self.tenant}/{self.namespace_local_name}/{self.local_name}"


__all__ = ["DEFAULT_NAMESPACE", "DEFAULT_TENANT", "InvalidTopicNameError", "NamespaceName",
           "PARTITION_SUFFIX", "TOPIC_NAME_CHARS_MAX", "TopicDomain", "TopicName", "url_encode"]
