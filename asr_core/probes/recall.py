"""Single-window scoring of the recall plant's slots: for each slot, decode only the one window of the model's context
length that ends at the slot's code word, and score the slot as evaluation does.

``python -m asr_core recall CKPT [CKPT ...] --data NAME=podcast:PATH [--data ...] [--device auto|cpu|cuda]
[--batch-windows N] [--out DIR]``

``evaluate`` scores the slots of the moving-window decoding (:mod:`asr_core.evaluation.recall`), where each output
frame is the average over every window covering it: most of those windows end after the slot, and some start after
the clear mention a long context would need. Here each slot gets one window of exactly the model's context ending
at its code word's end (:func:`slot_window`; shorter where the recording starts later), so the far band tells the
model's reach from the decoder's dilution of distant evidence. The reference of a window is the transcript's words
lying wholly inside it (:func:`window_words`); the slot is correct when the hypothesis word aligned with its code
word equals it (:func:`asr_core.evaluation.recall.slot_rows`).

Features are computed over the whole recording (normalised as ``evaluate`` does) and then cut; the model runs in
fp32. Writes ``<NAME>.slots.csv`` per dataset to ``--out`` (default ``recall/`` beside the checkpoint; with several
checkpoints, a folder per checkpoint in it): one row per slot, the columns of
:data:`~asr_core.contract.metrics.SLOT_COLUMNS` (condition ``clean``) and ``scoring`` (``window``). Prints each
dataset's accuracy per group. Nothing is logged to MLflow.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from asr_core.contract.metrics import SLOT_COLUMNS
from asr_core.contract.specs import parse_dataset_spec
from asr_core.data.corpora import CorpusError, Recording, load_corpus
from asr_core.data.corpora.base import Word
from asr_core.decoding.decode import forward_windows, greedy_ids, prepare_features, window_frames
from asr_core.evaluation.recall import Slot, group_accuracy, marked_reference, recall_slots, slot_rows, write_slot_table

RECALL_DIR = "recall"
SCORING = "window"
COLUMNS = (*SLOT_COLUMNS, "scoring")
TIME_TOLERANCE_S = 1e-3  # word times are rounded to milliseconds


def slot_window(end_s: float, window: int, frames: int, frames_per_second: float) -> tuple[int, int]:
    """The input frames ``(start, end)`` of the window of ``window`` frames that ends at ``end_s`` seconds (the
    frame holding it included), within the recording's ``frames``: shorter where the recording starts later."""
    e = min(frames, max(1, math.ceil(end_s * frames_per_second - 1e-6)))
    return max(0, e - window), e


def window_words(words: Sequence[Word], start_s: float, end_s: float) -> list[int]:
    """The indices of the ``words`` lying wholly inside [start_s, end_s] (a word cut by the window's start is not
    in its reference)."""
    return [i for i, w in enumerate(words) if w.start is not None and w.end is not None
            and w.start >= start_s - TIME_TOLERANCE_S and w.end <= end_s + TIME_TOLERANCE_S]


@dataclass(frozen=True)
class WindowModel:
    """What decoding one window needs: the model, its window in input frames, the feature frame rate, the
    tokenizer (``decode`` and ``blank_id``), the device and how many windows run at once."""

    model: object
    window: int
    frames_per_second: float
    tokenizer: object
    device: torch.device | str = "cpu"
    batch_windows: int = 8


def score_recording(wm: WindowModel, features: torch.Tensor, rec: Recording, slots: Sequence[Slot]
                    ) -> list[dict]:
    """The rows (:data:`COLUMNS`) of ``rec``'s slots, each decoded from its own window of ``features`` ((T, F),
    normalised over the whole recording)."""
    spans = [slot_window(s.end, wm.window, features.shape[0], wm.frames_per_second) for s in slots]
    feats = features.to(device=wm.device, dtype=torch.float32)
    texts: list[str] = []
    with torch.no_grad():
        for b0 in range(0, len(spans), wm.batch_windows):
            chunk = spans[b0: b0 + wm.batch_windows]
            probs, lengths = forward_windows(wm.model, feats, chunk, wm.device)  # type: ignore[arg-type]
            for i in range(len(chunk)):
                ids = greedy_ids(probs[i, : int(lengths[i])].cpu(), wm.tokenizer.blank_id)  # type: ignore[attr-defined]
                texts.append(wm.tokenizer.decode(ids))  # type: ignore[attr-defined]
    rows = []
    for s, (a, e), text in zip(slots, spans, texts):
        inside = window_words(rec.words, a / wm.frames_per_second, e / wm.frames_per_second)
        if s.index not in inside:
            raise ValueError(f"{rec.id}: slot {s.slot}'s code word ({rec.words[s.index].start}-{s.end} s) is not "
                             f"inside its window ({a / wm.frames_per_second:g}-{e / wm.frames_per_second:g} s): "
                             "the corpus's word times do not match its audio; regenerate it")
        ref = marked_reference([rec.words[i].text for i in inside], [dataclasses.replace(s, index=inside.index(
            s.index))])
        rows += slot_rows(ref, text, rec.id, extra={"scoring": SCORING})
    return rows


