"""Word scorers: what an evaluation measures of each hypothesis, as plug-ins.

A *word scorer* compares a decoder's hypothesis with the reference, each recording and condition, and names what it
adds through the metric contract (:mod:`asr_core.contract.metrics`): the per-recording table's columns, the metrics
of a dataset's condition, the run's tags and, for a scorer of marked slots, tables of its own. The evaluation
(:func:`asr_core.evaluation.evaluate.evaluate`) and the dataset loop (:func:`asr_core.evaluation.dataset.
evaluate_dataset`) loop over the scorers :data:`asr_core.evaluation.registry.SCORERS` makes; they know none by name.

The protocol, every hook but :meth:`WordScorer.bind` optional (:class:`WordScorer` gives the empty defaults):

* ``columns``: the table columns its rows fill, in the table's order after the ones before it;
* ``bind(dataset, recordings)`` → a :class:`Bound` scorer for one dataset, or None where it measures nothing there
  (no rows, metrics or tables: a planted-word scorer on a dataset without a plant);
* ``Bound.count(rec, ref, hyp)`` → the row's values for ``columns`` (``ref``, ``hyp``: normalised text);
  ``Bound.note(values)`` → what the per-recording log line says of them;
* ``Bound.metrics(condition, decoder, rows)`` → ``(metric key, value or None, log line)`` for one condition's rows;
* ``Bound.tables(done)`` → the tables it writes after the dataset is decoded (:class:`DatasetDone`), with metrics;
* ``tags(corpora)`` → the run's tags it records.

The WER itself is a scorer (:class:`WerScorer`), the first of every evaluation; the planted cue words
(:class:`CueScorer`, ``synth --cue``) follow it. The tail words (paper 002) and the recall plant's slots are plug-ins
of their own modules (:mod:`asr_core.evaluation.scorers.tail`, :mod:`asr_core.evaluation.scorers.recall`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asr_core.contract.metrics import CUE_COLUMNS, condition_name, cue_metric_key, metric_key
from asr_core.data.corpora import Recording
from asr_core.data.synth.cues import planted
from asr_core.scoring.score import Counts, corpus_wer, marked_counts, normalise_marked, score

WER_COLUMNS = ("ref_words", "substitutions", "deletions", "insertions", "hyp_words", "wer")

Metric = tuple[str, "float | None", str]  # metric key, value (None: nothing to log), the log line's text


@dataclass(frozen=True)
class DatasetDone:
    """A dataset decoded by one decoder: what a scorer's tables are made of. ``hyps``: one record per recording and
    condition (``recording``, ``condition``, ``ref``, ``hyp`` / ``hyp_<decoder>``); ``setup``: the model's decoding
    setting (:class:`asr_core.evaluation.decoders.Setup`); ``clean``: clean audio was decoded; ``out``: the folder
    the tables go to; ``tables_from``: folders of earlier evaluations whose tables of the same name are merged in."""

    dataset: str
    decoder: str
    recordings: Sequence[Recording]
    hyps: Sequence[Mapping[str, Any]]
    setup: Any
    clean: bool
    out: Path
    tables_from: Sequence[Path] = ()


class Bound:
    """One scorer bound to one dataset (see the module docstring); these defaults add nothing."""

    def count(self, rec: Recording, ref: str, hyp: str) -> dict[str, Any]:
        return {}

    def note(self, values: Mapping[str, Any]) -> str:
        return ""

    def metrics(self, snr_db: float | None, decoder: str, rows: Sequence[Mapping[str, Any]]) -> list[Metric]:
        return []

    def tables(self, done: DatasetDone) -> tuple[list[Path], dict[str, float], list[str]]:
        """The tables written, the metrics, the log lines."""
        return [], {}, []


class WordScorer:
    """A word scorer (see the module docstring); these defaults add nothing."""

    columns: tuple[str, ...] = ()

    def bind(self, dataset: str, recordings: Sequence[Recording]) -> Bound | None:
        return None

    def tags(self, corpora: Mapping[str, Sequence[Recording]]) -> dict[str, str]:
        return {}


def counts_of(row: Mapping[str, Any]) -> Counts:
    """The WER counts a table row holds."""
    return Counts(row["ref_words"], row["substitutions"], row["deletions"], row["insertions"], row["hyp_words"])


class _BoundWer(Bound):
    def __init__(self, dataset: str) -> None:
        self.dataset = dataset

    def count(self, rec: Recording, ref: str, hyp: str) -> dict[str, Any]:
        c = score(ref, hyp, normalised=True)
        return {"ref_words": c.ref_words, "substitutions": c.substitutions, "deletions": c.deletions,
                "insertions": c.insertions, "hyp_words": c.hyp_words, "wer": c.wer}

    def note(self, values: Mapping[str, Any]) -> str:
        return f"WER {values['wer']:.1f}%"

    def metrics(self, snr_db: float | None, decoder: str, rows: Sequence[Mapping[str, Any]]) -> list[Metric]:
        wer = corpus_wer(counts_of(r) for r in rows)
        key = metric_key(self.dataset, snr_db, decoder)
        return [(key, None if wer != wer else wer, f"{key} = {wer:.2f}%")]


class WerScorer(WordScorer):
    """The word error rate (:func:`asr_core.scoring.score.score`): columns :data:`WER_COLUMNS`, metrics
    ``wer[_<decoder>]/<NAME>[/snr<DB>]``."""

    columns = WER_COLUMNS

    def bind(self, dataset: str, recordings: Sequence[Recording]) -> Bound:
        return _BoundWer(dataset)


class _BoundCue(Bound):
    def __init__(self, dataset: str, marks: Mapping[str, tuple[int, ...]] | None) -> None:
        self.dataset, self.marks = dataset, marks
        self._refs: dict[str, tuple[list[str], list[int]]] = {}

    def count(self, rec: Recording, ref: str, hyp: str) -> dict[str, Any]:
        if self.marks is None:  # the columns stay empty where the dataset has no plant
            return {"cue_words": None, "cue_errors": None}
        if rec.id not in self._refs:  # the reference normalised word by word, so that the marks' indices follow
            self._refs[rec.id] = normalise_marked([w.text for w in rec.words], self.marks.get(rec.id, ()))
        cue_ref, cue_marks = self._refs[rec.id]
        m = marked_counts(cue_ref, hyp.split(), cue_marks)
        return {"cue_words": m.words, "cue_errors": m.errors}

    def note(self, values: Mapping[str, Any]) -> str:
        return f", cue {values['cue_errors']}/{values['cue_words']}" if values.get("cue_words") else ""

    def metrics(self, snr_db: float | None, decoder: str, rows: Sequence[Mapping[str, Any]]) -> list[Metric]:
        if self.marks is None:
            return []
        n, wrong = sum(r["cue_words"] for r in rows), sum(r["cue_errors"] for r in rows)
        key = cue_metric_key(self.dataset, snr_db, decoder)
        shown = f"{100.0 * wrong / n:.2f}%" if n else "n/a"
        return [(key, 100.0 * wrong / n if n else None, f"{key} = {shown} ({wrong} of {n} planted words wrong)")]


class CueScorer(WordScorer):
    """The planted cue words (``synth --cue``; :func:`asr_core.data.synth.cues.planted`) substituted or deleted:
    columns :data:`~asr_core.contract.metrics.CUE_COLUMNS` in every table (empty where a dataset has no plant),
    metrics ``cue[_<decoder>]/<NAME>[/snr<DB>]`` where it has one."""

    columns = CUE_COLUMNS

    def bind(self, dataset: str, recordings: Sequence[Recording]) -> Bound:
        return _BoundCue(dataset, planted(recordings))


def condition_rows(rows: Sequence[Mapping[str, Any]], snr_db: float | None) -> list[Mapping[str, Any]]:
    """The rows of one condition (clean: ``snr_db`` None)."""
    name = condition_name(snr_db)
    return [r for r in rows if r["condition"] == name]

