"""The tail-word error rate: the tail set of a text (threshold edge, ties, normalisation), errors on tail words only,
the tail's share of test references, the JSON file and the pooled corpus rate."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pytest

from asr_core.scoring.score import align_counts
from asr_core.scoring.tail import (UNSEEN_HEAD, UNSEEN_TAIL, TailCounts, TailSet, corpus_tail_rate, describe,
                                      share_of, tail_counts, tail_set, total_tail)

# 20 words: the x10, cat x5, plum x2, fig x1, kiwi x1, lime x1 (case and punctuation vary; normalised away).
TEXT = ["The cat, the cat. THE CAT the cat the cat!", "the the the the the", "Plum plum, Fig. kiwi lime"]
TAIL = TailSet(frozenset({"fig", "kiwi", "lime", "plum"}), "hand-made", 0.25, 20, 0.25)


def test_the_tail_is_the_rarest_words_up_to_the_share() -> None:
    t = tail_set(TEXT, share=0.25, source="hand-made")
    # budget 5 words: fig, kiwi, lime (3) then plum (5: exactly at the threshold, taken)
    assert t == dataclasses.replace(TAIL, head=frozenset({"the", "cat"}), unseen=UNSEEN_TAIL)
    assert t.total_words == 20 and t.tail_share == pytest.approx(0.25)


def test_a_word_the_training_text_never_says_is_a_tail_word_by_default_and_not_under_the_option() -> None:
    """Paper 002: tail tokens are those whose accumulated frequency in the training corpus is below the threshold; a
    word the corpus never says has frequency 0."""
    paper, older = tail_set(TEXT, share=0.25), tail_set(TEXT, share=0.25, unseen=UNSEEN_HEAD)
    assert paper.unseen == UNSEEN_TAIL and older.unseen == UNSEEN_HEAD
    assert "zebra" in paper and "zebra" not in older  # never said in TEXT
    assert "plum" in paper and "plum" in older and "cat" not in paper and "cat" not in older  # said: as counted
    ref, hyp = "the cat the zebra the plum", "the cat the zebu the plum"
    assert tail_counts(ref, hyp, paper) == TailCounts(words=2, substitutions=1, deletions=0, insertions=0)
    assert tail_counts(ref, hyp, older) == TailCounts(words=1, substitutions=0, deletions=0, insertions=0)
    assert share_of(["zebra and plum"], paper) == pytest.approx(1.0) and share_of(["zebra and plum"], older) == \
        pytest.approx(1 / 3)
    assert json.loads(describe(paper, {}))["unseen"] == "tail" and json.loads(describe(older, {}))["unseen"] == "head"
    for t in (paper, older):  # the file keeps which, and the text's other words
        assert TailSet.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    with pytest.raises(ValueError, match="unseen 'rare': one of tail, head"):
        tail_set(TEXT, unseen="rare")


def test_a_tail_set_written_before_sets_kept_their_heads_reads_as_it_counted() -> None:
    old = {k: v for k, v in tail_set(TEXT, share=0.25).to_dict().items() if k not in ("head", "unseen")}
    t = TailSet.from_dict(old)
    assert t.unseen == UNSEEN_HEAD and t.head is None and "zebra" not in t and "plum" in t
    assert t.to_dict() == old  # written back as it was: its hash, and so any evaluation setting naming it, holds
    with pytest.raises(ValueError, match="recompute it"):
        TailSet(frozenset({"plum"}), unseen=UNSEEN_TAIL)


def test_the_type_that_crosses_the_threshold_is_not_taken() -> None:
    t = tail_set(TEXT, share=0.2)  # budget 4: fig, kiwi, lime make 3; plum would make 5
    assert t.words == {"fig", "kiwi", "lime"} and t.tail_share == pytest.approx(0.15)
    assert "plum" not in t and len(t) == 3


def test_ties_are_broken_alphabetically() -> None:
    assert tail_set(TEXT, share=0.1).words == {"fig", "kiwi"}  # budget 2 of three words seen once
    assert tail_set(list(reversed(TEXT)), share=0.1).words == {"fig", "kiwi"}  # the order of the text is irrelevant
    assert tail_set(TEXT, share=0.04).words == frozenset()  # budget 0.8: not even one word


def test_normalisation_makes_one_type_of_a_word_however_written() -> None:
    t = tail_set(["Hello, world", "hello world", "HELLO! world.", "world world world"], share=0.5,
                 unseen=UNSEEN_HEAD)  # the raw "Hello," is no word of the text: with unseen=tail it would be
    assert t.total_words == 9 and t.words == {"hello"}  # hello x3 <= 4.5; world x6 would cross
    assert "Hello," not in t and tail_set("Hello, hello", share=0.99).words == frozenset()  # one type, 2 > 1.98


def test_bad_arguments_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        tail_set(TEXT, share=1.5)
    with pytest.raises(ValueError, match="no words"):
        tail_set(["", "  "], source="empty.txt")


def test_errors_on_tail_words_are_counted_and_the_others_ignored() -> None:
    ref = "The cat ate Fig, and plum with lime on bread."
    hyp = "the dog ate fog and with lime on kiwi bread today"
    # cat->dog (head, ignored), fig->fog (tail S), plum deleted (tail D), kiwi inserted (tail I), today (ignored)
    overall = align_counts("the cat ate fig and plum with lime on bread", hyp)
    assert (overall.substitutions, overall.deletions, overall.insertions) == (2, 1, 2)
    c = tail_counts(ref, hyp, TAIL)
    assert c == TailCounts(words=3, substitutions=1, deletions=1, insertions=1)
    assert c.errors == 3 and c.rate == pytest.approx(100.0)
    assert tail_counts(ref, "the cat ate fig and plum with lime on bread", TAIL) == TailCounts(3, 0, 0, 0)


def test_a_head_word_replaced_by_a_tail_word_is_no_tail_error() -> None:
    c = tail_counts("the cat sat", "the kiwi sat", TAIL)
    assert c == TailCounts(0, 0, 0, 0)
    assert math.isnan(c.rate)  # no tail word in the reference: no rate


def test_empty_sides() -> None:
    assert tail_counts("fig and plum", "", TAIL) == TailCounts(2, 0, 2, 0)
    assert tail_counts("", "kiwi and lime", TAIL) == TailCounts(0, 0, 0, 2)
    assert math.isnan(tail_counts("", "", TAIL).rate)
    assert tail_counts("fig", "fig", TAIL, normalised=True) == TailCounts(1, 0, 0, 0)


def test_with_every_word_in_the_tail_the_counts_are_the_wer_counts() -> None:
    rng = random.Random(0)
    vocab = "a b c d e".split()
    everything = TailSet(frozenset(vocab), "all", 0.5, 5, 0.5)
    for _ in range(100):
        r = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 10)))
        h = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 10)))
        c, o = tail_counts(r, h, everything, normalised=True), align_counts(r, h)
        assert (c.words, c.substitutions, c.deletions, c.insertions) == \
            (o.ref_words, o.substitutions, o.deletions, o.insertions)


def test_share_of_the_references_words_that_are_tail_words() -> None:
    assert share_of(["The fig, the plum.", "a cat and a kiwi"], TAIL) == pytest.approx(3 / 9)
    assert share_of("Fig fig cat", TAIL) == pytest.approx(2 / 3)  # one string is one reference
    assert math.isnan(share_of([], TAIL))


def test_corpus_rate_pools_counts_rather_than_averaging_rates() -> None:
    counts = [TailCounts(1, 1, 0, 0), TailCounts(9, 0, 0, 0), TailCounts(0, 0, 0, 1)]
    assert corpus_tail_rate(counts) == pytest.approx(100 * 2 / 10)  # the mean of rates would be 50 (or NaN)
    assert total_tail(counts) == TailCounts(10, 1, 0, 1)
    assert math.isnan(corpus_tail_rate([])) and math.isnan(corpus_tail_rate([TailCounts(0, 0, 0, 3)]))


def test_json_round_trip(tmp_path: Path) -> None:
    t = tail_set(TEXT, share=0.25, source="lm/train.txt")
    path = t.write(tmp_path / "tails" / "tail.json")
    assert TailSet.read(path) == t
    data = json.loads(path.read_text())
    assert data["words"] == ["fig", "kiwi", "lime", "plum"] and data["source"] == "lm/train.txt"
    assert TailSet.from_dict(t.to_dict()) == t


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"words": ["a"]}',
                                     '{"words": "a", "share": 0.05, "total_words": 3, "tail_share": 0.0}',
                                     '{"words": ["a"], "share": 2, "total_words": 3, "tail_share": 0.0}'])
def test_a_malformed_file_is_refused_naming_it(tmp_path: Path, content: str) -> None:
    path = tmp_path / "broken.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="broken.json") as e:
        TailSet.read(path)
    assert "tail_set" in str(e.value)  # says how to make a good one


def test_the_alignment_is_the_wer_alignment_where_two_would_cost_the_same() -> None:
    ref, hyp = "the cat ate fig and plum then lime", "the dog ate fog and then kiwi lime today"
    overall = align_counts(ref, hyp)  # jiwer substitutes "plum then" by "then kiwi" (cost 2, as D + I would be)
    assert (overall.substitutions, overall.deletions, overall.insertions) == (4, 0, 1)
    assert tail_counts(ref, hyp, TAIL) == TailCounts(words=3, substitutions=2, deletions=0, insertions=0)


def test_a_tail_set_refuses_impossible_values() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        TailSet(frozenset({"a"}), share=0.0)
    with pytest.raises(ValueError, match="negative"):
        TailSet(frozenset({"a"}), total_words=-1)
    with pytest.raises(ValueError, match="must be an integer"):
        TailSet.from_dict({"words": [], "share": 0.05, "total_words": True, "tail_share": 0.0})
    assert TailSet(["b", "a"]).words == {"a", "b"}  # any iterable of words is kept as a frozenset
