#!/usr/bin/env bash
# Installs everything pulsarlite needs on a fresh Debian machine (root, Python 3.11, Java 17):
# Debian's zookeeper package when missing, a virtualenv at .venv, the package and its test extras.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -f /usr/share/java/zookeeper.jar ]; then
  echo "== installing Debian's zookeeper"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=120 update -q
  apt-get -o DPkg::Lock::Timeout=120 install -y --no-install-recommends zookeeper
fi
command -v java >/dev/null || { echo "java (17) is required" >&2; exit 1; }

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.pulsarlite-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "== installing python packages into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[test]"
  touch "$stamp"
fi
echo "== setup done"
