"""Recordings -> windows of the current sequence length -> batches of a fixed audio duration (paper 000 §3.3).

A recording is cut into consecutive windows ``[k L, (k+1) L)`` of the sequence length ``L`` it is given when the
stream reaches it (the sequence-length warmup is a function of how many recordings came before). A word belongs to
a window only if it lies wholly inside it; words straddling a cut are dropped from both sides, their audio stays. A
trailing piece shorter than ``MIN_TAIL_S`` is dropped unless it is the whole recording.

Windows are gathered into batches until the next window would take the batch past ``batch_audio_s`` seconds of
audio, so every optimiser step sees about the same amount of audio whatever the context (batch = 1 h / L).
With gradient accumulation (``data.micro_batch_audio_s``), :func:`micro_batches` splits one step's windows, in
order, into the passes that are run forward/backward one at a time.

The stream is a pure function of (recordings, data config, seed): epoch ``e`` visits the recordings in the order
of ``numpy.random.default_rng([seed, e]).permutation``, and a :class:`Position` (epoch, recording, window) is all
a resumed run needs to continue exactly where it stopped.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from .config import DataConfig
from .corpora.base import Recording
from .schedules import sequence_length

MIN_TAIL_S = 0.5


@dataclass(frozen=True)
class Window:
    """Seconds ``[start, end)`` of ``recordings[recording]`` and the words wholly inside."""

    recording: int
    start: float
    end: float
    text: str

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Position:
    """Where the stream continues: the ``window``-th window of the ``index``-th recording of ``epoch``'s order."""

    epoch: int = 0
    index: int = 0
    window: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "window": self.window}

    @classmethod
    def from_dict(cls, d: dict[str, int]) -> "Position":
        return cls(int(d["epoch"]), int(d["index"]), int(d["window"]))


def window_bounds(duration: float, seq_len: float) -> list[tuple[float, float]]:
    """[(start, end), ...] seconds covering ``duration`` in steps of ``seq_len``."""
    n = max(1, math.ceil(duration / seq_len - 1e-9))
    out = []
    for k in range(n):
        start, end = k * seq_len, min((k + 1) * seq_len, duration)
        if k > 0 and end - start < MIN_TAIL_S:
            break
        out.append((start, end))
    return out


def duration_timed(recordings: Sequence[Recording], i: int) -> tuple[float, bool]:
    """(duration, every word timed) of ``recordings[i]``; a prepared corpus answers from its arrays."""
    ask = getattr(recordings, "duration_timed", None)
    if ask is not None:
        return ask(i)
    rec = recordings[i]
    return rec.duration, rec.timed


def micro_batches(windows: Sequence[Window], max_audio_s: float) -> list[list[Window]]:
    """One step's windows as the fewest contiguous micro-batches of at most ``max_audio_s`` padded audio.

    Padded audio is what a forward pass costs: windows x the step's longest window (a batch is padded to its
    longest member). Sizes differ by at most one window, so no pass is a small remainder with noisy batch
    statistics. ``max_audio_s = 0`` (no accumulation) gives the whole step as one micro-batch; a window longer
    than ``max_audio_s`` still gets a pass of its own.
    """
    if max_audio_s < 0:
        raise ValueError(f"max_audio_s must be 0 (one pass) or positive, got {max_audio_s!r}")
    if max_audio_s == 0 or not windows:
        return [list(windows)]
    longest = max(w.duration for w in windows)
    per_pass = max(1, math.floor(max_audio_s / longest + 1e-9))
    passes = math.ceil(len(windows) / per_pass)
    size, extra = divmod(len(windows), passes)
    out, i = [], 0
    for j in range(passes):
        n = size + (1 if j < extra else 0)
        out.append(list(windows[i : i + n]))
        i += n
    return out


