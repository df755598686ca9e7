"""Recordings -> windows of the current sequence length -> optimiser steps of about one hour (paper 000 §3.3).

A recording is cut into consecutive windows ``[k L, (k+1) L)`` of the sequence length ``L`` it is given when the
stream reaches it (the sequence-length warmup is a function of how many recordings came before). A word belongs to
a window only if it lies wholly inside it; words straddling a cut are dropped from both sides, their audio stays
(``data.cut: fixed``, the paper's and the code's). ``data.cut: pauses`` moves each cut back to the start of the word
it would split, by at most :data:`CUT_BOUND_S`, so windows are at most ``L`` long and no word is dropped where the
words leave room (:func:`pause_bounds`); :func:`lost_to_cuts` counts what either way drops. A trailing piece shorter
than ``MIN_TAIL_S`` is dropped unless it is the whole recording.

Every step holds about ``batch_audio_s`` of audio whatever the context: ``B = group_size(L)`` windows of length L
(B = 704 at 5.12 s, 352 at 10.24 s, ... 1 at 1 h; B halves as the warmup doubles L). Two make-ups
(``data.batching``):

* ``interleaved`` (default; the authors' ``exp/train.py`` with ``lcasr/utils/dataloading.py``): the recordings
  are taken B at a time, and step ``k`` of a group holds window ``k`` of each of its B recordings (a recording that
  has ended drops out, so a group's last steps are smaller). Each step mixes B different recordings. The epoch's
  order sorts recordings by duration, shuffles within runs of ``SUBGROUP`` (2000), cuts the result into blocks of
  the first group size and shuffles the blocks, so a group holds recordings of similar length (few steps of
  stragglers) in a random place of the epoch. The code rebuilds that order with the new B each time B halves; here
  the blocks keep the first B and later, smaller groups take consecutive parts of them (the same neighbourhoods,
  without making the order depend on when the warmup doubled).
* ``consecutive``: windows are taken in stream order (one recording after another) until the next would take the
  step past ``batch_audio_s``, so a step at 10 s holds one or two recordings.

With gradient accumulation (``data.micro_batch_audio_s``), :func:`micro_batches` splits one step's windows, in
order, into the passes that are run forward/backward one at a time.

What the steps hold in numbers, without reading audio or words (for cost estimates), is
:func:`asr_core.data.step_plan.step_lengths`.

The stream is a pure function of (recordings, data config, seed): epoch ``e`` orders the recordings with
``numpy.random.default_rng([seed, e])``, and a :class:`Position` (epoch, recording, window) is all a resumed run
needs to continue exactly where it stopped (interleaved: the group's first recording and the next window index).
"""

from __future__ import annotations

import bisect
import itertools
import math
import sys
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from asr_core.config import DataConfig
from asr_core.data.corpora.base import Recording, Word
from asr_core.schedules import sequence_length

MIN_TAIL_S = 0.5
# data.cut=pauses: how far (seconds) a cut may move back to the start of the word it would split. Longer than any
# word, short against the shortest context (5.12 s): a window keeps at least 60% of its length
CUT_BOUND_S = 2.0
SUBGROUP = 2000  # lcasr SimpleDataset(subgroup_shuffle_size=2000): recordings shuffled within runs of this many


def group_size(seq_len: float, data: DataConfig) -> int:
    """B, the windows a step is made for at window length ``seq_len``: ``B0 = ceil(batch_audio_s / s0)`` at the
    warmup's first length ``s0`` (704 at 5.12 s for one hour), halved as the window doubles:
    ``floor(B0 * s0 / seq_len)``, at least 1 (the code's ``int(B * 0.5)`` each doubling; 352 at 10.24 s, 2 at
    1310.72 s, 1 at 3600 s). Without warmup ``s0`` is the context."""
    s0 = data.context_s if data.seqlen_warmup == "none" else min(data.seqlen_warmup_start_s, data.context_s)
    b0 = max(1, math.ceil(data.batch_audio_s / s0 - 1e-9))
    return max(1, math.floor(b0 * s0 / seq_len + 1e-9))


@dataclass(frozen=True)
class Window:
    """Seconds ``[start, end)`` of ``recordings[recording]`` and the words wholly inside; ``seq`` is the window
    length it was cut at (the last window of a recording may be shorter)."""

    recording: int
    start: float
    end: float
    text: str
    seq: float = 0.0

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


