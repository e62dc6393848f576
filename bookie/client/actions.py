"""Events and actions shared by the ledger client's pure cores and their shell.

The cores (write_core, recovery_core) take events (method calls with these outcome enums) and
return lists of the frozen action dataclasses below; the shell executes the actions (gRPC to
bookies, CAS in ZooKeeper) and feeds the results back as events. No I/O here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple, Union

from bookie.client.metadata import LedgerMetadata
from pulsarlite.errors import PulsarliteError


class AddOutcome(enum.Enum):
    """A bookie's answer to one add (one entry of an AddRequest)."""

    OK = "OK"                          # persisted (journal fsynced) and acknowledged
    FENCED = "FENCED"                  # the ledger is fenced on this bookie: no more normal adds
    READ_ONLY = "READ_ONLY"            # the bookie refuses writes (disk nearly full)
    NO_SUCH_LEDGER = "NO_SUCH_LEDGER"  # treated like ERROR by the write core
    TOO_LARGE = "TOO_LARGE"            # the entry is above the bookie's entry_bytes_max: refused by design
    ERROR = "ERROR"                    # unreachable, timeout, any other code: the bookie failed


class ReadOutcome(enum.Enum):
    """A bookie's answer to a read of one entry."""

    FOUND = "FOUND"
    NO_SUCH_ENTRY = "NO_SUCH_ENTRY"
    NO_SUCH_LEDGER = "NO_SUCH_LEDGER"
    ERROR = "ERROR"                    # unreachable, timeout, checksum mismatch, anything else


class LacOutcome(enum.Enum):
    """A bookie's answer to ReadLac (with or without fence)."""

    OK = "OK"
    NO_SUCH_LEDGER = "NO_SUCH_LEDGER"  # the bookie holds nothing of the ledger (still fenced)
    ERROR = "ERROR"


@dataclass(frozen=True)
class EntryData:
    """One entry as a bookie returned it (fields of the proto Entry, checksum already verified)."""

    entry_id: int
    lac: int
    length: int        # ledger payload bytes through this entry
    payload: bytes


# -- actions ------------------------------------------------------------------------------

class SendAdd(NamedTuple):
    """Send one entry to one bookie (coalesce per bookie in the shell); answer with the core's
    ``on_add_result(bookie, entry_id, outcome, ...)``. Immutable like the other actions, but a
    NamedTuple: write_quorum of them per add on the broker's publish path, and a frozen
    dataclass costs ~3x as much to build (docs/decisions.md, "[perf]")."""

    bookie: str
    entry_id: int
    lac: int
    length: int
    payload: bytes
    recovery: bool = False


class SendAddRun(NamedTuple):
    """A run of new entries ``first_entry_id ..`` (one per payload, ``lengths[i]`` the ledger
    length through entry ``first_entry_id + i``), all sent with ``lac``: send to each bookie of
    ``sends`` (``(bookie, offsets)``, offsets into the run, None for all of them) the entries it
    stores. The same as one SendAdd per (entry, bookie of its write set), grouped per bookie so
    that the shell encodes each entry once and hands each bookie the run in one call."""

    first_entry_id: int
    lac: int
    lengths: tuple[int, ...]
    payloads: tuple[bytes, ...]
    sends: tuple[tuple[str, "tuple[int, ...] | None"], ...]


class ConfirmAdds(NamedTuple):
    """Every add with id <= last_entry_id is durable: complete them in order. The new LAC.
    A NamedTuple like SendAdd: one per confirmation on the publish path."""

    last_entry_id: int


@dataclass(frozen=True)
class FailAdds:
    """Every pending add with id >= first_entry_id failed with ``error``."""

    first_entry_id: int
    error: PulsarliteError


@dataclass(frozen=True)
class WriteMetadata:
    """CAS ``metadata`` against the version the shell last saw for this ledger, then call the
    core's ``on_metadata_written(metadata, ...)`` (and remember the new version) or
    ``on_metadata_conflict(current, ...)`` (and remember current's version)."""

    metadata: LedgerMetadata


@dataclass(frozen=True)
class CloseDone:
    """The write core's close finished: ``metadata`` is the CLOSED metadata in the store."""

    metadata: LedgerMetadata


@dataclass(frozen=True)
class CloseFailed:
    error: PulsarliteError


@dataclass(frozen=True)
class SendReadLac:
    """ReadLac to one bookie; answer with ``on_read_lac(bookie, outcome, lac)``."""

    bookie: str
    fence: bool


@dataclass(frozen=True)
class SendRead:
    """Read one entry from one bookie; answer with ``on_read(bookie, entry_id, outcome, entry)``."""

    bookie: str
    entry_id: int
    fence: bool


@dataclass(frozen=True)
class RecoveryDone:
    """Recovery finished: ``metadata`` is the CLOSED metadata now in the store (ours, or the one
    a concurrent recovery/close wrote first)."""

    metadata: LedgerMetadata


@dataclass(frozen=True)
class RecoveryFailed:
    """Recovery could not decide (too many bookies unreachable); retriable errors mean: re-read
    the metadata and run a new recovery later."""

    error: PulsarliteError


Action = Union[SendAdd, SendAddRun, ConfirmAdds, FailAdds, WriteMetadata, CloseDone, CloseFailed,
               SendReadLac, SendRead, RecoveryDone, RecoveryFailed]
