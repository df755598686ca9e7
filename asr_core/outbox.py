"""Alias kept for ``python -m asr_core.outbox TRIAL_DIR ...``, the command that logs of earlier versions print: the
outbox lives in :mod:`asr_core.runtime.outbox` (shipped by :mod:`asr_core.runtime.shipper`) and its command is ``python -m asr_core outbox``."""

import sys

from asr_core.runtime.shipper import cli

if __name__ == "__main__":
    sys.exit(cli())