def measure(checkpoint: str | Path, datasets: Sequence[str], *, device: str = "auto", batch_windows: int = 8,
            out_dir: str | Path | None = None) -> dict[str, Path]:
    """Single-window scoring of ``checkpoint`` on each ``NAME=FORMAT:PATH`` dataset with the recall plant; writes
    ``<NAME>.slots.csv`` to ``out_dir`` (default ``recall/`` beside the checkpoint) and returns the tables by
    dataset. A dataset without slots is refused before any decoding."""
    from asr_core.data.audio import load_audio
    from asr_core.data.features import FeatureExtractor
    from asr_core.device import resolve_device
    from asr_core.training.checkpoint import load_for_eval

    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} not found")
    if batch_windows < 1:
        raise ValueError(f"batch_windows must be at least 1, got {batch_windows}")
    if not datasets:
        raise ValueError("no datasets: give at least one NAME=podcast:PATH of a corpus made with synth --recall")
    parsed = [parse_dataset_spec(d) for d in datasets]
    corpora = {name: load_corpus(spec) for name, spec in parsed}
    slots = {name: recall_slots(recs) for name, recs in corpora.items()}
    lacking = [name for name, s in slots.items() if s is None]
    if lacking:
        raise ValueError(f"datasets {lacking} have no recall slots: give corpora made with python -m asr_core synth "
                         "--recall RATE (their metadata beside the split folder)")
    dev = resolve_device(device)
    model, cfg, tokenizer = load_for_eval(checkpoint, dev)
    if isinstance(model, torch.nn.Module):
        model.eval()
    fps = cfg.data.features.frames_per_second
    wm = WindowModel(model, window_frames(cfg.data.context_s, fps, cfg.model.subsampling_factor), fps, tokenizer,
                     dev, batch_windows)
    extractor = FeatureExtractor(cfg.data.features)
    out = Path(out_dir) if out_dir is not None else checkpoint.parent / RECALL_DIR
    print(f"[recall] {checkpoint}: context {cfg.data.context_s:g} s = {wm.window} frames, one window per slot",
          file=sys.stderr, flush=True)
    tables = {}
    for name, recordings in corpora.items():
        rows: list[dict] = []
        ds_slots = slots[name] or {}
        for n, rec in enumerate(recordings, 1):
            if not ds_slots.get(rec.id):
                continue
            feats = prepare_features(extractor, load_audio(rec.audio), rec.ignore, fps)
            rows += score_recording(wm, feats, rec, ds_slots[rec.id])
            print(f"[recall] {name} {n}/{len(recordings)} {rec.id}: {len(ds_slots[rec.id])} slots",
                  file=sys.stderr, flush=True)
        tables[name] = write_slot_table(out / f"{name}.slots.csv", rows, COLUMNS)
        for group, (ok, n_slots) in group_accuracy(rows).items():
            print(f"{name} {group}: {100.0 * ok / n_slots:.1f}% ({ok} of {n_slots} slots; single window, "
                  f"context {cfg.data.context_s:g} s)")
    return tables


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m asr_core recall", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", type=Path, nargs="+", metavar="CKPT",
                    help="one or more checkpoints (e.g. a sweep's models at each context)")
    ap.add_argument("--data", action="append", required=True, metavar="NAME=podcast:PATH",
                    help="a dataset made with synth --recall (repeatable)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--batch-windows", type=int, default=8, help="windows decoded together (default 8)")
    ap.add_argument("--out", type=Path, default=None, help=f"folder for the tables (default: {RECALL_DIR}/ next to "
                    "the checkpoint; needed for several checkpoints: each gets a folder in it)")
    a = ap.parse_args(argv)
    missing = [str(c) for c in a.checkpoints if not c.is_file()]
    if missing:
        print(f"recall: checkpoint not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    if len(a.checkpoints) > 1 and a.out is None:
        print("recall: several checkpoints need --out DIR (each gets a folder in it)", file=sys.stderr)
        return 2
    try:
        for k, ckpt in enumerate(a.checkpoints, 1):
            out = a.out if len(a.checkpoints) == 1 else a.out / f"{k}-{ckpt.parent.name}"
            for path in measure(ckpt, a.data, device=a.device, batch_windows=a.batch_windows,
                                out_dir=out).values():
                print(f"table: {path}")
    except (CorpusError, ValueError, FileNotFoundError, KeyError) as e:
        print(f"recall: {e}", file=sys.stderr)
        return 2
    return 0
