"""Process-wide settings shared by the server processes (bookie, broker)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import typing

from pulsarlite.config import load_toml
from pulsarlite.errors import PulsarliteError

T = typing.TypeVar("T")


def write_private_file(path: "str | os.PathLike", data: bytes | str) -> None:
    """Write ``data`` to ``path`` readable and writable by its owner only (0600), also when the
    file exists already with a wider mode (O_CREAT keeps an existing file's mode): tokens, keys
    and configs that may hold secrets."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(data.encode() if isinstance(data, str) else data)

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


# How long a thread may hold the GIL while another waits for it (CPython's default: 5 ms). The
# servers' event loop shares the GIL with worker threads that run Python (the offloader's
# encoding, the bookie's write-cache flush, tier reads); at 5 ms every hand-back delays the loop
# by up to 5 ms. PULSARLITE_GIL_SWITCH_INTERVAL_MS overrides it (benchmarks).
GIL_SWITCH_INTERVAL_S = 0.005
GIL_SWITCH_INTERVAL_ENV = "PULSARLITE_GIL_SWITCH_INTERVAL_MS"


def set_gil_switch_interval(environ=os.environ) -> float:
    """Apply GIL_SWITCH_INTERVAL_S, or the environment's override (ms, > 0); returns seconds."""
    interval_s = GIL_SWITCH_INTERVAL_S
    raw = environ.get(GIL_SWITCH_INTERVAL_ENV, "").strip()
    if raw:
        try:
            value_ms = float(raw)
        except ValueError:
            value_ms = -1.0
        if not 0 < value_ms <= 1000:
            raise PulsarliteError(f"{GIL_SWITCH_INTERVAL_ENV}={raw!r}: expected milliseconds in (0, 1000]")
        interval_s = value_ms / 1000
    sys.setswitchinterval(interval_s)
    return interval_s


def start_server_process(name: str, config_cls: type[T], config_path: str | None,
                         overlay: typing.Callable[[T], T] | None = None) -> T | None:
    """What every server process does first: GC tuning, logging to stderr, the TOML config
    loaded (the defaults without a path), ``overlay`` applied (e.g. ``--pulsar-conf``), validated
    (None after printing the reason: the caller exits with 2), uvloop."""
    tune_gc_for_server()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    try:
        set_gil_switch_interval()
        config = load_toml(config_cls, config_path) if config_path else config_cls()
        if overlay is not None:
            config = overlay(config)
    except PulsarliteError as e:
        print(f"pulsarlite {name}: {e}", file=sys.stderr)
        return None
    import uvloop

    uvloop.install()
    return config


def run_server(name: str, main: typing.Coroutine, logger: logging.Logger) -> int:
    """Run a server process's ``main`` coroutine to its end: 0, or 2 when it refused to start
    (ConfigError, MetadataAuthError: e.g. a wrong ZooKeeper credential), the reason logged and
    printed. Other errors propagate (the caller may map them to their own exit codes)."""
    from pulsarlite.errors import ConfigError
    from pulsarlite.metadata import MetadataAuthError
    try:
        asyncio.run(main)
    except (ConfigError, MetadataAuthError) as e:
        logger.error("%s refused to start error=%s", name, e)
        print(f"pulsarlite {name}: {e}", file=sys.stderr)
        return 2
    return 0
