"""The bookie's storage engine: journal (group-commit WAL), entry logs, index, checkpoints,
garbage collection, behind the asyncio facade :class:`BookieStore`."""

from bookie.storage.store import BookieStore, LedgerInfo, Status, StoredEntry

__all__ = ["BookieStore", "LedgerInfo", "Status", "StoredEntry"]
