"""Joining overlapping windows: frame selection by nearest window centre, word hypotheses of windows from greedy
CTC, Chiu et al.'s odd/even alignment, the longest-common-run merge, block-wise joining; all deterministic."""

from __future__ import annotations

import pytest
import torch
from rapidfuzz.distance import Levenshtein

from asr_core.data.tokenizer import Tokenizer
from asr_core.decoding.decode import greedy_ids
from asr_core.decoding.fusion import (WindowHyp, blockwise, chiu_merge, greedy_frames, lcs_merge, select_frames,
                                      tokenizer_pieces, window_hyp)

torch.set_num_threads(1)


def hyp(start: float, end: float, *words: tuple[str, float]) -> WindowHyp:
    return WindowHyp(tuple(w for w, _ in words), tuple(t for _, t in words), start, end)


def averaged(window_probs: list[torch.Tensor], starts: list[int], total: int) -> torch.Tensor:
    """What decode.posteriors does with the windows' probabilities: the mean over the windows covering a frame."""
    sums = torch.zeros(total, window_probs[0].shape[1])
    counts = torch.zeros(total)
    for p, s in zip(window_probs, starts):
        n = min(p.shape[0], total - s)
        sums[s: s + n] += p[:n]
        counts[s: s + n] += 1
    return sums / counts.unsqueeze(1)


def random_windows(lengths: list[int], vocab: int = 6, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.softmax(torch.randn(n, vocab, generator=g), dim=-1) for n in lengths]


# ---- (b) frame selection ------------------------------------------------------------------------------------

def test_select_frames_equals_averaging_where_windows_do_not_overlap():
    probs = random_windows([5, 5, 4])
    starts = [0, 5, 10]
    assert torch.equal(select_frames(probs, starts, 13), averaged(probs, starts, 13))  # the last window is cut


def test_select_frames_takes_each_frame_from_the_window_with_the_nearer_centre():
    probs = random_windows([8, 8])  # centres 4 and 8: frames 0..5 are nearer the first, 6..11 the second
    out = select_frames(probs, [0, 4], 12)
    assert torch.equal(out[:6], probs[0][:6]) and torch.equal(out[6:], probs[1][2:])
    assert not torch.allclose(out, averaged(probs, [0, 4], 12))


def test_select_frames_gives_a_tied_frame_to_the_earlier_window():
    probs = random_windows([7, 7])  # centres 3.5 and 5.5: frame 4 (centre 4.5) is as near to both
    out = select_frames(probs, [0, 2], 9)
    assert torch.equal(out[4], probs[0][4]) and torch.equal(out[5], probs[1][3])


def test_select_frames_says_which_frames_no_window_covers():
    with pytest.raises(ValueError, match="1 of 10 output frames .the first: 4. are covered by no window"):
        select_frames(random_windows([4, 5]), [0, 5], 10)
    with pytest.raises(ValueError, match="one start per window"):
        select_frames(random_windows([4]), [0, 4], 8)


# ---- word hypotheses of windows -----------------------------------------------------------------------------

def test_greedy_frames_gives_the_greedy_ids_with_the_frame_each_run_starts():
    probs = random_windows([40], vocab=5, seed=3)[0]
    got = greedy_frames(probs, blank=4)
    assert [i for i, _ in got] == greedy_ids(probs, 4)
    best = probs.argmax(-1).tolist()
    assert all(best[f] == i and (f == 0 or best[f - 1] != i) for i, f in got)
    assert greedy_frames(probs[:0], blank=4) == []


def test_window_hyp_joins_pieces_into_words_timed_at_the_mean_of_their_frames():
    pieces = ["▁the", "▁c", "at", "▁", "5", "", "▁sat"]  # id 5 decodes to nothing (e.g. the blank)
    tokens = [(2, 0), (0, 1), (1, 3), (2, 4), (3, 6), (4, 7), (5, 8), (6, 9)]
    h = window_hyp(tokens, pieces, start=10.0, end=15.0, frame_seconds=0.5)
    assert h.words == ("at", "the", "cat", "5", "sat")  # a window may start inside a word
    # frame f of the window is centred at 10 + (f + 0.5) * 0.5 s
    assert h.times == (10.25, 10.75, 12.0, 13.5, 14.75)
    assert (h.start, h.end) == (10.0, 15.0)
    assert window_hyp(tokens, pieces.__getitem__, start=10.0, end=15.0, frame_seconds=0.5) == h


