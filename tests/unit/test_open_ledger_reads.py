"""Opening a ledger WITHOUT recovery (LedgerClient.open_ledger(recovery=False): a Spark scan,
a tailing subscription, the offloader) reads an open ledger up to its LAC and disturbs nobody:

- it never returns an entry beyond the LAC, even when bookies already hold later entries
  (written, not yet confirmed: recovery may still close the ledger before them);
- no request it sends carries the fence flag, and the writer keeps adding and closes its
  ledger normally afterwards (checked against real bookie servers).

Each check is shown to catch a planted defect (an off-by-one in the readable bound, the LAC
taken from the wrong field, the fence flag sent by a non-recovery open or LAC refresh).
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.client import ledger_client as ledger_client_module
from bookie.client import reader as reader_module
from bookie.client.ledger_client import LedgerClient
from bookie.client.metadata import LedgerMetadata, LedgerState
from bookie.client.reader import LedgerReader
from bookie.server import BookieService
from pulsarlite.checksum import entry_checksum
from pulsarlite.config import LedgerClientConfig
from pulsarlite.errors import LedgerFencedError, MetadataVersionConflict, NoSuchEntryError
from test_bookie_fencing import real_bookie

LEDGER = 21


class MemoryLedgerManager:
    """The LedgerManager calls the client makes, on a dict (metadata through its JSON codec)."""

    def __init__(self, bookies: list[str] = ()) -> None:
        self.bookies = list(bookies)
        self.ledgers: dict[int, tuple[bytes, int]] = {}
        self.next_id = LEDGER

    def put(self, md: LedgerMetadata) -> None:
        self.ledgers[md.ledger_id] = (md.to_json(), 0)

    async def writable_bookies(self) -> list[str]:
        return list(self.bookies)

    async def new_ledger_id(self) -> int:
        self.next_id += 1
        return self.next_id

    async def create(self, md: LedgerMetadata) -> int:
        self.put(md)
        return 0

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        data, version = self.ledgers[ledger_id]
        return LedgerMetadata.from_json(data), version

    async def write(self, md: LedgerMetadata, version: int) -> int:
        _, current = self.ledgers[md.ledger_id]
        if current != version:
            raise MetadataVersionConflict(f"ledger {md.ledger_id}: version {version} != {current}")
        self.ledgers[md.ledger_id] = (md.to_json(), current + 1)
        return current + 1


def client_on(manager: MemoryLedgerManager, pool=None, **config) -> LedgerClient:
    client = LedgerClient(None, LedgerClientConfig(**config), owns_store=False)
    client.ledger_manager = manager
    if pool is not None:
        client.pool = pool
    return client


# -- fake bookies holding a precise state --------------------------------------------------

def stored(entry_id: int, lac: int) -> pb.Entry:
    payload = b"entry-%d" % entry_id
    return pb.Entry(ledger_id=LEDGER, entry_id=entry_id, lac=lac, length=0, payload=payload,
                    checksum=entry_checksum(LEDGER, entry_id, lac, 0, payload))


class FakeBookie:
    """Entries as a bookie stores them (each with the LAC it was sent with); answers ReadLac
    and reads like the real server (ReadLac: the highest LAC carried by a stored entry, and
    the highest entry id stored). Records every fence flag it is sent."""

    def __init__(self, lacs: dict[int, int]) -> None:
        self.entries = {i: stored(i, lac) for i, lac in lacs.items()}
        self.fence_flags: list[bool] = []

    async def read_lac(self, ledger_id: int, *, fence: bool = False) -> pb.ReadLacResponse:
        self.fence_flags.append(fence)
        if not self.entries:
            return pb.ReadLacResponse(code=pb.NO_SUCH_LEDGER, lac=-1, last_entry_id=-1)
        return pb.ReadLacResponse(code=pb.OK, lac=max(e.lac for e in self.entries.values()),
                                  last_entry_id=max(self.entries))

    async def read(self, ledger_id: int, first: int, last: int, *, fence: bool = False,
                   max_bytes: int = 0) -> pb.ReadResponse:
        self.fence_flags.append(fence)
        out = []
        for i in range(first, last + 1):
            if i not in self.entries:
                break
            out.append(self.entries[i])
        return pb.ReadResponse(code=pb.OK if out else pb.NO_SUCH_ENTRY, entries=out, lac=-1)


class FakePool:
    def __init__(self, bookies: dict[str, FakeBookie]) -> None:
        self.bookies = bookies

    def get(self, bookie_id: str) -> FakeBookie:
        return self.bookies[bookie_id]


# The writer of an E3/Qw3/Qa2 ledger confirmed entries 0..6 (entry i went out carrying LAC
# i - 1) and sent 7 and 8 while the LAC was 6; a holds 0..8, b 0..7, c 0..6 (their acks for 7
# and 8 are on the way). The highest LAC carried by a stored entry is 6: readable through 6.
WRITER_LAC = 6
LACS = [-1, 0, 1, 2, 3, 4, 5, 6, 6]


def open_state() -> tuple[FakePool, MemoryLedgerManager]:
    pool = FakePool({"a": FakeBookie({i: LACS[i] for i in range(9)}),
                     "b": FakeBookie({i: LACS[i] for i in range(8)}),
                     "c": FakeBookie({i: LACS[i] for i in range(7)})})
    manager = MemoryLedgerManager()
    manager.put(LedgerMetadata(ledger_id=LEDGER, ensemble_size=3, write_quorum=3, ack_quorum=2,
                               ensembles=((0, ("a", "b", "c")),)))
    return pool, manager


async def read_through(reader: LedgerReader, first: int, last: int) -> list[int]:
    return [e.entry_id for e in await reader.read(first, last)]


async def check_reads_stop_at_the_lac() -> None:
    """Raises AssertionError if a non-recovery reader returns an entry beyond the LAC (or
    sends the fence flag)."""
    pool, manager = open_state()
    client = client_on(manager, pool, read_entries_per_request_max=2)
    reader = await client.open_ledger(LEDGER, recovery=False)
    lac = WRITER_LAC
    assert reader.last_readable_entry_id <= lac, \
        f"open ledger readable through {reader.last_readable_entry_id}, beyond its LAC {lac}"
    assert reader.last_readable_entry_id == lac, reader.last_readable_entry_id
    assert await read_through(reader, 0, lac) == list(range(lac + 1))
    for last in (lac + 1, lac + 2):
        for first in (0, lac, lac + 1):
            if first > last:
                continue
            try:
                got = await read_through(reader, first, last)
            except NoSuchEntryError:
                continue
            raise AssertionError(f"open ledger: entries {got} returned, beyond its LAC {lac}")
    # the LAC refreshed while nothing more was confirmed: the same bound
    assert await reader.refresh_lac() <= lac, f"refreshed LAC {reader.last_readable_entry_id} beyond {lac}"
    # the writer confirms 7 and 8 and sends 9 carrying LAC 8, to a: readable through 8 now
    pool.bookies["a"].entries[9] = stored(9, 8)
    pool.bookies["b"].entries[8] = stored(8, 6)
    lac = 8
    assert await reader.refresh_lac() == lac, reader.last_readable_entry_id
    assert await read_through(reader, 7, lac) == [7, 8]
    with pytest.raises(NoSuchEntryError):
        got = await read_through(reader, 7, lac + 1)
        raise AssertionError(f"open ledger: entries {got} returned, beyond its LAC {lac}")
    # a fresh open agrees
    reader = await client.open_ledger(LEDGER, recovery=False)
    assert reader.last_readable_entry_id == lac, \
        f"open ledger readable through {reader.last_readable_entry_id}, its LAC is {lac}"
    flags = {name: b.fence_flags for name, b in pool.bookies.items()}
    assert not any(any(f) for f in flags.values()), f"a non-recovery reader sent the fence flag: {flags}"


async def test_an_open_ledger_is_read_up_to_its_lac_and_no_further():
    await check_reads_stop_at_the_lac()


async def test_after_an_ensemble_change_the_fragment_start_bounds_the_lac():
    """The new fragment's bookies hold nothing yet: the ensemble change itself proves entry
    (fragment start - 1) confirmed, and nothing beyond it is readable."""
    pool = FakePool({"a": FakeBookie({i: i - 1 for i in range(5)}),
                     "b": FakeBookie({i: i - 1 for i in range(5)}),
                     "c": FakeBookie({i: i - 1 for i in range(6)}),    # 5 sent before the change
                     "d": FakeBookie({})})
    manager = MemoryLedgerManager()
    manager.put(LedgerMetadata(ledger_id=LEDGER, ensemble_size=3, write_quorum=3, ack_quorum=2,
                               ensembles=((0, ("a", "b", "c")), (5, ("a", "b", "d")))))
    reader = await client_on(manager, pool).open_ledger(LEDGER, recovery=False)
    assert reader.last_readable_entry_id == 4
    assert await read_through(reader, 0, 4) == [0, 1, 2, 3, 4]
    with pytest.raises(NoSuchEntryError):
        await reader.read(0, 5)


def _lac_plus_one(self) -> int:
    if self.metadata.state is LedgerState.CLOSED:
        return self.metadata.last_entry_id
    return self.last_add_confirmed + 1


async def _lac_from_last_entry(metadata, pool, *, fence):
    """reader.read_lac taking each bookie's last stored entry for its LAC."""
    results = await asyncio.gather(*(pool.get(b).read_lac(metadata.ledger_id, fence=fence)
                                     for b in metadata.current_ensemble), return_exceptions=True)
    lasts = [r.last_entry_id for r in results if isinstance(r, pb.ReadLacResponse) and r.code == pb.OK]
    return max(max(lasts, default=-1), metadata.last_fragment_first_entry - 1)


