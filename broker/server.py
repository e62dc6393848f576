"""The broker's TCP server for the Pulsar binary protocol (asyncio; uvloop in the process)."""

from __future__ import annotations

import asyncio
import logging

from broker.connection import ConnectionAdmission, ServerConnection

log = logging.getLogger("pulsarlite.broker")


class BrokerServer:
    def __init__(self, service) -> None:
        self.service = service
        self._server: asyncio.AbstractServer | None = None
        self.connections: set[ServerConnection] = set()
        self.admission = ConnectionAdmission(service.config.connections_max,
                                             service.config.connections_per_address_max)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0 in tests)."""
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    def _make_connection(self) -> ServerConnection:
        connection = ServerConnection(self.service, admission=self.admission)
        self.connections.add(connection)
        original = connection.connection_lost

        def connection_lost(exc, _original=original, _conn=connection) -> None:
            self.connections.discard(_conn)
            _original(exc)

        connection.connection_lost = connection_lost      # type: ignore[method-assign]
        return connection

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._make_connection, host, port, reuse_address=True,
                                                backlog=1024)
        log.info("broker listening on %s:%d", host, self.port)

    async def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close_connections(self) -> None:
        for connection in list(self.connections):
            connection.close()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 5)
            except asyncio.TimeoutError:
                pass


__all__ = ["BrokerServer"]
