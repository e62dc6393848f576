"""``pulsarlite tokens create-secret-key | create-key-pair | create | show | validate``: Pulsar's
``pulsar tokens`` (same options, same key files and token format; pulsarlite/tokens.py).

Keys are given as the broker takes them (``token_secret_key`` / ``tokenSecretKey``):
``file:///path``, ``data:;base64,...``, a path, or bare base64. Keys are written with mode 0600
and never printed unless asked for (``create-secret-key`` without ``--output``)."""

from __future__ import annotations

import secrets
import sys
import time

from pulsarlite.process import write_private_file


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("tokens", help="make and check authentication tokens (as `pulsar tokens`)")
    sub = p.add_subparsers(dest="tokens_command", required=True)

    s = sub.add_parser("create-secret-key", help="a new secret key for HS256/HS384/HS512 tokens")
    s.add_argument("-a", "--signature-algorithm", default="HS256", choices=["HS256", "HS384", "HS512"])
    s.add_argument("-o", "--output", help="write the key to this file (mode 0600) instead of stdout")
    s.add_argument("-b", "--base64", action="store_true", help="encode the key in base64")
    s.set_defaults(func=_create_secret_key)

    k = sub.add_parser("create-key-pair", help="a new private/public key pair (DER) for RS*/ES* tokens")
    k.add_argument("-a", "--signature-algorithm", default="RS256",
                   choices=["RS256", "RS384", "RS512", "ES256", "ES384", "ES512"])
    k.add_argument("--output-private-key", required=True, help="file for the private key (PKCS#8 DER, mode 0600)")
    k.add_argument("--output-public-key", required=True, help="file for the public key (X.509 DER)")
    k.set_defaults(func=_create_key_pair)

    c = sub.add_parser("create", help="a new token for a role")
    c.add_argument("-s", "--subject", required=True, help="the role the token is for (the sub claim)")
    key = c.add_mutually_exclusive_group(required=True)
    key.add_argument("-sk", "--secret-key", help="secret key: file:///path, data:;base64,..., a path or base64")
    key.add_argument("-pk", "--private-key", help="private key: file:///path, data:..., or a path (DER or PEM)")
    c.add_argument("-e", "--expiry-time", help="relative expiry (30s, 10m, 3h, 2d, 1w, 1y); default: never")
    c.add_argument("-a", "--signature-algorithm", default=None,
                   help="default HS256 with a secret key, RS256 / ES256 with a private key")
    c.add_argument("--headers", action="append", default=[], metavar="KEY=VALUE", help="extra JWT header fields")
    c.set_defaults(func=_create)

    for name, helptext in (("show", "print a token's header and claims (signature not checked)"),
                           ("validate", "check a token's signature and expiry; print its claims")):
        v = sub.add_parser(name, help=helptext)
        source = v.add_mutually_exclusive_group()
        source.add_argument("-i", "--token", help="the token (else --token-file or stdin)")
        source.add_argument("-f", "--token-file", help="file holding the token")
        source.add_argument("--stdin", action="store_true", help="read the token from stdin")
        if name == "validate":
            vk = v.add_mutually_exclusive_group(required=True)
            vk.add_argument("-sk", "--secret-key", help="secret key (as for create)")
            vk.add_argument("-pk", "--public-key", help="public key: file:///path, data:..., or a path (DER or PEM)")
        v.set_defaults(func=_show if name == "show" else _validate)


def _read_key(value: str, option: str) -> bytes:
    from pulsarlite.security.tokens import read_key_bytes
    return read_key_bytes(value, setting=option)


def _token_of(args) -> str:
    if args.token:
        return args.token
    if args.token_file:
        with open(args.token_file) as f:
            return f.read()
    return sys.stdin.read()


def _run(body) -> int:
    from pulsarlite.errors import PulsarliteError
    try:
        return body()
    except (PulsarliteError, OSError) as e:
        print(f"pulsarlite tokens: {e}", file=sys.stderr)
        return 1


def _create_secret_key(args) -> int:
    from pulsarlite.tokens import create_secret_key, encode_key_output

    def body() -> int:
        data = encode_key_output(create_secret_key(args.signature_algorithm, secrets.token_bytes), args.base64)
        if args.output:
            write_private_file(args.output, data)
        else:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        return 0
    return _run(body)


def _create_key_pair(args) -> int:
    from pulsarlite.tokens import create_key_pair

    def body() -> int:
        private, public = create_key_pair(args.signature_algorithm)
        write_private_file(args.output_private_key, private)
        with open(args.output_public_key, "wb") as f:
            f.write(public)
        return 0
    return _run(body)


def _create(args) -> int:
    from pulsarlite.tokens import TokenError, create_token, parse_relative_time_s

    def body() -> int:
        headers = {}
        for item in args.headers:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise TokenError(f"--headers: expected KEY=VALUE, got {item!r}")
            headers[name] = value
        expiry_s = parse_relative_time_s(args.expiry_time) if args.expiry_time else None
        token = create_token(
            subject=args.subject, now_s=time.time(), algorithm=args.signature_algorithm, expiry_s=expiry_s,
            headers=headers,
            secret_key=_read_key(args.secret_key, "--secret-key") if args.secret_key else None,
            private_key=_read_key(args.private_key, "--private-key") if args.private_key else None)
        print(token)
        return 0
    return _run(body)


def _show(args) -> int:
    from pulsarlite.tokens import dumps, show_token

    def body() -> int:
        shown = show_token(_token_of(args))
        print(f"header={dumps(shown['header'])} body={dumps(shown['body'])}")
        return 0
    return _run(body)


def _validate(args) -> int:
    from pulsarlite.tokens import dumps, validate_token

    def body() -> int:
        claims = validate_token(
            _token_of(args), now_s=time.time(),
            secret_key=_read_key(args.secret_key, "--secret-key") if args.secret_key else None,
            public_key=_read_key(args.public_key, "--public-key") if args.public_key else None)
        print(dumps(claims))
        return 0
    return _run(body)