@pytest.mark.parametrize("defect", ["readable through LAC + 1", "LAC from the last entry stored"])
async def test_planted_an_open_ledger_readable_beyond_its_lac_is_caught(monkeypatch, defect):
    if defect == "readable through LAC + 1":
        monkeypatch.setattr(LedgerReader, "last_readable_entry_id", property(_lac_plus_one))
    else:
        monkeypatch.setattr(ledger_client_module, "read_lac", _lac_from_last_entry)
        monkeypatch.setattr(reader_module, "read_lac", _lac_from_last_entry)
    with pytest.raises(AssertionError, match="beyond its LAC"):
        await check_reads_stop_at_the_lac()


# -- against real bookie servers -----------------------------------------------------------

class FenceFlagSpy:
    """Records the fence flag of every read and ReadLac the real servers get (changes nothing)."""

    def __init__(self, monkeypatch) -> None:
        self.flags: list[tuple[str, int, bool]] = []
        for method in ("read", "read_lac"):
            original = getattr(BookieService, method)

            async def spying(service, request, original=original, method=method):
                self.flags.append((method, request.ledger_id, request.fence))
                return await original(service, request)
            monkeypatch.setattr(BookieService, method, spying)

    def fenced(self, ledger_id: int) -> list[str]:
        return [m for m, lid, fence in self.flags if lid == ledger_id and fence]


