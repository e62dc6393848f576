"""`pulsarlite broker --config FILE`: one broker process.

Start: config validated -> ZooKeeper (one MetadataStore, shared with the ledger client) ->
default cluster, tenant ``public`` and namespace ``public/default`` ensured -> ownership started
(it registers ``/loadbalance/brokers/<broker-id>``, ephemeral, again after a session loss) ->
serving the Pulsar protocol and the admin HTTP API + ``/metrics`` (``http_port``).
SIGTERM / SIGINT: stop accepting, stop the HTTP server, close every topic
(adds in flight finish, managed ledgers closed cleanly), close connections, exit.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from broker.config import BrokerConfig
from pulsarlite.process import run_server, start_server_process

log = logging.getLogger("pulsarlite.broker")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("broker", help="run a broker (Pulsar binary protocol server)")
    p.add_argument("--config", help="broker TOML config file (required unless --pulsar-conf is given)")
    p.add_argument("--pulsar-conf", metavar="FILE",
                   help="Pulsar's broker.conf: its ports, TLS, authentication and authorization keys override "
                        "the TOML config (pulsarlite/pulsar_conf.py lists the keys read)")
    p.set_defaults(func=run_from_args)


def run_from_args(args) -> int:
    if not args.config and not args.pulsar_conf:
        print("pulsarlite broker: give --config FILE and/or --pulsar-conf FILE", file=sys.stderr)
        return 2
    overlay = None
    if args.pulsar_conf:
        def overlay(config: BrokerConfig) -> BrokerConfig:
            return apply_pulsar_conf(config, args.pulsar_conf)
    config = start_server_process("broker", BrokerConfig, args.config, overlay=overlay)
    if config is None:
        return 2
    return run_server("broker", run_broker(config), log)


def apply_pulsar_conf(config: BrokerConfig, path: str) -> BrokerConfig:
    """``config`` with the settings of Pulsar's conf file at ``path`` (validated); the keys it does
    not read are listed once in a warning; ConfigError names the Pulsar key of a bad value."""
    from pulsarlite.pulsar_conf import read_pulsar_conf
    conf = read_pulsar_conf(path)
    warning = conf.warning(f"--pulsar-conf {path}")
    if warning:
        log.warning(warning)
    return conf.apply(config, f"--pulsar-conf {path}")


async def run_broker(config: BrokerConfig, *, stop_event: asyncio.Event | None = None,
                     started: asyncio.Future | None = None) -> None:
    from aiohttp import web

    from bookie.client.ledger_client import LedgerClient
    from broker.admin.http import make_admin_app
    from broker.admin.serving import make_admin_runner
    from broker.admin_backend import BrokerAdminBackend
    from broker.ownership.topics import make_ownership
    from broker.server import BrokerServer
    from broker.service import BrokerService
    from broker.tls import server_ssl_context
    from pulsarlite.config import zookeeper_auth
    from pulsarlite.metadata import MetadataStore

    config.validate()
    # the TLS files are read before anything starts: a bad one refuses to start, naming the setting
    ssl_context = server_ssl_context(config) if config.tls_enabled else None
    stop_event = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop_event.set)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests)
            pass

    store = await MetadataStore.connect(config.zookeeper, session_timeout_ms=config.zk_session_timeout_ms,
                                        auth=zookeeper_auth(config))
    try:
        ledger_client = await LedgerClient.connect(config.ledger_client_config(), store=store)
        ownership = make_ownership(store, config.effective_broker_id, config.service_url, config.web_service_url,
                                   lease_ms=config.zk_session_timeout_ms // 2,
                                   dead_owner_wait_s=config.zk_session_timeout_ms / 1000 + 1.0,
                                   service_url_tls=config.service_url_tls,
                                   web_service_url_tls=config.web_service_url_tls,
                                   listeners=config.listeners())
        await ownership.start()
        service = BrokerService(config, store=store, ledger_client=ledger_client, ownership=ownership)
        await service.policies.ensure_defaults(cluster=config.cluster_name, service_url=config.web_service_url,
                                               broker_service_url=config.service_url)
        server = BrokerServer(service)
        await server.start(config.host, config.port, port_tls=config.broker_service_port_tls,
                           ssl_context=ssl_context)
        runner = make_admin_runner(make_admin_app(BrokerAdminBackend(service)))
        await runner.setup()
        sites = [web.TCPSite(runner, config.host, config.http_port, reuse_address=True)]
        if config.web_service_port_tls:
            sites.append(web.TCPSite(runner, config.host, config.web_service_port_tls, reuse_address=True,
                                     ssl_context=ssl_context))
        try:
            for site in sites:
                await site.start()
        except BaseException:
            await runner.cleanup()
            await server.stop_accepting()
            raise
        service.start()
        from pulsarlite.loop_monitor import start_from_env
        start_from_env()      # diagnostics, off unless PULSARLITE_LOOP_MONITOR_MS is set
        log.info("admin http listening on %s:%d", config.host, config.http_port)
        if config.web_service_port_tls:
            log.info("admin https listening host=%s port=%d", config.host, config.web_service_port_tls)
        log.info("broker ready broker=%s service_url=%s", config.effective_broker_id, config.service_url)
        if started is not None and not started.done():
            started.set_result(server)

        await stop_event.wait()
        log.info("broker stopping broker=%s", config.effective_broker_id)
        await server.stop_accepting()
        try:
            await asyncio.wait_for(runner.cleanup(), 5)
        except (asyncio.TimeoutError, Exception) as e:   # noqa: BLE001 - keep shutting down
            log.warning("stopping the admin http server: %r", e)
        try:
            await asyncio.wait_for(service.close(), config.shutdown_grace_ms / 1000)
        except asyncio.TimeoutError:
            log.warning("topics did not close within %d ms", config.shutdown_grace_ms)
        await server.close_connections()
        await ownership.close()
        await ledger_client.close()
    finally:
        await store.close()
    log.info("broker stopped")
