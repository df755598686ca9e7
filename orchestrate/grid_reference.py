"""Alias kept for ``python -m orchestrate.grid_reference``, the command docs/grid-format.md named until the grid
reader moved into :mod:`orchestrate.plan`: the reference lives in :mod:`orchestrate.plan.grid_reference`."""

import sys

from orchestrate.plan.grid_reference import main

if __name__ == "__main__":
    sys.exit(main())
