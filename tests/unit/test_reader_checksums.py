"""The ledger reader verifies every entry's CRC32C (invariant 8, network side) and fails over
to another replica of the write set when a copy is corrupt, missing or unreachable."""

from __future__ import annotations

import pytest

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.client.metadata import LedgerMetadata, LedgerState
from bookie.client.reader import LedgerReader
from pulsarlite.checksum import entry_checksum
from pulsarlite.config import LedgerClientConfig
from pulsarlite.errors import BookieUnavailableError, ChecksumError

LEDGER = 7


def good(entry_id: int) -> pb.Entry:
    payload = b"entry-%d" % entry_id
    return pb.Entry(ledger_id=LEDGER, entry_id=entry_id, lac=entry_id - 1, length=0, payload=payload,
                    checksum=entry_checksum(LEDGER, entry_id, entry_id - 1, 0, payload))


def corrupt(entry_id: int) -> pb.Entry:
    e = good(entry_id)
    e.payload = b"ENTRY-%d" % entry_id
    return e


class FakeBookie:
    def __init__(self, entries=None, down=False) -> None:
        self.entries = entries or {}
        self.down = down
        self.reads = 0

    async def read(self, ledger_id, first, last, *, fence=False, max_bytes=0):
        self.reads += 1
        if self.down:
            raise BookieUnavailableError("down")
        out = []
        for i in range(first, last + 1):
            if i not in self.entries:
                break
            out.append(self.entries[i])
        return pb.ReadResponse(code=pb.OK if out else pb.NO_SUCH_ENTRY, entries=out, lac=last)


class FakePool:
    def __init__(self, bookies) -> None:
        self.bookies = bookies

    def get(self, bookie_id):
        return self.bookies[bookie_id]


def reader(bookies, e=3, qw=3, qa=2) -> LedgerReader:
    md = LedgerMetadata(ledger_id=LEDGER, ensemble_size=e, write_quorum=qw, ack_quorum=qa,
                        ensembles=((0, tuple(bookies)),), state=LedgerState.CLOSED, last_entry_id=9)
    return LedgerReader(md, FakePool(bookies), LedgerClientConfig(), last_add_confirmed=9)


async def test_corrupt_replica_is_skipped():
    bookies = {
        "a": FakeBookie({i: corrupt(i) for i in range(10)}),
        "b": FakeBookie({i: good(i) for i in range(10)}),
        "c": FakeBookie({i: good(i) for i in range(10)}),
    }
    entries = await reader(bookies).read(0, 9)
    assert [e.payload for e in entries] == [b"entry-%d" % i for i in range(10)]


async def test_partly_corrupt_reply_keeps_the_verified_prefix_and_fails_over():
    a = {i: good(i) for i in range(10)}
    a[5] = corrupt(5)
    bookies = {"a": FakeBookie(a), "b": FakeBookie({}, down=True), "c": FakeBookie({i: good(i) for i in range(10)})}
    entries = await reader(bookies).read(0, 9)
    assert [e.entry_id for e in entries] == list(range(10))
    assert all(e.payload == b"entry-%d" % e.entry_id for e in entries)


async def test_every_replica_corrupt_raises_checksum_error():
    bookies = {name: FakeBookie({i: corrupt(i) for i in range(10)}) for name in "abc"}
    with pytest.raises(ChecksumError):
        await reader(bookies).read(0, 0)


async def test_striped_reads_use_the_entry_write_set():
    # E3/Qw2: entry i lives on bookies i%3 and (i+1)%3
    names = ["a", "b", "c"]
    stores = {n: {} for n in names}
    for i in range(10):
        for k in (i % 3, (i + 1) % 3):
            stores[names[k]][i] = good(i)
    stores["a"] = {i: corrupt(i) for i in stores["a"]}  # a's copies are all bad
    bookies = {n: FakeBookie(stores[n]) for n in names}
    entries = await reader(bookies, e=3, qw=2, qa=2).read(0, 9)
    assert [e.payload for e in entries] == [b"entry-%d" % i for i in range(10)]


async def test_read_some_returns_one_replys_verified_entries():
    """``read_some`` (the offloader reads ledgers by it: memory bounded by the bookie's reply):
    what one reply holds, verified, from ``first``; the next replica if a copy is corrupt."""
    class ShortReplies(FakeBookie):
        async def read(self, ledger_id, first, last, *, fence=False, max_bytes=0):
            return await super().read(ledger_id, first, min(last, first + 2))     # 3 entries a reply

    a = {i: good(i) for i in range(10)}
    a[0] = corrupt(0)
    bookies = {"a": ShortReplies(a), "b": ShortReplies({i: good(i) for i in range(10)}),
               "c": ShortReplies({i: good(i) for i in range(10)})}
    r = reader(bookies)
    got = await r.read_some(0, 9)
    assert [e.entry_id for e in got] == [0, 1, 2] and got[0].payload == b"entry-0"     # from b: a's is corrupt
    assert [e.entry_id for e in await r.read_some(8, 9)] == [8, 9]
    with pytest.raises(Exception, match="past the last readable entry"):
        await r.read_some(9, 10)
