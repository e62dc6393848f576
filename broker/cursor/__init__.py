"""Cursors: a subscription's (durable) or a reader's (non-durable) position in a managed ledger.

- :mod:`.core`: :class:`CursorState`, the pure state (mark-delete position, acked ranges,
  partly acked batches), its bounded JSON form and the wire ack_set helpers;
- :mod:`.shell`: :class:`ManagedCursor`, persisted (debounced, compare-and-set) at
  ``cursor_path`` (pulsarlite/metadata_layout.py: a child of the managed ledger's znode); :func:`list_cursors`; :func:`stored_mark_delete`, :func:`advance_stored_cursor` and :func:`stored_cursors` for
  stored cursors nobody has loaded (retention moves idle subscriptions through them; admin stats
  read them).
"""

from broker.cursor.core import (CursorConfig, CursorState, InvalidAckError, ack_set_to_indexes, bits_to_words,
                                indexes_to_ack_set, words_to_bits)
from broker.cursor.shell import (CursorClosedError, CursorError, CursorFencedError, ManagedCursor,
                                 ManagedCursorState, advance_stored_cursor, list_cursors, stored_cursors,
                                 stored_mark_delete)

__all__ = [
    "CursorClosedError", "CursorConfig", "CursorError", "CursorFencedError", "CursorState", "InvalidAckError",
    "ManagedCursor", "ManagedCursorState", "ack_set_to_indexes", "advance_stored_cursor", "bits_to_words",
    "indexes_to_ack_set", "list_cursors", "stored_cursors", "stored_mark_delete", "words_to_bits",
]