def test_window_hyp_words_are_the_tokenizers_decoding_split_at_spaces():
    tok = Tokenizer.train(["the cat sat on the mat", "a dog ran to the cathedral at dawn"] * 5, 40)
    text = "the cathedral cat sat at dawn"
    ids = tok.encode(text)
    tokens = [(i, 3 * k) for k, i in enumerate(ids)]
    h = window_hyp(tokens + [(tok.blank_id, 99)], tokenizer_pieces(tok), start=0.0, end=30.0, frame_seconds=0.08)
    assert list(h.words) == tok.decode(ids).split() == text.split()
    assert len(h.times) == len(h.words) and list(h.times) == sorted(h.times)


def test_a_window_hyp_needs_a_time_per_word_and_a_span():
    with pytest.raises(ValueError, match="one time per word"):
        WindowHyp(("a", "b"), (1.0,), 0.0, 4.0)
    with pytest.raises(ValueError, match="end after it starts"):
        WindowHyp((), (), 4.0, 4.0)


# ---- (c) Chiu et al.'s overlapping inference ----------------------------------------------------------------

ODD = [hyp(0, 4, ("the", 0.5), ("cat", 1.2), ("sat", 2.0), ("on", 2.8), ("tha", 3.7)),
       hyp(4, 8, ("mad", 4.3), ("and", 5.2), ("purred", 6.0), ("loudly", 7.0))]
EVEN = [hyp(2, 6, ("sad", 2.1), ("on", 2.8), ("the", 3.7), ("mat", 4.3), ("and", 5.2)),
        hyp(6, 10, ("purred", 6.1), ("loudly", 7.0))]


def test_chiu_merge_keeps_of_each_aligned_pair_the_word_nearer_its_window_centre():
    # by hand: the/-, cat/-, sat/sad (2.0 s is 0 s from its centre, 2.1 s is 1.9 s from its), on/on, tha/the
    # (1.7 s vs 0.3 s), mad/mat (1.7 s vs 0.3 s), and/and, purred/purred, loudly/loudly
    assert chiu_merge(ODD, EVEN, confidence="seconds") == "the cat sat on the mat and purred loudly".split()


def test_chiu_merge_never_pairs_words_of_windows_that_do_not_overlap():
    odd = [hyp(0, 4, ("x", 1.0), ("y", 2.0)), hyp(4, 8)]
    even = [hyp(2, 6), hyp(6, 10, ("x", 7.0), ("y", 8.0))]
    assert Levenshtein.distance(blockwise(odd), blockwise(even)) == 0  # unconstrained, pairing them costs nothing
    assert chiu_merge(odd, even, confidence="seconds") == ["x", "y", "x", "y"]
    # by word position "y" is the last of its window's two words (-1), less confident than the gap the empty even
    # window 2-6 leaves at 2 s (-0.5): the gap rule drops it; the even "y" at 8 s no odd window covers
    assert chiu_merge(odd, even) == ["x", "x", "y"]


def test_chiu_merge_prefers_pairing_equal_words_and_keeps_unpaired_words_in_time_order():
    # "a x" / "x b": two substitutions cost as much as two words unpaired; the equal words are paired
    assert chiu_merge([hyp(0, 4, ("a", 1.0), ("x", 3.0))], [hyp(2, 6, ("x", 3.1), ("b", 5.0))]) == ["a", "x", "b"]
    # "a" (0-4 s) and "b" (6-10 s) can never pair; both are kept, the earlier first
    odd = [hyp(0, 4, ("a", 1.0)), hyp(4, 8), hyp(8, 12, ("k", 9.5))]
    even = [hyp(2, 6), hyp(6, 10, ("b", 7.0), ("k", 9.6))]
    assert chiu_merge(odd, even) == ["a", "b", "k"]


def test_chiu_merge_drops_an_unpaired_fragment_the_other_sequence_heard_nearer_its_centre():
    # "dog" is cut at the odd windows' edge at 4 s: "d" ends window 0-4, "og" starts window 4-8; the even window 2-6
    # hears "dog" whole at its centre. "og" pairs with nothing; the even window covering 4.2 s is centred 0.2 s
    # from it, nearer than its own (1.8 s), so it goes; "d" pairs with "dog" and loses to it
    odd = [hyp(0, 4, ("a", 1.0), ("d", 3.9)), hyp(4, 8, ("og", 4.2), ("ran", 6.0))]
    even = [hyp(2, 6, ("dog", 4.0), ("ran", 5.9))]
    assert chiu_merge(odd, even, confidence="seconds") == ["a", "dog", "ran"]


