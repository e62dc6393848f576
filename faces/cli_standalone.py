"""`pulsarlite standalone [--data-dir D]`: ZooKeeper + 3 bookies + 1 broker + a file:// tier,
in the foreground until Ctrl-C (see faces/standalone.py)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "standalone", help="run ZooKeeper, 3 bookies, 1 broker and a file:// tier in the foreground",
        description="Run ZooKeeper, 3 bookies, 1 broker and a file:// offload tier, supervised in the "
                    "foreground; Ctrl-C (or SIGTERM) stops every process. Data, configs and logs live in "
                    "--data-dir and are kept across restarts; a directory that already holds a cluster "
                    "keeps the ports it was created with.")
    p.add_argument("--data-dir", default="data/standalone", help="state, data, configs and logs (default data/standalone)")
    p.add_argument("--port", type=int, default=None, help="Pulsar protocol port (default: the --pulsar-conf "
                                                           "brokerServicePort, else 6650)")
    p.add_argument("--http-port", type=int, default=None, help="admin HTTP port (default: the --pulsar-conf "
                                                                "webServicePort, else 8080)")
    p.add_argument("--pulsar-conf", metavar="FILE",
                   help="Pulsar's standalone.conf: ports, TLS, authentication and authorization keys "
                        "(pulsarlite/pulsar_conf.py lists them; other keys are listed once in a warning)")
    p.add_argument("--zookeeper-port", type=int, default=2181, help="ZooKeeper client port (default 2181)")
    p.add_argument("--bookie-port", type=int, default=3181,
                   help="first bookie port; the 3 bookies use PORT..PORT+2 (default 3181)")
    p.add_argument("--tier", metavar="URI", default=None,
                   help="offload tier (default file://DATA_DIR/tier; '' for none)")
    p.add_argument("--no-lake", dest="lake", action="store_false", default=True,
                   help="do not make offloaded ledgers Iceberg tables (on by default with a file:// tier "
                        "when pyiceberg is installed; docs/lakehouse.md)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for health at start (default 120)")
    p.add_argument("--restarts-max", type=int, default=5,
                   help="a child dying more often than this within 5 minutes stops the standalone (default 5)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from pulsarlite.errors import ConfigError
    from faces.standalone import RestartPolicy, Standalone, StandaloneSettings
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    try:
        port, http_port, broker_settings = _ports_and_broker_settings(args)
        settings = StandaloneSettings(
            data_dir=Path(args.data_dir).resolve(), port=port, http_port=http_port,
            zookeeper_port=args.zookeeper_port, bookie_port=args.bookie_port, tier_uri=args.tier,
            lake=args.lake, start_timeout_s=args.timeout, policy=RestartPolicy(restarts_max=args.restarts_max),
            broker_settings=broker_settings).validate()
    except ConfigError as e:
        print(f"pulsarlite standalone: {e}", file=sys.stderr)
        return 2
    return Standalone(settings).run()


def _ports_and_broker_settings(args) -> tuple[int, int, dict]:
    """(Pulsar port, HTTP port, BrokerConfig fields) from the flags and ``--pulsar-conf``: a flag
    wins over the conf's brokerServicePort / webServicePort; the rest of the conf is checked here,
    before anything starts (ConfigError naming the key)."""
    if not args.pulsar_conf:
        return args.port or 6650, args.http_port or 8080, {}
    from broker.config import BrokerConfig
    from pulsarlite.pulsar_conf import STANDALONE_OWNED_FIELDS, read_pulsar_conf
    import os
    conf = read_pulsar_conf(args.pulsar_conf).with_paths_resolved(os.getcwd())   # children run elsewhere
    warning = conf.warning(f"--pulsar-conf {args.pulsar_conf}")
    if warning:
        logging.getLogger("pulsarlite.standalone").warning(warning)
    settings = conf.fields(STANDALONE_OWNED_FIELDS)
    conf_port, conf_http_port = settings.pop("port", 6650), settings.pop("http_port", 8080)   # ours, not the broker's
    port, http_port = args.port or conf_port, args.http_port or conf_http_port
    config = conf.apply(BrokerConfig(port=port, http_port=http_port), f"--pulsar-conf {args.pulsar_conf}",
                        skip_fields=STANDALONE_OWNED_FIELDS | {"port", "http_port"})
    # the files and keys it names are read now too: the broker would only crash-loop on them
    if config.tls_enabled:
        from broker.tls import server_ssl_context
        server_ssl_context(config)
    if config.authentication_enabled:
        from broker.security.authentication import AuthenticationService
        AuthenticationService.from_config(config)
    return port, http_port, settings
