#!/bin/sh
# Makes the bookie-authentication secrets of a compose deployment at its first start (the
# bookie-auth-init service of deploy/docker-compose*.yml; trust model in docs/security.md), in
# DIR (default /var/lib/pulsarlite-auth, the bookie-auth volume):
#   secret.key          the HS256 key the bookies verify tokens with (raw bytes)
#   broker.token        the brokers' credential towards the bookies (role "broker")
#   autorecovery.token  the bookies' own autorecovery workers' credential (role "autorecovery")
#   admin.token         the operator shell's (role "admin")
#   zookeeper.digest    the ZooKeeper credential "pulsarlite:<random>" of every broker, bookie and
#                       the shell (digest ACLs on the znodes):
#     docker compose exec bookie-1 pulsarlite bookkeeper --zookeeper zookeeper:2181 \
#       --zookeeper-auth-digest-file /var/lib/pulsarlite-auth/zookeeper.digest \
#       --bookie-auth-token-file /var/lib/pulsarlite-auth/admin.token listbookies
# Files are 0600, made once and kept across restarts (never overwritten); delete the volume to
# make new ones. Needs pulsarlite on PATH (PULSARLITE=path to override).
set -eu
dir=$(cd "${1:-/var/lib/pulsarlite-auth}" && pwd)
pulsarlite=${PULSARLITE:-pulsarlite}
umask 077
cd "$dir"
if [ ! -s secret.key ]; then
  "$pulsarlite" tokens create-secret-key --output secret.key.tmp
  mv secret.key.tmp secret.key
fi
for role in broker autorecovery admin; do
  if [ ! -s "$role.token" ]; then
    "$pulsarlite" tokens create --secret-key "file://$dir/secret.key" --subject "$role" > "$role.token.tmp"
    mv "$role.token.tmp" "$role.token"
  fi
done
if [ ! -s zookeeper.digest ]; then
  password=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  printf 'pulsarlite:%s\n' "$password" > zookeeper.digest.tmp
  mv zookeeper.digest.tmp zookeeper.digest
fi
echo "authentication secrets in $dir: secret.key, broker.token, autorecovery.token, admin.token, zookeeper.digest"
