#!/usr/bin/env bash
# The main job, from a fresh machine: installs what it needs, starts a local cluster
# (ZooKeeper + 3 bookies) under ./run/cluster, writes a replicated ledger (E3/Qw3/Qa2) and reads
# it back. The cluster keeps running afterwards; stop it with
#   .venv/bin/pulsarlite cluster stop --dir run/cluster
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
DIR=${PULSARLITE_DIR:-run/cluster}
PL=.venv/bin/pulsarlite
$PL cluster start --dir "$DIR" --bookies 3
ZK=$($PL cluster status --dir "$DIR" --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["zookeeper"])')
$PL cluster status --dir "$DIR"
echo "== writing 1000 entries to a new ledger (ensemble 3, write quorum 3, ack quorum 2)"
OUT=$($PL bookkeeper --zookeeper "$ZK" simpletest --ensemble 3 --write-quorum 3 --ack-quorum 2 --entries 1000 --json)
echo "$OUT"
LEDGER=$(echo "$OUT" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["ledger_id"])')
echo "== reading ledger $LEDGER back"
$PL bookkeeper --zookeeper "$ZK" readledger "$LEDGER" --json
$PL bookkeeper --zookeeper "$ZK" ledgermetadata "$LEDGER"
$PL bookkeeper --zookeeper "$ZK" listbookies
echo
echo "The cluster is still running (ZooKeeper at $ZK). Stop it with:"
echo "  $PL cluster stop --dir $DIR"
