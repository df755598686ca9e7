"""``python -m asr_study``: the same as the installed ``asr-study`` command."""

from __future__ import annotations

import sys

from asr_study.cli import main

if __name__ == "__main__":
    sys.exit(main())