def cut_windows(rec: Recording, index: int, seq_len: float) -> list[Window]:
    """The windows of one recording. Untimed recordings are one window if they fit, else none."""
    if not rec.timed:
        if rec.duration <= seq_len + 1e-6:
            return [Window(index, 0.0, rec.duration, rec.text)]
        return []
    out = []
    words = rec.words
    w0 = 0
    for start, end in window_bounds(rec.duration, seq_len):
        while w0 < len(words) and words[w0].start < start - 1e-9:  # type: ignore[operator]
            w0 += 1
        inside = []
        j = w0
        while j < len(words) and words[j].start < end:  # type: ignore[operator]
            w = words[j]
            if w.start >= start - 1e-9 and w.end <= end + 1e-9:  # type: ignore[operator]
                inside.append(w.text)
            j += 1
        out.append(Window(index, start, end, " ".join(inside)))
    return out


class WindowStream:
    """Deterministic batches of windows over ``epochs`` passes of ``recordings``."""

    def __init__(self, recordings: Sequence[Recording], data: DataConfig, seed: int, epochs: int = 1) -> None:
        if not recordings:
            raise ValueError("no training recordings: the corpus is empty")
        self.recordings = recordings
        self.data = data
        self.seed = seed
        self.epochs = epochs
        self._orders: dict[int, np.ndarray] = {}
        self.skipped_untimed = 0

    def order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders[epoch] = np.random.default_rng([self.seed, epoch]).permutation(len(self.recordings))
        return self._orders[epoch]

    def seq_len(self, epoch: int, index: int) -> float:
        """Sequence length given to the ``index``-th recording of ``epoch``."""
        d = self.data
        r = epoch * len(self.recordings) + index
        return sequence_length(r, d.context_s, d.seqlen_warmup_start_s, d.seqlen_warmup_every, d.seqlen_warmup)

    def windows_at(self, epoch: int, index: int) -> list[Window]:
        rec_idx = int(self.order(epoch)[index])
        return cut_windows(self.recordings[rec_idx], rec_idx, self.seq_len(epoch, index))

    def _walk(self, pos: Position) -> Iterator[tuple[Window, Position]]:
        """Every window from ``pos`` on, with its own position."""
        epoch, index, wi = pos.epoch, pos.index, pos.window
        n = len(self.recordings)
        while epoch < self.epochs:
            produced = False
            while index < n:
                wins = self.windows_at(epoch, index)
                for k in range(wi, len(wins)):
                    produced = True
                    yield wins[k], Position(epoch, index, k)
                index, wi = index + 1, 0
            if not produced and pos.epoch < epoch:  # a whole epoch without windows: no more will come
                return
            epoch, index = epoch + 1, 0

    def batches(self, pos: Position = Position()) -> Iterator[tuple[list[Window], Position]]:
        """(windows of one optimiser step, position of the next step's first window), until the data is used up."""
        batch: list[Window] = []
        total = 0.0
        for win, wpos in self._walk(pos):
            if batch and total + win.duration > self.data.batch_audio_s + 1e-6:
                yield batch, wpos
                batch, total = [], 0.0
            batch.append(win)
            total += win.duration
        if batch:
            yield batch, Position(self.epochs, 0, 0)

    def count_steps(self) -> int:
        """Optimiser steps in the whole stream (durations only; no audio is read)."""
        steps, total, any_in_batch = 0, 0.0, False
        untimed_too_long = 0
        for epoch in range(self.epochs):
            for index in range(len(self.recordings)):
                rec_idx = int(self.order(epoch)[index])
                duration, timed = duration_timed(self.recordings, rec_idx)
                seq = self.seq_len(epoch, index)
                if timed:
                    durs = [e - s for s, e in window_bounds(duration, seq)]
                elif duration <= seq + 1e-6:
                    durs = [duration]
                else:
                    durs, untimed_too_long = [], untimed_too_long + 1
                for dur in durs:
                    if any_in_batch and total + dur > self.data.batch_audio_s + 1e-6:
                        steps, total = steps + 1, 0.0
                    total += dur
                    any_in_batch = True
        if untimed_too_long:
            print(f"chunking: {untimed_too_long} recording visits without word times were longer than their "
                  "window and are skipped (cannot cut text without timestamps)", file=sys.stderr)
        self.skipped_untimed = untimed_too_long
        return steps + (1 if any_in_batch else 0)
