"""The command line of ``python -m asr_core recall`` (the scoring: :mod:`asr_core.probes.recall`): its options and
their checks, made before torch is imported, so that a bad value is refused in a fraction of a second.

Single-window scoring of the recall plant's slots, and the causal check: the key re-rendered with another code word,
or silenced.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from asr_core.data.corpora import CorpusError
from asr_core.probes.checkpoints import out_for, refusal
from asr_core.probes.recall_options import AS_IS, KEYS, MIN_WINDOW_S, RECALL_DIR, check_window, parse_keys

def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m asr_core recall", description=__doc__.split("\n\n")[1].strip())
    ap.add_argument("checkpoints", type=Path, nargs="+", metavar="CKPT",
                    help="one or more checkpoints (e.g. a sweep's models at each context)")
    ap.add_argument("--data", action="append", required=True, metavar="NAME=podcast:PATH",
                    help="a dataset made with synth --recall (repeatable)")
    ap.add_argument("--key", default=AS_IS, metavar="EDITS",
                    help=f"comma-separated, of {', '.join(KEYS)} (default {AS_IS}): swap re-renders each clear "
                         "mention of the code word as another code word, silence as nothing (the causal check)")
    ap.add_argument("--window-s", type=float, default=None, metavar="S",
                    help=f"decode each slot from a window of S seconds, at least {MIN_WINDOW_S:g} (default: the "
                         "model's context)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--batch-windows", type=int, default=8, help="windows decoded together (default 8)")
    ap.add_argument("--out", type=Path, default=None, help=f"folder for the tables (default: {RECALL_DIR}/ next to "
                    "the checkpoint; needed for several checkpoints: each gets a folder in it)")
    a = ap.parse_args(argv)
    try:
        keys = parse_keys(a.key)
        check_window(a.window_s)
    except ValueError as e:
        print(f"recall: {e}", file=sys.stderr)
        return 2
    refused = refusal("recall", a.checkpoints, a.out)
    if refused:
        print(refused, file=sys.stderr)
        return 2
    from asr_core.evaluation.scorers.slots import write_slot_table
    from asr_core.probes.recall import SUMMARY_COLUMNS, measure

    renderers: dict[str, Any] = {}
    summary: list[dict[str, Any]] = []
    try:
        for k, ckpt in enumerate(a.checkpoints, 1):
            out = out_for(a.out, a.checkpoints, k)
            for path in measure(ckpt, a.data, keys=keys, device=a.device, batch_windows=a.batch_windows,
                                out_dir=out, renderers=renderers, summary=summary, window_s=a.window_s).values():
                print(f"table: {path}")
    except (CorpusError, ValueError, FileNotFoundError, KeyError) as e:
        print(f"recall: {e}", file=sys.stderr)
        return 2
    if len(a.checkpoints) > 1:
        path = write_slot_table(a.out / "summary.csv", summary, SUMMARY_COLUMNS)
        print(f"summary: {path}")
    return 0