def test_chiu_merge_is_blockwise_when_the_other_sequence_is_empty():
    assert chiu_merge(ODD, []) == blockwise(ODD) == "the cat sat on tha mad and purred loudly".split()
    assert chiu_merge([], EVEN) == blockwise(EVEN)
    assert chiu_merge(ODD, [hyp(2, 6), hyp(6, 10)]) == blockwise(ODD)  # even windows without words
    assert chiu_merge([], []) == []


def truth_windows(n_words: int, window: float, shift: float) -> tuple[list[str], list[WindowHyp]]:
    """A recording of ``n_words`` words, one every 0.5 s, and windows that each recognise exactly their words."""
    words = [f"w{i % 7}" for i in range(n_words)]
    times = [0.25 + 0.5 * i for i in range(n_words)]
    hyps, s = [], 0.0
    while s < times[-1]:
        inside = [(w, t) for w, t in zip(words, times) if s <= t < s + window]
        hyps.append(hyp(s, s + window, *inside))
        s += shift
    return words, hyps


def test_chiu_merge_and_lcs_merge_recover_words_every_window_got_right():
    words, hyps = truth_windows(200, 4.0, 2.0)
    assert chiu_merge(hyps[0::2], hyps[1::2]) == words
    assert lcs_merge(hyps) == words
    assert len(blockwise(hyps)) > len(words)  # overlapping windows joined block-wise repeat words


def test_chiu_merge_needs_windows_in_time_order():
    with pytest.raises(ValueError, match="odd windows must be in time order"):
        chiu_merge(ODD[::-1], EVEN)


# ---- (d) longest common run ---------------------------------------------------------------------------------

A = hyp(0, 4, ("one", 0.5), ("two", 1.2), ("three", 2.1), ("four", 2.9), ("five", 3.8))


def test_lcs_merge_joins_two_windows_at_their_common_run_in_the_overlap():
    b = hyp(2, 6, ("tree", 2.2), ("four", 2.9), ("five", 3.8), ("six", 4.5), ("seven", 5.5))
    assert lcs_merge([A, b]) == "one two three four five six seven".split()
    c = hyp(4, 8, ("six", 4.5), ("seven", 5.5), ("eight", 6.5))
    assert lcs_merge([A, b, c]) == "one two three four five six seven eight".split()


def test_lcs_merge_looks_for_the_run_only_where_the_windows_overlap():
    # "one" recurs in the second window, but 0.5 s is before it starts: no run, the words after 3.8 s follow
    b = hyp(2, 6, ("won", 2.2), ("for", 2.9), ("six", 4.5), ("one", 5.5))
    assert lcs_merge([A, b]) == "one two three four five six one".split()


def test_lcs_merge_without_a_common_run_joins_by_times():
    b = hyp(2, 6, ("tree", 2.2), ("for", 3.0), ("hive", 3.9), ("six", 4.5), ("seven", 5.5))
    assert lcs_merge([A, b]) == "one two three four five hive six seven".split()  # 3.9 s is after 3.8 s
    b = hyp(2, 6, ("tree", 2.2), ("four", 2.9), ("fife", 3.7), ("six", 4.5))
    assert lcs_merge([A, b], min_run=2) == "one two three four five six".split()
    assert lcs_merge([hyp(0, 4), b]) == list(b.words)
    assert lcs_merge([]) == []
    with pytest.raises(ValueError, match="min_run must be at least 1"):
        lcs_merge([A], min_run=0)


# ---- determinism --------------------------------------------------------------------------------------------

def test_every_method_gives_the_same_output_twice():
    probs = random_windows([8, 8, 8], seed=5)
    assert torch.equal(select_frames(probs, [0, 4, 8], 16), select_frames(probs, [0, 4, 8], 16))
    _, hyps = truth_windows(60, 4.0, 2.0)
    noisy = [hyp(h.start, h.end, *[(w if k % 3 else "z", t) for k, (w, t) in enumerate(zip(h.words, h.times))])
             for h in hyps]
    assert chiu_merge(noisy[0::2], noisy[1::2]) == chiu_merge(noisy[0::2], noisy[1::2])
    assert lcs_merge(noisy) == lcs_merge(noisy)
    assert chiu_merge(ODD, EVEN) == chiu_merge(list(ODD), list(EVEN))
