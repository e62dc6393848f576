"""TLS for the broker's listeners: one server-side :class:`ssl.SSLContext` from the PEM files of
:class:`broker.config.BrokerConfig`, used by the ``pulsar+ssl://`` listener
(``broker_service_port_tls``) and the ``https://`` admin listener (``web_service_port_tls``).

Client certificates, as Pulsar's broker treats them:

- ``tls_require_trusted_client_cert_on_connect``: a client must present a certificate that
  verifies against ``tls_trust_certs_file_path`` (mTLS); the handshake fails otherwise.
- else, with ``tls_trust_certs_file_path`` set: a certificate is asked for but optional; one that is
  presented must verify (the handshake fails otherwise), and a verified one is handed to the
  authentication layer as the connection's ``peer_certificate`` (role = CN for the TLS provider).
- ``tls_allow_insecure_connection``: client certificates are not asked for at all, so none is
  trusted and none reaches the authentication layer (Python's ssl cannot accept an unverified
  client certificate and still report it; a certificate nobody checked proves no role).

The peer certificate of a connection is ``transport.get_extra_info("peercert")``: the dict of
:meth:`ssl.SSLSocket.getpeercert` for a verified certificate, else None (or an empty dict, which
:func:`peer_certificate_of` turns into None).
"""

from __future__ import annotations

import ssl

from pulsarlite.errors import ConfigError


def server_ssl_context(config) -> ssl.SSLContext:
    """The context of both TLS listeners; ConfigError naming the setting whose file is missing or
    does not load (the message never holds the key's content)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_certificate_file_path, config.tls_key_file_path)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"tls_certificate_file_path / tls_key_file_path: cannot load the certificate "
                          f"{config.tls_certificate_file_path!r} with its key {config.tls_key_file_path!r}: "
                          f"{type(e).__name__}: {getattr(e, 'strerror', None) or getattr(e, 'reason', None) or e}"
                          ) from None
    if config.tls_allow_insecure_connection and not config.tls_require_trusted_client_cert_on_connect:
        context.verify_mode = ssl.CERT_NONE
        return context
    if config.tls_trust_certs_file_path:
        try:
            context.load_verify_locations(cafile=config.tls_trust_certs_file_path)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"tls_trust_certs_file_path: cannot load {config.tls_trust_certs_file_path!r}: "
                              f"{type(e).__name__}: {getattr(e, 'strerror', None) or e}") from None
        context.verify_mode = (ssl.CERT_REQUIRED if config.tls_require_trusted_client_cert_on_connect
                               else ssl.CERT_OPTIONAL)
    return context


def peer_certificate_of(transport) -> dict | None:
    """The verified client certificate of a (TLS) transport in getpeercert() form, or None."""
    if transport is None:
        return None
    try:
        cert = transport.get_extra_info("peercert")
    except Exception:   # noqa: BLE001 - a transport going away: no certificate
        return None
    return cert or None


def common_name_of(peer_certificate: dict | None) -> str | None:
    """The subject's (non-empty) CN of a getpeercert() dict (the TLS provider's role), or None."""
    if not peer_certificate:
        return None
    for rdn in peer_certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return value
    return None


__all__ = ["server_ssl_context", "peer_certificate_of", "common_name_of"]
