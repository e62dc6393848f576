"""Ledger metadata in ZooKeeper (docs/protocol.md#zookeeper-layout): id generation, CRUD with compare-and-set,
listing, and the registry of live bookies.

Layout::

    /ledgers/idgen/ID-<seq>                    transient sequential nodes: ledger id generation
    /ledgers/000/0000/0000/0000/L0001          ledger metadata (JSON, see metadata.py)
    /ledgers/available/<bookie-id>             ephemeral: writable bookies
    /ledgers/available/readonly/<bookie-id>    ephemeral: read-only bookies

Ids come from ZooKeeper sequential nodes: the suffix is the parent's child-change counter, which
only grows (creates and deletes both count) and is persisted, so ids never repeat, even across
restarts, as long as /ledgers/idgen is not deleted. They increase by 2 per id (create + delete);
the counter is a signed 32-bit int, so one cluster can allocate about 10^9 ledger ids.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any, Callable, Iterable

from bookie.client.metadata import LedgerMetadata
from pulsarlite.errors import MetadataError, MetadataNotFoundError
from pulsarlite.metadata import ChildrenWatch, MetadataExistsError, MetadataStore
from pulsarlite.metadata_documents import bookie_registration_data
from pulsarlite.metadata_layout import (AVAILABLE_PATH, IDGEN_PREFIX, LEDGERS_ROOT, READONLY_CHILD,
                                       READONLY_PATH, ledger_id_from_path, ledger_path)
from pulsarlite.metadata_layout import bookie_registration_path as _registration_path

log = logging.getLogger(__name__)


_TOP_LEVEL = re.compile(r"^\d{3}$")
_MIDDLE_LEVEL = re.compile(r"^\d{4}$")
_LEAF = re.compile(r"^L\d{4}$")

BookiesCallback = Callable[[list[str], list[str]], Any]


def bookie_registration_path(bookie_id: str, *, read_only: bool) -> str:
    check_bookie_id(bookie_id)
    return _registration_path(bookie_id, read_only=read_only)


def check_bookie_id(bookie_id: str) -> None:
    """ValueError unless ``bookie_id`` can name a znode under the bookie registrations (and
    under autorecovery's per-bookie paths)."""
    if not bookie_id or "/" in bookie_id or bookie_id in (READONLY_CHILD, ".", ".."):
        raise ValueError(f"invalid bookie id {bookie_id!r}")


class LedgerManager:
    """Ledger metadata CRUD over a :class:`MetadataStore`. Writes are compare-and-set on the
    znode version: callers read (metadata, version), apply a pure transform, and ``write``."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    # -- ids ----------------------------------------------------------------------------------
    async def new_ledger_id(self) -> int:
        """A ledger id never handed out before (unique and increasing)."""
        path = await self.store.create(IDGEN_PREFIX, sequence=True, make_parents=True)
        try:
            ledger_id = int(path[len(IDGEN_PREFIX):])
        except ValueError:
            raise MetadataError(f"unexpected id generation node {path}") from None
        try:
            await self.store.delete(path)
        except MetadataError as e:  # the id is ours anyway; a leftover node is harmless
            log.warning("could not delete id generation node %s: %s", path, e)
        return ledger_id

    # -- metadata -----------------------------------------------------------------------------
    async def create(self, md: LedgerMetadata) -> int:
        """Store new metadata; returns its version (0). MetadataExistsError if the id is taken."""
        await self.store.create(ledger_path(md.ledger_id), md.to_json(), make_parents=True)
        return 0

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """(metadata, version). MetadataNotFoundError if there is no such ledger."""
        path = ledger_path(ledger_id)
        try:
            data, version = await self.store.get(path)
        except MetadataNotFoundError:
            raise MetadataNotFoundError(f"ledger {ledger_id}: no metadata at {path}") from None
        try:
            md = LedgerMetadata.from_json(data)
        except ValueError as e:
            err = MetadataError(f"ledger {ledger_id}: malformed metadata at {path}: {e}")
            err.retriable = False
            raise err from None
        if md.ledger_id != ledger_id:
            err = MetadataError(f"ledger {ledger_id}: metadata at {path} names ledger {md.ledger_id}")
            err.retriable = False
            raise err
        return md, version

    async def write(self, md: LedgerMetadata, version: int) -> int:
        """Compare-and-set the metadata at ``version``; returns the new version.
        MetadataVersionConflict if it changed since read (re-read, re-apply, retry)."""
        if version < 0:
            raise ValueError("write needs the version that was read (>= 0)")
        return await self.store.set(ledger_path(md.ledger_id), md.to_json(), version)

    async def delete(self, ledger_id: int, version: int = -1) -> None:
        """Delete a ledger's metadata (at ``version``, -1: any). MetadataNotFoundError if absent."""
        await self.store.delete(ledger_path(ledger_id), version)

    async def exists(self, ledger_id: int) -> bool:
        return await self.store.exists(ledger_path(ledger_id))

    async def list_ledger_ids(self) -> list[int]:
        """Every ledger id with metadata, ascending (walks the hierarchy; ignores available/,
        cookies/, idgen/ and anything else that is not a ledger node)."""
        top = [name for name in await self.store.children(LEDGERS_ROOT) if _TOP_LEVEL.match(name)]
        paths = [f"{LEDGERS_ROOT}/{name}" for name in top]
        for _ in range(3):
            paths = await self._expand(paths, _MIDDLE_LEVEL)
        leaves = await self._expand(paths, _LEAF)
        return sorted(ledger_id_from_path(p) for p in leaves)

    async def ledgers_naming(self, bookies: Iterable[str]) -> list[LedgerMetadata]:
        """The metadata of every ledger whose ensembles or ``under_replicated_bookies`` name one
        of ``bookies``, ascending by id (ledgers deleted meanwhile are skipped)."""
        wanted = frozenset(bookies)
        out = []
        for ledger_id in await self.list_ledger_ids():
            try:
                md, _ = await self.read(ledger_id)
            except MetadataNotFoundError:
                continue
            if wanted & (md.all_bookies() | frozenset(md.under_replicated_bookies)):
                out.append(md)
        return out

    async def _expand(self, parents: list[str], pattern: re.Pattern) -> list[str]:
        listed = await asyncio.gather(*(self.store.children(p) for p in parents))
        return [f"{parent}/{name}" for parent, names in zip(parents, listed)
                for name in names if pattern.match(name)]

    # -- bookies ------------------------------------------------------------------------------
    async def writable_bookies(self) -> list[str]:
        return [b for b in await self.store.children(AVAILABLE_PATH) if b != READONLY_CHILD]

    async def readonly_bookies(self) -> list[str]:
        return await self.store.children(READONLY_PATH)

    async def watch_bookies(self, callback: BookiesCallback) -> tuple[ChildrenWatch, ChildrenWatch]:
        """``callback(writable, readonly)`` (sorted bookie ids) now and whenever either set
        changes; runs in the loop. Returns the two watch handles (cancel both to stop)."""
        state: dict[str, list[str] | None] = {"writable": None, "readonly": None}

        def changed(key: str, names: list[str]) -> None:
            if key == "writable":
                names = [b for b in names if b != READONLY_CHILD]
            if state[key] == names:
                return
            state[key] = names
            if state["writable"] is not None and state["readonly"] is not None:
                callback(list(state["writable"]), list(state["readonly"]))

        writable = await self.store.watch_children(AVAILABLE_PATH, lambda n: changed("writable", n))
        try:
            readonly = await self.store.watch_children(READONLY_PATH, lambda n: changed("readonly", n))
        except BaseException:
            writable.cancel()
            raise
        return writable, readonly




async def register_bookie(store: MetadataStore, bookie_id: str, *, read_only: bool,
                          stale_wait_s: float = 30.0, metrics_address: str = "") -> str:
    """Register a live bookie: an ephemeral node under /ledgers/available (or its readonly/ child
    when ``read_only``) owned by this store's session, holding ``bookie_registration_data``
    (pulsarlite/metadata_documents.py); the
    node of the other mode, if this session owns it, is removed after the new one exists.
    Idempotent. A node left by an earlier
    session (a bookie restarted before its old session expired) is waited for, up to
    ``stale_wait_s``; if it is still there, MetadataExistsError (another live bookie with the
    same id?). Returns the registration path. Call again after SessionState.LOST."""
    path = bookie_registration_path(bookie_id, read_only=read_only)
    other = bookie_registration_path(bookie_id, read_only=not read_only)
    data = bookie_registration_data(bookie_id, metrics_address)
    deadline = time.monotonic() + stale_wait_s
    while True:
        try:
            await store.create(path, data, ephemeral=True, make_parents=True)
            break
        except MetadataExistsError:
            stat = await store.stat(path)
            if stat is not None and stat.ephemeral_owner == store.session_id:
                break  # already ours
            if stat is not None and time.monotonic() >= deadline:
                raise MetadataExistsError(
                    f"bookie {bookie_id}: {path} is held by another session "
                    f"(0x{stat.ephemeral_owner:x}) for more than {stale_wait_s}s; "
                    f"is another bookie running with this id?") from None
            if stat is not None:
                await asyncio.sleep(0.1)
    await _delete_if_ours(store, other)
    return path


async def unregister_bookie(store: MetadataStore, bookie_id: str) -> None:
    """Remove this session's registration nodes of ``bookie_id`` (both modes; absent is fine)."""
    for read_only in (False, True):
        await _delete_if_ours(store, bookie_registration_path(bookie_id, read_only=read_only))


async def _delete_if_ours(store: MetadataStore, path: str) -> None:
    stat = await store.stat(path)
    if stat is None or stat.ephemeral_owner != store.session_id:
        return
    try:
        await store.delete(path, stat.version)
    except MetadataNotFoundError:
        pass


__all__ = ["LedgerManager", "register_bookie", "unregister_bookie", "bookie_registration_path"]
