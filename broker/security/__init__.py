"""Authentication and authorization of the broker's clients (issue 27, docs/architecture.md#invariant-11).

- :mod:`broker.security.authentication`: who a client is. Providers (token, basic, tls) turn the
  credentials a client presents (CONNECT's auth method and data, an HTTP ``Authorization``
  header, the peer certificate of a TLS connection) into a role, or refuse.
- :mod:`broker.security.authorization`: what a role may do (superusers, tenant admins,
  namespace and topic permissions).

Both are pure: no I/O and no clock of their own (time is passed in). Secrets never leave them:
errors and logs name the method and the reason, never the credential.
"""
