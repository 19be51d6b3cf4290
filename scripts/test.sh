#!/usr/bin/env bash
# Install everything the tests need (system packages, locked Python dependencies, kafkajs)
# and run the whole suite: unit tests, then integration tests with real etcd, SeaweedFS,
# brokers, Kafka clients and Spark. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
exec .venv/bin/python -m pytest -q -rfEs -p no:cacheprovider "$@"
