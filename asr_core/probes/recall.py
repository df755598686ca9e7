"""Single-window scoring of the recall plant's slots, and the causal check: the key re-rendered with another code word,
or silenced.

``python -m asr_core recall CKPT [CKPT ...] --data NAME=podcast:PATH [--data ...] [--key as-is,swap,silence]
[--window-s S] [--device auto|cpu|cuda] [--batch-windows N] [--out DIR]``

Each slot is decoded from the one window of the model's context that ends 1 s after its code word
(:mod:`asr_core.evaluation.scorers.slot_window`, as ``evaluate`` adds to its slot table), or with ``--window-s`` of S
seconds instead (a model trained on long windows, asked with short ones: does it copy when the window holds one key
only?), on the recording's audio as it is
(``as-is``) or re-rendered with every clear mention of the code word said otherwise, all else equal
(:mod:`asr_core.data.synth.rerender`): ``swap`` says another code word there, ``silence`` nothing. A model that
recalls far slots from the key follows the swap (its output at the slot becomes the swap word) and falls to the guess
rate without the key; a model that guesses from the slot's own audio or the corpus's frequencies does neither. Only
recordings that say their key are edited.

Writes ``<NAME>.slots.csv`` per dataset to ``--out`` (default ``recall/`` beside the checkpoint; with several
checkpoints, a folder per checkpoint in it, and ``summary.csv``: per checkpoint, context, window, seed, dataset, edit
and group, the accuracy and the share that follows the swap, :data:`SUMMARY_COLUMNS`): one row per slot and key edit,
the columns of :data:`~asr_core.contract.metrics.SLOT_COLUMNS` (condition ``clean``, scoring ``window``, with the forced
choice among the slot's candidates), then ``key`` (the edit), ``swap_word``, ``followed`` (1 where the output at the
slot is the swap word) and ``followed_choice`` (1 where the forced choice is the swap word). The swap word of a slot is
the one the re-rendering says (:func:`~asr_core.data.synth.rerender.swap_for`), or in a copy corpus (slots with
``recall_choices``) the slot's token's partner (:func:`asr_core.data.synth.copy_plant.partner`). Prints each dataset's
exact-match, forced-choice, posterior-choice and onset-match accuracy per group and edit, with chance (1/candidates),
and for the swap how often the output and the forced choice follow it. Nothing is logged to MLflow.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from asr_core.contract.metrics import SLOT_COLUMNS, WINDOW
from asr_core.contract.specs import parse_dataset_spec, split_spec
from asr_core.data.corpora import load_corpus
from asr_core.data.synth.rerender import Rerenderer
from asr_core.decoding.decode import prepare_features, window_frames
from asr_core.evaluation.scorers.slots import Slot, group_accuracy, group_of, recall_slots, write_slot_table
from asr_core.evaluation.scorers.slot_window import WindowModel, score_recording
from asr_core.probes.recall_options import AS_IS, RECALL_DIR, check_window

COLUMNS = (*SLOT_COLUMNS, "key", "swap_word", "followed", "followed_choice")


def swap_for_slot(slot: Slot, edit_word: str) -> str:
    """The word a swapped key says for ``slot``: its token's partner in a copy corpus (:attr:`Slot.copy`), else the
    edit's word (the recording's code word's swap)."""
    if not slot.copy:
        return edit_word
    from asr_core.data.synth.copy_plant import partner

    return str(partner(slot.word))


def follow_rate(rows: Sequence[dict[str, Any]], column: str = "followed") -> dict[str, tuple[int, int]]:
    """Per group of the swapped rows: (slots whose output, or with ``column`` ``followed_choice`` whose forced
    choice, is the swap word, slots)."""
    out: dict[str, list[int]] = {}
    for r in rows:
        if r.get("key") != "swap":
            continue
        c = out.setdefault(group_of(str(r["band"]), str(r["kind"])), [0, 0])
        c[0] += int(r.get(column) or 0)
        c[1] += 1
    return {g: (a, n) for g, (a, n) in out.items()}


SUMMARY_COLUMNS = ("checkpoint", "context_s", "window_s", "seed", "dataset", "key", "group", "slots", "correct",
                   "accuracy", "followed", "follow_rate", "chance", "choice_correct", "choice_accuracy",
                   "posterior_slots", "posterior_correct", "posterior_accuracy", "onset_correct", "onset_accuracy",
                   "followed_choice", "follow_choice_rate")


