#!/usr/bin/env bash
# Installs everything pulsarlite needs on a fresh Debian machine (root, Python 3.11, Java 17):
# Debian's zookeeper, docker-compose, chromium, chromium-driver and postgresql packages when missing, a virtualenv at .venv, the package and its test extras.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: zookeeper (run by the launcher and tests) and docker-compose (CI validates
# deploy/docker-compose.yml with it; no Docker engine is needed for that), chromium and
# chromium-driver (the console's browser tests drive them through selenium; nothing is downloaded
# at test time), postgresql (initdb and postgres: the lakehouse tests run a catalog on a real
# PostgreSQL server in a temporary directory, tests/local_postgres.py; the package's own cluster is not used)
missing=""
[ -f /usr/share/java/zookeeper.jar ] || missing="$missing zookeeper"
command -v docker-compose >/dev/null || missing="$missing docker-compose"
command -v chromium >/dev/null || missing="$missing chromium"
command -v chromedriver >/dev/null || missing="$missing chromium-driver"
{ command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } || missing="$missing postgresql"
if [ -n "$missing" ]; then
  echo "== installing Debian's$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=120 update -q
  apt-get -o DPkg::Lock::Timeout=120 install -y --no-install-recommends $missing
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
