"""One optimiser step's windows -> padded feature tensors, prepared ahead of the training loop when asked.

:class:`BatchMaker` turns windows into ``(features (B, T, F), lengths (B,), targets)``, two ways:

* whole recordings (``data.batching: consecutive``): audio is read and its features computed once per recording
  (consecutive windows share recordings, a few are kept), then cut and padded;
* windows (``interleaved``, where one step touches B recordings and each recording is used again a step later):
  each recording's per-bin mean and std are computed once (one read of the whole recording, kept: 640 bytes a
  recording), and every window is read by seeking to its own samples, its frames computed and normalised with the
  recording's statistics (:meth:`asr_core.data.features.FeatureExtractor.frames`). Memory stays one step's windows
  whatever the group (a group of 352 podcasts of 30 min would be ~20 GB of float32 features); the audio is
  decoded twice, once for the statistics and once in windows. The frames equal the whole-recording ones (bit for
  bit at 16 kHz in the tests; resampled files to float rounding).

:class:`StepLoader` walks :meth:`WindowStream.batches` and yields :class:`Step` s, each split into micro-batches
(:func:`asr_core.data.chunking.micro_batches`). With ``num_workers = 0`` a step is prepared when it is asked for, in the
caller's thread. With ``num_workers = N > 0``, N threads prepare the micro-batches of up to N upcoming steps while
the model trains on the current one: reading audio (libsndfile) and the mel/FFT torch ops release the GIL, so
threads overlap with training without the pickling and start-up cost of processes. Steps come back in stream
order whatever finishes first, and features are the same bits either way (each worker thread uses the caller's
intra-op thread count, so reductions split the same way), so the data and the results of a seed do not depend on
``num_workers``. A step carries the stream position *after* it: a checkpoint records the last step consumed,
never one merely prefetched, so resuming is exact.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from asr_core.data.audio import load_audio, read_segment
from asr_core.data.chunking import Position, Window, WindowStream, micro_batches
from asr_core.contract.specs import CorpusError
from asr_core.data.corpora.base import Recording
from asr_core.data.features import FeatureExtractor, normalise, statistics
from asr_core.data.tokenizer import Tokenizer


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward pass: ``features`` (B, T, F) zero-padded, ``lengths`` (B,) frames, token ids."""

    features: torch.Tensor
    lengths: torch.Tensor
    targets: list[list[int]]

    @property
    def size(self) -> int:
        return len(self.targets)


@dataclass(frozen=True)
class Step:
    """One optimiser step: its windows (in stream order), their micro-batches, and where the stream goes on."""

    windows: list[Window]
    micro: list[MicroBatch]
    next_pos: Position

    @property
    def size(self) -> int:
        return len(self.windows)


class _Entry:
    """A cached recording's features (or statistics), computed by whichever thread asks first (the others wait on
    the lock)."""

    __slots__ = ("lock", "features")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.features: object | None = None


@dataclass(frozen=True)
class RecordingStats:
    """What a window needs of its whole recording: per-bin (mean, std) (1, F) and its length in samples."""

    mean: torch.Tensor
    std: torch.Tensor
    samples: int


class BatchMaker:
    """Windows -> padded features (B, T, F), lengths (B,), token targets. Thread-safe.

    Keeps the features of the last ``cache`` recordings used, since consecutive windows (and the ends of one
    step and the start of the next) come from the same recording.
    """

    def __init__(self, recordings: Sequence[Recording], features: FeatureExtractor, tok: Tokenizer,
                 cache: int = 4, windows: bool = False, stats_cache: int = 1 << 18) -> None:
        self.recordings = recordings
        self.features = features
        self.tok = tok
        self.windows = windows
        self.cache: OrderedDict[int, _Entry] = OrderedDict()
        self.cache_size = stats_cache if windows else cache
        self._lock = threading.Lock()

    def _entry(self, idx: int) -> _Entry:
        with self._lock:
            entry = self.cache.get(idx)
            if entry is None:
                entry = self.cache[idx] = _Entry()
                if len(self.cache) > self.cache_size:
                    self.cache.popitem(last=False)  # a thread still computing it keeps its own reference
            else:
                self.cache.move_to_end(idx)
            return entry

    def _wave(self, idx: int) -> torch.Tensor:
        rec = self.recordings[idx]
        try:
            return load_audio(rec.audio, self.features.cfg.sample_rate)
        except OSError as e:
            raise CorpusError(f"recording {rec.id!r} ({rec.audio}): cannot read its audio: {e}") from None

    def recording_features(self, idx: int) -> torch.Tensor:
        """(T, F) normalised features of ``recordings[idx]``."""
        entry = self._entry(idx)
        with entry.lock:
            if entry.features is None:
                entry.features = self.features(self._wave(idx))
            return entry.features  # type: ignore[return-value]

    def keep_recording_stats(self, idx: int, stats: RecordingStats) -> None:
        """Keep ``stats`` as ``recordings[idx]``'s statistics: recordings cut from one audio file share them, so a
        caller that has them already spares the read."""
        entry = self._entry(idx)
        with entry.lock:
            entry.features = stats

    def recording_stats(self, idx: int) -> RecordingStats:
        """Per-bin statistics of ``recordings[idx]``'s features (one read of the whole recording, then kept)."""
        entry = self._entry(idx)
        with entry.lock:
            if entry.features is None:
                wave = self._wave(idx)
                mean, std = statistics(self.features.raw(wave))
                entry.features = RecordingStats(mean, std, int(wave.shape[0]))
            return entry.features  # type: ignore[return-value]

    def window_features(self, w: Window) -> torch.Tensor:
        """(t, F) normalised features of one window, read from its own samples."""
        st = self.recording_stats(w.recording)
        fps = self.features.frames_per_second
        total = self.features.n_frames(st.samples)
        a = min(int(round(w.start * fps)), total - 1)
        b = min(a + max(1, int(round(w.duration * fps))), total)
        lo, hi = self.features.sample_span(a, b)
        rec = self.recordings[w.recording]
        try:
            seg = read_segment(rec.audio, max(0, lo), min(st.samples, hi), self.features.cfg.sample_rate)
        except OSError as e:
            raise CorpusError(f"recording {rec.id!r} ({rec.audio}): cannot read its audio: {e}") from None
        return normalise(self.features.frames(seg, a, b, st.samples), stats=(st.mean, st.std))

    def __call__(self, windows: Sequence[Window]) -> MicroBatch:
        fps = self.features.frames_per_second
        pieces = []
        for w in windows:
            if self.windows:
                pieces.append(self.window_features(w))
                continue
            feats = self.recording_features(w.recording)
            a = min(int(round(w.start * fps)), feats.shape[0] - 1)
            b = min(a + max(1, int(round(w.duration * fps))), feats.shape[0])
            pieces.append(feats[a:b])
        lengths = torch.tensor([p.shape[0] for p in pieces], dtype=torch.long)
        x = torch.zeros(len(pieces), int(lengths.max()), pieces[0].shape[1])
        for i, p in enumerate(pieces):
            x[i, : p.shape[0]] = p
        return MicroBatch(x, lengths, [self.tok.encode(w.text) for w in windows])