async def check_open_without_recovery_leaves_the_writer_alone(tmp_path, spy: FenceFlagSpy) -> None:
    """A writer on three real bookies; another client opens its ledger without recovery and
    tails it while the writer goes on. Raises AssertionError if anything got fenced."""
    async with contextlib.AsyncExitStack() as stack:
        bookies = [await stack.enter_async_context(real_bookie(tmp_path, f"bookie-{i}")) for i in range(3)]
        ids = [b.cfg.effective_bookie_id for b in bookies]
        manager = MemoryLedgerManager(ids)
        owner = client_on(manager, add_timeout_ms=10_000)
        tailer = client_on(manager, read_entries_per_request_max=7)
        stack.push_async_callback(owner.close)
        stack.push_async_callback(tailer.close)
        writer = await owner.create_ledger(3, 3, 2)
        ledger_id = writer.ledger_id
        payloads = [b"payload-%d" % i for i in range(60)]
        for p in payloads[:20]:
            await writer.add(p)

        reader = await tailer.open_ledger(ledger_id, recovery=False)
        assert reader.last_readable_entry_id <= 19
        seen = [e.payload for e in await reader.read(0, reader.last_readable_entry_id)]
        for p in payloads[20:40]:                  # the writer goes on after the open ...
            await writer.add(p)
        await reader.refresh_lac()                 # ... and after a LAC refresh
        seen += [e.payload for e in await reader.read(len(seen), reader.last_readable_entry_id)]
        for p in payloads[40:]:
            await writer.add(p)
        reader = await tailer.open_ledger(ledger_id, recovery=False)
        seen += [e.payload for e in await reader.read(len(seen), reader.last_readable_entry_id)]
        assert seen == payloads[:len(seen)] and len(seen) >= 39, len(seen)

        md = await writer.close()
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 59, md
        assert not spy.fenced(ledger_id), f"a non-recovery open or read sent the fence flag: {spy.fenced(ledger_id)}"
        fenced_on = [b.cfg.effective_bookie_id for b in bookies if b.store.ledger_info(ledger_id).fenced]
        assert not fenced_on, f"ledger fenced on {fenced_on} though nobody recovered it"
        reader = await tailer.open_ledger(ledger_id, recovery=False)
        assert [e.payload for e in await reader.read(0, 59)] == payloads