def _pct(ok: int, n: int) -> float | str:
    return round(100.0 * ok / n, 2) if n else ""


def choice_counts(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per group of ``rows`` (one key edit's): chance (%, the mean of 1/candidates), and (hits, slots) of the forced
    choice, the posterior choice (slots where it was made) and the onset match."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        c = out.setdefault(group_of(str(r["band"]), str(r["kind"])), {"chance": [], "choice": [0, 0],
                                                                      "posterior": [0, 0], "onset": [0, 0]})
        if r.get("n_choices") not in (None, ""):
            c["chance"].append(100.0 / int(r["n_choices"]))
        for name, col in (("choice", "choice_correct"), ("posterior", "posterior_correct"),
                          ("onset", "onset_correct")):
            if r.get(col) not in (None, ""):
                c[name][0] += int(r[col])
                c[name][1] += 1
    return out


def summary_rows(checkpoint: Path, context_s: float, seed: int, dataset: str, rows: Sequence[dict[str, Any]],
                 window_s: float | None = None) -> list[dict[str, Any]]:
    """Per key edit and group of one checkpoint's rows on ``dataset``: slots, correct, accuracy (%), chance (%),
    forced-choice, posterior-choice and onset-match hits and accuracies (%), and for the swap the slots whose output,
    and those whose forced choice, is the swap word and their shares (%) (:data:`SUMMARY_COLUMNS`)."""
    out = []
    follows, follows_choice = follow_rate(rows), follow_rate(rows, "followed_choice")
    for key in dict.fromkeys(str(r["key"]) for r in rows):
        mine = [r for r in rows if r["key"] == key]
        counts = choice_counts(mine)
        for group, (ok, n) in group_accuracy(mine, scoring=WINDOW).items():
            f = follows.get(group) if key == "swap" else None
            fc = follows_choice.get(group) if key == "swap" else None
            c = counts[group]
            out.append({"checkpoint": str(checkpoint), "context_s": context_s,
                        "window_s": context_s if window_s is None else window_s, "seed": seed, "dataset": dataset,
                        "key": key, "group": group, "slots": n, "correct": ok, "accuracy": round(100.0 * ok / n, 2),
                        "followed": f[0] if f else "", "follow_rate": round(100.0 * f[0] / f[1], 2) if f else "",
                        "chance": round(sum(c["chance"]) / len(c["chance"]), 2) if c["chance"] else "",
                        "choice_correct": c["choice"][0] if c["choice"][1] else "",
                        "choice_accuracy": _pct(*c["choice"]), "posterior_slots": c["posterior"][1] or "",
                        "posterior_correct": c["posterior"][0] if c["posterior"][1] else "",
                        "posterior_accuracy": _pct(*c["posterior"]),
                        "onset_correct": c["onset"][0] if c["onset"][1] else "",
                        "onset_accuracy": _pct(*c["onset"]), "followed_choice": fc[0] if fc else "",
                        "follow_choice_rate": round(100.0 * fc[0] / fc[1], 2) if fc else ""})
    return out


def _window_note(r: dict[str, Any], context_s: float) -> str:
    w = r.get("window_s")
    return "" if w in (None, "") or float(w) == float(context_s) else f", windows of {float(w):g} s"


def summary_line(dataset: str, r: dict[str, Any], context_s: float) -> str:
    """How a summary row is printed (``context_s``: the model's; the window, where it differs, is the row's)."""
    def pct(v: Any) -> str:
        return "–" if v == "" else f"{float(v):.1f}%"

    line = (f"{dataset} {r['key']} {r['group']}: {r['accuracy']:.1f}% ({r['correct']} of {r['slots']} slots; "
            f"single window, context {context_s:g} s{_window_note(r, context_s)}); forced choice "
            f"{pct(r['choice_accuracy'])}, posterior choice {pct(r['posterior_accuracy'])}, onset "
            f"{pct(r['onset_accuracy'])} (chance {pct(r['chance'])})")
    if r["key"] == "swap":
        line += (f"; {r['follow_rate']:.1f}% follow the swap, forced choice {pct(r['follow_choice_rate'])}")
    return line


