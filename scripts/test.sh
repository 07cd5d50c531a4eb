#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the test suite. Extra arguments go to pytest, e.g.
#   bash scripts/test.sh -m slow        # the slow tests (real default model, bigger pipelines)
#   bash scripts/test.sh -m "not gpu"   # everything that runs without a GPU
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec python -m pytest "$@"
