"""The tail-word error rate of paper 002 as a word scorer (:mod:`asr_core.evaluation.scorers.base`): given a tail set
(``--tail FILE.json``, ``eval.tail``; :mod:`asr_core.scoring.tail`), every table gains the columns ``tail_words``
and ``tail_errors`` (after the others), each condition the metric ``tail[_<decoder>]/<NAME>[/snr<DB>]`` in percent,
and the run the tag ``eval.tail``. Without a tail set the scorer is not made (:mod:`asr_core.evaluation.registry`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from asr_core.contract.metrics import TAIL_COLUMNS, TAIL_TAG, tail_metric_key
from asr_core.data.corpora import Recording
from asr_core.evaluation.scorers.base import Bound, Metric, WordScorer
from asr_core.scoring.tail import TailSet, describe, load_tail, tail_counts


class _BoundTail(Bound):
    def __init__(self, dataset: str, tail: TailSet) -> None:
        self.dataset, self.tail = dataset, tail

    def count(self, rec: Recording, ref: str, hyp: str) -> dict[str, Any]:
        t = tail_counts(ref, hyp, self.tail, normalised=True)
        return {"tail_words": t.words, "tail_errors": t.errors}

    def note(self, values: Mapping[str, Any]) -> str:
        return f", tail {values['tail_errors']}/{values['tail_words']}"

    def metrics(self, snr_db: float | None, decoder: str, rows: Sequence[Mapping[str, Any]]) -> list[Metric]:
        n, wrong = sum(r["tail_words"] for r in rows), sum(r["tail_errors"] for r in rows)
        key = tail_metric_key(self.dataset, snr_db, decoder)
        shown = f"{100.0 * wrong / n:.2f}%" if n else "n/a"
        return [(key, 100.0 * wrong / n if n else None, f"{key} = {shown} ({wrong} errors on {n} tail words)")]


class TailScorer(WordScorer):
    """The tail words' errors against ``tail`` (see the module docstring)."""

    columns = TAIL_COLUMNS

    def __init__(self, tail: TailSet) -> None:
        self.tail = tail

    def bind(self, dataset: str, recordings: Sequence[Recording]) -> Bound:
        return _BoundTail(dataset, self.tail)

    def tags(self, corpora: Mapping[str, Sequence[Recording]]) -> dict[str, str]:
        return {TAIL_TAG: describe(self.tail, {n: [r.text for r in recs] for n, recs in corpora.items()})}


def tail_scorer(job: Any) -> TailScorer | None:
    """The registry's factory: a scorer when the request names a tail set (read here: a bad file is refused before
    any work), else None."""
    return None if job.tail is None else TailScorer(load_tail(job.tail, "tail set (--tail, eval.tail)"))
