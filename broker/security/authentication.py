"""Authentication: the credentials a client presents -> its role, or :class:`AuthenticationError`.

Protocol (as Pulsar's ``AuthenticationProvider`` / ``AuthenticationService``):

- A client presents an :class:`AuthenticationData`: the method name (``"token"``, ``"basic"``,
  ``"tls"``), the method's bytes (CONNECT's ``auth_data``, the HTTP ``Authorization`` header's
  credential), and the peer certificate of its TLS connection when there is one.
- :class:`AuthenticationService` hands it to the provider configured for that method; the provider
  answers the role it proves, or raises :class:`AuthenticationError`. A method that is not
  configured is refused.
- A client that presents nothing gets ``anonymous_user_role`` when one is configured, else it is
  refused (:meth:`AuthenticationService.authenticate_anonymous`).
- With ``authentication_enabled`` off, the service is not consulted at all (everything is served
  as before: the shells check :attr:`AuthenticationService.enabled`).

Errors name the method and what was wrong, never the credential (invariant 11).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from broker.errors import BrokerError
from pulsarlite.wire import pb


class AuthenticationError(BrokerError):
    """The client has not proven a role: no credentials, unknown method, bad or expired ones.
    The message says why, never what the credential was."""

    server_error = pb.AuthenticationError


@dataclass(frozen=True)
class AuthenticationData:
    """What a client presented. ``peer_certificate``: the peer certificate of its TLS connection in
    ``ssl.SSLSocket.getpeercert()`` form (a dict with ``subject`` etc.), or None without TLS or
    without a verified client certificate."""

    method: str
    data: bytes
    peer_certificate: dict | None = None


@runtime_checkable
class AuthenticationProvider(Protocol):
    """One authentication method. ``authenticate`` returns the role the data proves, or raises
    :class:`AuthenticationError`; it does no I/O."""

    method: str

    def authenticate(self, auth: AuthenticationData) -> str: ...


__all__ = ["AuthenticationData", "AuthenticationError", "AuthenticationProvider"]
