#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv with the locked dependencies and the project.
# Usage: scripts/setup.sh [--test]   (--test adds the system packages the tests start:
# etcd, kcat, Java for Spark, Node for kafkajs, and .venv-quix and .venv-faust for the
# Quix Streams and Faust tests)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ "${1:-}" = "--test" ]; then
  need=()
  command -v etcd >/dev/null || need+=(etcd-server)
  command -v etcdctl >/dev/null || need+=(etcd-client)
  command -v kcat >/dev/null || need+=(kcat)
  command -v java >/dev/null || need+=(openjdk-17-jre-headless)
  command -v javac >/dev/null || need+=(openjdk-17-jdk-headless)  # the Java client test
  command -v node >/dev/null || need+=(nodejs)
  command -v npm >/dev/null || need+=(npm)
  if [ ${#need[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "installing system packages: ${need[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.kafscale-lock-$(cat requirements.lock pyproject.toml setup.py protocol/_fastrecords.c protocol/native_common.h ingest_job/_columnar.c segments/_localio.c | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements.lock
  .venv/bin/python -m pip install -q --no-deps -e .
  rm -f .venv/.kafscale-lock-* && touch "$stamp"
fi

# The project's byte code, compiled once here: where PYTHONDONTWRITEBYTECODE is set, every
# process (each broker, each bench or test helper) would otherwise compile its sources
# again on import, ~0.2 s of CPU per broker start. Up-to-date files are skipped.
.venv/bin/python -m compileall -q -j0 protocol segments groupcoord txncoord broker ingest_job bench tests >/dev/null

# A framework whose pins clash with the project's gets a virtualenv of its own, built
# from its lock (rebuilt when the lock changes): side_venv DIR LOCK
side_venv() {
  local stamp
  stamp=$1/.lock-$(sha256sum "$2" | cut -c1-16)
  if [ ! -f "$stamp" ]; then
    [ -x "$1/bin/python" ] || "$PY" -m venv "$1"
    "$1/bin/python" -m pip install -q -r "$2"
    rm -f "$1"/.lock-* && touch "$stamp"
  fi
}
if [ "${1:-}" = "--test" ]; then
  # Quix Streams (the compaction test's stateful app) pins confluent-kafka below ours
  side_venv .venv-quix tests/integration/quix/requirements.lock
  # Faust (faust-streaming) pins click below ours
  side_venv .venv-faust tests/integration/faust/requirements.lock
fi

if [ "${1:-}" = "--test" ] && [ -f tests/integration/js/package.json ]; then
  (cd tests/integration/js && { [ -d node_modules ] || npm ci --silent --no-audit --no-fund; })
fi
