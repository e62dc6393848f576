#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs, checks that the generated
# protobuf code is current, then runs unit, simulation, integration, chaos and fuzz tests
# (tests/fuzz with 5 s of fuzzing per target; PULSARLITE_FUZZ=0 leaves it out).
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== generated code up to date?"
.venv/bin/python scripts/gen_proto.py --check
echo "== tests"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
