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
    "cluster": "faces.cli_cluster",
    "bookkeeper": "faces.cli_bookkeeper",
    "admin": "faces.cli_admin",
    "standalone": "faces.cli_standalone",
    "produce": "faces.cli_client",   # registers produce and consume
    "consume": "faces.cli_client",
    "perf": "faces.cli_perf",
    "autorecovery": "bookie.autorecovery.service",
    "tokens": "faces.cli_tokens",
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