async def test_open_without_recovery_never_fences_the_writer(tmp_path, monkeypatch):
    await check_open_without_recovery_leaves_the_writer_alone(tmp_path, FenceFlagSpy(monkeypatch))


async def test_recovery_does_fence(tmp_path, monkeypatch):
    """The spy sees fence flags when they are sent: an open WITH recovery fences the writer."""
    spy = FenceFlagSpy(monkeypatch)
    async with contextlib.AsyncExitStack() as stack:
        bookies = [await stack.enter_async_context(real_bookie(tmp_path, f"bookie-{i}")) for i in range(3)]
        manager = MemoryLedgerManager([b.cfg.effective_bookie_id for b in bookies])
        owner, other = client_on(manager, add_timeout_ms=10_000), client_on(manager)
        stack.push_async_callback(owner.close)
        stack.push_async_callback(other.close)
        writer = await owner.create_ledger(3, 3, 2)
        for i in range(5):
            await writer.add(b"x%d" % i)
        reader = await other.open_ledger(writer.ledger_id, recovery=True)
        assert reader.metadata.is_closed and reader.metadata.last_entry_id == 4
        assert "read_lac" in spy.fenced(writer.ledger_id)
        with pytest.raises(LedgerFencedError):
            await writer.add(b"after the takeover")


_REAL_READ_LAC = reader_module.read_lac


async def _fencing_read_lac(metadata, pool, *, fence):
    return await _REAL_READ_LAC(metadata, pool, fence=True)


@pytest.mark.parametrize("defect", ["open sends the fence flag", "LAC refresh sends the fence flag"])
async def test_planted_a_non_recovery_open_that_fences_is_caught(tmp_path, monkeypatch, defect):
    """Planted defect: open_ledger(recovery=False) (or LedgerReader.refresh_lac, reader.py's
    own import of read_lac) reads the LAC with the fence flag: the writer gets fenced."""
    module = ledger_client_module if defect == "open sends the fence flag" else reader_module
    monkeypatch.setattr(module, "read_lac", _fencing_read_lac)
    with pytest.raises((AssertionError, LedgerFencedError), match="fence"):
        await check_open_without_recovery_leaves_the_writer_alone(tmp_path, FenceFlagSpy(monkeypatch))