def measure(checkpoint: str | Path, datasets: Sequence[str], *, keys: Sequence[str] = (AS_IS,), device: str = "auto",
            batch_windows: int = 8, out_dir: str | Path | None = None, window_s: float | None = None,
            renderers: dict[str, Rerenderer] | None = None, summary: list[dict[str, Any]] | None = None
            ) -> dict[str, Path]:
    """Single-window scoring of ``checkpoint`` on each ``NAME=FORMAT:PATH`` dataset with the recall plant, for each
    key edit of ``keys``; writes ``<NAME>.slots.csv`` to ``out_dir`` (default ``recall/`` beside the checkpoint) and
    returns the tables by dataset. ``window_s``: the window's seconds (default the model's context). A dataset
    without slots (or, for an edit, not re-renderable) is refused before
    any decoding. ``renderers`` (by dataset name): re-renderers kept from an earlier checkpoint's call, so each
    edited recording is rendered once. ``summary``: a list the checkpoint's :func:`summary_rows` are added to."""
    from asr_core.data.audio import load_audio
    from asr_core.data.features import FeatureExtractor
    from asr_core.device import resolve_device
    from asr_core.training.checkpoint import load_for_eval

    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} not found")
    if batch_windows < 1:
        raise ValueError(f"batch_windows must be at least 1, got {batch_windows}")
    check_window(window_s)
    if not datasets:
        raise ValueError("no datasets: give at least one NAME=podcast:PATH of a corpus made with synth --recall")
    parsed = [parse_dataset_spec(d) for d in datasets]
    corpora = {name: load_corpus(spec) for name, spec in parsed}
    slots = {name: recall_slots(recs) for name, recs in corpora.items()}
    lacking = [name for name, s in slots.items() if s is None]
    if lacking:
        raise ValueError(f"datasets {lacking} have no recall slots: give corpora made with python -m asr_core synth "
                         "--recall RATE (their metadata beside the split folder)")
    edits = [k for k in keys if k != AS_IS]
    renderers = {} if renderers is None else renderers
    for name, spec in parsed if edits else ():
        if name not in renderers:
            renderers[name] = Rerenderer(Path(split_spec(spec)[1]))
    dev = resolve_device(device)
    model, cfg, tokenizer = load_for_eval(checkpoint, dev)
    if isinstance(model, torch.nn.Module):
        model.eval()
    fps = cfg.data.features.frames_per_second
    seconds = cfg.data.context_s if window_s is None else window_s
    wm = WindowModel(model, window_frames(seconds, fps, cfg.model.subsampling_factor), fps, tokenizer, dev,
                     batch_windows)
    extractor = FeatureExtractor(cfg.data.features)
    out = Path(out_dir) if out_dir is not None else checkpoint.parent / RECALL_DIR
    print(f"[recall] {checkpoint}: context {cfg.data.context_s:g} s, windows of {seconds:g} s = {wm.window} frames, "
          f"one window per slot; "
          f"key: {', '.join(keys)}", file=sys.stderr, flush=True)
    tables = {}
    for name, recordings in corpora.items():
        rows: list[dict[str, Any]] = []
        ds_slots = slots[name] or {}
        for n, rec in enumerate(recordings, 1):
            if not ds_slots.get(rec.id):
                continue
            for key in keys:
                edit = renderers[name].edit_for(rec, key) if key != AS_IS else None
                if key != AS_IS and edit is None:
                    continue  # a recording without its key sentence: nothing to edit
                wave = load_audio(rec.audio) if edit is None else torch.from_numpy(
                    renderers[name].edited_audio(rec, edit))
                feats = prepare_features(extractor, wave, rec.ignore, fps)
                part = score_recording(wm, feats, rec, ds_slots[rec.id], extra={"key": key})
                for r, s in zip(part, ds_slots[rec.id]):
                    swap = swap_for_slot(s, edit.word) if edit is not None and key == "swap" else ""
                    r["swap_word"] = swap
                    r["followed"] = int(bool(swap) and r["hyp"] == swap)
                    r["followed_choice"] = int(bool(swap) and r["choice"] == swap)
                rows += part
            print(f"[recall] {name} {n}/{len(recordings)} {rec.id}: {len(ds_slots[rec.id])} slots",
                  file=sys.stderr, flush=True)
        tables[name] = write_slot_table(out / f"{name}.slots.csv", rows, COLUMNS)
        part = summary_rows(checkpoint, cfg.data.context_s, cfg.train.seed, name, rows, seconds)
        for r in part:
            print(summary_line(name, r, cfg.data.context_s))
        if summary is not None:
            summary += part
    return tables
