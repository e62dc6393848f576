"""Terminated topics (Pulsar's ``terminate``): a topic that takes no more messages, for good.

``/admin/terminated-topics/<tenant>/<ns>/persistent/<topic>`` holds the last entry's position,
JSON ``{"ledgerId": L, "entryId": E}``, written by the topic's owner once every add it had
accepted is done (so nothing can follow that position) and read when the topic loads. Deleting
the topic deletes it (a new topic of the same name starts unterminated).
"""

from __future__ import annotations

import json

from broker.managed_ledger import Position
from pulsarlite.errors import MetadataNotFoundError
from pulsarlite.metadata import MetadataExistsError
from pulsarlite.metadata_layout import terminated_path


async def read_terminated(store, ml_name: str) -> Position | None:
    """The position a topic was terminated at (None: not terminated)."""
    got = await store.get_or_none(terminated_path(ml_name))
    if got is None:
        return None
    doc = json.loads(got[0])
    return Position(int(doc["ledgerId"]), int(doc["entryId"]))


async def write_terminated(store, ml_name: str, position: Position) -> Position:
    """Record the termination; the position recorded first wins (a repeat answers it)."""
    data = json.dumps({"ledgerId": position.ledger_id, "entryId": position.entry_id}).encode()
    try:
        await store.create(terminated_path(ml_name), data, make_parents=True)
    except MetadataExistsError:
        found = await read_terminated(store, ml_name)
        if found is not None:
            return found
    return position


async def delete_terminated(store, ml_name: str) -> None:
    try:
        await store.delete(terminated_path(ml_name))
    except MetadataNotFoundError:
        pass


__all__ = ["delete_terminated", "read_terminated", "write_terminated"]
