"""Joining the outputs of overlapping windows into one output per recording: five methods, all pure and
deterministic (the same input always gives the same output).

* (a) averaging, for reference, is :func:`asr_core.decoding.decode.posteriors`: every output frame the mean of the
  windows covering it.
* (b) :func:`select_frames`: every output frame taken from ONE window, the one whose centre is nearest (the
  frame-level counterpart of Hugging Face's strided CTC chunking, which keeps each chunk's middle and drops its
  strides). Equal to averaging where windows do not overlap.
* (c) :func:`chiu_merge`: Chiu et al.'s overlapping inference as paper 001 §2.2 describes it. Windows overlap by
  50%; the odd windows' word hypotheses are concatenated into one sequence, the even windows' into another, and
  the two are aligned by edit distance in which words of windows that do not overlap in time are never paired
  (infinite cost); among alignments of equal edit distance, the one whose paired words are nearest in time. Of
  each aligned pair the more confident word is kept: by the paper's word-position confidence ``-|i - C_k / 2|``
  for the i-th of the C_k words of window k (``confidence="position"``), or by nearness in seconds to the window's
  centre (``confidence="seconds"``). A word left unpaired is not always kept: by the *gap rule* it is weighed
  against the "no word" the other sequence's window covering its time has at that spot, and dropped when that gap
  is strictly more confident (a fragment cut at a window's edge that the other sequence heard whole goes; a word
  no window of the other sequence covers stays).
* (d) :func:`lcs_merge`: consecutive windows joined at their longest common run of words in the overlap, as
  NeMo's buffered (LCS) merge joins buffers, when the run has at least :data:`LCS_MIN_RUN` words; without one, by
  times. Each join drops words: those of either window beyond the cut (see :func:`lcs_merge`).
* :func:`blockwise`: the windows' words concatenated (paper 001 §4.1's block-wise inference, right for windows that
  do not overlap; a word cut at a window's edge stays two words).

Word-level methods take :class:`WindowHyp` (a window's words with their times); :func:`window_hyp` makes one from
a window's greedy CTC output (:func:`~asr_core.decoding.decode.greedy_frames`) and the tokenizer's pieces (:func:`tokenizer_pieces`).

Libraries: the longest common run of (d) is the standard library's ``difflib.SequenceMatcher.find_longest_match``.
The alignment of (c) is its own small dynamic program (numpy, one row at a time, within a band of times, exact
int64 costs): the infinite cost between words of non-overlapping windows, and the ties broken by time, are what no
edit-distance library (rapidfuzz, jiwer) takes.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import TYPE_CHECKING

import numpy as np
import torch

from asr_core.decoding.decode import greedy_frames

if TYPE_CHECKING:
    from asr_core.data.tokenizer import Tokenizer

WORD_START = "\u2581"  # SentencePiece's "▁": the piece begins a word
UNKNOWN_WORD = WORD_START + "\u2047"  # the unknown piece as its own word, "⁇", as SentencePiece decodes it


# ---- (b) frame selection ------------------------------------------------------------------------------------

def select_frames(window_probs: Sequence[torch.Tensor], starts: Sequence[int], total: int) -> torch.Tensor:
    """One recording's frame posteriors from overlapping windows, each output frame taken whole from the window
    whose centre is nearest to it (ties: the window earlier in the list).

    window_probs: per window (T_i, V) probabilities; starts: each window's first output frame in the recording;
    total: the recording's output frames. A window reaching past ``total`` is cut there. Distances are measured
    between frame centres (``t + 0.5``) and window centres (``start + T_i / 2``). Returns (total, V) in the
    windows' dtype. Where windows do not overlap this is exactly the average of :func:`~asr_core.decoding.decode.
    posteriors`, each frame having one window.
    """
    if len(window_probs) != len(starts):
        raise ValueError(f"{len(window_probs)} windows but {len(starts)} starts: give one start per window")
    if not window_probs:
        raise ValueError("no windows to select frames from: give at least one window")
    vocab = window_probs[0].shape[-1]
    for i, p in enumerate(window_probs):
        if p.dim() != 2 or p.shape[1] != vocab:
            raise ValueError(f"window {i} has shape {tuple(p.shape)}; every window must be (T_i, {vocab})")
        if starts[i] < 0:
            raise ValueError(f"window {i} starts at frame {starts[i]}; starts must be >= 0")
    frame_centre = torch.arange(total, dtype=torch.float64) + 0.5
    best = torch.full((total,), math.inf, dtype=torch.float64)
    owner = torch.full((total,), -1, dtype=torch.long)
    for i, (p, s) in enumerate(zip(window_probs, starts)):
        e = min(s + p.shape[0], total)
        if e <= s:
            continue
        dist = (frame_centre[s:e] - (s + p.shape[0] / 2)).abs()
        nearer = dist < best[s:e]  # strict: on a tie the earlier window keeps the frame
        best[s:e] = torch.where(nearer, dist, best[s:e])
        owner[s:e] = torch.where(nearer, torch.full_like(owner[s:e], i), owner[s:e])
    if bool((owner < 0).any()):
        first = int((owner < 0).nonzero()[0])
        raise ValueError(f"{int((owner < 0).sum())} of {total} output frames (the first: {first}) are covered by no "
                         "window: the windows must cover every frame of the recording")
    out = window_probs[0].new_zeros(total, vocab)
    for i, (p, s) in enumerate(zip(window_probs, starts)):
        e = min(s + p.shape[0], total)
        if e <= s:
            continue
        mine = owner[s:e] == i
        out[s:e][mine] = p[: e - s][mine]
    return out


# ---- word hypotheses of windows -----------------------------------------------------------------------------

@dataclass(frozen=True)
class WindowHyp:
    """One window's words. ``times``: each word's centre time in seconds from the start of the recording (one
    per word, in order); ``start``, ``end``: the window's span in seconds."""

    words: tuple[str, ...]
    times: tuple[float, ...]
    start: float
    end: float

    def __post_init__(self) -> None:
        if len(self.words) != len(self.times):
            raise ValueError(f"{len(self.words)} words but {len(self.times)} times: give one time per word")
        if not self.end > self.start:
            raise ValueError(f"a window must end after it starts, got start={self.start}, end={self.end}")

    @property
    def centre(self) -> float:
        return (self.start + self.end) / 2


def tokenizer_pieces(tok: Tokenizer) -> list[str]:
    """Each id's SentencePiece piece as :func:`window_hyp` reads it: "" for the blank and for control or unused
    (reserved) ids, which decode to nothing; the unknown piece as the word "⁇", as the tokenizer decodes it."""
    sp = tok.sp
    out = []
    for i in range(tok.pieces):
        if sp.is_control(i) or sp.is_unused(i):
            out.append("")
        elif sp.is_unknown(i):
            out.append(UNKNOWN_WORD)
        else:
            out.append(sp.id_to_piece(i))
    return out + [""]  # the blank


def window_hyp(tokens: Sequence[tuple[int, int]], pieces: Sequence[str] | Callable[[int], str], *, start: float,
               end: float, frame_seconds: float) -> WindowHyp:
    """A window's words with their times from its greedy CTC output.

    tokens: ``(token id, output frame within the window)`` as :func:`~asr_core.decoding.decode.greedy_frames` gives them; pieces: each id's
    SentencePiece piece (:func:`tokenizer_pieces`, or a callable id -> piece), "" for ids that decode to nothing;
    start, end: the window's span in seconds in the recording; frame_seconds: seconds per output frame. A piece
    starting with "▁" starts a word, any other continues the current one (the window's first piece starts one in
    any case); a word's time is the mean of its pieces' frame centre times, ``start + (frame + 0.5) *
    frame_seconds``. The words are those of the tokenizer's decoding split at spaces.
    """
    piece = pieces if callable(pieces) else pieces.__getitem__
    groups: list[tuple[str, list[float]]] = []  # per word: its text and its pieces' times
    for tid, frame in tokens:
        p = piece(tid)
        if not p:
            continue
        t = start + (frame + 0.5) * frame_seconds
        if p.startswith(WORD_START) or not groups:
            groups.append(("", []))
        text, frame_times = groups[-1]
        groups[-1] = (text + p.lstrip(WORD_START), frame_times + [t])
    groups = [(text, ts) for text, ts in groups if text]  # a lone "▁" makes no word
    words = [text for text, _ in groups]
    times = [sum(ts) / len(ts) for _, ts in groups]
    return WindowHyp(tuple(words), tuple(times), start, end)


def blockwise(hyps: Sequence[WindowHyp]) -> list[str]:
    """Block-wise joining (paper 001 §4.1): the windows' words one window after the other, nothing merged across
    a window's edge."""
    return [w for h in hyps for w in h.words]


# ---- (c) Chiu et al.'s overlapping inference ----------------------------------------------------------------

CONFIDENCES = ("position", "seconds")  # chiu_merge's confidence of a word: paper 001 §2.2's, or seconds off centre


def position_confidence(count: int) -> np.ndarray:
    """Paper 001 §2.2's confidence of each word of a window of ``count`` words: ``-|i - count / 2|`` for its i-th
    word, i = 1 .. count (highest mid-window, lowest at the edges). Returns (count,) float64."""
    return -np.abs(np.arange(1, count + 1, dtype=np.float64) - count / 2)


def gap_confidence(hyp: WindowHyp, t: float, confidence: str) -> float:
    """The confidence of "no word" at time ``t`` in window ``hyp`` (which covers ``t``): ``"position"``: of the spot
    between its n-th and (n+1)-th word, n its words before ``t``: ``-|n + 0.5 - C / 2|`` (C its words; an empty
    window gives -0.5); ``"seconds"``: ``-|t - centre|``, as a word said at ``t`` would have."""
    if confidence == "seconds":
        return -abs(t - hyp.centre)
    before = bisect_left(hyp.times, t)
    return -abs(before + 0.5 - len(hyp.words) / 2)


@dataclass(frozen=True)
class FlatWords:
    """A sequence of windows flattened: per word its text, time, window span and confidence (higher: kept)."""

    words: tuple[str, ...]
    times: np.ndarray  # (N,) float64 seconds
    starts: np.ndarray  # (N,) the word's window start
    ends: np.ndarray  # (N,) the word's window end
    confidence: np.ndarray  # (N,) position: -|i - C_k / 2|; seconds: -|time - window centre|

    @classmethod
    def of(cls, hyps: Sequence[WindowHyp], name: str, confidence: str) -> "FlatWords":
        for k in range(1, len(hyps)):
            if hyps[k].start < hyps[k - 1].start:
                raise ValueError(f"the {name} windows must be in time order: window {k} starts at "
                                 f"{hyps[k].start} s, before window {k - 1} at {hyps[k - 1].start} s")
        words = tuple(w for h in hyps for w in h.words)
        times = np.array([t for h in hyps for t in h.times], dtype=np.float64)
        starts = np.array([h.start for h in hyps for _ in h.words], dtype=np.float64)
        ends = np.array([h.end for h in hyps for _ in h.words], dtype=np.float64)
        if confidence == "seconds":
            conf = -np.abs(times - (starts + ends) / 2)
        else:
            conf = np.concatenate([position_confidence(len(h.words)) for h in hyps] or [np.zeros(0)])
        return cls(words, times, starts, ends, conf)


DIAG, UP, LEFT = 0, 1, 2  # backpointers: pair odd i-1 with even j-1; odd i-1 alone; even j-1 alone
COST_LIMIT = 2 ** 61  # alignment costs stay below this (int64); "unreachable" is this


def chiu_merge(odd: Sequence[WindowHyp], even: Sequence[WindowHyp], *, confidence: str = "position") -> list[str]:
    """Chiu et al.'s overlapping inference: one word sequence from the odd windows' and the even windows'
    hypotheses (windows overlapping by 50%: the even windows are the odd ones shifted by half a window).

    Each sequence is flattened into one word sequence, every word with its window and its confidence; the two are
    aligned by edit distance: pairing two words costs 0 when they are equal and 1 when not, but is impossible
    (infinite cost) when their windows do not overlap in time; leaving a word unpaired costs 1. Among alignments of
    equal edit distance the one whose paired words are nearest in time wins (the sum over pairs of the distance
    between their times, in milliseconds), then the one with the fewest substitutions, then pairing over leaving
    words unpaired; unpaired words come out in time order.

    ``confidence`` (:data:`CONFIDENCES`): ``"position"``, paper 001 §2.2's: the i-th of the C_k words of window k
    has ``-|i - C_k / 2|`` (:func:`position_confidence`); ``"seconds"``: minus the seconds from the word's time to its
    window's centre. Of each aligned pair the more confident word is kept (ties: the odd window's). A word left
    unpaired is paired with "no word" of the other sequence (the *gap rule*): that gap is as confident as the
    other sequence's window covering the word's time makes it at that spot (:func:`gap_confidence`; the most
    confident such window), and the word is dropped when the gap is strictly more confident, kept otherwise (a
    fragment of a word cut at a window's edge, which the other sequence heard whole mid-window, goes; a word no
    window of the other sequence covers stays). With no even windows this is :func:`blockwise` of the odd ones
    (and the other way round).

    The alignment runs within a band: the words emitted so far from either sequence are never more than two
    window lengths later than the next word of the other, which holds for every pair a window overlap allows.
    """
    if confidence not in CONFIDENCES:
        raise ValueError(f"confidence {confidence!r}: valid are {', '.join(CONFIDENCES)}")
    a, b = FlatWords.of(odd, "odd", confidence), FlatWords.of(even, "even", confidence)
    n, m = len(a.words), len(b.words)
    if n == 0 or m == 0:
        return list(a.words) + list(b.words)
    slack = 2 * max(h.end - h.start for h in [*odd, *even])
    sub_w, time_w, gap, ms = _cost_weights(n, m, slack)
    ta, tb = np.maximum.accumulate(a.times).tolist(), np.maximum.accumulate(b.times).tolist()
    # row i (odd[:i] emitted): columns j with even[:j] emitted, none later than odd[i] + slack, and the next even
    # word not earlier than odd[i - 1] - slack
    lo = [0] + [bisect_left(tb, ta[i - 1] - slack) for i in range(1, n + 1)]
    hi = [bisect_right(tb, ta[i] + slack) for i in range(n)] + [m]
    for i in range(1, n + 1):  # rows must connect: a path goes down within a column both rows hold
        lo[i] = min(lo[i], hi[i - 1])
    b_words = np.array(b.words, dtype=object)
    prev = np.arange(lo[0], hi[0] + 1, dtype=np.int64) * gap  # row 0: even words alone
    pointers: list[np.ndarray] = [np.full(hi[0] - lo[0] + 1, LEFT, dtype=np.int8)]
    for i in range(1, n + 1):
        cols = np.arange(lo[i], hi[i] + 1)
        up = np.full(cols.shape, COST_LIMIT, dtype=np.int64)
        inside = (cols >= lo[i - 1]) & (cols <= hi[i - 1])
        up[inside] = prev[cols[inside] - lo[i - 1]] + gap
        diag = np.full(cols.shape, COST_LIMIT, dtype=np.int64)
        jd = cols - 1  # the even word paired with odd i - 1
        ok = (jd >= lo[i - 1]) & (jd <= hi[i - 1]) & (jd >= 0)
        ok[ok] &= (b.starts[jd[ok]] < a.ends[i - 1]) & (a.starts[i - 1] < b.ends[jd[ok]])  # windows overlap
        apart = np.minimum(np.rint(np.abs(b.times[jd[ok]] - a.times[i - 1]) * 1000 / ms), slack * 1000 / ms)
        diag[ok] = (prev[jd[ok] - lo[i - 1]] + (b_words[jd[ok]] != a.words[i - 1]).astype(np.int64) * (gap + sub_w)
                    + apart.astype(np.int64) * time_w)
        base = np.minimum(np.minimum(up, diag), COST_LIMIT)
        # leaving even words alone along the row: D[j] = min_k<=j (base[k] + (j - k) * gap)
        k = np.arange(len(cols), dtype=np.int64) * gap
        row = np.minimum(np.minimum.accumulate(base - k) + k, COST_LIMIT)
        left = np.full(cols.shape, COST_LIMIT, dtype=np.int64)
        left[1:] = row[:-1] + gap
        ptr = np.where(diag == row, DIAG, np.where(up == row, UP, LEFT)).astype(np.int8)
        # a tie between an odd word alone and an even word alone: the later word is the one emitted last
        later_even = np.zeros(cols.shape, dtype=bool)
        later_even[1:] = b.times[cols[1:] - 1] > a.times[i - 1]
        ptr[(ptr == UP) & (left == row) & later_even] = LEFT
        pointers.append(ptr)
        prev = row
    if prev[-1] >= COST_LIMIT:  # pragma: no cover - the last column of the last row is always reachable
        raise RuntimeError("the alignment found no path; report the windows that caused it")
    out: list[str] = []
    i, j = n, m
    while i > 0 or j > 0:
        step = pointers[i][j - lo[i]] if i > 0 else LEFT
        if step == DIAG:
            keep_even = b.confidence[j - 1] > a.confidence[i - 1]
            out.append(b.words[j - 1] if keep_even else a.words[i - 1])
            i, j = i - 1, j - 1
        elif step == UP:
            if a.confidence[i - 1] >= _cover_confidence(even, a.times[i - 1], confidence):
                out.append(a.words[i - 1])
            i -= 1
        else:
            if b.confidence[j - 1] >= _cover_confidence(odd, b.times[j - 1], confidence):
                out.append(b.words[j - 1])
            j -= 1
    return out[::-1]


def _cost_weights(n: int, m: int, slack: float) -> tuple[int, int, int, int]:
    """The integer weights of :func:`chiu_merge`'s alignment cost, ``edit distance * gap + time apart * time_w +
    substitutions * sub_w``, each term outweighing every sum of the later ones: (sub_w, time_w, gap, ms), ``ms``
    the milliseconds of one unit of time apart (1, coarser only where the costs would not fit in int64)."""
    pairs = min(n, m)
    ms = 1
    while True:
        sub_w, time_w = 1, pairs + 1
        gap = time_w * (pairs * math.ceil(slack * 1000 / ms) + 1)
        if (n + m + 2) * (gap + sub_w + time_w * math.ceil(slack * 1000 / ms)) < COST_LIMIT:
            return sub_w, time_w, gap, ms
        ms *= 10


def _cover_confidence(hyps: Sequence[WindowHyp], t: float, confidence: str) -> float:
    """The gap rule: the confidence of "no word" at ``t`` in the most confident window of ``hyps`` covering it
    (-inf: none covers it)."""
    return max((gap_confidence(h, t, confidence) for h in hyps if h.start <= t < h.end), default=-math.inf)


# ---- (d) longest common run ---------------------------------------------------------------------------------

# lcs_merge's shortest common run that joins two windows, in words. 1: the run searched for is the longest one in the
# overlap, so a single word anchors a join only where the two windows share no two consecutive words there; such a
# word is often a function word ("the", "a") said at two different times, and the join then drops or repeats the
# words between them, which the join by times would not. 1 is kept as the default because it is the decoding every
# logged fusion-lcs result has (NeMo's merge sets no minimum either); 2 is the setting to try against it.
LCS_MIN_RUN = 1


def lcs_merge(hyps: Sequence[WindowHyp], *, min_run: int = LCS_MIN_RUN) -> list[str]:
    """Consecutive windows joined at their longest common run of words, NeMo-style (buffered LCS merge).

    hyps: the windows in time order. The words joined so far whose time lies in the next window, and that next
    window's words whose time lies in the previous window (the overlap, by time), are searched for their longest
    common contiguous run of words (the earliest such run on ties). If it is at least ``min_run`` words long
    (:data:`LCS_MIN_RUN`), the join is *cut at the run*: the words joined so far are kept up to the run's end, the
    next window's words after it follow, and the words of either side beyond the cut (the joined words after the
    run, the next window's words before it) are dropped. Without one, the join goes *by times*: the next window's
    words later than the last word joined so far follow, its others are dropped.
    """
    if min_run < 1:
        raise ValueError(f"min_run must be at least 1 word, got {min_run}")
    for k in range(1, len(hyps)):
        if hyps[k].start < hyps[k - 1].start:
            raise ValueError(f"the windows must be in time order: window {k} starts at {hyps[k].start} s, "
                             f"before window {k - 1} at {hyps[k - 1].start} s")
    if not hyps:
        return []
    words, times = list(hyps[0].words), list(hyps[0].times)
    for k in range(1, len(hyps)):
        h = hyps[k]
        tail = next((i for i, t in enumerate(times) if t >= h.start), len(times))  # joined words in window k
        # window k's first words, those within window k - 1
        head = next((i for i, t in enumerate(h.times) if t > hyps[k - 1].end), len(h.times))
        run = SequenceMatcher(None, words[tail:], list(h.words[:head]), autojunk=False).find_longest_match(
            0, len(words) - tail, 0, head)
        if run.size >= min_run:
            cut = tail + run.a + run.size
            words, times = words[:cut], times[:cut]
            rest = range(run.b + run.size, len(h.words))
        else:
            last = times[-1] if times else -math.inf
            rest = range(next((i for i, t in enumerate(h.times) if t > last), len(h.words)), len(h.words))
        words += [h.words[i] for i in rest]
        times += [h.times[i] for i in rest]
    return words
