#!/usr/bin/env bash
# The test suite: unit tests, integration tests against a real local SLURM cluster and `mlflow server`, and the
# quick demo study end to end. Installs what it needs first. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONUNBUFFERED=1
exec .venv/bin/python -m pytest --durations=30 "$@"
