"""ManagedLedger.kept_listeners: a rollover after a failed add whose recovery closes the ledger
with more entries than were confirmed reports exactly those entries (adds failed back to their
callers, kept by the recovery), before any add queued during the rollover goes to the next
ledger. Small fakes of the ledger client, writers and list store; the shell and core are real."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from bookie.client.metadata import LedgerMetadata, LedgerState
from broker.managed_ledger.config import ManagedLedgerConfig
from broker.managed_ledger.core import LedgerInfo, LedgerInfoState, ManagedLedgerMetadata, Position
from broker.managed_ledger.shell import ManagedLedger
from pulsarlite.errors import BookieUnavailableError, NotEnoughBookiesError

NAME = "public/default/persistent/kept"


@dataclass
class Entry:
    entry_id: int
    payload: bytes


class FakeWriter:
    """A ledger writer whose adds are answered by the test (oldest first); its close fails
    (retriable), so the managed ledger recovers the ledger instead."""

    def __init__(self, ledger_id: int, log: list) -> None:
        self.ledger_id = ledger_id
        self.log = log
        self.entries: list[bytes] = []
        self.waiting: list = []

    def add_entries(self, payloads, done, context) -> int:
        first = len(self.entries)
        for payload in payloads:
            entry_id = len(self.entries)
            self.entries.append(payload)
            self.waiting.append((entry_id, done, context))
            self.log.append(("write", self.ledger_id, payload))
        return first

    def answer(self, error=None) -> None:
        entry_id, done, context = self.waiting.pop(0)
        done(context, entry_id, entry_id, error)

    async def close(self) -> LedgerMetadata:
        assert not self.waiting                        # drained: every add answered
        raise BookieUnavailableError("close: bookies gone")


class FakeReader:
    def __init__(self, entries: list[bytes]) -> None:
        self.entries = entries

    async def read(self, first: int, last: int) -> list[Entry]:
        return [Entry(i, self.entries[i]) for i in range(first, last + 1)]


class FakeClient:
    """Creates ``next_writer``; recovery of ``old`` closes it at entry ``kept_last``."""

    def __init__(self, old: FakeWriter, next_writer: FakeWriter, kept_last: int, *, unreadable: bool = False) -> None:
        self.old, self.next_writer, self.kept_last = old, next_writer, kept_last
        self.unreadable = unreadable       # reading the kept entries fails (bookies down)
        self.recovered: list[int] = []
        self.opened: list[int] = []

    async def create_ledger(self, ensemble_size, write_quorum, ack_quorum, *, custom=None) -> FakeWriter:
        return self.next_writer

    async def recover(self, ledger_id: int) -> LedgerMetadata:
        assert ledger_id == self.old.ledger_id
        self.recovered.append(ledger_id)
        kept = self.old.entries[:self.kept_last + 1]
        return LedgerMetadata(ledger_id, 3, 3, 2, ((0, ("b1", "b2", "b3")),), state=LedgerState.CLOSED,
                              last_entry_id=self.kept_last, length=sum(len(p) for p in kept))

    async def open_ledger(self, ledger_id: int, *, recovery: bool) -> FakeReader:
        assert ledger_id == self.old.ledger_id and recovery is False
        self.opened.append(ledger_id)
        if self.unreadable:
            raise BookieUnavailableError("read: bookies gone")
        return FakeReader(self.old.entries[:self.kept_last + 1])


class FakeStore:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def write(self, name: str, data: bytes, version: int) -> int:
        self.writes.append(data)
        return version + 1


async def roll_after_failed_add(kept_last: int, *, unreadable: bool = False):
    """a0 confirmed; a1 and a2 fail (rollover FAILURE); a3 is added during the rollover."""
    log: list = []
    w1, w2 = FakeWriter(1, log), FakeWriter(2, log)
    client = FakeClient(w1, w2, kept_last, unreadable=unreadable)
    ml = ManagedLedger(NAME, client, FakeStore(), ManagedLedgerConfig().validate(), lambda: 0, None)
    ml._writer = w1
    ml._version = 0
    ml._run(ml._core.on_opened(ManagedLedgerMetadata((LedgerInfo(1, created_ms=0),))))
    ml.kept_listeners.append(lambda kept: log.append(("kept", list(kept), list(w2.entries))))
    ml.kept_unread_listeners.append(lambda first, last: log.append(("unread", first, last, list(w2.entries))))
    results: dict[bytes, object] = {}

    def done(tag: bytes, first, last, position, error):
        results[tag] = position if error is None else type(error)

    for p in (b"a0", b"a1", b"a2"):
        ml.add_entries([p], [0], done, p)
    w1.answer()                                        # a0 confirmed at 1:0
    w1.answer(NotEnoughBookiesError("bookie down"))    # a1 failed: rollover (FAILURE) starts
    w1.answer(NotEnoughBookiesError("bookie down"))    # a2 failed too
    rollover = ml._rollover_task
    assert rollover is not None and not rollover.done()
    ml.add_entries([b"a3"], [0], done, b"a3")        # queued behind the rollover
    assert w2.entries == []
    await rollover
    assert client.recovered == [1]                     # the close failed: recovered instead
    w2.answer()                                        # a3 confirmed in the next ledger
    await asyncio.sleep(0)
    assert results == {b"a0": Position(1, 0), b"a1": NotEnoughBookiesError, b"a2": NotEnoughBookiesError,
                       b"a3": Position(2, 0)}
    assert ml.current_ledger_id == 2
    closed = ml.metadata.info(1)
    assert closed.state is LedgerInfoState.CLOSED and closed.entries == kept_last + 1
    return ml, client, log


async def test_kept_entries_reported_before_queued_adds_go_to_next_ledger():
    ml, client, log = await roll_after_failed_add(kept_last=2)
    assert client.opened == [1]
    kept = [(Position(1, 1), b"a1"), (Position(1, 2), b"a2")]
    # (the listener saw nothing written to ledger 2 yet)
    assert log == [("write", 1, b"a0"), ("write", 1, b"a1"), ("write", 1, b"a2"),
                   ("kept", kept, []),
                   ("write", 2, b"a3")]


async def test_only_the_entries_beyond_the_confirmed_ones_are_kept():
    ml, client, log = await roll_after_failed_add(kept_last=1)
    assert [e for e in log if e[0] == "kept"] == [("kept", [(Position(1, 1), b"a1")], [])]
    assert log.index(("write", 2, b"a3")) > log.index(("kept", [(Position(1, 1), b"a1")], []))


async def test_no_kept_entries_no_listener_call():
    ml, client, log = await roll_after_failed_add(kept_last=0)
    assert client.opened == []                         # nothing read
    assert log == [("write", 1, b"a0"), ("write", 1, b"a1"), ("write", 1, b"a2"), ("write", 2, b"a3")]


async def test_kept_entries_that_cannot_be_read_are_reported_as_unread():
    """Their topic's deduplication cannot learn them: it is told which (so that no dedup snapshot
    claims to cover them; found by the whole publish path's simulation, seed 6911)."""
    ml, client, log = await roll_after_failed_add(kept_last=2, unreadable=True)
    assert client.opened == [1]
    assert [e for e in log if e[0] in ("kept", "unread")] == [("unread", Position(1, 1), Position(1, 2), [])]
    assert log.index(("write", 2, b"a3")) > log.index(("unread", Position(1, 1), Position(1, 2), []))
