"""Alias kept for ``python -m orchestrate.estimate --derive``: the estimate lives in
:mod:`orchestrate.budget.estimate`."""

import sys

from orchestrate.budget.estimate import derive_cli

if __name__ == "__main__":
    sys.exit(derive_cli(sys.argv[1:]))
