#!/usr/bin/env bash
# The test suite: unit tests, integration tests against a real local SLURM cluster and `mlflow server`, and the
# quick demo study end to end, on two workers (TEST_WORKERS=N to change; tests/conftest.py keeps what shares a
# session fixture on one worker). Installs what it needs first. Extra arguments go to pytest.
#   ./scripts/test.sh            the whole suite (30-60 minutes on 2 cores: docs/results/2026-11-30-suite-time.md)
#   ./scripts/test.sh fast       the fast tier for daily work: no SLURM, browser or slow tests (3-4 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONUNBUFFERED=1
# one thread per process: two workers (and the trainers they start) share two cores, and torch's threads spin-wait;
# a process that wants more sets it itself
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
if [[ "${1:-}" == "fast" ]]; then
  shift
  set -- -m "not slow and not slurm and not browser" "$@"
fi
exec .venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" --dist loadgroup --durations=30 "$@"
