"""Ledger recovery that changes the ensemble, on real bookie processes and a real ZooKeeper:
a ledger E3 Qw2 Qa2 whose last entry's write set holds a bookie lost for good (kill -9, never
restarted). Qw == Qa: the entry cannot be re-written to Qa bookies of its write set, so the
recovery replaces the lost bookie from that entry on (a spare bookie of the four), closes the
ledger with the new fragment, and every entry reads back; the spare really holds the entry
its fragment names it for."""

from __future__ import annotations

import asyncio
import logging

import pytest

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.client.metadata import LedgerState
from pulsarlite.errors import LedgerFencedError

from .test_ledgers import connect, name_of, read_all, start_cluster, write_stream

pytestmark = pytest.mark.integration


async def test_recovery_replaces_a_bookie_lost_for_good_when_qw_equals_qa(cluster_factory, caplog):
    cluster = await start_cluster(cluster_factory, 4)
    owner, other = await connect(cluster), await connect(cluster)
    try:
        writer = await owner.create_ledger(3, 2, 2)
        acked: dict[int, bytes] = {}
        await write_stream(writer, 300, acked)
        ensemble = writer.metadata.current_ensemble
        # the last entry (past the LAC the bookies hold) is re-written by recovery to its write
        # set, ensemble[2] and ensemble[0]: lose ensemble[2] for good
        victim = ensemble[299 % 3]
        assert victim in writer.metadata.write_set(299)
        spare = next(cluster.records[n].bookie_id for n in cluster.bookie_names
                     if cluster.records[n].bookie_id not in ensemble)
        await asyncio.to_thread(cluster.kill, name_of(cluster, victim))

        with caplog.at_level(logging.INFO, logger="pulsarlite.ledger_client"):
            reader, got = await read_all(other, writer.ledger_id, recovery=True)
        md = reader.metadata
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 299
        # from F, the lowest entry past the LAC whose write set holds the victim, the spare
        # replaces it; the entries below keep their fragment
        first = md.ensembles[-1][0]
        assert md.ensembles == ((0, ensemble), (first, tuple(spare if b == victim else b for b in ensemble)))
        assert 0 < first <= 299 and victim in writer.metadata.write_set(first)
        assert got == acked
        changes = [r.getMessage() for r in caplog.records if "recovery ensemble change" in r.getMessage()]
        assert changes == [f"ledger recovery ensemble change ledger={writer.ledger_id} replaced={victim} "
                           f"by={spare} from_entry={first}"], changes
        # the replacement holds every entry its fragment names it for, byte for byte
        named = [e for e in range(first, 300) if spare in md.write_set(e)]
        assert named
        for entry_id in named:
            resp = await other.pool.get(spare).read(writer.ledger_id, entry_id, entry_id)
            assert resp.code == pb.OK and [e.payload for e in resp.entries] == [acked[entry_id]]
        # a reader that opens the closed ledger afresh reads it all (the lost bookie's entries
        # from their other replica)
        _, again = await read_all(owner, writer.ledger_id, recovery=False)
        assert again == acked
        with pytest.raises(LedgerFencedError):
            await writer.add(b"after the recovery")
    finally:
        await owner.close()
        await other.close()
