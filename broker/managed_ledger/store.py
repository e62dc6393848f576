"""Compare-and-set access to managed-ledger lists in ZooKeeper.

A managed ledger is named like Pulsar's: ``<tenant>/<namespace>/persistent/<topic>``; its list
lives at ``managed_ledger_path(name)`` (pulsarlite/metadata_layout.py), and the document's types
and codec are pulsarlite/ledger_list.py (one codec, shared with the Spark source). Only the owner
writes, always at the version it read or wrote last.
"""

from __future__ import annotations

from pulsarlite.errors import MetadataError
from pulsarlite.ledger_list import ManagedLedgerMetadata, decode
from pulsarlite.metadata import MetadataStore
from pulsarlite.metadata_layout import managed_ledger_path, managed_ledgers_of_namespace_path


# -- access ------------------------------------------------------------------------------------
class ManagedLedgerStore:
    """Read / create / compare-and-set / delete of managed-ledger lists over a MetadataStore."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    async def read(self, name: str) -> tuple[ManagedLedgerMetadata, int, bytes] | None:
        """(metadata, version, raw bytes), or None if there is no such managed ledger."""
        path = managed_ledger_path(name)
        got = await self.store.get_or_none(path)
        if got is None:
            return None
        data, version = got
        try:
            return decode(data), version, data
        except ValueError as e:
            err = MetadataError(f"managed ledger {name}: {path}: {e}")
            err.retriable = False
            raise err from None

    async def create(self, name: str, data: bytes) -> int:
        """MetadataExistsError if it exists; returns the version (0)."""
        await self.store.create(managed_ledger_path(name), data, make_parents=True)
        return 0

    async def write(self, name: str, data: bytes, version: int) -> int:
        """Compare-and-set at ``version``; MetadataVersionConflict if it changed."""
        if version < 0:
            raise ValueError("write needs the version read or written last (>= 0)")
        return await self.store.set(managed_ledger_path(name), data, version)

    async def delete(self, name: str, version: int) -> None:
        """Delete the list at ``version`` (children such as cursors go with it)."""
        await self.store.delete(managed_ledger_path(name), version, recursive=True)

    async def list_names(self, tenant: str, namespace: str) -> list[str]:
        topics = await self.store.children(managed_ledgers_of_namespace_path(tenant, namespace))
        return [f"{tenant}/{namespace}/persistent/{t}" for t in topics]


__all__ = ["ManagedLedgerStore"]
