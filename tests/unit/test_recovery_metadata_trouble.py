"""Ledger recovery when ZooKeeper fails the close's CAS with an unknown outcome (the request or
its answer lost): the recovery run ends at once and ``LedgerClient.recover`` reads the metadata
again and retries, instead of waiting out the run's timeout (``add_timeout_ms``) with its
metadata task dead. Whether the lost CAS applied or not, the ledger ends CLOSED at the last
entry a quorum holds, and what recover returns is what is stored."""

from __future__ import annotations

import asyncio

import pytest

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.client.metadata import LedgerMetadata, LedgerState
from pulsarlite.errors import MetadataError
from test_open_ledger_reads import LEDGER, FakeBookie, FakePool, MemoryLedgerManager, client_on


class WritableFakeBookie(FakeBookie):
    """A FakeBookie that also takes (recovery) adds: OK on the loop's next turn."""

    def __init__(self, bookie_id: str, lacs: dict[int, int]) -> None:
        super().__init__(lacs)
        self.bookie_id = bookie_id
        self.recovery_adds: list[int] = []

    def send_add(self, entry_id: int, entry: bytes, recovery: bool, callback) -> None:
        self.recovery_adds.append(entry_id)
        asyncio.get_running_loop().call_soon(callback, self.bookie_id, [(entry_id, pb.OK)])


class FlakyCloseManager(MemoryLedgerManager):
    """The first CAS to CLOSED fails with ZooKeeper trouble; ``applied``: it did apply."""

    def __init__(self, applied: bool) -> None:
        super().__init__()
        self.applied = applied
        self.failed_closes = 0

    async def write(self, md: LedgerMetadata, version: int) -> int:
        if md.state is LedgerState.CLOSED and not self.failed_closes:
            self.failed_closes += 1
            if self.applied:
                await super().write(md, version)
            raise MetadataError("connection loss: outcome unknown")
        return await super().write(md, version)


@pytest.mark.parametrize("applied", [False, True], ids=["not-applied", "applied"])
async def test_a_close_cas_with_an_unknown_outcome_is_retried_at_once(applied):
    # entries 0..6, entry i sent with LAC i - 1: every bookie holds all of them
    lacs = {i: i - 1 for i in range(7)}
    pool = FakePool({b: WritableFakeBookie(b, lacs) for b in ("a", "b", "c")})
    manager = FlakyCloseManager(applied)
    manager.put(LedgerMetadata(ledger_id=LEDGER, ensemble_size=3, write_quorum=3, ack_quorum=2,
                               ensembles=((0, ("a", "b", "c")),)))
    # the run's own timeout is far beyond the bound below: only a prompt retry passes
    client = client_on(manager, pool, add_timeout_ms=600_000)
    md = await asyncio.wait_for(client.recover(LEDGER), 20)
    assert manager.failed_closes == 1
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 6
    stored, _ = await manager.read(LEDGER)
    assert stored == md
