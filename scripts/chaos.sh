#!/usr/bin/env bash
# The longer chaos runs (time-bounded): seeded runs one after another, alternating 4 and 3
# bookies, until the budget is spent. Each run: a fresh local cluster (2 brokers), producers of
# the official client and pulsarlite's own, a seeded fault schedule (kill -9 bookies, all
# bookies, brokers; SIGSTOP a broker past its session; restart ZooKeeper; a bookie's disk full),
# then every acknowledged message checked present, in order, with duplicates counted.
#
#   bash scripts/chaos.sh                       # ~15 minutes, runs of 180 s of faults
#   CHAOS_BUDGET_S=3600 CHAOS_RUN_S=300 CHAOS_SEED=100 bash scripts/chaos.sh
#
# Results (one JSON line per run) are appended to run/chaos/results.jsonl; a failed run keeps its
# directory (logs) and prints the command that replays it. Exit status 1 if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
BUDGET_S=${CHAOS_BUDGET_S:-900}
RUN_S=${CHAOS_RUN_S:-180}
SPARK=--spark   # CHAOS_SPARK=0: skip the Spark scan
if [ "${CHAOS_SPARK:-1}" = 0 ]; then SPARK=""; fi
SEED=${CHAOS_SEED:-$(date +%s)}
mkdir -p run/chaos
RESULTS=run/chaos/results.jsonl
deadline=$(( $(date +%s) + BUDGET_S ))
failed=0
runs=0
bookies=4
while [ "$(date +%s)" -lt "$deadline" ]; do
  left=$(( deadline - $(date +%s) ))
  # a run takes its fault time plus ~60-120 s of start, heal and read-back
  duration=$RUN_S
  if [ "$left" -lt $(( RUN_S + 120 )) ]; then duration=$(( left - 120 )); fi
  if [ "$duration" -lt 30 ]; then break; fi
  echo "== chaos run seed=$SEED bookies=$bookies duration_s=$duration ($left s of budget left)"
  if .venv/bin/python -m tests.chaos.run --seed "$SEED" --duration-s "$duration" --bookies "$bookies" $SPARK \
       --dir "run/chaos/seed-$SEED" --results "$RESULTS"; then
    rm -rf "run/chaos/seed-$SEED"
  else
    failed=$((failed + 1))
  fi
  runs=$((runs + 1))
  SEED=$((SEED + 1))
  if [ "$bookies" = 4 ]; then bookies=3; else bookies=4; fi
done
echo "== $runs chaos runs, $failed failed; results in $RESULTS"
.venv/bin/python - "$RESULTS" "$runs" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][-int(sys.argv[2]):] if int(sys.argv[2]) else []
print("| seed | bookies | faults | acknowledged | lost | duplicated | redelivered | ok |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['seed']} | {r['bookies']} | {len(r['faults'])} | {r['acknowledged']} | {r['lost']} | "
          f"{r['duplicated']} | {r.get('redelivered')} | {'yes' if r['ok'] else 'NO'} |")
PY
[ "$failed" = 0 ]
