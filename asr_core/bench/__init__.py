"""``python -m asr_core bench train|decode|data|calibrate``: speed and memory tables measured in one run;
``calibrate`` also writes the calibration file that ``orchestrate plan --estimate`` reads."""

from __future__ import annotations

import importlib
import sys

BENCHES = {"train": "asr_core.bench.train", "decode": "asr_core.bench.decode", "data": "asr_core.bench.data",
           "calibrate": "asr_core.bench.calibrate"}


TEXTS = {"train": "training speed and memory tables; --gpu-presets for the paper's models",
         "decode": "real-time factor of moving-window decoding",
         "data": "the data side of a trial at the paper's scale: memory, start-up, loader rate",
         "calibrate": "real training steps on this device: a calibration file for orchestrate plan --estimate"}


def cli(argv: list[str]) -> int:
    """Dispatch to one bench; without one (or with ``--help``) the list of benches, each with its line."""
    if not argv or argv[0] not in BENCHES:
        asked = argv[:1] in (["-h"], ["--help"])
        print(f"usage: python -m asr_core bench {{{'|'.join(BENCHES)}}} [ARGS]\n\nbenches:\n"
              + "\n".join(f"  {name:10s}{TEXTS[name]}" for name in BENCHES), file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    return int(importlib.import_module(BENCHES[argv[0]]).cli(argv[1:]) or 0)
