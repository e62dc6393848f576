"""Where bookies declare their rack: ``/ledgers/racks/<bookie-id>``, a persistent node whose
data is the rack name (UTF-8), written by the bookie at start from ``BookieConfig.rack`` (and
removed when the rack is empty). Persistent, not the ephemeral registration: a bookie that is
down keeps its rack, so the auditor and workers still know where its surviving peers are.
Nothing here matches the ledger metadata's own paths, so ``list_ledger_ids`` never sees it.

Readers (the replication worker; placement of new ensembles) take ``read_racks`` as a
``{bookie id: rack}`` map and pass it to the pure placement code; a bookie with no node has
no rack (placement treats it as unknown, never as a rack of its own)."""

from __future__ import annotations

import asyncio

from bookie.client.ledger_manager import check_bookie_id
from pulsarlite.errors import MetadataNotFoundError
from pulsarlite.metadata import MetadataExistsError, MetadataStore
from pulsarlite.metadata_layout import RACKS_ROOT
from pulsarlite.metadata_layout import rack_path as _rack_path

RACK_BYTES_MAX = 256


def rack_path(bookie_id: str) -> str:
    check_bookie_id(bookie_id)
    return _rack_path(bookie_id)


async def publish_rack(store: MetadataStore, bookie_id: str, rack: str) -> None:
    """Record ``bookie_id``'s rack (idempotent); an empty rack removes the node."""
    path = rack_path(bookie_id)
    if not rack:
        try:
            await store.delete(path)
        except MetadataNotFoundError:
            pass
        return
    data = rack.encode()
    if len(data) > RACK_BYTES_MAX:
        raise ValueError(f"rack name longer than {RACK_BYTES_MAX} bytes")
    try:
        await store.create(path, data, make_parents=True)
    except MetadataExistsError:
        await store.set(path, data, -1)


async def read_racks(store: MetadataStore) -> dict[str, str]:
    """``{bookie id: rack}`` of every bookie that declared one."""
    names = sorted(await store.children(RACKS_ROOT))
    got = await asyncio.gather(*(store.get_or_none(_rack_path(n)) for n in names))
    return {n: g[0].decode(errors="replace") for n, g in zip(names, got) if g is not None and g[0]}
