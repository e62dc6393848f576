#!/usr/bin/env bash
# Makes deploy/secrets/ for deploy/docker-compose.secure.yml (git-ignored; never check it in):
#   ca.cert.pem                    a CA of this deployment (its key is left beside the directory, as
#                                  secrets.ca.key.pem: keep it offline, it is not mounted)
#   broker.cert.pem / .key.pem     the brokers' certificate (SAN: localhost, 127.0.0.1, broker-1, broker-2)
#   bookie.cert.pem / .key.pem     the bookies' certificate, TLS on the bookie port (SAN: localhost,
#                                  127.0.0.1, bookie-1, bookie-2, bookie-3)
#   token-secret.key               the HS256 secret key, raw bytes (Pulsar's `tokens create-secret-key` format)
#   admin.token                    a token for role "admin" (the superuser), for the CLI and clients
# Needs openssl and pulsarlite (PULSARLITE=path to the command; default .venv/bin/pulsarlite).
# Refuses to overwrite an existing directory.
set -euo pipefail
cd "$(dirname "$0")"
out=$(realpath -m "${1:-secrets}")
pulsarlite=${PULSARLITE:-$PWD/../.venv/bin/pulsarlite}
if [ -e "$out" ]; then echo "$out exists: remove it first to make new secrets" >&2; exit 1; fi
mkdir -m 700 "$out"
umask 077
openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj "/CN=pulsarlite-deploy-ca" \
  -keyout "$out/ca.key.pem" -out "$out/ca.cert.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=pulsarlite-broker" \
  -keyout "$out/broker.key.pem" -out "$out/broker.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:broker-1,DNS:broker-2\n' > "$out/san.ext"
openssl x509 -req -in "$out/broker.csr" -CA "$out/ca.cert.pem" -CAkey "$out/ca.key.pem" -CAcreateserial \
  -days 825 -extfile "$out/san.ext" -out "$out/broker.cert.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=pulsarlite-bookie" \
  -keyout "$out/bookie.key.pem" -out "$out/bookie.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:bookie-1,DNS:bookie-2,DNS:bookie-3\n' > "$out/san.ext"
openssl x509 -req -in "$out/bookie.csr" -CA "$out/ca.cert.pem" -CAkey "$out/ca.key.pem" -CAcreateserial \
  -days 825 -extfile "$out/san.ext" -out "$out/bookie.cert.pem" 2>/dev/null
rm -f "$out/broker.csr" "$out/bookie.csr" "$out/san.ext" "$out/ca.cert.srl"
"$pulsarlite" tokens create-secret-key --output "$out/token-secret.key"
"$pulsarlite" tokens create --secret-key "file://$out/token-secret.key" --subject admin > "$out/admin.token"
# the containers run as uid 10001 (deploy/Dockerfile): as root, hand the files to it and keep
# them private; otherwise they must be world-readable for the containers to read them
mv "$out/ca.key.pem" "$out.ca.key.pem"          # the CA key does not go into the containers
if [ "$(id -u)" = 0 ]; then
  chown -R 10001 "$out"
  chmod 700 "$out"; chmod 600 "$out"/*
else
  chmod 755 "$out"; chmod 644 "$out"/*
  echo "warning: not root, so $out/ is world-readable (the containers run as uid 10001);" \
       "run this as root to keep the broker key and the token secret private" >&2
fi
echo "made $(cd "$out" && pwd): ca.cert.pem, broker.{cert,key}.pem, bookie.{cert,key}.pem, token-secret.key, admin.token"
