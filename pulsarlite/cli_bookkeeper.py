"""`pulsarlite bookkeeper ...`: the operator shell, after BookKeeper's `bookkeeper shell`.

    listbookies | listledgers | ledgermetadata ID | readledger ID | deleteledger ID |
    simpletest --ensemble E --write-quorum Qw --ack-quorum Qa --entries N
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
import time

from pulsarlite.errors import PulsarliteError

SIMPLETEST_WINDOW = 1000  # adds in flight


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bookkeeper", help="operator shell for bookies and ledgers")
    p.add_argument("--zookeeper", default=os.environ.get("PULSARLITE_ZOOKEEPER", "127.0.0.1:2181"),
                   help="ZooKeeper connect string (default $PULSARLITE_ZOOKEEPER or 127.0.0.1:2181)")
    sub = p.add_subparsers(dest="bk_command", required=True)

    s = sub.add_parser("listbookies", help="list live bookies (writable and read-only)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_run(_listbookies))

    s = sub.add_parser("listledgers", help="list ledger ids")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_run(_listledgers))

    s = sub.add_parser("ledgermetadata", help="print a ledger's metadata")
    s.add_argument("ledger_id", type=int)
    s.set_defaults(func=_run(_ledgermetadata))

    s = sub.add_parser("readledger", help="read a ledger's entries (never fences unless --recover)")
    s.add_argument("ledger_id", type=int)
    s.add_argument("--first", type=int, default=0)
    s.add_argument("--last", type=int, default=-1, help="last entry id (default: the last readable)")
    s.add_argument("--recover", action="store_true", help="open with recovery (fences the writer)")
    s.add_argument("--print-entries", action="store_true", help="print each entry's payload")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_run(_readledger))

    s = sub.add_parser("deleteledger", help="delete a ledger from the bookies and the metadata")
    s.add_argument("ledger_id", type=int)
    s.set_defaults(func=_run(_deleteledger))

    s = sub.add_parser("simpletest", help="write N entries to a new ledger and report")
    s.add_argument("--ensemble", "-e", type=int, default=3)
    s.add_argument("--write-quorum", "-w", type=int, default=3)
    s.add_argument("--ack-quorum", "-a", type=int, default=2)
    s.add_argument("--entries", "-n", type=int, default=100)
    s.add_argument("--entry-size", type=int, default=100, help="payload bytes per entry")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_run(_simpletest))


def _run(coro_fn):
    def run(args) -> int:
        try:
            return asyncio.run(_with_client(coro_fn, args))
        except (PulsarliteError, ValueError) as e:
            print(f"pulsarlite bookkeeper: {e}", file=sys.stderr)
            return 1
    return run


async def _with_client(coro_fn, args) -> int:
    from bookie.client.ledger_client import LedgerClient
    from pulsarlite.config import LedgerClientConfig

    client = await LedgerClient.connect(LedgerClientConfig(zookeeper=args.zookeeper))
    try:
        return await coro_fn(client, args)
    finally:
        await client.close()


async def _listbookies(client, args) -> int:
    writable = await client.ledger_manager.writable_bookies()
    readonly = await client.ledger_manager.readonly_bookies()
    if args.json:
        print(json.dumps({"writable": writable, "readonly": readonly}))
    else:
        for b in writable:
            print(f"{b}\twritable")
        for b in readonly:
            print(f"{b}\treadonly")
    return 0


async def _listledgers(client, args) -> int:
    ids = await client.ledger_manager.list_ledger_ids()
    print(json.dumps(ids) if args.json else "\n".join(map(str, ids)))
    return 0


async def _ledgermetadata(client, args) -> int:
    md, version = await client.ledger_manager.read(args.ledger_id)
    doc = json.loads(md.to_json())
    doc["version"] = version
    print(json.dumps(doc, indent=2, sort_keys=True))
    return 0


async def _readledger(client, args) -> int:
    reader = await client.open_ledger(args.ledger_id, recovery=args.recover)
    last = reader.last_readable_entry_id if args.last < 0 else min(args.last, reader.last_readable_entry_id)
    count, size, last_seen = 0, 0, -1
    async for entry in reader.iter_entries(args.first, last):
        count += 1
        size += len(entry.payload)
        last_seen = entry.entry_id
        if args.print_entries and not args.json:
            print(f"{entry.entry_id}\t{entry.payload!r}")
    if args.json:
        print(json.dumps({"ledger_id": args.ledger_id, "entries": count, "last_entry_id": last_seen,
                          "bytes": size, "state": reader.metadata.state.value}))
    else:
        print(f"ledger {args.ledger_id}: {count} entries, {size} bytes, last entry {last_seen}")
    return 0


async def _deleteledger(client, args) -> int:
    await client.delete_ledger(args.ledger_id)
    print(f"ledger {args.ledger_id} deleted")
    return 0


async def _simpletest(client, args) -> int:
    if args.entries < 0 or args.entry_size < 0:
        raise ValueError("--entries and --entry-size must be >= 0")
    writer = await client.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum)
    payload = b"x" * args.entry_size
    started = time.monotonic()
    window: collections.deque = collections.deque()
    acked = 0
    for _ in range(args.entries):
        if len(window) >= SIMPLETEST_WINDOW:
            await window.popleft()
            acked += 1
        window.append(writer.add_async(payload))
    for fut in window:
        await fut
        acked += 1
    await writer.close()
    elapsed = time.monotonic() - started
    result = {"ledger_id": writer.ledger_id, "entries_acked": acked, "seconds": round(elapsed, 3),
              "ensemble": list(writer.metadata.current_ensemble)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"ledger {writer.ledger_id}: {acked} entries acknowledged in {elapsed:.3f}s "
              f"on {', '.join(writer.metadata.current_ensemble)}")
    return 0
