"""The training corpus as the estimate sees it, and the trainer's steps replayed over it.

A corpus is its recordings' durations (and whether every word is timed), in the trainer's order: a prepared corpus's
arrays, another corpus's transcripts, or, where the training corpus is not on disk (the paper's
``data/spotify/train``), :data:`PAPER_CORPUS_ASSUMPTION`. The trainer's own planner
(:func:`asr_core.data.step_plan.step_lengths`: the same order, groups and sequence-length warmup as
``train``, no audio or words read) then gives the window length and padded audio of every optimiser step. Corpora are
read once per process and plans cached per (corpus, the data settings that change the plan, seed), so the paper
grid's 321 trials replay 30 plans of 105,000 recordings in a few seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from asr_core.config import Config
from asr_core.data.step_plan import StepLengths, corpus_durations, step_lengths, training_stream
from orchestrate.budget.calibration import EstimateError

# The paper's training corpus when it is not on disk (../shared/REFERENCE.md: ~58k hours, ~105k podcasts).
PAPER_RECORDINGS = 105_000
PAPER_HOURS = 58_000.0
PAPER_GAMMA_SHAPE = 2.0
PAPER_CLIP_S = (60.0, 4 * 3600.0)
PAPER_SEED = 0
PAPER_CORPUS_ASSUMPTION = (
    f"{PAPER_RECORDINGS:,} recordings, {PAPER_HOURS:,.0f} h (paper 000: ~105k podcasts, ~58k hours); durations "
    f"drawn from a gamma distribution of shape {PAPER_GAMMA_SHAPE:g} (coefficient of variation 0.71, median ~28 min) "
    f"with mean {PAPER_HOURS * 60 / PAPER_RECORDINGS:.1f} min, clipped to 1 min-4 h and rescaled to the total "
    f"(seed {PAPER_SEED}); every word timed. The paper gives no distribution: the shape is an assumption")


# ---- the training corpus's durations -------------------------------------------------------------------------------
class Durations(Sequence[Any]):
    """A corpus as the planner sees it: (duration, every word timed) per recording, in the trainer's order."""

    def __init__(self, durations: np.ndarray, timed: np.ndarray) -> None:
        self.durations = np.asarray(durations, dtype=np.float64)
        self.timed = np.asarray(timed, dtype=bool)

    def __len__(self) -> int:
        return len(self.durations)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return Durations(self.durations[i], self.timed[i])
        raise TypeError("a Durations corpus holds durations only (the planner asks duration_timed)")

    def __iter__(self) -> Iterator[Any]:
        raise TypeError("a Durations corpus holds durations only")

    def duration_timed(self, i: int) -> tuple[float, bool]:
        return float(self.durations[i]), bool(self.timed[i])

    def durations_timed(self) -> tuple[np.ndarray, np.ndarray]:
        """Every recording's (duration, timed) at once (what :func:`~asr_core.data.step_plan.step_lengths` asks
        first)."""
        return self.durations, self.timed

    @property
    def hours(self) -> float:
        return float(self.durations.sum()) / 3600.0


def paper_durations(recordings: int = PAPER_RECORDINGS, hours: float = PAPER_HOURS) -> Durations:
    """:data:`PAPER_CORPUS_ASSUMPTION`: durations drawn once, deterministically."""
    rng = np.random.default_rng(PAPER_SEED)
    total = hours * 3600.0
    d = rng.gamma(PAPER_GAMMA_SHAPE, 1.0, recordings)
    d = np.clip(d / d.mean() * total / recordings, *PAPER_CLIP_S)
    d *= total / d.sum()
    return Durations(d, np.ones(recordings, dtype=bool))


@dataclass(frozen=True)
class Corpus:
    key: str  # what the plans are cached under
    durations: Durations
    note: str  # where the durations came from, printed with the estimate
    assumed: bool


_corpora: dict[str, Corpus] = {}


def training_corpus(spec: str, workdir: Path | None = None) -> Corpus:
    """The durations of ``data.train`` in the trainer's order (:func:`~asr_core.data.step_plan.corpus_durations`: a
    prepared corpus's arrays, another corpus's transcripts, where a recording lasts until its last word), or, when
    the path is not here, the paper's corpus as assumed (:data:`PAPER_CORPUS_ASSUMPTION`). Read once per process."""
    from asr_core.contract.specs import CorpusError, split_named_spec, split_spec

    try:
        fmt, path = split_spec(split_named_spec(spec)[1])
    except CorpusError as e:
        raise EstimateError(f"data.train {spec!r}: {e}") from None
    if workdir is not None and not path.is_absolute():
        path = workdir / path
    if not path.exists():
        key = "assumed:paper"
        if key not in _corpora:
            _corpora[key] = Corpus(key, paper_durations(), f"not on disk here ({path}); assumed: "
                                   + PAPER_CORPUS_ASSUMPTION, True)
        return _corpora[key]
    key = f"{fmt}:{path.resolve()}"
    if key not in _corpora:
        try:  # in the trainer's order
            durations, timed, how = corpus_durations(fmt, path)
        except CorpusError as e:
            raise EstimateError(f"data.train {spec!r}: {e}") from None
        d = Durations(durations, timed)
        _corpora[key] = Corpus(key, d, f"{path}: {len(d):,} recordings, {d.hours:,.1f} h, durations from {how}",
                               False)
    return _corpora[key]


# ---- the plan of one trial ----------------------------------------------------------------------------------------
_plans: dict[tuple[Any, ...], dict[float, StepLengths]] = {}


def plan_key(cfg: Config, corpus: Corpus) -> tuple[Any, ...]:
    """What a trial's steps depend on: the corpus, the data settings that cut and group windows, the seed (the
    order), epochs and max_steps."""
    d, t = cfg.data, cfg.train
    return (corpus.key, d.context_s, d.batch_audio_s, d.batching, d.seqlen_warmup, d.seqlen_warmup_start_s,
            d.seqlen_warmup_every, d.max_recordings, t.seed, t.epochs, t.max_steps)


def trial_steps(cfg: Config, corpus: Corpus) -> dict[float, StepLengths]:
    """The trainer's steps of ``cfg`` over ``corpus`` per window length (cached per :func:`plan_key`): the same
    stream ``asr_core.training.train`` builds (``train.max_steps`` repeats the data until that many steps)."""
    key = plan_key(cfg, corpus)
    if key not in _plans:
        _plans[key] = step_lengths(training_stream(corpus.durations, cfg), cfg.train.max_steps)
    return _plans[key]
