"""``python -m orchestrate COMMAND ...`` (the same as the installed ``orchestrate`` script)."""

import sys

from orchestrate.cli.commands import main

if __name__ == "__main__":
    sys.exit(main())
