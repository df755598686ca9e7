"""The command line of ``python -m asr_core lm ppl`` (the perplexities: :mod:`asr_core.lm.ppl`): its options, and
the checks of the contexts and of the checkpoint's file made before torch is imported, so that a wrong argument is
refused in a fraction of a second.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr_core.contract.folder.checkpoint_file import file_refusal
from asr_core.contract.options import renamed


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m asr_core lm ppl",
                                 description="Per-token perplexity of an LM checkpoint at several contexts.")
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--data", action="append", required=True, metavar="[NAME=]SPEC",
                    help="text:FILE.jsonl|FILE.txt|FOLDER or a corpus spec FORMAT:PATH (repeatable)")
    renamed(ap, "--context", ap.add_argument("--lm-contexts", dest="context", default="64,256,1024",
                                             help="LM contexts in tokens, comma-separated"))
    ap.add_argument("--chunk", type=int, default=0, help="tokens scored per forward pass (0: the training chunk)")
    ap.add_argument("--batch", type=int, default=8, help="documents scored side by side")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                    help="auto: bf16 autocast on CUDA, fp32 on the CPU")
    ap.add_argument("--tracking-uri", default=None, help="log lm_ppl/<dataset>/ctx<n> to MLflow there")
    ap.add_argument("--run-id", default=None, help="the run to log into (default: the checkpoint's)")
    ap.add_argument("--tail", type=Path, default=None, metavar="FILE.json",
                    help="a tail set (python -m asr_core tailset): also the perplexity over the tokens of its words")
    a = ap.parse_args(argv)
    try:
        contexts = sorted({int(c) for c in a.context.split(",") if c.strip()})
        if not contexts or min(contexts) < 0:
            raise ValueError
    except ValueError:
        print(f"lm ppl: --lm-contexts {a.context!r} must be non-negative integers separated by commas, e.g. 64,256,1024",
              file=sys.stderr)
        return 2
    refused = file_refusal(a.checkpoint)  # the LM's reader says the same, after torch is imported
    if refused:
        print(f"lm ppl: {refused}", file=sys.stderr)
        return 2
    from asr_core.lm.ppl import run

    return run(a, contexts)
