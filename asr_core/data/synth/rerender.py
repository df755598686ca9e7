"""The causal check of the recall plant: a test recording rendered again with its code word's clear mentions said
otherwise, all else equal (``python -m asr_core recall --key swap,silence``).

A recording of a corpus made by ``python -m asr_core synth --recall`` is reproduced from the corpus's stamp
(``synth.json``: :func:`stamped_plans`) with a
:class:`~asr_core.data.synth.recall.KeyEdit`: ``swap`` says another code word (:func:`swap_for`: the one whose
rendering by the recording's first voice is closest in length) in the span of every clear mention, ``silence`` says
nothing there. Every other sample, every word time and every slot are the corpus's; the re-rendering is checked
against the recording's transcript (:func:`edited_audio` refuses one that differs: a corpus made by another
espeak-ng build, or edited since).

A corpus made with ``synth --copy`` (:mod:`asr_core.data.synth.copy_plant`) is re-rendered the same way with a
:class:`~asr_core.data.synth.copy_plant.CopyEdit`: ``swap`` says every key token as its partner
(:func:`~asr_core.data.synth.copy_plant.partner`; a slot's swap word is
:func:`~asr_core.data.synth.copy_plant.swap_of_slot`), ``silence`` nothing in each key token's span; unmasked slots
are left as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from asr_core.contract.specs import CorpusError
from asr_core.data.corpora.base import Recording
from asr_core.data.synth.copy_plant import CopyConfig, CopyEdit
from asr_core.data.synth.cues import CueConfig, meta_file, read_meta
from asr_core.data.synth.recall import CODE_WORDS, KeyEdit, RecallConfig, swap_word
from asr_core.data.synth.generate import Plan, make_plans, render
from asr_core.data.synth.audio import Speaker, espeak

TIME_TOLERANCE_S = 1e-3  # word times are rounded to milliseconds


def stamped_plans(out: Path, split: str) -> tuple[list[Plan], RecallConfig | None]:
    """The plans of ``split`` of the corpus in ``out`` as its ``synth.json`` made them, and its recall plant (None
    without one): what re-renders a recording exactly (:class:`Rerenderer`). ValueError naming the
    file when the corpus has no complete stamp or not that split."""
    stamp = out / "synth.json"
    try:
        info = json.loads(stamp.read_text())
        args = info["args"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{stamp}: no readable synth stamp ({type(e).__name__}: {e}); only a corpus made by "
                         "python -m asr_core synth can be re-rendered") from None
    if not info.get("complete") or split not in args.get("splits", ()):
        why = "is not complete" if not info.get("complete") else f"has no split {split!r}"
        raise ValueError(f"{stamp}: the corpus {why} (splits: {', '.join(args.get('splits', ()))})")
    eval_max = args.get("eval_max_minutes")
    lo, hi = args["min_minutes"], args["max_minutes"]
    if split != "train" and eval_max is not None:
        lo, hi = min(lo, eval_max), eval_max
    cue = CueConfig.parse(args["cue"]) if "cue" in args else None
    plans = make_plans(split, args["hours"] if split == "train" else args["eval_hours"], args["seed"],
                       min_minutes=lo, max_minutes=hi, meeting_fraction=args["meeting_fraction"],
                       voices=args.get("voices", 0), shift=args.get("shift", "far"),
                       cue=cue if cue is not None and cue.active else None)
    return plans, RecallConfig.parse(args["recall"]) if "recall" in args else None


def stamped_copy(out: Path) -> CopyConfig | None:
    """The copy plant the ``synth.json`` of the corpus in ``out`` records (None: none, or no readable stamp)."""
    try:
        args = json.loads((out / "synth.json").read_text())["args"]
        return CopyConfig.parse(args["copy"]) if "copy" in args else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def swap_for(plan: Plan, word: str) -> str:
    """The swap word of ``plan``'s code word ``word``: :func:`~asr_core.data.synth.recall.swap_word` over the code
    words as the plan's first speaker says them."""
    spk = plan.speakers[0]
    lengths = {w: len(espeak(w, Speaker(spk.voice, spk.rate, spk.pitch))) for w in CODE_WORDS}
    return swap_word(word, lengths)


class Rerenderer:
    """Re-renders the recordings of one split folder (``<corpus>/<split>``) with a key edit."""

    def __init__(self, split_dir: Path) -> None:
        self.split_dir = Path(split_dir)
        try:
            plans, self.recall = stamped_plans(self.split_dir.parent, self.split_dir.name)
        except ValueError as e:
            raise CorpusError(str(e)) from None
        self.copy = stamped_copy(self.split_dir.parent)
        if self.recall is None and self.copy is None:
            raise CorpusError(f"{self.split_dir.parent / 'synth.json'}: the corpus has no recall plant; make one with "
                              "python -m asr_core synth --recall RATE (or --copy BANDS)")
        self.plans = {p.id: p for p in plans}
        self._edited: dict[tuple[str, KeyEdit], np.ndarray] = {}  # what was rendered, for the next checkpoint

    def edit_for(self, rec: Recording, mode: str) -> KeyEdit | None:
        """The :class:`KeyEdit` of ``mode`` for ``rec`` (a :class:`CopyEdit` in a copy corpus); None for a recording
        that never says its key (nothing to edit)."""
        meta = self._meta(rec)
        if not meta.get("recall_key"):
            return None
        if self.copy is not None:
            return CopyEdit(mode)
        return KeyEdit(mode, swap_for(self._plan(rec), meta["recall_word"]) if mode == "swap" else "")

    def edited_audio(self, rec: Recording, edit: KeyEdit) -> np.ndarray:
        """``rec``'s audio (N,) float32 at 16 kHz with ``edit`` applied; CorpusError when the re-rendering's words or
        times differ from the recording's transcript. Kept for the next call with the same recording and edit."""
        if (rec.id, edit) in self._edited:
            return self._edited[(rec.id, edit)]
        wave, words, _, _ = render(self._plan(rec), recall=self.recall, key_edit=edit, copy=self.copy)
        same = len(words) == len(rec.words) and all(
            a.text == b.text and abs((a.start or 0.0) - (b.start or 0.0)) <= TIME_TOLERANCE_S
            and abs((a.end or 0.0) - (b.end or 0.0)) <= TIME_TOLERANCE_S for a, b in zip(words, rec.words))
        if not same:
            raise CorpusError(f"{rec.id}: rendering it again does not reproduce its transcript "
                              f"{rec.meta.get('transcript', '')} (another espeak-ng build, or the corpus was edited); "
                              "regenerate the corpus on this machine")
        self._edited[(rec.id, edit)] = wave
        return wave

    def _plan(self, rec: Recording) -> Plan:
        plan = self.plans.get(rec.id)
        if plan is None:
            raise CorpusError(f"{rec.id}: not among the recordings the stamp {self.split_dir.parent / 'synth.json'} "
                              f"makes for split {self.split_dir.name!r}")
        return plan

    def _meta(self, rec: Recording) -> dict:
        path = meta_file(rec)
        if path is None or not path.is_file():
            raise CorpusError(f"{rec.id}: no metadata beside the split folder {self.split_dir}")
        return read_meta(path)