def pause_bounds(words: Sequence[Word], duration: float, seq_len: float,
                 bound_s: float = CUT_BOUND_S) -> list[tuple[float, float]]:
    """[(start, end), ...] covering ``duration`` in windows of at most ``seq_len`` seconds whose cuts split no word:
    each cut is moved back from ``start + seq_len`` to the start of the word it falls in (repeatedly, where words
    overlap), by at most ``bound_s``; where that is not possible (the word began more than ``bound_s`` earlier, or
    at the window's start) the cut stays and the word is dropped, as fixed cuts drop it. ``words`` in time order,
    all timed. A trailing piece shorter than ``MIN_TAIL_S`` is dropped unless it is the whole recording or holds a
    word."""
    starts = [float(w.start) for w in words]  # type: ignore[arg-type]
    reach = list(itertools.accumulate((float(w.end) for w in words), max))  # type: ignore[arg-type]
    out: list[tuple[float, float]] = []
    start = 0.0
    while True:
        target = start + seq_len
        if target >= duration - 1e-9:  # the tail: kept if long enough or if it holds a word (none is dropped)
            if not out or duration - start >= MIN_TAIL_S or (starts and starts[-1] >= start - 1e-9):
                out.append((start, duration))
            return out
        cut = target
        i = bisect.bisect_left(starts, cut - 1e-9) - 1  # the last word that starts before the cut
        while i >= 0 and reach[i] > cut + 1e-9:  # some word up to i is still running at the cut
            if words[i].end > cut + 1e-9:  # type: ignore[operator]
                cut = starts[i]
            i -= 1
        if cut < target - bound_s - 1e-9 or cut <= start + 1e-9:
            cut = target
        out.append((start, cut))
        start = cut


def lost_to_cuts(recordings: Sequence[Recording], seq_len: float, cut: str = "fixed", sample: int = 1000
                 ) -> dict[str, float]:
    """What cutting ``recordings`` into windows of ``seq_len`` drops: the share of words (and of their speech, in
    seconds) that lie wholly in no window, in percent, over at most ``sample`` timed recordings spread evenly over
    the corpus (reading every word of a large corpus would take longer than it tells). Keys ``words_lost_pct``,
    ``speech_lost_pct``, ``recordings`` (those counted); zero recordings: both shares NaN."""
    n = len(recordings)
    picks = range(n) if n <= sample else sorted({int(i * n / sample) for i in range(sample)})
    words = lost = 0
    speech = speech_lost = 0.0
    counted = 0
    for i in picks:
        rec = recordings[i]
        if not rec.timed or not rec.words:
            continue
        counted += 1
        bounds = (pause_bounds(rec.words, rec.duration, seq_len) if cut == "pauses"
                  else window_bounds(rec.duration, seq_len))
        ends = [e for _, e in bounds]
        for w in rec.words:
            a, b = float(w.start), float(w.end)  # type: ignore[arg-type]
            k = bisect.bisect_right(ends, a + 1e-9)  # the window the word starts in
            words += 1
            speech += b - a
            if not (k < len(bounds) and bounds[k][0] <= a + 1e-9 and b <= bounds[k][1] + 1e-9):
                lost += 1
                speech_lost += b - a
    nan = float("nan")
    return {"words_lost_pct": 100.0 * lost / words if words else nan,
            "speech_lost_pct": 100.0 * speech_lost / speech if speech > 0 else nan, "recordings": float(counted)}


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


def cut_windows(rec: Recording, index: int, seq_len: float, cut: str = "fixed") -> list[Window]:
    """The windows of one recording (``cut``: ``data.cut``). Untimed recordings are one window if they fit, else
    none."""
    if not rec.timed:
        if rec.duration <= seq_len + 1e-6:
            return [Window(index, 0.0, rec.duration, rec.text, seq_len)]
        return []
    out = []
    words = rec.words
    w0 = 0
    bounds = pause_bounds(words, rec.duration, seq_len) if cut == "pauses" else window_bounds(rec.duration, seq_len)
    for start, end in bounds:
        while w0 < len(words) and words[w0].start < start - 1e-9:  # type: ignore[operator]
            w0 += 1
        inside = []
        j = w0
        while j < len(words) and words[j].start < end:  # type: ignore[operator]
            w = words[j]
            if w.start >= start - 1e-9 and w.end <= end + 1e-9:  # type: ignore[operator]
                inside.append(w.text)
            j += 1
        out.append(Window(index, start, end, " ".join(inside), seq_len))
    return out


