"""The plan in numbers: what the optimiser steps of a :class:`~asr_core.data.chunking.WindowStream` will hold, from
the recordings' durations alone (no audio or words read), for cost estimates (:mod:`orchestrate.budget.estimate`).

:func:`step_lengths` replays the stream's own order, groups, sequence-length warmup and make-up
(``data.batching``), vectorised over the groups of an interleaved epoch, and sums per window length the steps,
windows, audio and padded audio (:class:`StepLengths`): the same steps the trainer takes, counted.

The trainer's own rules for what it trains on live here too, so that the trainer and the budget apply one copy:
:func:`trainer_order` (the order of a corpus's recordings), :func:`training_stream` (the stream of a config) and
:func:`corpus_durations` (a corpus on disk as the planner sees it, in that order, no audio read).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from asr_core.data.chunking import MIN_TAIL_S, WindowStream, duration_timed, group_size, window_bounds
from asr_core.data.corpora.base import Recording

if TYPE_CHECKING:
    from asr_core.config import Config

REPEAT = 1 << 30  # epochs of a stream that train.max_steps ends: the data repeats, a fresh order each time


def trainer_order(recordings: Sequence[Recording]) -> Sequence[Recording]:
    """``recordings`` in the order the trainer reads them: by id, so that the order does not depend on how a reader
    lists files; a prepared corpus as it is (it is stored in id order, and is not built recording by recording to
    sort it)."""
    from asr_core.data.corpora.prepared import PreparedCorpus

    return recordings if isinstance(recordings, PreparedCorpus) else sorted(recordings, key=lambda r: r.id)


def training_stream(recordings: Sequence[Recording], cfg: "Config") -> WindowStream:
    """The stream the trainer trains ``cfg`` on over ``recordings``, which must already be in :func:`trainer_order`:
    the first ``data.max_recordings`` of them (the trainer cuts them once before, to check and tokenise them; a second
    cut changes nothing), in ``train.seed``'s order, for ``train.epochs``, or repeated until ``train.max_steps`` where
    that is set."""
    t = cfg.train
    if cfg.data.max_recordings:
        recordings = recordings[: cfg.data.max_recordings]
    return WindowStream(recordings, cfg.data, t.seed, t.epochs if not t.max_steps else REPEAT)


def corpus_durations(fmt: str, path: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """(durations in s, every word timed, where they came from) of the corpus ``fmt:path``, in :func:`trainer_order`,
    with no audio read: a prepared corpus's arrays, another corpus's transcripts (a recording lasts until its last
    word). Raises :class:`~asr_core.contract.specs.CorpusError` as the corpus readers do."""
    if fmt == "prepared":
        from asr_core.data.corpora.prepared import PreparedCorpus

        corpus = PreparedCorpus(path)
        pairs = [corpus.duration_timed(i) for i in range(len(corpus))]
        how = "a prepared corpus's arrays"
    else:
        from asr_core.data.corpora import load_corpus

        pairs = [(r.duration, r.timed) for r in trainer_order(load_corpus(f"{fmt}:{path}", audio=False))]
        how = "transcripts (a recording lasts until its last word)"
    return (np.array([p[0] for p in pairs], dtype=np.float64), np.array([p[1] for p in pairs], dtype=bool), how)


@dataclass
class StepLengths:
    """Totals of the optimiser steps cut at one window length: ``steps``, ``windows``, ``audio_s`` (the windows'
    audio), ``padded_s`` (sum over steps of windows x the step's longest window: what a padded forward pass
    computes on), ``padded_s2`` (sum over steps of windows x longest window squared: what attention over padded
    windows computes on, ~L^2 per window) and ``audio_s2`` (sum of each window's duration squared: attention
    without padding, flash-attn's variable-length kernel)."""

    steps: int = 0
    windows: int = 0
    audio_s: float = 0.0
    padded_s: float = 0.0
    padded_s2: float = 0.0
    audio_s2: float = 0.0

    def add(self, other: "StepLengths") -> None:
        self.steps += other.steps
        self.windows += other.windows
        self.audio_s += other.audio_s
        self.padded_s += other.padded_s
        self.padded_s2 += other.padded_s2
        self.audio_s2 += other.audio_s2


def _plan_add(out: dict[float, StepLengths], seq: float, steps: int, windows: int, audio: float, pad1: float,
              pad2: float, audio2: float) -> None:
    cur = out.setdefault(float(seq), StepLengths())
    cur.add(StepLengths(int(steps), int(windows), float(audio), float(pad1), float(pad2), float(audio2)))


def _step_sizes(windows: Sequence[float]) -> tuple[int, float, float, float, float]:
    """(windows, audio, padded, padded^2, sum of squares) of one step from its window durations."""
    longest = max(windows)
    return (len(windows), sum(windows), len(windows) * longest, len(windows) * longest * longest,
            sum(w * w for w in windows))


def _member_windows(dur: np.ndarray, timed: np.ndarray, seq: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised :func:`window_bounds` / the untimed rule of :class:`WindowStream`: per recording (windows kept,
    duration of the last kept window, recordings skipped as untimed and too long)."""
    n = np.maximum(1, np.ceil(dur / seq - 1e-9)).astype(np.int64)
    start = (n - 1) * seq
    last = np.minimum(n * seq, dur) - start
    drop = (n > 1) & (last < MIN_TAIL_S)
    n_w = np.where(drop, n - 1, n)
    tail = np.where(drop, np.minimum((n - 1) * seq, dur) - (n - 2) * seq, last)
    fits = dur <= seq + 1e-6
    skipped = ~timed & ~fits
    n_w = np.where(timed, n_w, np.where(fits, 1, 0))
    tail = np.where(timed, tail, np.where(fits, dur, 0.0))
    return n_w, tail, skipped


def _window_list(duration: float, timed: bool, seq: float) -> list[float]:
    if timed:
        return [e - s for s, e in window_bounds(duration, seq)]
    return [duration] if duration <= seq + 1e-6 else []


def step_lengths(stream: WindowStream, max_steps: int = 0) -> dict[float, StepLengths]:
    """What the optimiser steps of ``stream`` hold, per window length they are cut at (durations only, no audio or
    words read; vectorised over groups, so a 100k-recording corpus takes a fraction of a second): steps,
    windows, audio and padded audio (:class:`StepLengths`). ``max_steps`` > 0 stops after that many steps, as
    the trainer does with ``train.max_steps`` (give the stream enough epochs). The steps add up to
    :meth:`WindowStream.count_steps`."""
    bulk = getattr(stream.recordings, "durations_timed", None)  # a durations-only corpus answers at once
    if bulk is not None:
        dur, timed = (np.asarray(x) for x in bulk())
    else:
        pairs = [duration_timed(stream.recordings, i) for i in range(len(stream.recordings))]
        dur = np.array([p[0] for p in pairs], dtype=np.float64)
        timed = np.array([p[1] for p in pairs], dtype=bool)
    if stream.interleaved:
        stream.sort_by_duration(dur)
    out: dict[float, StepLengths] = {}
    stream.skipped_untimed = 0
    total = 0
    pending: list[float] = []  # consecutive: the windows of the step still open (it continues into the next epoch)
    seq_of_pending = [0.0]
    for epoch in range(stream.epochs):
        before = total
        order = stream.order(epoch)
        if stream.interleaved:
            total = _interleaved_epoch(stream, epoch, order, dur, timed, out, total, max_steps)
        else:
            total = _consecutive_epoch(stream, epoch, order, dur, timed, out, total, max_steps, pending,
                                       seq_of_pending)
        if max_steps and total >= max_steps:
            return out
        if total == before and not pending and (max_steps or epoch > 0):  # an epoch without windows: no more come
            break
    if pending:
        _plan_add(out, seq_of_pending[0], 1, *_step_sizes(pending))
    return out


def _interleaved_epoch(stream: WindowStream, epoch: int, order: np.ndarray, dur: np.ndarray, timed: np.ndarray,
                       out: dict[float, StepLengths], total: int, max_steps: int) -> int:
    n = len(order)
    # group starts: a group takes the window length of its first recording, which changes only where the
    # recording counter crosses a multiple of seqlen_warmup_every; between two such points groups are regular
    every = stream.data.seqlen_warmup_every
    runs_start, runs_seq, runs_b = [], [], []
    index = 0
    while index < n:
        seq = stream.seq_len(epoch, index)
        b = group_size(seq, stream.data)
        r = epoch * n + index
        change = (r // every + 1) * every - epoch * n  # first index whose window length may differ
        count = max(1, math.ceil((min(change, n) - index) / b))
        runs_start.append(np.arange(index, index + count * b, b))
        runs_seq.append(np.full(count, seq))
        runs_b.append(np.full(count, b))
        index += count * b
    st_all = np.concatenate(runs_start)
    starts = st_all.tolist()
    sizes = np.minimum(np.concatenate(runs_b), n - st_all).tolist()
    seqs = np.concatenate(runs_seq).tolist()
    g = len(starts)
    steps_g = np.zeros(g, dtype=np.int64)
    win_g = np.zeros(g, dtype=np.int64)
    audio_g = np.zeros(g)
    pad1_g = np.zeros(g)
    pad2_g = np.zeros(g)
    sq2_g = np.zeros(g)
    st, sz, sq = np.array(starts), np.array(sizes), np.array(seqs)
    for seq in np.unique(sq):
        for b in np.unique(sz[sq == seq]):
            which = np.nonzero((sq == seq) & (sz == b))[0]
            idx = order[st[which][:, None] + np.arange(b)[None, :]]
            n_w, tail, skipped = _member_windows(dur[idx], timed[idx], float(seq))
            stream.skipped_untimed += int(skipped.sum())
            full = np.where(tail >= seq - 1e-9, n_w, np.maximum(n_w - 1, 0))
            f = full.max(axis=1)
            partial_last = (n_w == f[:, None] + 1) & (n_w > 0)
            c_f = partial_last.sum(axis=1)
            t_max = np.where(partial_last, tail, 0.0).max(axis=1)
            windows = n_w.sum(axis=1)
            steps_g[which] = n_w.max(axis=1)
            win_g[which] = windows
            audio_g[which] = np.where(n_w > 0, (n_w - 1) * seq + tail, 0.0).sum(axis=1)
            pad1_g[which] = seq * (windows - c_f) + c_f * t_max
            pad2_g[which] = seq * seq * (windows - c_f) + c_f * t_max * t_max
            sq2_g[which] = np.where(n_w > 0, (n_w - 1) * seq * seq + tail * tail, 0.0).sum(axis=1)
    cut = g
    if max_steps:
        cum = np.cumsum(steps_g) + total
        over = np.nonzero(cum >= max_steps)[0]
        if len(over):
            cut = int(over[0])
    for seq in np.unique(sq[:cut]):
        m = np.nonzero(sq[:cut] == seq)[0]
        _plan_add(out, float(seq), steps_g[m].sum(), win_g[m].sum(), audio_g[m].sum(), pad1_g[m].sum(),
                  pad2_g[m].sum(), sq2_g[m].sum())
    total += int(steps_g[:cut].sum())
    if cut < g:  # the group in which max_steps falls: its first steps, one by one
        seq, members = seqs[cut], order[starts[cut]:starts[cut] + sizes[cut]]
        wins = [_window_list(float(dur[m]), bool(timed[m]), seq) for m in members]
        depth = max(len(w) for w in wins)
        for k in range(min(depth, max_steps - total)):
            _plan_add(out, seq, 1, *_step_sizes([w[k] for w in wins if k < len(w)]))
            total += 1
    return total


def _consecutive_epoch(stream: WindowStream, epoch: int, order: np.ndarray, dur: np.ndarray, timed: np.ndarray,
                       out: dict[float, StepLengths], total: int, max_steps: int, pending: list[float],
                       seq_of_pending: list[float]) -> int:
    """Windows in stream order packed up to ``batch_audio_s`` (one Python pass over the windows), as the consecutive
    make-up of :class:`WindowStream`; ``pending`` (the open step) carries over to the next epoch."""
    limit = stream.data.batch_audio_s + 1e-6
    audio = sum(pending)
    for index in range(len(order)):
        seq = stream.seq_len(epoch, index)
        m = int(order[index])
        wins = _window_list(float(dur[m]), bool(timed[m]), seq)
        if not wins and not timed[m]:
            stream.skipped_untimed += 1
        for d in wins:
            if pending and audio + d > limit:
                _plan_add(out, seq_of_pending[0], 1, *_step_sizes(pending))
                total += 1
                pending.clear()
                audio = 0.0
                if max_steps and total >= max_steps:
                    return total
            seq_of_pending[0] = seq if not pending else max(seq_of_pending[0], seq)
            pending.append(d)
            audio += d
    return total
