"""Alias kept for ``python -m orchestrate.estimate --derive``: the estimate lives in
:mod:`orchestrate.budget.estimate`, the derivation of the built-in calibration in :mod:`orchestrate.budget.paper_fit`."""

import sys

from orchestrate.budget.paper_fit import derive_cli

if __name__ == "__main__":
    sys.exit(derive_cli(sys.argv[1:]))
