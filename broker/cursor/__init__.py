"""Cursors: a subscription's (durable) or a reader's (non-durable) position in a managed ledger.

- :mod:`.core`: :class:`CursorState`, the pure state (mark-delete position, acked ranges,
  partly acked batches), its bounded JSON form and the wire ack_set helpers;
- :mod:`.shell`: :class:`ManagedCursor`, persisted (debounced, compare-and-set) at
  ``cursor_path`` (pulsarlite/metadata_layout.py: a child of the managed ledger's znode); :func:`list_cursors`.
"""

from broker.cursor.core import (CursorConfig, CursorState, InvalidAckError, ack_set_to_indexes, bits_to_words,
                                indexes_to_ack_set, words_to_bits)
from broker.cursor.shell import (CursorClosedError, CursorError, CursorFencedError, ManagedCursor,
                                 ManagedCursorState, list_cursors)

__all__ = [
    "CursorClosedError", "CursorConfig", "CursorError", "CursorFencedError", "CursorState", "InvalidAckError",
    "ManagedCursor", "ManagedCursorState", "ack_set_to_indexes", "bits_to_words",
    "indexes_to_ack_set", "list_cursors", "words_to_bits",
]
