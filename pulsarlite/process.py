"""Process-wide settings shared by the server processes (bookie, broker)."""

from __future__ import annotations

import gc
import logging
import sys
import typing

from pulsarlite.config import load_toml
from pulsarlite.errors import PulsarliteError

T = typing.TypeVar("T")

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


def start_server_process(name: str, config_cls: type[T], config_path: str) -> T | None:
    """What every server process does first: GC tuning, logging to stderr, the TOML config
    loaded and validated (None after printing the reason: the caller exits with 2), uvloop."""
    tune_gc_for_server()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    try:
        config = load_toml(config_cls, config_path)
    except PulsarliteError as e:
        print(f"pulsarlite {name}: {e}", file=sys.stderr)
        return None
    import uvloop

    uvloop.install()
    return config
