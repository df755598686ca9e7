"""The evaluation's plug-ins: which decoders decode and which word scorers score, made from an evaluation's
request (:class:`asr_core.evaluation.evaluate.EvaluationRun`).

:data:`DECODERS` and :data:`SCORERS` are lists of factories, in the order the tables, metrics and log lines follow.
A factory takes the request (and, for a decoder, the model's :class:`~asr_core.evaluation.decoders.Setup`) and gives
its plug-ins: none where the request does not ask for them. A new decoder or scorer is a module of its own (see
:mod:`asr_core.evaluation.decoders` and :mod:`asr_core.evaluation.scorers.base` for the protocols) and one line here;
:func:`~asr_core.evaluation.evaluate.evaluate` and :func:`~asr_core.evaluation.dataset.evaluate_dataset` stay as
they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asr_core.contract.metrics import window_decoder
from asr_core.evaluation.scorers.recall import RecallScorer
from asr_core.evaluation.scorers.base import CueScorer, WerScorer, WordScorer
from asr_core.evaluation.scorers.tail import tail_scorer

# the decoders import torch, the scorers do not: a request's scorers (its tail set read) are made before any work
Setup = Any  # asr_core.evaluation.decoders.Setup


def _greedy(job: Any, setup: Setup) -> list[Any]:
    from asr_core.evaluation.decoders import GreedyDecoder

    return [GreedyDecoder()]


def _beam(job: Any, setup: Setup) -> list[Any]:
    return [job.beam] if job.beam is not None else []


def _fusion(job: Any, setup: Setup) -> list[Any]:
    from asr_core.evaluation.decoders import FusionDecoder

    return [FusionDecoder(m) for m in job.fusion]


def _windows(job: Any, setup: Setup) -> list[Any]:
    from asr_core.decoding.decode import window_frames
    from asr_core.evaluation.decoders import WindowDecoder

    fps, sub = setup.fps, setup.subsampling
    return [WindowDecoder(window_decoder(w), w, window_frames(w, fps, sub)) for w in job.windows]


# greedy first: the trial's own decoder; the others are "extra" (with any, only they are logged)
DECODERS: list[Callable[[Any, Setup], list[Any]]] = [_greedy, _beam, _fusion, _windows]
SCORERS: list[Callable[[Any], WordScorer | None]] = [lambda job: WerScorer(), lambda job: CueScorer(), tail_scorer,
                                                     lambda job: RecallScorer()]


def decoders_for(job: Any, setup: Setup) -> list[Any]:
    """The decoders ``job`` asks for, greedy first."""
    return [d for make in DECODERS for d in make(job, setup)]


def scorers_for(job: Any) -> list[WordScorer]:
    """The word scorers ``job`` asks for, the WER first."""
    return [s for make in SCORERS if (s := make(job)) is not None]
