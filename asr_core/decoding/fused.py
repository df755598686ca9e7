"""Every window fusion method on one recording: the windows each needs, each window run once, and how their greedy
outputs are joined (paper 001; the joining itself is :mod:`asr_core.decoding.fusion`'s and
:mod:`asr_core.decoding.rover`'s). The method names are :data:`asr_core.contract.metrics.FUSION_METHODS`.

* ``average`` is not here: it is the greedy decoder of every evaluation, :func:`~asr_core.decoding.decode.posteriors`
  at the evaluation's stride (each output frame the mean of the windows covering it).
* ``select``: the windows at the evaluation's stride; each output frame's best class taken from the window whose
  centre is nearest (:func:`~asr_core.decoding.fusion.select_frames`), then CTC's collapse.
* ``blockwise``: windows side by side (stride 1), their words concatenated (:func:`~asr_core.decoding.fusion.
  blockwise`): paper 001 §4.1's block-wise inference; a word cut at a window's edge stays two words.
* ``blockwise-frames``: windows side by side, their frames concatenated, then CTC's collapse: averaging at stride 1
  (a repeated token or a word cut at the edge is joined across it).
* ``chiu``: windows at 50% overlap (:data:`OVERLAP`); the odd and the even windows' words joined by Chiu et al.'s
  alignment (:func:`~asr_core.decoding.fusion.chiu_merge`), each pair's word chosen by paper 001 §2.2's
  word-position confidence; ``chiu-seconds``: the same, chosen by the seconds from its window's centre.
* ``lcs``: windows at 50% overlap, consecutive windows joined at their longest common run of words
  (:func:`~asr_core.decoding.fusion.lcs_merge`).
* ``rover``: the :data:`ROVER_PHASES` phase-shifted block-wise decodings (phase p: a short window over the first p/8
  of a window, then whole windows from there), voted word by word by SCTK's ``rover`` (frequency voting,
  :func:`asr_core.decoding.rover.rover`): the hypothesis-level twin of averaging 8 windows per frame.

Greedy decoding needs only each frame's best class, so :class:`WindowIds` keeps that per window (not its
posteriors: an hour-long recording at a paper context holds hundreds of windows) and runs a window only the first time
a method asks for it; the evaluation's averaging pass hands it the windows it ran (``on_window`` of
:func:`~asr_core.decoding.decode.posteriors`), so ``select`` and most of ``rover``'s windows cost nothing more.
Everything here is deterministic: the same model and features give the same texts.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from asr_core.contract.metrics import FUSION_METHODS
from asr_core.decoding.decode import WindowBatch, collapse_frames, forward_windows, plan_windows
from asr_core.decoding.fusion import (LCS_MIN_RUN, WindowHyp, blockwise, chiu_merge, lcs_merge, select_frames,
                                      window_hyp)
from asr_core.decoding.rover import TimedWord, rover

if TYPE_CHECKING:
    from asr_core.model.acoustic import AcousticModel as Model

OVERLAP = 0.5  # the stride of chiu and lcs, a fraction of the window: paper 001's 50% overlap
CHIU_CONFIDENCE = {"chiu": "position", "chiu-seconds": "seconds"}  # chiu_merge's confidence per method
ROVER_PHASES = 8  # rover's block-wise decodings, each shifted by 1/8 of a window: as many as averaging at 0.125

Span = tuple[int, int]  # a window's first and end input frame


class WindowIds:
    """The best class of each output frame of the windows of one recording, each window run at most once.

    features: (T, F), normalised over the recording; ``batch``: windows run together (an out-of-memory error halves
    it for the rest of the evaluation, as in :func:`~asr_core.decoding.decode.posteriors`)."""

    def __init__(self, model: "Model", features: torch.Tensor, *, subsampling: int, batch: WindowBatch,
                 device: torch.device | str = "cpu", bf16: bool = False) -> None:
        self.model, self.subsampling, self.batch, self.device, self.bf16 = model, subsampling, batch, device, bf16
        self.frames = int(features.shape[0])
        self.out_frames = math.ceil(self.frames / subsampling)
        self._feats = features
        self._ids: dict[Span, torch.Tensor] = {}
        self.ran = 0  # windows run here (not handed over by keep)

    def keep(self, span: Span, probs: torch.Tensor) -> None:
        """Remember a window already run elsewhere: its span and its (T', V) probabilities (clipped to the recording)."""
        self._ids[tuple(span)] = probs.argmax(dim=-1).to("cpu")  # type: ignore[index]

    def ids(self, spans: Sequence[Span]) -> list[torch.Tensor]:
        """Per span its best classes (T_i',), long; the spans not yet known are run in batches first."""
        todo = [s for s in dict.fromkeys(tuple(s) for s in spans) if s not in self._ids]
        if todo:
            feats = self._feats.to(device=self.device, dtype=torch.float32)
            b0 = 0
            while b0 < len(todo):
                chunk = todo[b0: b0 + self.batch.size]
                try:
                    probs, lengths = forward_windows(self.model, feats, chunk, self.device, self.bf16)
                except torch.OutOfMemoryError:
                    if not self.batch.shrink(len(chunk)):
                        raise
                    print(f"[decode] out of memory with {len(chunk)} windows; {self.batch.size} at a time from now "
                          "on", file=sys.stderr)
                    continue
                for i, (s, _) in enumerate(chunk):
                    n = min(int(lengths[i]), self.out_frames - s // self.subsampling)
                    self._ids[(s, _)] = probs[i, :n].argmax(dim=-1).to("cpu")
                b0 += len(chunk)
                self.ran += len(chunk)
        return [self._ids[tuple(s)] for s in spans]  # type: ignore[index]


def phase_spans(frames: int, window: int, step: int, phase: int) -> list[Span]:
    """The block-wise windows of ``phase`` (0 .. ROVER_PHASES - 1): a short window over the first ``phase * step``
    input frames (none for phase 0), then whole windows of ``window`` frames side by side to the end (the last cut
    there). Every frame of the recording is in exactly one of them."""
    first = min(phase * step, frames)
    spans = [(0, first)] if first > 0 else []
    s = first
    while s < frames:
        spans.append((s, min(s + window, frames)))
        s += window
    return spans


def window_stride(method: str, stride: float) -> float:
    """The stride, as a fraction of the window, of the windows ``method`` joins; ``stride``: the evaluation's
    (``select``'s). ``rover``'s phases shift by an eighth of a window (:func:`rover_step`)."""
    return {"select": stride, "blockwise": 1.0, "blockwise-frames": 1.0, "chiu": OVERLAP, "chiu-seconds": OVERLAP,
            "lcs": OVERLAP, "rover": 1.0 / ROVER_PHASES}[method]


def rover_step(window: int, subsampling: int) -> int:
    """The shift between rover's phases in input frames: an eighth of the window, rounded down to whole output
    frames (at least one), so that every phase's first short window is shorter than a window."""
    return max(subsampling, window // ROVER_PHASES // subsampling * subsampling)


def _select(cache: WindowIds, spans: list[Span], blank: int) -> list[int]:
    sub = cache.subsampling
    best = select_frames([i.unsqueeze(1).float() for i in cache.ids(spans)], [s // sub for s, _ in spans],
                         cache.out_frames)
    return [t for t, _ in collapse_frames(best[:, 0].long(), blank)]


def _hyps(cache: WindowIds, spans: list[Span], pieces: Sequence[str], blank: int, fps: float) -> list[WindowHyp]:
    sub = cache.subsampling
    return [window_hyp(collapse_frames(ids, blank), pieces, start=s / fps, end=e / fps, frame_seconds=sub / fps)
            for (s, e), ids in zip(spans, cache.ids(spans))]


def _rover(cache: WindowIds, window: int, pieces: Sequence[str], blank: int, fps: float) -> list[str]:
    step = rover_step(window, cache.subsampling)
    frame_s = cache.subsampling / fps
    phases = []
    for p in range(ROVER_PHASES):
        hyps = _hyps(cache, phase_spans(cache.frames, window, step, p), pieces, blank, fps)
        phases.append([TimedWord(w, max(0.0, t - frame_s / 2), frame_s) for h in hyps for w, t in zip(h.words, h.times)])
    return [w.word for w in rover(phases, "recording", "meth1")]


def join_words(method: str, hyps: Sequence[WindowHyp]) -> list[str]:
    """The words of a word-level method (``blockwise``, ``chiu``, ``chiu-seconds``, ``lcs``) from its windows'
    hypotheses in time order (``chiu``'s: every window at 50% overlap, the odd ones 0, 2, 4, ...)."""
    if method == "blockwise":
        return blockwise(hyps)
    if method in ("chiu", "chiu-seconds"):
        return chiu_merge(hyps[0::2], hyps[1::2], confidence=CHIU_CONFIDENCE[method])
    if method == "lcs":
        return lcs_merge(hyps, min_run=LCS_MIN_RUN)
    raise ValueError(f"{method!r} is not a word-level window fusion method: valid are blockwise, chiu, "
                     "chiu-seconds, lcs")


def fused_texts(cache: WindowIds, methods: Sequence[str], *, window: int, stride: float, tokenizer,
                pieces: Sequence[str], fps: float) -> dict[str, str]:
    """The text of the recording in ``cache`` by each of ``methods`` (names of
    :data:`~asr_core.contract.metrics.FUSION_METHODS`). ``window``: the context in input frames; ``stride``: the
    evaluation's (``select``'s) as a fraction of the window; ``pieces``: each id's piece
    (:func:`asr_core.decoding.fusion.tokenizer_pieces`); ``fps``: input frames per second."""
    unknown = [m for m in methods if m not in FUSION_METHODS]
    if unknown:
        raise ValueError(f"window fusion method {unknown[0]!r}: valid are {', '.join(FUSION_METHODS)}")
    blank = tokenizer.blank_id
    sub = cache.subsampling
    out: dict[str, str] = {}
    for m in methods:
        if cache.frames == 0:
            out[m] = ""
        elif m in ("select", "blockwise-frames"):
            plan = plan_windows(cache.frames, window, window_stride(m, stride), sub)
            out[m] = tokenizer.decode(_select(cache, plan.spans, blank))
        elif m in ("blockwise", "chiu", "chiu-seconds", "lcs"):
            hyps = _hyps(cache, plan_windows(cache.frames, window, window_stride(m, stride), sub).spans, pieces,
                         blank, fps)
            out[m] = " ".join(join_words(m, hyps))
        else:
            out[m] = " ".join(_rover(cache, window, pieces, blank, fps))
    return out
