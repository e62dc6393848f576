"""The `pulsarlite` command. Each family of subcommands lives in its own module and registers
itself here; modules are imported lazily so `pulsarlite --help` stays fast."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module with `add_parser(subparsers)`; the parser's `func(args) -> int` runs it
SUBCOMMANDS = {
    "bookie": "bookie.main",
    "broker": "broker.main",
    "cluster": "pulsarlite.cli_cluster",
    "bookkeeper": "pulsarlite.cli_bookkeeper",
    "admin": "pulsarlite.cli_admin",
    "standalone": "pulsarlite.cli_standalone",
    "produce": "pulsarlite.cli_client",   # registers produce and consume
    "consume": "pulsarlite.cli_client",
    "perf": "pulsarlite.cli_perf",
    "autorecovery": "bookie.autorecovery.service",
    "tokens": "pulsarlite.cli_tokens",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pulsarlite", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in SUBCOMMANDS.items():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