class StepLoader:
    """Iterator of :class:`Step` from ``pos`` on; see the module docstring. Use as a context manager (or call
    :meth:`close`) so the worker threads stop with the loop."""

    def __init__(self, stream: WindowStream, pos: Position, maker: BatchMaker, micro_batch_audio_s: float = 0.0,
                 num_workers: int = 0) -> None:
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self._batches = stream.batches(pos)
        self._maker = maker
        self._micro_s = micro_batch_audio_s
        self._ahead = num_workers  # steps in preparation beyond the one handed out
        self._queue: deque[tuple[list[Window], Position, list[Future[MicroBatch]]]] = deque()
        self._exhausted = False
        self._closed = False
        self._pool: ThreadPoolExecutor | None = None
        # interleaved windows: the statistics of the next group's recordings are computed ahead, on threads of
        # their own, while this group trains (a group needs ~800 audio-seconds of them per second of training)
        self._stream = stream
        self._ahead_pool: ThreadPoolExecutor | None = None
        self._warmed: set[tuple[int, int]] = set()
        if maker.windows and stream.interleaved and num_workers > 0:
            self._ahead_pool = ThreadPoolExecutor(max(1, num_workers // 2), thread_name_prefix="asr-stats")
        if num_workers > 0:
            threads = torch.get_num_threads()
            self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="asr-data",
                                            initializer=torch.set_num_threads, initargs=(threads,))

    def __iter__(self) -> Iterator[Step]:
        return self

    def __next__(self) -> Step:
        if self._closed:
            raise StopIteration
        if self._pool is None:
            nxt = next(self._batches, None)
            if nxt is None:
                raise StopIteration
            windows, next_pos = nxt
            return Step(windows, [self._maker(mb) for mb in micro_batches(windows, self._micro_s)], next_pos)
        self._fill(self._ahead + 1)
        if not self._queue:
            raise StopIteration
        windows, next_pos, futures = self._queue.popleft()
        self._fill(self._ahead + 1)  # keep the workers busy while the caller trains on this step
        self._warm(next_pos)
        return Step(windows, [f.result() for f in futures], next_pos)

    def _warm(self, pos: Position) -> None:
        """Start computing the statistics of the group ``pos`` is in (or starts) and of the one after it."""
        if self._ahead_pool is None:
            return
        epoch, index = pos.epoch, pos.index
        for _ in range(2):
            members = self._stream.group(epoch, index)
            if not members:
                if epoch + 1 >= self._stream.epochs:
                    return
                epoch, index = epoch + 1, 0
                members = self._stream.group(epoch, index)
            if (epoch, index) not in self._warmed:
                self._warmed.add((epoch, index))
                for m in members:
                    self._ahead_pool.submit(self._maker.recording_stats, m)
            index += len(members)

    def _fill(self, depth: int) -> None:
        assert self._pool is not None
        while not self._exhausted and len(self._queue) < depth:
            nxt = next(self._batches, None)
            if nxt is None:
                self._exhausted = True
                return
            windows, next_pos = nxt
            futures = [self._pool.submit(self._maker, mb) for mb in micro_batches(windows, self._micro_s)]
            self._queue.append((windows, next_pos, futures))

    def close(self) -> None:
        """Drop prefetched steps and stop the threads (waits only for micro-batches already being made)."""
        self._closed = True
        if self._pool is not None:
            for _, _, futures in self._queue:
                for f in futures:
                    f.cancel()
            self._queue.clear()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._ahead_pool is not None:
            self._ahead_pool.shutdown(wait=True, cancel_futures=True)
            self._ahead_pool = None

    def __enter__(self) -> "StepLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
