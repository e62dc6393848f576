"""The ledger list of a managed ledger: the document at ``/managed-ledgers/<tenant>/<ns>/persistent/<topic>``
(``managed_ledger_path`` in pulsarlite/metadata_layout.py), its types and its one JSON codec, used by
the broker's managed ledger (which alone writes it) and by every reader (the Spark source, the admin
API, tools). Pure: no I/O.

The znode holds::

    {"version": 1,
     "ledgers": [{"ledger_id": 7, "state": "CLOSED", "entries": 1000, "size_bytes": 123456,
                  "min_publish_time_ms": 1700000000000, "max_publish_time_ms": 1700000000500,
                  "created_ms": 1700000000000,
                  "offload": {"state": "none", "uri": null}}, ...],
     "properties": {}}

Ledger ids grow along the list; only ledgers at its end may be OPEN. ``offload`` is the ledger's
:class:`OffloadRecord` (its codec is ``to_json`` / ``from_json``); its unknown keys
are kept verbatim (the offloader owns them); ``properties`` maps strings to strings (the
compaction view is one, ``pulsarlite.compaction``: :class:`CompactionRecord`, its codec below). Encoding is deterministic (sorted keys), so
equal lists are equal bytes. :func:`decode` refuses a malformed document with a ValueError
("malformed managed ledger metadata: <what is wrong>"); no class of its own (callers catch
ValueError, as for every other document they read).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from pulsarlite.errors import InvariantViolation, check

FORMAT_VERSION = 1


# -- the document ------------------------------------------------------------------------------
class LedgerInfoState(enum.Enum):
    OPEN = "OPEN"        # the current ledger (or one a crashed owner left: recovered on open)
    CLOSED = "CLOSED"    # entries/size/publish times are final


class OffloadState(enum.Enum):
    """The offload state of a ledger (offload/core.py: the machine and its transition table)."""

    NONE = "none"
    OFFLOADING = "offloading"
    OFFLOADED = "offloaded"
    BOOKIE_DELETED = "bookie-deleted"


@dataclass(frozen=True)
class ObjectStats:
    """What the written object holds (from the writer), recorded with ``offloaded``."""

    rows: int
    size_bytes: int
    checksum: str                      # CRC32C of the whole object, 8 hex digits
    min_publish_time_ms: int | None
    max_publish_time_ms: int | None

    def __post_init__(self) -> None:
        check(self.rows >= 0 and self.size_bytes > 0, f"bad object stats {self}")


@dataclass(frozen=True)
class OffloadRecord:
    """The recorded offload metadata of one ledger (docs/protocol.md#offload-record): the
    ``offload`` dict of its entry in the list, written only by the offloader (offload/core.py
    drives it); ``to_json`` / ``from_json`` are its one codec. Unknown keys are kept verbatim
    in ``extra``."""

    state: OffloadState = OffloadState.NONE
    uri: str | None = None
    attempt_uuid: str | None = None
    stats: ObjectStats | None = None
    offloaded_ms: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)   # unknown keys, kept verbatim

    def __post_init__(self) -> None:
        if self.state is OffloadState.NONE:
            check(self.uri is None and self.stats is None, f"state none with an object: {self}")
        else:
            check(self.uri is not None and self.attempt_uuid is not None,
                  f"state {self.state.value} without uri/uuid")
        if self.state in (OffloadState.OFFLOADED, OffloadState.BOOKIE_DELETED):
            check(self.stats is not None and self.offloaded_ms is not None,
                  f"state {self.state.value} without object stats")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        out["state"] = self.state.value
        out["uri"] = self.uri
        if self.attempt_uuid is not None:
            out["uuid"] = self.attempt_uuid
        if self.stats is not None:
            out.update(rows=self.stats.rows, size_bytes=self.stats.size_bytes,
                       checksum=self.stats.checksum,
                       min_publish_time_ms=self.stats.min_publish_time_ms,
                       max_publish_time_ms=self.stats.max_publish_time_ms)
        if self.offloaded_ms is not None:
            out["offloaded_ms"] = self.offloaded_ms
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "OffloadRecord":
        """ValueError if malformed."""
        known = {"state", "uri", "uuid", "rows", "size_bytes", "checksum",
                 "min_publish_time_ms", "max_publish_time_ms", "offloaded_ms"}
        try:
            state = OffloadState(raw.get("state", "none"))
            stats = None
            if "size_bytes" in raw and raw.get("checksum") is not None:
                stats = ObjectStats(int(raw["rows"]), int(raw["size_bytes"]), str(raw["checksum"]),
                                    _opt_int(raw.get("min_publish_time_ms")),
                                    _opt_int(raw.get("max_publish_time_ms")))
            return cls(state=state, uri=raw.get("uri"), attempt_uuid=raw.get("uuid"),
                       stats=stats, offloaded_ms=_opt_int(raw.get("offloaded_ms")),
                       extra={k: v for k, v in raw.items() if k not in known})
        except (InvariantViolation, TypeError, KeyError) as exc:
            raise ValueError(f"malformed offload record {dict(raw)!r}: {exc}") from None


@dataclass(frozen=True)
class LedgerInfo:
    ledger_id: int
    state: LedgerInfoState = LedgerInfoState.OPEN
    entries: int = 0
    size_bytes: int = 0
    # None: no entries, or unknown (a ledger recovered after a crash without a publish-time
    # extractor): readers must not prune such a ledger by publish time
    min_publish_time_ms: int | None = None
    max_publish_time_ms: int | None = None
    created_ms: int = 0
    offload: OffloadRecord = field(default_factory=OffloadRecord)

    def __post_init__(self) -> None:
        check(self.ledger_id >= 0, f"ledger id {self.ledger_id} < 0")
        check(self.entries >= 0 and self.size_bytes >= 0,
              f"ledger {self.ledger_id}: negative stats {self.entries}/{self.size_bytes}")
        check(self.entries > 0 or self.size_bytes == 0, f"ledger {self.ledger_id}: bytes without entries")
        lo, hi = self.min_publish_time_ms, self.max_publish_time_ms
        check((lo is None) == (hi is None), f"ledger {self.ledger_id}: publish time bounds half set")
        check(lo is None or (self.entries > 0 and lo <= hi),
              f"ledger {self.ledger_id}: bad publish time bounds {lo}..{hi} with {self.entries} entries")


@dataclass(frozen=True)
class ManagedLedgerMetadata:
    """What /managed-ledgers/<tenant>/<ns>/persistent/<topic> holds (codec: encode/decode below)."""

    ledgers: tuple[LedgerInfo, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen_open = False
        previous = -1
        for info in self.ledgers:
            check(info.ledger_id > previous, f"ledger ids not increasing along the list: {self.ledger_ids}")
            previous = info.ledger_id
            if info.state is LedgerInfoState.OPEN:
                seen_open = True
            else:
                check(not seen_open, f"a CLOSED ledger after an OPEN one: {self.ledger_ids}")

    @property
    def ledger_ids(self) -> list[int]:
        return [i.ledger_id for i in self.ledgers]

    def info(self, ledger_id: int) -> LedgerInfo:
        for i in self.ledgers:
            if i.ledger_id == ledger_id:
                return i
        raise KeyError(ledger_id)

    @property
    def open_ledgers(self) -> list[LedgerInfo]:
        return [i for i in self.ledgers if i.state is LedgerInfoState.OPEN]

    @property
    def entries(self) -> int:
        return sum(i.entries for i in self.ledgers)

    @property
    def size_bytes(self) -> int:
        return sum(i.size_bytes for i in self.ledgers)


# -- codec -------------------------------------------------------------------------------------
def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def encode(md: ManagedLedgerMetadata) -> bytes:
    """The znode bytes of ``md`` (sorted keys: equal lists give equal bytes)."""
    return json.dumps({
        "version": FORMAT_VERSION,
        "ledgers": [{
            "ledger_id": i.ledger_id,
            "state": i.state.value,
            "entries": i.entries,
            "size_bytes": i.size_bytes,
            "min_publish_time_ms": i.min_publish_time_ms,
            "max_publish_time_ms": i.max_publish_time_ms,
            "created_ms": i.created_ms,
            "offload": i.offload.to_json(),
        } for i in md.ledgers],
        "properties": dict(md.properties),
    }, sort_keys=True).encode()


def decode(data: bytes) -> ManagedLedgerMetadata:
    """The list in ``data``; ValueError if it is not valid JSON of the current format or its
    list breaks an invariant (ids not increasing, a CLOSED ledger after an OPEN one, negative
    stats)."""
    try:
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise TypeError(f"a JSON object expected, got {type(raw).__name__}")
        if raw.get("version") != FORMAT_VERSION:
            raise ValueError(f"unknown format version {raw.get('version')!r}")
        if not isinstance(raw["ledgers"], list):
            raise TypeError("ledgers is not a list")
        ledgers = tuple(LedgerInfo(
            ledger_id=int(r["ledger_id"]),
            state=LedgerInfoState(r["state"]),
            entries=int(r["entries"]),
            size_bytes=int(r["size_bytes"]),
            min_publish_time_ms=_opt_int(r.get("min_publish_time_ms")),
            max_publish_time_ms=_opt_int(r.get("max_publish_time_ms")),
            created_ms=int(r.get("created_ms", 0)),
            offload=OffloadRecord.from_json(r.get("offload") or {}),
        ) for r in raw["ledgers"])
        properties = {str(k): str(v) for k, v in (raw.get("properties") or {}).items()}
        return ManagedLedgerMetadata(ledgers=ledgers, properties=properties)
    except (KeyError, TypeError, ValueError, AttributeError, AssertionError) as e:
        raise ValueError(f"malformed managed ledger metadata: {e}") from None


# -- the compacted view: one property of the list ---------------------------------------------
COMPACTION_PROPERTY = "pulsarlite.compaction"
COMPACTION_PROPERTY_CHARS_MAX = 4096       # the value broker/compaction/ writes is ~60 characters
_ERROR_ECHO_CHARS_MAX = 120


@dataclass(frozen=True)
class CompactionRecord:
    """A topic's compacted view as its list records it, under the property ``pulsarlite.compaction``
    (written by broker/compaction/ at the end of a run, in the same compare-and-set that names the
    previous compacted ledger for deletion; read by the broker serving ``readCompacted`` and by
    the Spark source)::

        {"entries": 5, "horizon": [2, 1], "ledger": 9}

    ``ledger``: the compacted ledger; ``horizon``: the last original position (ledger, entry) it
    covers; ``entries``: how many entries the compacted ledger holds (absent: 0). Integers only,
    none negative; other keys are ignored (as the readers before this codec did)."""

    ledger_id: int
    horizon_ledger_id: int
    horizon_entry_id: int
    entries: int = 0

    def __post_init__(self) -> None:
        for name in ("ledger_id", "horizon_ledger_id", "horizon_entry_id", "entries"):
            value = getattr(self, name)
            check(type(value) is int and value >= 0, f"{name} must be an integer >= 0, got {value!r}")


def encode_compaction(record: CompactionRecord) -> str:
    """The property value of ``record`` (sorted keys: equal records give equal strings)."""
    return json.dumps({"ledger": record.ledger_id, "horizon": [record.horizon_ledger_id, record.horizon_entry_id],
                       "entries": record.entries}, sort_keys=True)


def decode_compaction(properties: Mapping[str, str]) -> CompactionRecord | None:
    """The compacted view recorded in a list's ``properties``; None if the topic was never
    compacted. ValueError ("malformed pulsarlite.compaction property <value>: <what is wrong>",
    the value cut to a bounded length) if it is not a record as :class:`CompactionRecord` states."""
    raw = properties.get(COMPACTION_PROPERTY)
    if raw is None:
        return None
    try:
        if not isinstance(raw, str):
            raise TypeError(f"a string expected, got {type(raw).__name__}")
        if len(raw) > COMPACTION_PROPERTY_CHARS_MAX:
            raise ValueError(f"longer than {COMPACTION_PROPERTY_CHARS_MAX} characters")
        obj = json.loads(raw)
        if not isinstance(obj, dict):
            raise TypeError(f"a JSON object expected, got {type(obj).__name__}")
        horizon = obj["horizon"]
        if not isinstance(horizon, list) or len(horizon) != 2:
            raise ValueError(f"horizon must be [ledger, entry], got {horizon!r}")
        return CompactionRecord(ledger_id=obj["ledger"], horizon_ledger_id=horizon[0], horizon_entry_id=horizon[1],
                                entries=obj.get("entries", 0))
    except KeyError as e:
        problem = f"missing key {e}"
    except (TypeError, ValueError, AssertionError) as e:
        problem = str(e)
    shown = repr(raw[:_ERROR_ECHO_CHARS_MAX] + "..." if len(raw) > _ERROR_ECHO_CHARS_MAX else raw) \
        if isinstance(raw, str) else type(raw).__name__
    raise ValueError(f"malformed {COMPACTION_PROPERTY} property {shown}: {problem}")


__all__ = ["COMPACTION_PROPERTY", "COMPACTION_PROPERTY_CHARS_MAX", "CompactionRecord", "FORMAT_VERSION", "LedgerInfo",
           "LedgerInfoState", "ManagedLedgerMetadata", "ObjectStats", "OffloadRecord", "OffloadState", "decode", "decode_compaction",
           "encode", "encode_compaction"]