class WindowStream:
    """Deterministic optimiser steps of windows over ``epochs`` passes of ``recordings`` (see the module
    docstring for the two make-ups, ``data.batching``)."""

    def __init__(self, recordings: Sequence[Recording], data: DataConfig, seed: int, epochs: int = 1) -> None:
        if not recordings:
            raise ValueError("no training recordings: the corpus is empty")
        self.recordings = recordings
        self.data = data
        self.seed = seed
        self.epochs = epochs
        self.interleaved = data.batching == "interleaved"
        self._orders: dict[int, np.ndarray] = {}
        self._by_duration: np.ndarray | None = None
        self.skipped_untimed = 0

    def order(self, epoch: int) -> np.ndarray:
        """The recordings (indices) in the order epoch ``epoch`` visits them."""
        if epoch not in self._orders:
            rng = np.random.default_rng([self.seed, epoch])
            if not self.interleaved:
                self._orders[epoch] = rng.permutation(len(self.recordings))
            else:
                self._orders[epoch] = self._duration_blocks(rng)
        return self._orders[epoch]

    def sort_by_duration(self, durations: np.ndarray) -> None:
        """Take the recordings' durations read in bulk (a plan in numbers has them all at once), so that ordering
        an interleaved epoch does not read them one recording at a time."""
        if self._by_duration is None:
            self._by_duration = np.argsort(durations, kind="stable")

    def _duration_blocks(self, rng: np.random.Generator) -> np.ndarray:
        """Sorted by duration, shuffled within runs of SUBGROUP, cut into blocks of the first group size, blocks
        shuffled (lcasr ``SimpleDataset.create_batches``)."""
        if self._by_duration is None:
            durations = np.array([duration_timed(self.recordings, i)[0] for i in range(len(self.recordings))])
            self._by_duration = np.argsort(durations, kind="stable")
        idx = self._by_duration
        runs = [rng.permutation(idx[i:i + SUBGROUP]) for i in range(0, len(idx), SUBGROUP)]
        mixed = np.concatenate(runs)
        b0 = group_size(self.seq_len(0, 0), self.data)
        blocks = [mixed[i:i + b0] for i in range(0, len(mixed), b0)]
        return np.concatenate([blocks[j] for j in rng.permutation(len(blocks))])

    def seq_len(self, epoch: int, index: int) -> float:
        """Sequence length given to the ``index``-th recording of ``epoch``."""
        d = self.data
        r = epoch * len(self.recordings) + index
        return sequence_length(r, d.context_s, d.seqlen_warmup_start_s, d.seqlen_warmup_every, d.seqlen_warmup)

    def windows_at(self, epoch: int, index: int) -> list[Window]:
        rec_idx = int(self.order(epoch)[index])
        return cut_windows(self.recordings[rec_idx], rec_idx, self.seq_len(epoch, index), self.data.cut)

    def group(self, epoch: int, index: int) -> list[int]:
        """Interleaved: the recordings (indices) of the group that starts at the ``index``-th of ``epoch``."""
        if epoch >= self.epochs or index >= len(self.recordings):
            return []
        size = group_size(self.seq_len(epoch, index), self.data)
        return [int(i) for i in self.order(epoch)[index:index + size]]

    def batches(self, pos: Position = Position()) -> Iterator[tuple[list[Window], Position]]:
        """(windows of one optimiser step, position of the next step), until the data is used up."""
        return self._groups(pos) if self.interleaved else self._consecutive(pos)

    # ---- interleaved: step k of a group = window k of each of its B recordings -----------------------------
    def _groups(self, pos: Position) -> Iterator[tuple[list[Window], Position]]:
        epoch, index, k = pos.epoch, pos.index, pos.window
        n = len(self.recordings)
        while epoch < self.epochs:
            produced = False
            order = self.order(epoch)
            while index < n:
                seq = self.seq_len(epoch, index)
                members = order[index:index + group_size(seq, self.data)]
                wins = [cut_windows(self.recordings[int(m)], int(m), seq, self.data.cut) for m in members]
                depth = max(len(w) for w in wins)
                nxt = index + len(members)
                for kk in range(k, depth):
                    produced = True
                    step = [w[kk] for w in wins if kk < len(w)]
                    yield step, (Position(epoch, index, kk + 1) if kk + 1 < depth else Position(epoch, nxt, 0))
                index, k = nxt, 0
            if not produced and pos.epoch < epoch:  # a whole epoch without windows: no more will come
                return
            epoch, index = epoch + 1, 0

    # ---- consecutive: windows in stream order up to batch_audio_s -----------------------------------------
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

    def _consecutive(self, pos: Position) -> Iterator[tuple[list[Window], Position]]:
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

    def _window_durations(self, epoch: int, index: int, seq: float) -> list[float]:
        """Durations of the windows of the ``index``-th recording of ``epoch`` (durations only; no words read)."""
        rec_idx = int(self.order(epoch)[index])
        duration, timed = duration_timed(self.recordings, rec_idx)
        if timed and self.data.cut == "pauses":  # where the cuts fall depends on the words
            return [w.duration for w in cut_windows(self.recordings[rec_idx], rec_idx, seq, "pauses")]
        if timed:
            return [e - s for s, e in window_bounds(duration, seq)]
        if duration <= seq + 1e-6:
            return [duration]
        self.skipped_untimed += 1
        return []

    def step_recordings(self, total_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Per optimiser step of the first ``total_steps``: (recordings the stream had used before the step's group,
        recordings used once its group is done), counted over epochs (``epoch * len(recordings) + index``; durations
        only, no audio read). Interleaved: a group is the B recordings trained together. Consecutive: the step's own
        windows' recordings. What the learning rate's cosine over recordings reads
        (:func:`asr_core.schedules.learning_rate_by_recordings`). Shorter than ``total_steps`` when the data ends
        first."""
        before: list[int] = []
        after: list[int] = []
        n = len(self.recordings)
        if self.interleaved:
            epoch = 0
            while epoch < self.epochs and len(before) < total_steps:
                index, produced = 0, False
                while index < n and len(before) < total_steps:
                    seq = self.seq_len(epoch, index)
                    end = min(n, index + group_size(seq, self.data))
                    depth = max(len(self._window_durations(epoch, i, seq)) for i in range(index, end))
                    take = min(depth, total_steps - len(before))
                    before += [epoch * n + index] * take
                    after += [epoch * n + end] * take
                    produced = produced or depth > 0
                    index = end
                if not produced:
                    break
                epoch += 1
        else:
            total, first, last = 0.0, None, None
            epoch = 0
            while epoch < self.epochs and len(before) < total_steps:
                produced = False
                for index in range(n):
                    r = epoch * n + index
                    for dur in self._window_durations(epoch, index, self.seq_len(epoch, index)):
                        produced = True
                        if first is not None and total + dur > self.data.batch_audio_s + 1e-6:
                            before.append(first)
                            after.append(last + 1)
                            total, first = 0.0, None
                            if len(before) == total_steps:
                                break
                        first = r if first is None else first
                        last, total = r, total + dur
                    if len(before) == total_steps:
                        break
                if not produced:
                    break
                epoch += 1
            if first is not None and len(before) < total_steps:
                before.append(first)
                after.append(last + 1)
        return np.asarray(before, dtype=np.int64), np.asarray(after, dtype=np.int64)

    def count_steps(self) -> int:
        """Optimiser steps in the whole stream (durations only; no audio is read)."""
        self.skipped_untimed = 0
        steps = 0
        n = len(self.recordings)
        if self.interleaved:
            for epoch in range(self.epochs):
                index = 0
                while index < n:
                    seq = self.seq_len(epoch, index)
                    end = min(n, index + group_size(seq, self.data))
                    steps += max(len(self._window_durations(epoch, i, seq)) for i in range(index, end))
                    index = end
        else:
            total, any_in_batch = 0.0, False
            for epoch in range(self.epochs):
                for index in range(n):
                    for dur in self._window_durations(epoch, index, self.seq_len(epoch, index)):
                        if any_in_batch and total + dur > self.data.batch_audio_s + 1e-6:
                            steps, total = steps + 1, 0.0
                        total += dur
                        any_in_batch = True
            steps += 1 if any_in_batch else 0
        if self.skipped_untimed:
            print(f"chunking: {self.skipped_untimed} recording visits without word times were longer than their "
                  "window and are skipped (cannot cut text without timestamps)", file=sys.stderr)
        return steps
