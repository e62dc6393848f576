"""The broker's TCP server for the Pulsar binary protocol (asyncio; uvloop in the process)."""

from __future__ import annotations

import asyncio
import logging
import ssl

from broker.connection import ConnectionAdmission, ServerConnection

log = logging.getLogger("pulsarlite.broker")


class BrokerServer:
    def __init__(self, service) -> None:
        self.service = service
        self._server: asyncio.AbstractServer | None = None
        self._server_tls: asyncio.AbstractServer | None = None   # the pulsar+ssl:// listener, if any
        self.connections: set[ServerConnection] = set()
        self.admission = ConnectionAdmission(service.config.connections_max,
                                             service.config.connections_per_address_max)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0 in tests)."""
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    @property
    def port_tls(self) -> int | None:
        """The bound port of the TLS listener, None without one."""
        return None if self._server_tls is None else self._server_tls.sockets[0].getsockname()[1]

    def _make_connection(self) -> ServerConnection:
        connection = ServerConnection(self.service, admission=self.admission)
        self.connections.add(connection)
        original = connection.connection_lost

        def connection_lost(exc, _original=original, _conn=connection) -> None:
            self.connections.discard(_conn)
            _original(exc)

        connection.connection_lost = connection_lost      # type: ignore[method-assign]
        return connection

    async def start(self, host: str, port: int, *, port_tls: int = 0,
                    ssl_context: ssl.SSLContext | None = None) -> None:
        """Listen on ``port``, and on ``port_tls`` with ``ssl_context`` when both are given (the
        same connections, behind TLS: ServerConnection.peer_certificate is set from the handshake)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._make_connection, host, port, reuse_address=True,
                                                backlog=1024)
        log.info("broker listening on %s:%d", host, self.port)
        if port_tls and ssl_context is not None:
            try:
                self._server_tls = await loop.create_server(
                    self._make_connection, host, port_tls, reuse_address=True, backlog=1024, ssl=ssl_context,
                    ssl_handshake_timeout=self.service.config.connect_timeout_ms / 1000)
            except BaseException:
                self._server.close()
                raise
            log.info("broker listening tls=true host=%s port=%d", host, self.port_tls)

    async def stop_accepting(self) -> None:
        for server in (self._server, self._server_tls):
            if server is not None:
                server.close()

    async def close_connections(self) -> None:
        for connection in list(self.connections):
            connection.close()
        for server in (self._server, self._server_tls):
            if server is not None:
                try:
                    await asyncio.wait_for(server.wait_closed(), 5)
                except asyncio.TimeoutError:
                    pass


__all__ = ["BrokerServer"]
