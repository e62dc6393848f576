#!/usr/bin/env bash
# The main job, from a fresh machine: installs what it needs, starts a local cluster
# (ZooKeeper + 3 bookies + 1 broker) under ./run/cluster, writes a replicated ledger (E3/Qw3/Qa2)
# and reads it back, then produces to and consumes from a topic through the broker with the
# official Pulsar client. The cluster keeps running afterwards; stop it with
#   .venv/bin/pulsarlite cluster stop --dir run/cluster
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
DIR=${PULSARLITE_DIR:-run/cluster}
PL=.venv/bin/pulsarlite
$PL cluster start --dir "$DIR" --bookies 3 --brokers 1
STATUS=$($PL cluster status --dir "$DIR" --json)
ZK=$(echo "$STATUS" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["zookeeper"])')
SERVICE_URL=$(echo "$STATUS" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["service_url"])')
ADMIN_URL=$(echo "$STATUS" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["admin_url"])')
$PL cluster status --dir "$DIR"
echo "== writing 1000 entries to a new ledger (ensemble 3, write quorum 3, ack quorum 2)"
OUT=$($PL bookkeeper --zookeeper "$ZK" simpletest --ensemble 3 --write-quorum 3 --ack-quorum 2 --entries 1000 --json)
echo "$OUT"
LEDGER=$(echo "$OUT" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["ledger_id"])')
echo "== reading ledger $LEDGER back"
$PL bookkeeper --zookeeper "$ZK" readledger "$LEDGER" --json
$PL bookkeeper --zookeeper "$ZK" ledgermetadata "$LEDGER"
$PL bookkeeper --zookeeper "$ZK" listbookies
echo "== producing and consuming through the broker ($SERVICE_URL) with the official Pulsar client"
.venv/bin/python scripts/demo_pubsub.py "$SERVICE_URL" --messages 1000
echo
echo "The cluster is still running:"
echo "  service URL  $SERVICE_URL   (any Pulsar client)"
echo "  admin URL    $ADMIN_URL   (e.g. curl $ADMIN_URL/admin/v2/persistent/public/default)"
echo "  ZooKeeper    $ZK"
echo "Stop it with:"
echo "  $PL cluster stop --dir $DIR"
