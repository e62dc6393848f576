"""Process-wide settings shared by the server processes (bookie, broker)."""

from __future__ import annotations

import gc

# Young-generation collections after this many net allocations (CPython's default is 700): a
# server allocates a few objects per message, so the default runs a collection every few
# hundred messages and a full one often enough to stall the loop for tens of milliseconds with
# a large heap. Measured in BENCHMARKS.md ("GC in the server processes").
GC_THRESHOLDS = (100_000, 50, 1_000)


def tune_gc_for_server() -> None:
    """Freeze what start-up allocated (imports, config) out of the collector's reach and raise
    the collection thresholds. Call once, early in a long-running server process."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
