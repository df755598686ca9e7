"""Alias kept for ``python -m orchestrate.loadtest``: the load test lives in :mod:`orchestrate.tools.loadtest`."""

import sys

from orchestrate.tools.loadtest import main

if __name__ == "__main__":
    sys.exit(main())
