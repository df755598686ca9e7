"""How alike a trained model's attention heads are (paper 003), measured on test recordings and logged to its run.

The command line of ``python -m asr_core heads`` (the measurement: :mod:`asr_core.probes.heads`): its options, and
the checks of a checkpoint's file made before torch is imported, so that a wrong path is refused in a fraction of
a second.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr_core.contract.folder.checkpoint_file import command_refusal
from asr_core.contract.trial import HEADS_DIR
from asr_core.data.corpora import CorpusError
from asr_core.runtime.outbox import fail_fast_http


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m asr_core heads", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--data", action="append", default=None, metavar="NAME=FORMAT:PATH",
                    help="a dataset (repeatable); default: the first of the checkpoint's eval.datasets")
    ap.add_argument("--rows", type=int, default=None,
                    help="query rows of A sampled per window (default: the checkpoint's eval.head_rows, 64)")
    ap.add_argument("--max-windows", type=int, default=None,
                    help="windows per dataset (default: the checkpoint's eval.head_windows, 32)")
    ap.add_argument("--batch-windows", type=int, default=None,
                    help="windows per forward pass; 0 = sized from the GPU's free memory (8 on the CPU); default: "
                         "the checkpoint's eval.batch_windows")
    ap.add_argument("--precision", default=None, choices=("auto", "bf16", "fp32"),
                    help="auto: bf16 autocast on CUDA, fp32 on the CPU; default: the checkpoint's eval.precision")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--out", type=Path, default=None, help=f"folder for the matrices and figures (default: "
                    f"{HEADS_DIR}/ next to CKPT)")
    ap.add_argument("--strict", action="store_true", help="a bad corpus file is fatal instead of skipped")
    ap.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: the one the checkpoint "
                    "recorded; with no run known, nothing is logged)")
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--no-log", action="store_true", help="do not log to MLflow")
    a = ap.parse_args(argv)
    fail_fast_http()  # one MLflow call fails fast; the outbox retries
    refused = command_refusal("heads", a.checkpoint)  # before torch is imported: a second, not several
    if refused:
        print(refused, file=sys.stderr)
        return 2
    try:
        from asr_core.config import Config
        from asr_core.model.heads import REPRESENTATIONS
        from asr_core.probes.heads import measure
        from asr_core.training.checkpoint import acoustic_header

        ck = acoustic_header(a.checkpoint)
        ev = Config.from_stored(ck["config"], source=str(a.checkpoint)).eval
        del ck
        data = a.data or list(ev.datasets[:1])
        results = measure(a.checkpoint, data, rows=a.rows if a.rows is not None else ev.head_rows,
                          max_windows=a.max_windows if a.max_windows is not None else ev.head_windows,
                          batch_windows=a.batch_windows if a.batch_windows is not None else ev.batch_windows,
                          precision=a.precision or ev.precision, device=a.device, tracking_uri=a.tracking_uri,
                          run_id=a.run_id, out_dir=a.out, log=not a.no_log, strict=a.strict)
    except (CorpusError, ValueError, FileNotFoundError, KeyError) as e:
        print(f"heads: {e}", file=sys.stderr)
        return 2
    for name, s in results.items():
        print(f"{name}: {s.windows} windows of {s.context_s:g} s")
        for r in REPRESENTATIONS:
            layers = " ".join(f"{v:.3f}" for v in s.diversity[r])
            print(f"  {r}: sum {s.diversity[r].sum():.4f}  similarity {s.similarity[r].mean():.4f}  per layer "
                  f"{layers}")
    return 0
