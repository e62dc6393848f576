"""TLS on the bookie port (docs/security.md "Bookies: TLS").

A bookie with ``bookie_tls_certificate_file_path`` and ``bookie_tls_key_file_path`` (BookieConfig)
speaks TLS only on its port: a plain client fails the handshake and is served nothing. Ledger
clients with ``bookie_tls_enabled`` (LedgerClientConfig, BrokerConfig; a bookie's own autorecovery
client whenever its bookie serves TLS) connect with TLS, verify the bookie's certificate against
``bookie_tls_trust_certs_file_path`` (empty: the system's CAs), and check that the certificate
names the host of the bookie id they dial (a DNS name or an IP address in its subjectAltName).
Every bookie of a cluster serves TLS, or none does. Authentication (the AuthRequest frame) is
unchanged and runs inside the TLS session, so tokens no longer travel in clear.

Contexts are built once per process and file path (the files are read at the first use: the
bookie's start, a client's first connection); a file that does not load is a ConfigError naming
the setting, never the key's content.
"""

from __future__ import annotations

import functools
import ssl

from pulsarlite.errors import ConfigError


def server_context(certificate_file_path: str, key_file_path: str) -> ssl.SSLContext | None:
    """The bookie's server context, or None when TLS is off (neither file set)."""
    if not certificate_file_path and not key_file_path:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certificate_file_path, key_file_path)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"bookie_tls_certificate_file_path / bookie_tls_key_file_path: cannot load the "
                          f"certificate {certificate_file_path!r} with its key {key_file_path!r}: "
                          f"{type(e).__name__}: {getattr(e, 'strerror', None) or getattr(e, 'reason', None) or e}"
                          ) from None
    return context


@functools.lru_cache(maxsize=8)
def client_context(trust_certs_file_path: str) -> ssl.SSLContext:
    """A ledger client's context: the bookie's certificate must verify against the trust file
    (the system's CAs when empty) and name the host dialled."""
    try:
        context = ssl.create_default_context(cafile=trust_certs_file_path or None)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"bookie_tls_trust_certs_file_path: cannot load {trust_certs_file_path!r}: "
                          f"{type(e).__name__}: {getattr(e, 'strerror', None) or e}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


__all__ = ["client_context", "server_context"]
