"""`pulsarlite cluster ...`: a local cluster of ZooKeeper, bookies and brokers on loopback.

    start --dir D --bookies N [--brokers M] | status --dir D [--json] | stop --dir D |
    kill --dir D NAME | restart --dir D NAME
"""

from __future__ import annotations

import json
import logging
import sys

from pulsarlite.errors import ConfigError, PulsarliteError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("cluster", help="run a local cluster (ZooKeeper + bookies + brokers) in the background")
    sub = p.add_subparsers(dest="cluster_command", required=True)

    s = sub.add_parser("start", help="start (or resume) a cluster; returns once all are healthy")
    _add_dir(s)
    s.add_argument("--bookies", type=int, default=3, help="number of bookies (default 3)")
    s.add_argument("--brokers", type=int, default=0, help="number of brokers (default 0)")
    s.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for health (default 60)")
    s.set_defaults(func=_start)

    s = sub.add_parser("status", help="show the cluster's processes and their health")
    _add_dir(s)
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=_status)

    s = sub.add_parser("stop", help="stop every process (bookies first, ZooKeeper last)")
    _add_dir(s)
    s.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    s.set_defaults(func=_stop)

    s = sub.add_parser("kill", help="SIGKILL one process (e.g. bookie-2, zookeeper)")
    _add_dir(s)
    s.add_argument("name")
    s.set_defaults(func=_kill)

    s = sub.add_parser("restart", help="restart one process with the same config and ports")
    _add_dir(s)
    s.add_argument("name")
    s.add_argument("--timeout", type=float, default=60.0)
    s.set_defaults(func=_restart)


def _add_dir(parser) -> None:
    parser.add_argument("--dir", required=True, help="cluster directory (state, data, configs, logs)")


def _quiet_kazoo() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)


def _fail(e: Exception) -> int:
    print(f"pulsarlite cluster: {e}", file=sys.stderr)
    return 2 if isinstance(e, ConfigError) else 1


def _start(args) -> int:
    from pulsarlite.cluster import LocalCluster, format_status
    _quiet_kazoo()
    try:
        cluster = LocalCluster(args.dir, start_timeout_s=args.timeout)
        try:
            cluster.start_processes(bookies=args.bookies, brokers=args.brokers)
            print(format_status(cluster.status()))
        finally:
            cluster.close()
    except PulsarliteError as e:
        return _fail(e)
    return 0


def _status(args) -> int:
    from pulsarlite.cluster import LocalCluster, format_status
    _quiet_kazoo()
    try:
        cluster = LocalCluster.open(args.dir)
        try:
            status = cluster.status()
        finally:
            cluster.close()
    except PulsarliteError as e:
        return _fail(e)
    print(json.dumps(status) if args.json else format_status(status))
    return 0


def _stop(args) -> int:
    from pulsarlite.cluster import LocalCluster
    _quiet_kazoo()
    try:
        LocalCluster.open(args.dir, stop_grace_s=args.grace).stop()
    except PulsarliteError as e:
        return _fail(e)
    return 0


def _kill(args) -> int:
    from pulsarlite.cluster import LocalCluster
    _quiet_kazoo()
    try:
        cluster = LocalCluster.open(args.dir)
        try:
            cluster.kill(args.name)
        finally:
            cluster.close()
    except PulsarliteError as e:
        return _fail(e)
    return 0


def _restart(args) -> int:
    from pulsarlite.cluster import LocalCluster
    _quiet_kazoo()
    try:
        cluster = LocalCluster.open(args.dir, start_timeout_s=args.timeout)
        try:
            cluster.restart(args.name)
        finally:
            cluster.close()
    except PulsarliteError as e:
        return _fail(e)
    return 0
