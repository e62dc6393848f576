#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs, checks that the generated
# protobuf code is current, then runs unit, simulation, integration, chaos and fuzz tests
# (tests/fuzz with 5 s of fuzzing per target; PULSARLITE_FUZZ=0 leaves it out).
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`).
# PULSARLITE_TEST_WORKERS=1 runs one pytest process (the simulation sweeps then run in a background
# process beside it: tests/sim/background_sweep.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== generated code up to date?"
.venv/bin/python scripts/gen_proto.py --check
# A suite run writes ~2-3 GB at a time under the temp directory (clusters' journals and entry logs;
# a passed test's directory is deleted at its end): on a fuller disk ZooKeeper stops mid-run.
tmp_dir="$(.venv/bin/python -c 'import tempfile; print(tempfile.gettempdir())')"
free_kib="$(df -Pk "$tmp_dir" | awk 'NR == 2 {print $4}')"
echo "== free disk under $tmp_dir: $((free_kib / 1024)) MiB"
if [ "$free_kib" -lt $((4 * 1024 * 1024)) ]; then
  echo "WARNING: less than 4 GiB free under $tmp_dir; integration tests may fail when the disk fills" >&2
fi
echo "== tests"
# Two pytest-xdist workers (PULSARLITE_TEST_WORKERS, 1 = one process), each taking whole modules
# (a module's cluster is started once), in the collected order: the simulation sweeps first (the
# longest tests), then the rest as workers free up.
workers="${PULSARLITE_TEST_WORKERS:-2}"
parallel=()
if [ "$workers" -gt 1 ]; then
  parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "${parallel[@]}" "$@"
