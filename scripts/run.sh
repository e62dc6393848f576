#!/usr/bin/env bash
# The main command, from a fresh machine: installs what pulsarlite needs (scripts/setup.sh),
# starts `pulsarlite standalone` (ZooKeeper + 3 bookies + 1 broker + a file:// tier) with its data
# in ./run/standalone, waits until it is ready, produces and consumes 1,000 messages with the
# official Pulsar client (scripts/demo_pubsub.py), then keeps serving in the foreground until
# Ctrl-C, which stops every process (data kept for the next run).
#
#   bash scripts/run.sh               serve after the demo until Ctrl-C
#   bash scripts/run.sh --demo-only   stop after the demo (also when CI=true)
#
# Environment: PULSARLITE_DIR (data dir, default run/standalone), PULSARLITE_PORT (6650),
# PULSARLITE_HTTP_PORT (8080), PULSARLITE_ZK_PORT (2181), PULSARLITE_BOOKIE_PORT (3181: 3181..3183).
# Ports apply when the directory is created; an existing directory keeps its own.
set -euo pipefail
cd "$(dirname "$0")/.."

DEMO_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --demo-only) DEMO_ONLY=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $arg (try --help)" >&2; exit 2 ;;
  esac
done
if [ "${CI:-}" = "true" ]; then DEMO_ONLY=1; fi

bash scripts/setup.sh
DIR=${PULSARLITE_DIR:-run/standalone}
mkdir -p "$DIR"
OUT="$DIR/standalone.out"
: > "$OUT"

.venv/bin/pulsarlite standalone --data-dir "$DIR" \
  --port "${PULSARLITE_PORT:-6650}" --http-port "${PULSARLITE_HTTP_PORT:-8080}" \
  --zookeeper-port "${PULSARLITE_ZK_PORT:-2181}" --bookie-port "${PULSARLITE_BOOKIE_PORT:-3181}" \
  >"$OUT" 2>&1 &
PID=$!

stop_standalone() {
  trap - INT TERM
  if kill -0 "$PID" 2>/dev/null; then
    kill -TERM "$PID" 2>/dev/null || true
  fi
  wait "$PID" 2>/dev/null || true
  if [ "${SERVING:-0}" = 0 ]; then grep -E "^pulsarlite standalone: (stopping|stopped)" "$OUT" || true; fi
}
trap 'echo; echo "== stopping"; stop_standalone; exit 130' INT TERM

echo "== starting pulsarlite standalone in $DIR (output in $OUT)"
for _ in $(seq 1 600); do
  if grep -q "pulsarlite standalone is ready" "$OUT"; then break; fi
  if ! kill -0 "$PID" 2>/dev/null; then
    echo "pulsarlite standalone exited before it was ready:" >&2
    cat "$OUT" >&2
    wait "$PID" || exit $?
    exit 1
  fi
  sleep 0.5
done
if ! grep -q "pulsarlite standalone is ready" "$OUT"; then
  echo "pulsarlite standalone not ready after 300 s:" >&2; cat "$OUT" >&2; stop_standalone; exit 1
fi
sed -n '/pulsarlite standalone is ready/,/Press Ctrl-C/p' "$OUT"
SERVICE_URL=$(sed -n 's/^  service URL  //p' "$OUT" | head -1)
ADMIN_URL=$(sed -n 's/^  admin URL    //p' "$OUT" | head -1)

DEMO_TOPIC="demo-$(date +%s)"
echo "== producing and consuming 1000 messages through $SERVICE_URL with the official Pulsar client"
DEMO_STATUS=0
.venv/bin/python scripts/demo_pubsub.py "$SERVICE_URL" --messages 1000 \
  --topic "persistent://public/default/$DEMO_TOPIC" || DEMO_STATUS=$?
echo "== topics: curl $ADMIN_URL/admin/v2/persistent/public/default"
curl -fsS "$ADMIN_URL/admin/v2/persistent/public/default" 2>/dev/null | head -c 2000 || true
echo
echo "== web console: open $ADMIN_URL/ in a browser (cluster, tenants, topics);"
echo "   the demo topic's segments: $ADMIN_URL/#/topic/public/default/$DEMO_TOPIC"

if [ "$DEMO_ONLY" = 1 ] || [ "$DEMO_STATUS" != 0 ]; then
  stop_standalone
  exit "$DEMO_STATUS"
fi

echo "== serving until Ctrl-C (service URL $SERVICE_URL, web console and admin $ADMIN_URL/); standalone output follows"
SERVING=1
tail -n 0 -f --pid="$PID" "$OUT" &
wait "$PID" || STATUS=$?
trap - INT TERM
exit "${STATUS:-0}"
