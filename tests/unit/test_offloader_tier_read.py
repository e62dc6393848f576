"""The broker's tier read path and object checks against a real file:// store (no cluster):
encode + upload, verify (and its corruption detection), and TierReadCache reads by row group,
whole-object and ranged, with the same entries back (invariant 7)."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

import offload.tier as offloader
from broker.managed_ledger.core import LedgerInfo, LedgerInfoState
from offload.shell import CorruptObjectError
from offload.tier import Tier, TierReadCache, encode_and_upload, verify_object
from offload.core import OffloadRecord, OffloadState
from pulsarlite.wire.entry import Message, build_batch_entry, build_entry

KEY = "public/default/t/ledger-7-0123456789abcdef.parquet"


def message(i: int, batch_index: int = -1) -> Message:
    return Message(os.urandom(200 + i % 50), f"k{i % 3}", False, None, {"i": str(i)}, None, i, False, False,
                   False, batch_index)


def entries(n: int) -> list[tuple[int, bytes]]:
    out = []
    for e in range(n):
        if e % 2:
            out.append((e, build_batch_entry([message(e * 10 + j, j) for j in range(5)], producer_name="p",
                                             sequence_id=e * 10, publish_time_ms=1_700_000_000_000 + e)))
        else:
            out.append((e, build_entry(message(e), producer_name="p", sequence_id=e,
                                       publish_time_ms=1_700_000_000_000 + e)))
    return out


@pytest.fixture
def tier(tmp_path):
    return Tier(f"file://{tmp_path}", None)


def offloaded_info(tier: Tier, stats, n: int) -> LedgerInfo:
    record = OffloadRecord(OffloadState.OFFLOADED, tier.uri_of(KEY), "0123456789abcdef", stats, offloaded_ms=1)
    return LedgerInfo(7, LedgerInfoState.CLOSED, entries=n, size_bytes=1, min_publish_time_ms=0,
                      max_publish_time_ms=0, offload=record)


def test_encode_upload_verify_and_detect_corruption(tier, tmp_path):
    original = entries(40)
    stats = encode_and_upload(tier, KEY, 7, original, partition=-1, row_group_bytes=4_000)
    assert stats.rows == 20 + 20 * 5
    verify_object(tier, KEY, stats, 40)
    with pytest.raises(CorruptObjectError):
        verify_object(tier, KEY, stats, 41)                  # an entry missing from the object
    path = tmp_path / KEY
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObjectError):
        verify_object(tier, KEY, stats, 40)
    path.unlink()
    with pytest.raises(CorruptObjectError):
        verify_object(tier, KEY, stats, 40)                  # gone


@pytest.mark.parametrize("whole_object", [True, False])
def test_tier_reads_give_back_the_same_entries_by_row_group(tier, monkeypatch, whole_object):
    if not whole_object:
        monkeypatch.setattr(offloader, "SMALL_OBJECT_BYTES", 0)     # ranged GETs per row group
    original = entries(40)
    stats = encode_and_upload(tier, KEY, 7, original, partition=-1, row_group_bytes=4_000)
    info = offloaded_info(tier, stats, 40)
    pool = ThreadPoolExecutor(2)

    async def run(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def main():
        cache = TierReadCache(tier, run, bytes_max=1 << 20)
        got = await cache.read(info, 0, 39)
        some = await cache.read(info, 13, 17)
        await asyncio.sleep(0.2)                             # let read-ahead settle
        return cache, got, some

    cache, got, some = asyncio.run(main())
    pool.shutdown()
    assert [e for e, _ in got] == list(range(40))
    assert got == original          # uncompressed entries come back byte for byte
    assert some == original[13:18]
    assert cache.row_groups_read >= 2 and cache.bytes <= 1 << 20
