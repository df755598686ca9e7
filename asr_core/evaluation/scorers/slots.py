"""Scoring the recall plant's slots (``synth --recall``, :mod:`asr_core.data.synth.recall`): per slot, whether the
decoded output has the code word where the transcript has it.

A slot's code word is a *marked* word, as the planted cue words are (:func:`asr_core.scoring.score.marked_counts`):
the reference is normalised word by word (:func:`~asr_core.scoring.score.normalise_marked`), aligned with the
normalised hypothesis by the same Levenshtein alignment (jiwer's), and the slot is correct when the hypothesis word
aligned with its code word (:func:`aligned_words`; none where the alignment deletes it) equals the code word. So a
slot is wrong exactly when :func:`~asr_core.scoring.score.marked_counts` counts its word as an error.

Two scorings share this (the table's ``scoring`` column): ``average``, the moving-window decoding of whole recordings
that ``evaluate`` makes (:func:`slot_rows`, the table ``eval/<DATASET>[.<DECODER>].slots.csv`` and the metrics
``recall/<DATASET>/<GROUP>`` of :mod:`asr_core.contract.metrics`), and ``window``, the single window ending 1 s after each
slot (:mod:`asr_core.evaluation.scorers.slot_window`; greedy and clean, in the same table, no metrics). The table has one
row per slot, condition and scoring (:data:`SLOT_COLUMNS`); the metrics are the clean condition's moving-window
accuracy in percent per group (:func:`group_accuracy`): masked slots with a key sentence by band
(``near``, ``far``) and the controls (``unmasked``: the acoustic ceiling; ``no-key``: the guess rate, 1/K).

Single-window rows also hold the forced choice among the slot's candidates (:attr:`Slot.choices`: the metadata's
``recall_choices``, else the recall plant's code words), made from the window's posteriors
(:mod:`asr_core.evaluation.scorers.slot_window`, :class:`ForcedChoice`): ``choice``, ``choice_correct``, ``onset_correct``,
``posterior_choice``, ``posterior_correct`` and ``n_choices`` (:data:`CHOICE_COLUMNS`); moving-window rows leave them
empty.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jiwer

from asr_core.contract.evaluation import merge_tables
from asr_core.contract.metrics import (AVERAGE, CLEAN, GREEDY, RECALL_GROUPS, SLOT_COLUMNS, recall_metric_key,
                                     snr_of)
from asr_core.contract.specs import CorpusError
from asr_core.data.corpora.base import Recording
from asr_core.data.synth.cues import meta_file, read_meta
from asr_core.data.synth.recall import BANDS, CODE_WORDS, KINDS, onset
from asr_core.scoring.score import normalise, normalise_marked


@dataclass(frozen=True)
class Slot:
    """One slot as the corpus recorded it: ``slot`` (its id), ``index`` of the code word among the transcript's
    words, ``word``, ``band`` (near/far), ``kind`` (masked/unmasked/no-key), ``distance_s`` (to the latest clear
    mention; None without a key), ``start``/``end`` (the slot sentence's first word's start and the code word's
    end, seconds), ``choices`` (the candidates of the forced choice: the metadata's ``recall_choices``, else the
    recall plant's code words) and ``copy`` (whether the metadata lists them: a copy corpus, whose swap edit says
    each key as its partner)."""

    slot: str
    index: int
    word: str
    band: str
    kind: str
    distance_s: float | None
    start: float
    end: float
    choices: tuple[str, ...] = CODE_WORDS
    copy: bool = False


CHOICE_COLUMNS = SLOT_COLUMNS[SLOT_COLUMNS.index("choice"):]  # the forced choice's cells (module docstring)


@dataclass(frozen=True)
class ForcedChoice:
    """A slot's forced choice from one window: ``choice`` (the candidate of best CTC likelihood; "" when none was
    made) and ``posterior`` (the candidate of most posterior mass over the masked span; "" unless every candidate
    is one piece)."""

    choice: str = ""
    posterior: str = ""


def onset_match(hyp: str, word: str) -> int:
    """1 when the hypothesis word ``hyp`` starts with ``word``'s written onset (:func:`~asr_core.data.synth.recall.
    onset`; its first letter where it starts with a vowel), else 0 (also for "": no word aligned)."""
    head = onset(word) or word[:1]
    return int(bool(hyp) and hyp.startswith(head))


def _choices(meta: Mapping[str, Any], path: Path) -> tuple[str, ...] | None:
    listed = meta.get("recall_choices")
    if listed is None:
        return None
    if not isinstance(listed, list) or not listed or not all(isinstance(w, str) and w for w in listed) \
            or len(set(listed)) != len(listed):
        raise CorpusError(f"{path}: recall_choices {listed!r} is not a list of distinct words; regenerate the corpus")
    return tuple(listed)


def recall_slots(recordings: Sequence[Recording]) -> dict[str, tuple[Slot, ...]] | None:
    """The slots of each recording, by recording id, from the synthetic corpus's metadata next to the split folder
    (``recall_slots``); None when no recording's metadata has the key (a corpus made without the plant, or another
    format). Metadata that do not match their transcript (another word at a recorded index, an unknown band or kind)
    raise :class:`CorpusError` naming the file."""
    found: dict[str, tuple[Slot, ...]] = {}
    for rec in recordings:
        path = meta_file(rec)
        if path is None or not path.is_file():
            continue
        meta = read_meta(path)
        if "recall_slots" not in meta:
            continue
        slots = []
        listed = _choices(meta, path)
        for s in meta["recall_slots"]:
            i = s.get("index") if isinstance(s, dict) else None
            if not isinstance(i, int) or not 0 <= i < len(rec.words) or rec.words[i].text != s.get("word") \
                    or s.get("band") not in BANDS or s.get("kind") not in KINDS:
                raise CorpusError(f"{path}: recall slot {s!r} does not match transcript {rec.meta['transcript']} "
                                  f"({len(rec.words)} words); regenerate the corpus (python -m asr_core synth "
                                  "--recall RATE)")
            if listed is not None and s["word"] not in listed:
                raise CorpusError(f"{path}: recall slot {s!r}: its word is not among recall_choices {list(listed)}; "
                                  "regenerate the corpus")
            d = s.get("distance_s")
            slots.append(Slot(str(s.get("slot", f"{rec.id}/{len(slots)}")), i, s["word"], s["band"], s["kind"],
                              None if d is None else float(d), float(s.get("start", rec.words[i].start or 0.0)),
                              float(s.get("end", rec.words[i].end or 0.0)),
                              CODE_WORDS if listed is None else listed, listed is not None))
        found[rec.id] = tuple(slots)
    if not found:
        return None
    return {rec.id: found.get(rec.id, ()) for rec in recordings}


def aligned_words(ref: Sequence[str], hyp: Sequence[str], indices: Iterable[int]) -> dict[int, str]:
    """The hypothesis word the alignment of ``hyp`` against ``ref`` (jiwer's, as
    :func:`~asr_core.scoring.score.marked_counts` counts) puts at each of ``indices`` of ``ref``: the word it
    equals or substitutes; "" where it deletes the reference word. ``ref``, ``hyp``: normalised words."""
    wanted = list(indices)
    bad = sorted(i for i in wanted if not 0 <= i < len(ref))
    if bad:
        raise ValueError(f"indices {bad[:5]} are outside the reference's {len(ref)} words")
    if not hyp or not wanted:
        return {i: "" for i in wanted}
    at: dict[int, str] = {}
    for chunk in jiwer.process_words(" ".join(ref), " ".join(hyp)).alignments[0]:
        if chunk.type in ("equal", "substitute"):
            for k in range(chunk.ref_end_idx - chunk.ref_start_idx):
                at[chunk.ref_start_idx + k] = hyp[chunk.hyp_start_idx + k]
    return {i: at.get(i, "") for i in wanted}


@dataclass(frozen=True)
class MarkedReference:
    """A recording's reference normalised word by word (``words``) and where each slot's code word lies in it
    (``positions``, in the order of ``slots``)."""

    words: tuple[str, ...]
    slots: tuple[Slot, ...]
    positions: tuple[int, ...]


def marked_reference(words: Sequence[str], slots: Sequence[Slot]) -> MarkedReference:
    """``words`` (the transcript's) normalised so that the slots' indices follow (ValueError naming a code word that
    does not stay one word)."""
    ref, marks = normalise_marked(words, [s.index for s in slots])
    where = dict(zip(sorted({s.index for s in slots}), marks))
    return MarkedReference(tuple(ref), tuple(slots), tuple(where[s.index] for s in slots))


def slot_rows(reference: MarkedReference, hyp_text: str, recording: str, condition: str = CLEAN,
              extra: Mapping[str, Any] | None = None, scoring: str = AVERAGE,
              choices: Sequence[ForcedChoice] | None = None) -> list[dict[str, Any]]:
    """One row per slot of ``reference`` (:data:`SLOT_COLUMNS`, then ``extra``'s columns) for the hypothesis
    ``hyp_text`` (raw decoded text; normalised here) of ``recording`` in ``condition``, scored as ``scoring``.
    ``choices``: each slot's :class:`ForcedChoice` (the single-window scoring); without, the cells of
    :data:`CHOICE_COLUMNS` are empty."""
    hyp = normalise(hyp_text).split()
    at = aligned_words(reference.words, hyp, reference.positions)
    snr = snr_of(condition)
    if choices is not None and len(choices) != len(reference.slots):
        raise ValueError(f"{len(choices)} forced choices for {len(reference.slots)} slots")
    rows = []
    for k, (s, p) in enumerate(zip(reference.slots, reference.positions)):
        h = at[p]
        cells = dict.fromkeys(CHOICE_COLUMNS, "")
        if choices is not None:
            c = choices[k]
            cells = {"choice": c.choice, "choice_correct": int(c.choice == s.word) if c.choice else "",
                     "onset_correct": onset_match(h, reference.words[p]), "posterior_choice": c.posterior,
                     "posterior_correct": int(c.posterior == s.word) if c.posterior else "",
                     "n_choices": len(s.choices)}
        rows.append({"recording": recording, "condition": condition, "snr_db": None if math.isnan(snr) else snr,
                     "slot": s.slot, "word": s.word, "band": s.band, "kind": s.kind, "distance_s": s.distance_s,
                     "hyp": h, "correct": int(h == reference.words[p]), "scoring": scoring, **cells, **(extra or {})})
    return rows


def slot_table(recordings: Sequence[Recording], hyps: Sequence[Mapping[str, Any]],
               slots: Mapping[str, Sequence[Slot]], decoder: str = GREEDY) -> list[dict[str, Any]]:
    """The per-slot rows of a dataset from ``evaluate``'s hypotheses (``recording``, ``condition`` and ``hyp``, or
    ``hyp_<decoder>`` for a beam decoder), in their order; recordings without slots give none."""
    by_id = {r.id: r for r in recordings}
    key = "hyp" if decoder == GREEDY else f"hyp_{decoder}"
    refs: dict[str, MarkedReference] = {}
    rows: list[dict[str, Any]] = []
    for h in hyps:
        rid = str(h["recording"])
        if not slots.get(rid):
            continue
        if rid not in refs:
            refs[rid] = marked_reference([w.text for w in by_id[rid].words], slots[rid])
        rows += slot_rows(refs[rid], str(h[key]), rid, str(h["condition"]))
    return rows


def group_of(band: str, kind: str) -> str:
    """The group of :data:`~asr_core.contract.metrics.RECALL_GROUPS` a slot counts in: a masked slot's band, else
    its kind (``unmasked``, ``no-key``)."""
    return band if kind == "masked" else kind


def group_accuracy(rows: Iterable[Mapping[str, Any]], condition: str = CLEAN, scoring: str = AVERAGE
                   ) -> dict[str, tuple[int, int]]:
    """Per group of :data:`~asr_core.contract.metrics.RECALL_GROUPS` (only those with slots): (correct, slots) of the
    rows in ``condition`` scored as ``scoring``."""
    out: dict[str, list[int]] = {}
    for r in rows:
        if r["condition"] != condition or (r.get("scoring") or AVERAGE) != scoring:
            continue
        c = out.setdefault(group_of(str(r["band"]), str(r["kind"])), [0, 0])
        c[0] += int(r["correct"])
        c[1] += 1
    return {g: (out[g][0], out[g][1]) for g in RECALL_GROUPS if g in out}


def recall_metrics(dataset: str, rows: Iterable[Mapping[str, Any]], decoder: str = GREEDY) -> dict[str, float]:
    """``recall[_<decoder>]/<dataset>/<group>``: the clean condition's slot accuracy in percent per group."""
    return {recall_metric_key(dataset, g, decoder): 100.0 * ok / n for g, (ok, n) in group_accuracy(rows).items()}


def write_slot_table(path: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = SLOT_COLUMNS) -> Path:
    """Write ``rows`` as CSV with ``columns`` (None as empty cells)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, list(columns), extrasaction="ignore")
        w.writeheader()
        w.writerows({c: ("" if r.get(c) is None else r.get(c)) for c in columns} for r in rows)
    return path


SLOT_KEY = ("condition", "slot", "scoring")  # a per-slot table holds one row per slot, condition and scoring


def merge_slot_tables(new: Path, older: Iterable[Path]) -> int:
    """:func:`asr_core.contract.evaluation.merge_tables` for per-slot tables: ``new`` also gets the rows of the
    ``older`` tables whose (condition, slot, scoring) it does not hold itself (a table written before the
    ``scoring`` column holds moving-window rows; rows of a table without the forced-choice columns take them over
    empty). Returns the rows taken over."""
    return merge_tables(new, older, key=SLOT_KEY, missing={"scoring": AVERAGE})
