"""`pulsarlite cluster ...`: a local cluster of ZooKeeper, bookies and brokers on loopback.

    start --dir D --bookies N [--brokers M] [--tier URI] [--s3-endpoint URL]
          [--bookie-config FILE] [--broker-config FILE] | status --dir D [--json] | stop --dir D |
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
    s.add_argument("--bookie-config", metavar="FILE", default=None,
                   help="bookie TOML (e.g. deploy/conf/bookie-1.toml) whose settings every new bookie gets, "
                        "except addresses, ids, directories and ZooKeeper (the launcher's)")
    s.add_argument("--broker-config", metavar="FILE", default=None,
                   help="broker TOML (e.g. deploy/conf/broker-1.toml) whose settings every new broker gets, "
                        "except addresses, ids and ZooKeeper; --tier/--s3-endpoint win over it")
    s.add_argument("--tier", metavar="URI", default=None,
                   help="offload tier of every broker: s3://bucket/prefix or file:///dir (broker key [offload] tier_uri; "
                        "also rewrites existing brokers' configs)")
    s.add_argument("--s3-endpoint", metavar="URL", default=None,
                   help="S3 endpoint for an s3:// tier, e.g. http://127.0.0.1:9000 (broker key [offload] "
                        "tier_s3_endpoint_url); credentials come from the AWS_* environment variables")
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
    from faces.cluster import BOOKIE, BROKER, LocalCluster, format_status, settings_from_file, tier_settings
    _quiet_kazoo()
    try:
        settings = tier_settings(args.tier, args.s3_endpoint)
        bookie_overrides = settings_from_file(BOOKIE, args.bookie_config) if args.bookie_config else {}
        broker_overrides = settings_from_file(BROKER, args.broker_config) if args.broker_config else {}
        broker_overrides.update(settings)
        cluster = LocalCluster(args.dir, start_timeout_s=args.timeout)
        try:
            if settings:
                changed = cluster.update_broker_configs(settings)
                running = [n for n in changed if cluster.records[n].alive()]
                if running:
                    print(f"pulsarlite cluster: new tier settings take effect when these brokers restart: "
                          f"{', '.join(running)} (pulsarlite cluster restart --dir {args.dir} NAME)",
                          file=sys.stderr)
            cluster.start_processes(bookies=args.bookies, brokers=args.brokers,
                                    bookie_overrides=bookie_overrides, broker_overrides=broker_overrides)
            print(format_status(cluster.status()))
        finally:
            cluster.close()
    except PulsarliteError as e:
        return _fail(e)
    return 0


def _status(args) -> int:
    from faces.cluster import LocalCluster, format_status
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
    from faces.cluster import LocalCluster
    _quiet_kazoo()
    try:
        LocalCluster.open(args.dir, stop_grace_s=args.grace).stop()
    except PulsarliteError as e:
        return _fail(e)
    return 0


def _kill(args) -> int:
    from faces.cluster import LocalCluster
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
    from faces.cluster import LocalCluster
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
