"""Ties of Chiu et al.'s alignment (asr_core.decoding.fusion.chiu_merge): among alignments of equal edit distance,
the one pairing words said together wins over one pairing words said seconds apart."""

from __future__ import annotations

import pytest

from asr_core.decoding.fusion import (LCS_MIN_RUN, WindowHyp, chiu_merge, gap_confidence, lcs_merge,
                                      position_confidence)


def hyp(start: float, end: float, *words: tuple[str, float]) -> WindowHyp:
    return WindowHyp(tuple(w for w, _ in words), tuple(t for _, t in words), start, end)


def test_a_tie_of_edit_distance_pairs_the_words_said_together():
    # a recording of 8 s, windows of 4 s at 50%: odd 0-4 and 4-8, even 2-6 and 6-8 (cut at the end). At the end the
    # odd window heard "mad" at 6.5 s and missed "today" at 7.5 s; the even one heard "mat" (6.6 s) and "today".
    # Pairing mad/mat (said together) and leaving "today" alone costs 2, as does pairing mad/today (1 s apart) and
    # leaving "mat" alone: the first is right. The second keeps "mad" of its pair and "mat" alone, and loses "today".
    odd = [hyp(0, 4, ("the", 0.5), ("cat", 1.5), ("sat", 2.5)),
           hyp(4, 8, ("on", 4.5), ("the", 5.5), ("mad", 6.5))]
    even = [hyp(2, 6, ("sat", 2.5), ("on", 4.5), ("the", 5.5)),
            hyp(6, 8, ("mat", 6.6), ("today", 7.5))]
    assert chiu_merge(odd, even) == "the cat sat on the mat today".split()


# ---- the confidence of paper 001 §2.2 ------------------------------------------------------------------------

ODD = [hyp(0, 4, ("the", 0.5), ("cat", 1.2), ("sat", 2.0), ("on", 2.8), ("tha", 3.7)),
       hyp(4, 8, ("mad", 4.3), ("and", 5.2), ("purred", 6.0), ("loudly", 7.0))]
EVEN = [hyp(2, 6, ("sad", 2.1), ("on", 2.8), ("the", 3.7), ("mat", 4.3), ("and", 5.2)),
        hyp(6, 10, ("purred", 6.1), ("loudly", 7.0))]


def test_position_confidence_is_minus_the_distance_of_i_from_half_the_window_words():
    assert position_confidence(4).tolist() == [-1.0, 0.0, -1.0, -2.0]  # i = 1..4, C_k / 2 = 2
    assert position_confidence(5).tolist() == [-1.5, -0.5, -0.5, -1.5, -2.5]
    assert position_confidence(0).tolist() == []


def test_chiu_merge_keeps_of_each_aligned_pair_the_word_of_higher_position_confidence():
    # paper 001 §2.2 by hand (its text gives the rule, no worked numbers). The odd windows are 0-4 s (5 words) and
    # 4-8 s (4 words), the even 2-6 s (5 words) and 6-10 s (2 words). Alignment: the/-, cat/-, sat/sad, on/on,
    # tha/the, mad/mat, and/and, purred/purred, loudly/loudly. Confidences -|i - C_k/2|:
    #   sat  3rd of 5: -0.5   vs  sad  1st of 5: -1.5  -> sat
    #   tha  5th of 5: -2.5   vs  the  3rd of 5: -0.5  -> the
    #   mad  1st of 4: -1     vs  mat  4th of 5: -1.5  -> mad (by seconds "mat", 0.3 s from its centre, would win)
    # "the" and "cat" (0.5, 1.2 s) are in no even window: the gap rule keeps them.
    assert chiu_merge(ODD, EVEN) == "the cat sat on the mad and purred loudly".split()
    assert chiu_merge(ODD, EVEN, confidence="seconds") == "the cat sat on the mat and purred loudly".split()


def test_the_gap_rule_weighs_a_lone_word_against_the_spot_it_would_hold_in_the_other_window():
    w = hyp(2, 6, ("a", 2.5), ("b", 3.0), ("c", 5.0), ("d", 5.5))  # 4 words
    assert gap_confidence(w, 2.2, "position") == -1.5  # before "a": between words 0 and 1, -|0.5 - 2|
    assert gap_confidence(w, 4.0, "position") == -0.5  # between "b" and "c", -|2.5 - 2|
    assert gap_confidence(hyp(2, 6), 4.0, "position") == -0.5  # an empty window
    assert gap_confidence(w, 3.0, "seconds") == -1.0
    # the lone odd "y" (3rd of 4: -1) lies in the even window 2-6 before its first word: that gap is -|0.5 - 1| =
    # -0.5, surer: "y" goes. "x" and "v" no even window covers, "w" no odd one: they stay
    odd = [hyp(0, 4, ("x", 0.5), ("v", 1.0), ("y", 2.5), ("z", 3.0))]
    assert chiu_merge(odd, [hyp(2, 6, ("z", 3.0), ("w", 5.0))]) == ["x", "v", "z", "w"]


def test_an_unknown_confidence_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match="valid are position, seconds"):
        chiu_merge(ODD, EVEN, confidence="centre")


# ---- the LCS merge's shortest run ----------------------------------------------------------------------------

def test_lcs_merge_joins_on_a_single_shared_word_only_at_a_shortest_run_of_one():
    # the two windows share only "the", said at 2.5 s in one and 3.6 s in the other: joined there (the default, 1
    # word) "four five" go; with runs of 2 words at least, the join goes by times and keeps them
    a = hyp(0, 4, ("one", 0.5), ("two", 1.2), ("three", 2.1), ("the", 2.5), ("four", 3.0), ("five", 3.8))
    b = hyp(2, 6, ("a", 2.2), ("the", 3.6), ("fine", 3.9), ("six", 4.5))
    assert LCS_MIN_RUN == 1
    assert lcs_merge([a, b]) == "one two three the fine six".split()
    assert lcs_merge([a, b], min_run=2) == "one two three the four five fine six".split()
