"""The command line of ``python -m asr_core evaluate`` (:func:`asr_core.evaluation.evaluate.cli` runs it): its
options, the values of ``--fusion`` and ``--window-s`` parsed and checked, and the summary table it prints.

Nothing here imports torch or pandas: a refused option costs no more than starting Python.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from asr_core.contract.metrics import FUSION_METHODS, GREEDY, TAIL_COLUMNS, window_decoder
from asr_core.contract.options import renamed

if TYPE_CHECKING:
    import pandas as pd

WINDOWS_VALID = "valid: comma-separated positive numbers of seconds, each once, e.g. 5.12,10.24"


def parser(description: str) -> argparse.ArgumentParser:
    """The options of ``python -m asr_core evaluate``; unset ones are None (the checkpoint's ``eval`` section
    fills them in)."""
    ap = argparse.ArgumentParser(prog="python -m asr_core evaluate", description=description)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--data", action="append", default=None, metavar="NAME=FORMAT:PATH",
                    help="a dataset (repeatable); default: eval.datasets of the checkpoint's config")
    ap.add_argument("--snr", action="append", type=float, default=None, metavar="DB",
                    help="music at this SNR in dB (repeatable); clean audio is always evaluated; default: the "
                         "checkpoint's eval.snrs")
    ap.add_argument("--clean-only", action="store_true", help="no music at all (not the checkpoint's eval.snrs)")
    ap.add_argument("--noisy", action="append", default=None, metavar="NAME",
                    help="a dataset also decoded with music at the SNRs (repeatable); default: the checkpoint's "
                         "eval.noisy when --data is not given, else every dataset")
    ap.add_argument("--stride", type=float, default=None, help="window stride as a fraction of the context "
                    "(default: the checkpoint's eval.stride, 0.125)")
    ap.add_argument("--batch-windows", type=int, default=None,
                    help="windows decoded together; 0 = sized from the GPU's free memory (8 on the CPU); default: "
                         "the checkpoint's eval.batch_windows")
    ap.add_argument("--precision", default=None, choices=("auto", "bf16", "fp32"),
                    help="auto: bf16 autocast on CUDA, fp32 on the CPU; default: the checkpoint's eval.precision")
    ap.add_argument("--noise", default=None, help="'synthetic' or an audio file of music")
    ap.add_argument("--out", type=Path, default=None, help="folder for the CSV tables (default: next to CKPT)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--strict", action="store_true", help="a bad corpus file is fatal instead of skipped")
    ap.add_argument("--tail", type=Path, default=None, metavar="FILE.json",
                    help="a tail set (python -m asr_core tailset): also the tail-word error rate, logged as "
                         "tail/<NAME>; default: the checkpoint's eval.tail")
    ap.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: the one the checkpoint "
                    "recorded; with no run known, nothing is logged)")
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--no-log", action="store_true", help="do not log to MLflow")
    ap.add_argument("--fusion", default=None, metavar="METHOD[,METHOD...]",
                    help="window fusion methods decoded beside the greedy averaging (paper 001), each logged as "
                         f"wer_fusion-<METHOD>/...: {', '.join(FUSION_METHODS)}, or 'all'")
    ap.add_argument("--window-s", default=None, metavar="SECONDS[,SECONDS...]",
                    help="also decode greedily at these windows (seconds) instead of the model's context, windows "
                         "averaged at the same stride, each logged as wer_window-<SECONDS>s/...")
    b = ap.add_argument_group("beam search (paper 004): logged as wer_<NAME>/... beside the greedy wer/...")
    b.add_argument("--decoder", default=GREEDY, choices=(GREEDY, "beam"), help="greedy (default) or beam")
    b.add_argument("--lm", type=Path, default=None, help="with --decoder beam: an LM checkpoint (lm train)")
    renamed(b, "--alpha", b.add_argument("--lm-weight", dest="alpha", type=float, default=None,
                                         help="the LM's weight (default: BeamConfig's, paper 004's code)"))
    renamed(b, "--beta", b.add_argument("--token-bonus", dest="beta", type=float, default=None,
                                        help="bonus per token"))
    b.add_argument("--beam-width", type=int, default=None)
    b.add_argument("--lm-context", type=int, default=None, help="tokens the LM remembers (an LM's context is "
                   "counted in tokens)")
    b.add_argument("--prompt", type=Path, default=None, help="a text file the LM reads before each recording")
    b.add_argument("--decoder-name", default=None,
                   help="the metrics' prefix wer_<NAME>/ (default: beam, or beam-lm<CONTEXT> with an LM)")
    return ap


def parse_fusion(text: str | None) -> tuple[str, ...]:
    """``--fusion``'s value: comma-separated method names, or ``all`` (every one of
    :data:`~asr_core.contract.metrics.FUSION_METHODS`); None: none."""
    if text is None:
        return ()
    if text.strip() == "all":
        return FUSION_METHODS
    methods = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in methods if m not in FUSION_METHODS]
    if bad or not methods:
        what = f"{', '.join(map(repr, bad))} is not a window fusion method; " if bad else ""
        raise ValueError(f"--fusion {text!r}: {what}valid are {', '.join(FUSION_METHODS)} (comma-separated), or "
                         "'all'" + (" ('average' is the greedy decoder itself)" if "average" in bad else ""))
    return methods


def parse_windows(text: str | None) -> tuple[float, ...]:
    """``--window-s``'s value: comma-separated decoding windows in seconds, each positive and given once (as their
    decoder names, :func:`~asr_core.contract.metrics.window_decoder`, tell them apart); None: none. Raises
    ValueError naming the option, the value and what is valid."""
    if text is None:
        return ()
    try:
        windows = tuple(float(w) for w in text.split(","))
        names = [window_decoder(w) for w in windows]
    except ValueError:
        raise ValueError(f"--window-s {text!r}: {WINDOWS_VALID}") from None
    if len(set(names)) != len(names):
        raise ValueError(f"--window-s {text!r} repeats a window; {WINDOWS_VALID}")
    return windows


def print_summary(df: "pd.DataFrame") -> None:
    """The corpus WER (and cue and tail error rates where measured) per decoder, dataset and condition of
    :func:`~asr_core.evaluation.evaluate.evaluate`'s table, on stdout."""
    keys = ["decoder", "dataset", "condition"] if "decoder" in df.columns else ["dataset", "condition"]
    summary = df.groupby(keys, sort=False)[["ref_words", "substitutions", "deletions", "insertions"]].sum()
    summary["wer"] = 100 * (summary.substitutions + summary.deletions + summary.insertions) / summary.ref_words
    if df["cue_words"].notna().any():
        cue = df.dropna(subset=["cue_words"]).groupby(keys, sort=False)[["cue_words", "cue_errors"]].sum()
        summary = summary.join(cue)
        summary["cue"] = 100 * summary.cue_errors / summary.cue_words.where(summary.cue_words > 0)
    if "tail_words" in df.columns:
        summary = summary.join(df.groupby(keys, sort=False)[list(TAIL_COLUMNS)].sum())
        summary["tail"] = 100 * summary.tail_errors / summary.tail_words.where(summary.tail_words > 0)
    print(summary.round(2).to_string())
