#!/usr/bin/env bash
# Set up (once) and run a broker on the embedded defaults: 127.0.0.1:9092, segments in
# ./data, embedded metadata in ./data/meta. Extra arguments go to `kafscale broker`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/kafscale broker "$@"
