"""ROVER through SCTK's real ``rover`` binary: identity, majority vote, empty hypotheses, segmentation, the error
when the binary is missing, determinism."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from asr_core.decoding import rover as rover_module
from asr_core.decoding.rover import (TimedWord, read_ctm, rover, rover_binary, rover_command, segment_cuts,
                                     split_words, write_ctm)


def _present() -> bool:
    try:
        rover_command()
    except FileNotFoundError:
        return False
    return True


needs_rover = pytest.mark.skipif(not _present(), reason="SCTK's rover binary is missing: run `bash scripts/setup.sh` "
                                                        "(installs Debian's sctk)")


def _words(text: str, start: float = 0.0, step: float = 0.5, duration: float = 0.4,
           confidence: float = 1.0) -> list[TimedWord]:
    return [TimedWord(w, round(start + i * step, 3), duration, confidence) for i, w in enumerate(text.split())]


def _same(got: list[TimedWord], want: list[TimedWord]) -> None:
    assert [w.word for w in got] == [w.word for w in want]
    assert [w.start for w in got] == pytest.approx([w.start for w in want], abs=1e-3)
    assert [w.duration for w in got] == pytest.approx([w.duration for w in want], abs=1e-3)


SENTENCE = "the cat sat on the mat and then it slept"


@needs_rover
def test_identical_hypotheses_come_back_unchanged() -> None:
    words = _words(SENTENCE, start=0.25)
    for n in (1, 2, 3):
        _same(rover([words] * n, "rec1"), words)


@needs_rover
def test_majority_word_wins() -> None:
    a = _words("the cat sat on the mat")
    b = _words("the hat sat on the mat")
    for hyps in ([a, b, a], [b, a, a], [a, a, b]):
        _same(rover(hyps, "rec1", method="meth1"), a)


@needs_rover
def test_majority_over_insertions_and_deletions() -> None:
    a = _words("the cat sat on the mat")
    dropped = [w for w in a if w.word != "sat"]
    inserted = a[:3] + [TimedWord("down", 1.45, 0.04)] + a[3:]
    assert [w.word for w in rover([a, dropped, a], "r")] == SENTENCE.split()[:6]
    assert [w.word for w in rover([dropped, dropped, a], "r")] == ["the", "cat", "on", "the", "mat"]
    assert [w.word for w in rover([a, inserted, a], "r")] == SENTENCE.split()[:6]


@needs_rover
def test_voted_times_average_the_voters() -> None:
    a = _words("one two", start=0.0)
    b = _words("one two", start=0.3)
    got = rover([a, a, b], "r")
    assert [w.start for w in got] == pytest.approx([0.1, 0.6], abs=1e-3)
    assert [w.end for w in got] == pytest.approx([0.5, 1.0], abs=1e-3)


@needs_rover
def test_avgconf_weighs_confidences() -> None:
    a = _words("yes", confidence=0.2)
    b = _words("no", confidence=0.9)
    assert [w.word for w in rover([a, a, b], "r", method="meth1")] == ["yes"]
    assert [w.word for w in rover([a, a, b], "r", method="avgconf", alpha=0.0)] == ["no"]


@needs_rover
def test_empty_hypotheses() -> None:
    words = _words(SENTENCE)
    assert rover([[], []], "r") == []
    assert rover([[]], "r") == []
    _same(rover([[], words], "r"), words)  # an empty first file would crash the binary: it goes last
    _same(rover([words, [], words], "r"), words)
    assert rover([[], [], words], "r") == []  # two votes for "no word" against one


@needs_rover
def test_case_is_kept_unless_asked() -> None:
    words = _words("The CAT")
    assert [w.word for w in rover([words, words], "r")] == ["The", "CAT"]
    assert [w.word for w in rover([words, words], "r", case_sensitive=False)] == ["the", "cat"]


@needs_rover
def test_segments_vote_like_one_run(tmp_path: Path) -> None:
    long_text = " ".join([SENTENCE] * 12)  # 120 words over 60 s
    a = _words(long_text)
    b = [TimedWord("dog" if i % 7 == 3 else w.word, w.start, w.duration) for i, w in enumerate(a)]
    c = [w for i, w in enumerate(a) if i % 11 != 5]
    whole = rover([a, b, c], "r", segment_seconds=None)
    segmented = rover([a, b, c], "r", segment_seconds=10.0, workdir=tmp_path)
    _same(segmented, whole)
    _same(segmented, a)
    assert len(list(tmp_path.glob("seg*_rover.ctm"))) > 1


def test_segment_cuts_prefer_pauses_then_fewest_straddlers() -> None:
    # words every 0.5 s, 0.4 s long: every word end is a pause in a lone hypothesis
    a = _words(" ".join(["w"] * 40))
    cuts = segment_cuts([a], 5.0)
    assert cuts == [5.0, 10.0, 15.0]  # the first word start, or end, at least 5 s on that no word straddles
    assert not any(w.start < c < w.end for c in cuts for w in a)
    # a second hypothesis shifted by 0.2 s with contiguous words: no pause shared, cut where fewest words straddle
    b = _words(" ".join(["w"] * 40), start=0.2, duration=0.5)
    cuts = segment_cuts([a, b], 5.0)
    assert cuts == sorted(cuts) and all(5.0 <= y - x <= 10.0 for x, y in zip([0.0] + cuts, cuts))
    segments = [split_words(h, cuts) for h in (a, b)]
    assert [sum(len(s) for s in segs) for segs in segments] == [40, 40]
    assert segment_cuts([[], []], 5.0) == []
    with pytest.raises(ValueError, match="positive"):
        segment_cuts([a], 0.0)


@needs_rover
def test_deterministic() -> None:
    a = _words("a b c d e f g h")
    b = _words("a x c d y f g h", start=0.05)
    c = _words("a b c z e f h", start=0.1)
    first = rover([a, b, c], "r", method="avgconf", alpha=0.5)
    assert all(rover([a, b, c], "r", method="avgconf", alpha=0.5) == first for _ in range(3))


def test_ctm_round_trip(tmp_path: Path) -> None:
    words = _words("one two three", confidence=0.75)
    path = write_ctm(tmp_path / "h.ctm", "rec-7", words)
    assert path.read_text().splitlines()[0] == "rec-7 1 0.000000 0.400000 one 0.750000"
    assert read_ctm(path) == words


def test_bad_input_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="whitespace"):
        write_ctm(tmp_path / "h.ctm", "rec 1", [])
    with pytest.raises(ValueError, match="null word"):
        write_ctm(tmp_path / "h.ctm", "r", [TimedWord("@", 0.0, 0.1)])
    with pytest.raises(ValueError, match="whitespace"):
        rover([[TimedWord("two words", 0.0, 0.1)]], "r")
    with pytest.raises(ValueError, match="neither negative"):
        rover([[TimedWord("w", -1.0, 0.1)]], "r")
    with pytest.raises(ValueError, match="give one of"):
        rover([[]], "r", method="majority")
    with pytest.raises(ValueError, match="no hypotheses"):
        rover([], "r")


def test_missing_binary_says_to_install_sctk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(rover_module, "SCTK_ROVER", tmp_path / "absent" / "rover")
    monkeypatch.setattr(rover_module.shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError, match="scripts/setup.sh"):
        rover_binary()
    with pytest.raises(FileNotFoundError, match="sctk"):
        rover([_words("a b")], "r")


def test_lookup_falls_back_to_path_then_sctk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(rover_module, "SCTK_ROVER", tmp_path / "absent" / "rover")
    monkeypatch.setattr(rover_module.shutil, "which", lambda name: f"/opt/bin/{name}")
    assert rover_command() == ["/opt/bin/rover"]
    monkeypatch.setattr(rover_module.shutil, "which", lambda name: "/opt/bin/sctk" if name == "sctk" else None)
    assert shlex.split(rover_binary()) == ["/opt/bin/sctk", "rover"]
