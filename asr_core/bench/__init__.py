"""``python -m asr_core bench train|decode|data|calibrate``: speed and memory tables measured in one run;
``calibrate`` also writes the calibration file that ``orchestrate plan --estimate`` reads."""

from __future__ import annotations

import importlib
import sys

BENCHES = {"train": "asr_core.bench.train", "decode": "asr_core.bench.decode", "data": "asr_core.bench.data",
           "calibrate": "asr_core.bench.calibrate"}


def cli(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHES:
        print(f"usage: python -m asr_core bench {{{'|'.join(BENCHES)}}} [ARGS]", file=sys.stderr)
        return 2
    return int(importlib.import_module(BENCHES[argv[0]]).cli(argv[1:]) or 0)
