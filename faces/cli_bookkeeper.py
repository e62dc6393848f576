"""`pulsarlite bookkeeper ...`: the operator shell, after BookKeeper's `bookkeeper shell`.

    listbookies | listledgers | ledgermetadata ID | readledger ID | deleteledger ID |
    simpletest --ensemble E --write-quorum Qw --ack-quorum Qa --entries N |
    listunderreplicated [--json] | recover BOOKIE [--wait-s S] | decommission BOOKIE [--timeout-s S] [--cancel] |
    autorecovery status [--json]
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
    p.add_argument("--bookie-auth-token-file", default=os.environ.get("PULSARLITE_BOOKIE_AUTH_TOKEN_FILE", ""),
                   help="file holding the token presented to bookies with bookie_auth_enabled (default "
                        "$PULSARLITE_BOOKIE_AUTH_TOKEN_FILE; or the token itself in $PULSARLITE_BOOKIE_AUTH_TOKEN)")
    p.add_argument("--zookeeper-auth-digest-file", default=os.environ.get("PULSARLITE_ZOOKEEPER_AUTH_DIGEST_FILE", ""),
                   help="file holding the ZooKeeper credential 'user:password' (docs/security.md; default "
                        "$PULSARLITE_ZOOKEEPER_AUTH_DIGEST_FILE; or the credential itself in "
                        "$PULSARLITE_ZOOKEEPER_AUTH_DIGEST)")
    p.add_argument("--zookeeper-acl-read-restricted", action="store_true",
                   default=os.environ.get("PULSARLITE_ZOOKEEPER_ACL_READ_RESTRICTED", "") in ("1", "true"),
                   help="znodes this shell creates are readable by the credential only (as the cluster's "
                        "zookeeper_acl_read_restricted; default $PULSARLITE_ZOOKEEPER_ACL_READ_RESTRICTED)")
    p.add_argument("--bookie-tls", action="store_true",
                   default=os.environ.get("PULSARLITE_BOOKIE_TLS", "") in ("1", "true"),
                   help="connect to the bookies with TLS (bookies with bookie_tls_certificate_file_path; default "
                        "$PULSARLITE_BOOKIE_TLS; implied by --bookie-tls-trust-certs-file)")
    p.add_argument("--bookie-tls-trust-certs-file", default=os.environ.get("PULSARLITE_BOOKIE_TLS_TRUST_CERTS_FILE", ""),
                   help="CA file the bookies' certificates must verify against (default "
                        "$PULSARLITE_BOOKIE_TLS_TRUST_CERTS_FILE; empty: the system's CAs)")
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

    s = sub.add_parser("listunderreplicated", help="list ledgers marked under-replicated")
    s.add_argument("--json", action="store_true",
                   help="a JSON list: one object per ledger (ledger_id, missing_bookies, lost_bookies: those "
                        "marked because they were lost, ctime_ms, locked_by)")
    s.set_defaults(func=_run(_listunderreplicated))

    s = sub.add_parser("recover", help="mark every ledger naming BOOKIE under-replicated now "
                                       "(the replication workers then move its copies)")
    s.add_argument("bookie")
    s.add_argument("--json", action="store_true")
    s.add_argument("--wait-s", type=float, default=0.0,
                   help="then wait up to this long until no ledger names BOOKIE (0: do not wait)")
    s.set_defaults(func=_run(_recover))

    s = sub.add_parser("decommission", help="move every copy off BOOKIE (which may still be up) and "
                                            "wait until no ledger names it")
    s.add_argument("bookie")
    s.add_argument("--timeout-s", type=float, default=3600.0, help="give up waiting after this long")
    s.add_argument("--poll-s", type=float, default=1.0, help="progress check interval")
    s.add_argument("--cancel", action="store_true",
                   help="end a decommission (or forget a finished one): the bookie takes new ledgers again")
    s.set_defaults(func=_run(_decommission))

    s = sub.add_parser("autorecovery", help="autorecovery state")
    ar = s.add_subparsers(dest="ar_command", required=True)
    st = ar.add_parser("status", help="the auditor, the under-replicated count, decommissioning bookies")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_run(_autorecovery_status))

    s = sub.add_parser("secure-znodes", help="give every znode of pulsarlite's layout the ACL of the ZooKeeper "
                                             "credential (--zookeeper-auth-digest-file): for a cluster made before "
                                             "ZooKeeper authentication was on")
    s.set_defaults(func=_run(_secure_znodes))

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

    client = await LedgerClient.connect(LedgerClientConfig(
        zookeeper=args.zookeeper,
        bookie_auth_token="" if args.bookie_auth_token_file else os.environ.get("PULSARLITE_BOOKIE_AUTH_TOKEN", ""),
        bookie_auth_token_file=args.bookie_auth_token_file,
        zookeeper_auth_digest=("" if args.zookeeper_auth_digest_file
                               else os.environ.get("PULSARLITE_ZOOKEEPER_AUTH_DIGEST", "")),
        zookeeper_auth_digest_file=args.zookeeper_auth_digest_file,
        zookeeper_acl_read_restricted=args.zookeeper_acl_read_restricted,
        bookie_tls_enabled=args.bookie_tls or bool(args.bookie_tls_trust_certs_file),
        bookie_tls_trust_certs_file_path=args.bookie_tls_trust_certs_file).validate())
    try:
        return await coro_fn(client, args)
    finally:
        await client.close()


async def _secure_znodes(client, args) -> int:
    from pulsarlite.metadata_layout import PULSARLITE_ROOTS
    if client.store.auth is None:
        print("pulsarlite bookkeeper secure-znodes: give the credential (--zookeeper-auth-digest-file or "
              "$PULSARLITE_ZOOKEEPER_AUTH_DIGEST)", file=sys.stderr)
        return 2
    total = 0
    for root in PULSARLITE_ROOTS:
        count = await client.store.apply_acl_tree(root)
        print(f"{root}\t{count} znodes")
        total += count
    print(f"ACL of ZooKeeper user {client.store.auth.user!r} set on {total} znodes")
    return 0


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


# -- autorecovery ---------------------------------------------------------------------------

async def _listunderreplicated(client, args) -> int:
    from bookie.autorecovery.urmanager import UnderReplicationManager

    urm = UnderReplicationManager(client.store)
    rows = []
    for mark in await urm.list_marks():
        rows.append({"ledger_id": mark.ledger_id, "missing_bookies": list(mark.missing_bookies),
                     "lost_bookies": list(mark.lost_bookies), "ctime_ms": mark.ctime_ms,
                     "locked_by": await urm.lock_holder(mark.ledger_id)})
    if args.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            print(f"{r['ledger_id']}\tmissing={','.join(r['missing_bookies'])}"
                  + (f"\tlost={','.join(r['lost_bookies'])}" if r["lost_bookies"] else "")
                  + (f"\tlocked_by={r['locked_by']}" if r["locked_by"] else ""))
    return 0


async def _recover(client, args) -> int:
    from bookie.autorecovery.urmanager import UnderReplicationManager

    urm = UnderReplicationManager(client.store)
    marked = []
    for md in await client.ledger_manager.ledgers_naming([args.bookie]):
        await urm.mark(md.ledger_id, [args.bookie], int(time.time() * 1000))
        marked.append(md.ledger_id)
    if args.wait_s < 0:
        raise ValueError("--wait-s must be >= 0")
    remaining = marked
    if args.wait_s > 0:
        deadline = time.monotonic() + args.wait_s
        while True:
            remaining = [md.ledger_id for md in await client.ledger_manager.ledgers_naming([args.bookie])]
            if not remaining or time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(1.0, args.wait_s / 10))
    if args.json:
        print(json.dumps({"bookie": args.bookie, "ledgers_marked": marked,
                          "ledgers_naming_it": remaining if args.wait_s > 0 else None}))
    else:
        print(f"bookie {args.bookie}: {len(marked)} ledgers marked under-replicated"
              + (f", {len(remaining)} still name it" if args.wait_s > 0 else ""))
    return 1 if args.wait_s > 0 and remaining else 0


async def _decommission(client, args) -> int:
    """Mark the bookie decommissioning (the auditor marks its ledgers at once), mark its ledgers
    ourselves too (no auditor needed for the marks), then wait until nothing names it."""
    from bookie.autorecovery.urmanager import UnderReplicationManager

    if args.timeout_s <= 0 or args.poll_s <= 0:
        raise ValueError("--timeout-s and --poll-s must be > 0")
    urm = UnderReplicationManager(client.store)
    if args.cancel:
        found = await urm.cancel_decommission(args.bookie)
        print(f"bookie {args.bookie}: " + ("decommission cancelled" if found else "was not decommissioning"))
        return 0
    await urm.start_decommission(args.bookie, int(time.time() * 1000))
    deadline = time.monotonic() + args.timeout_s
    first = None
    marked: set[int] = set()
    while True:
        naming = await client.ledger_manager.ledgers_naming([args.bookie])
        if first is None:
            first = len(naming)
        for md in naming:       # ledgers created on it meanwhile too (while it is writable)
            if md.ledger_id not in marked:
                await urm.mark(md.ledger_id, [args.bookie], int(time.time() * 1000))
                marked.add(md.ledger_id)
        first = max(first, len(marked))
        print(f"decommission {args.bookie}: {first - len(naming)}/{first} ledgers moved, "
              f"{len(naming)} still name it", file=sys.stderr, flush=True)
        if not naming:
            await urm.finish_decommission(args.bookie, int(time.time() * 1000))
            print(f"bookie {args.bookie} decommissioned: no ledger names it; it stays read-only "
                  f"(stop it, or 'decommission --cancel' to use it again)")
            return 0
        if time.monotonic() >= deadline:
            print(f"pulsarlite bookkeeper: decommission {args.bookie}: {len(naming)} ledgers still name it "
                  f"after {args.timeout_s}s (ids {[md.ledger_id for md in naming][:20]}); "
                  f"it stays marked decommissioning", file=sys.stderr)
            return 1
        await asyncio.sleep(args.poll_s)


async def _autorecovery_status(client, args) -> int:
    from bookie.autorecovery.auditor import current_auditor
    from bookie.autorecovery.urmanager import UnderReplicationManager

    urm = UnderReplicationManager(client.store)
    states = await urm.decommission_states()
    status = {"auditor": await current_auditor(client.store),
              "under_replicated_ledgers": len(await urm.list_marked()),
              "locked_ledgers": len(await urm.locked()),
              "decommissioning": sorted(b for b, st in states.items() if st != "decommissioned"),
              "decommissioned": sorted(b for b, st in states.items() if st == "decommissioned")}
    if args.json:
        print(json.dumps(status))
    else:
        print(f"auditor: {status['auditor'] or '(none)'}")
        print(f"under-replicated ledgers: {status['under_replicated_ledgers']} "
              f"(being repaired: {status['locked_ledgers']})")
        print(f"decommissioning: {', '.join(status['decommissioning']) or '(none)'}")
        print(f"decommissioned (read-only, kept off new ledgers): {', '.join(status['decommissioned']) or '(none)'}")
    return 0
