"""The synthetic corpus: deterministic, loadable by the podcast reader, word times that hold the words."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asr_core.data.audio import load_audio
from asr_core.data.corpora import load_corpus
from asr_core.data.synth.generate import SPLITS, Plan, make_plans, render, synthesise
from asr_core.data.synth.audio import Room, Speaker, espeak
from asr_core.data.synth.text import TOPICS, vocabulary

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "corpus"
    synthesise(out, 0.02, seed=3, eval_hours=0.01, min_minutes=0.4, max_minutes=0.6, meeting_fraction=0.5, jobs=2)
    return out


def test_every_split_round_trips_through_the_podcast_reader(corpus: Path) -> None:
    meta = {json.loads(line)["id"]: json.loads(line) for line in (corpus / "recordings.jsonl").read_text().splitlines()}
    for split in SPLITS:
        recs = load_corpus(f"podcast:{corpus / split}", strict=True)
        assert recs, split
        for r in recs:
            m = meta[r.id]
            assert m["split"] == split
            assert r.timed and len(r.words) == m["words"]
            assert abs(r.duration - m["duration"]) < 1e-3
            assert r.words[-1].end <= r.duration
            assert all(a.end <= b.start for a, b in zip(r.words, r.words[1:]))  # ordered, no overlap
            assert set(w.text for w in r.words) <= set(vocabulary())
            wave = load_audio(r.audio)
            assert wave.shape[0] == pytest.approx(r.duration * 16000, abs=1)


def test_same_seed_same_corpus_and_jobs_do_not_matter(corpus: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    synthesise(again, 0.02, seed=3, eval_hours=0.01, min_minutes=0.4, max_minutes=0.6, meeting_fraction=0.5,
               jobs=1, splits=("train",))
    for f in sorted((corpus / "train").iterdir()):
        assert (again / "train" / f.name).read_bytes() == f.read_bytes(), f.name


def test_other_seed_differs() -> None:
    a = make_plans("train", 0.2, seed=1)
    b = make_plans("train", 0.2, seed=2)
    assert [p.speakers for p in a] != [p.speakers for p in b]


def test_shifted_split_uses_voices_and_ranges_never_seen_in_training() -> None:
    train = make_plans("train", 2.0, seed=0)
    shifted = make_plans("test-shifted", 0.5, seed=0)
    train_voices = {s.voice for p in train for s in p.speakers}
    for p in shifted:
        for s in p.speakers:
            assert s.voice not in train_voices
            assert not 145 <= s.rate <= 185 and not 35 <= s.pitch <= 65
        assert p.room.lowpass_hz <= 4000 < min(q.room.lowpass_hz for q in train)


def test_voices_option_narrows_the_in_domain_splits_only() -> None:
    """--voices N: train and test draw from the same N voices; test-shifted is what it was without the option."""
    train = make_plans("train", 2.0, seed=0, voices=3)
    test = make_plans("test", 0.5, seed=0, voices=3)
    used = {s.voice for p in train + test for s in p.speakers}
    assert used == {"en-us+m1", "en+m2", "en-gb-x-rp+m3"}
    assert any(p.kind == "meeting" for p in train)
    assert make_plans("test-shifted", 0.5, seed=0, voices=3) == make_plans("test-shifted", 0.5, seed=0)
    assert len({s.voice for p in make_plans("train", 2.0, seed=0) for s in p.speakers}) > 3
    solo = make_plans("train", 0.5, seed=0, voices=1)
    assert {p.kind for p in solo} == {"podcast"} and {s.voice for p in solo for s in p.speakers} == {"en-us+m1"}

def test_near_shift_keeps_the_training_voices_and_moves_rate_pitch_and_room() -> None:
    """--shift near: test-shifted speaks with the (limited) training voices, outside the training ranges."""
    train = make_plans("train", 2.0, seed=0, voices=3)
    near = make_plans("test-shifted", 0.5, seed=0, voices=3, shift="near")
    assert {s.voice for p in near for s in p.speakers} <= {s.voice for p in train for s in p.speakers}
    for p in near:
        for s in p.speakers:
            assert not 145 <= s.rate <= 185 and not 35 <= s.pitch <= 65
        assert p.room.lowpass_hz <= 4500 < min(q.room.lowpass_hz for q in train)
    assert make_plans("test", 0.5, seed=0, voices=3, shift="near") == make_plans("test", 0.5, seed=0, voices=3)
    with pytest.raises(ValueError, match="shift must be one of far, near"):
        make_plans("test-shifted", 0.5, seed=0, shift="sideways")


def test_eval_max_minutes_shortens_evaluation_recordings_only(tmp_path: Path) -> None:
    """--eval-max-minutes: more, shorter recordings in the evaluation splits; train keeps its lengths."""
    from asr_core.data.synth.generate import synthesise

    long = make_plans("test", 0.2, seed=0)
    short = make_plans("test", 0.2, seed=0, min_minutes=0.5, max_minutes=1.0)
    assert len(short) > 2 * len(long) and max(p.target_s for p in short) <= 60.0
    out = tmp_path / "c"
    summary = synthesise(out, 0.01, 0, eval_hours=0.01, min_minutes=0.6, max_minutes=0.6, eval_max_minutes=0.15,
                         splits=("train", "test"), jobs=1)
    metas = [json.loads(line) for line in (out / "recordings.jsonl").read_text().splitlines()]
    # a recording ends with the sentence that crosses its target length, so it runs a few seconds over
    assert max(m["duration"] for m in metas if m["split"] == "test") < min(
        m["duration"] for m in metas if m["split"] == "train")
    assert summary["test"]["recordings"] >= 3 and summary["train"]["recordings"] == 1


def test_eval_min_minutes_lengthens_evaluation_recordings_and_leaves_train(tmp_path: Path) -> None:
    """--eval-min-minutes: the evaluation splits' shortest recording; train's files and the stamp's arguments are
    those of a corpus made without it (the option enters the stamp only when given)."""
    common = dict(eval_hours=0.01, min_minutes=0.2, max_minutes=0.25, splits=("train", "test"), jobs=1)
    plain = synthesise(tmp_path / "plain", 0.004, 0, **common)
    longer = synthesise(tmp_path / "long", 0.004, 0, eval_min_minutes=0.3, eval_max_minutes=0.35, **common)
    args = [json.loads((tmp_path / d / "synth.json").read_text())["args"] for d in ("plain", "long")]
    assert "eval_min_minutes" not in args[0] and args[1]["eval_min_minutes"] == 0.3
    for f in sorted((tmp_path / "plain" / "train").iterdir()):
        assert (tmp_path / "long" / "train" / f.name).read_bytes() == f.read_bytes(), f.name
    metas = [json.loads(line) for line in (tmp_path / "long" / "recordings.jsonl").read_text().splitlines()]
    assert min(m["duration"] for m in metas if m["split"] == "test") >= 0.3 * 60
    assert longer["test"]["recordings"] < plain["test"]["recordings"]


@pytest.mark.parametrize("extra, valid", [
    (["--eval-min-minutes", "0"], "at most --eval-max-minutes (5, from --max-minutes)"),
    (["--eval-min-minutes", "4.5", "--eval-max-minutes", "4"], "at most --eval-max-minutes (4)")])
def test_eval_min_minutes_refused_outside_its_range(tmp_path: Path, extra: list[str], valid: str) -> None:
    r = subprocess.run([sys.executable, "-m", "asr_core", "synth", str(tmp_path / "c"), "--hours", "0.01", *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and not (tmp_path / "c").exists()
    last = r.stderr.strip().splitlines()[-1]
    assert "--eval-min-minutes" in last and valid in last and f"got {extra[1]}" in last, last


def test_key_terms_recur_minutes_apart() -> None:
    plan = make_plans("train", 0.1, seed=5, min_minutes=3, max_minutes=3, meeting_fraction=0)[0]
    _, words, _, meta = render(plan, dry=True)
    first = [w for w in words if w.text == meta["key_terms"][0]]
    assert len(first) >= 4
    assert first[-1].start - first[0].start > 90  # the main key term comes back after more than 1.5 minutes
    assert all(t in TOPICS[plan.topic] for t in meta["key_terms"])


def test_meeting_alternates_two_voices() -> None:
    plans = [p for p in make_plans("train", 1.0, seed=0, meeting_fraction=1.0)]
    p = plans[0]
    short = Plan(p.id, p.split, p.kind, p.topic, p.speakers, p.room, 40.0, p.seed)
    _, words, speakers, _ = render(short, dry=True)
    assert set(speakers) == {0, 1} and len(set(s.voice for s in p.speakers)) == 2
    turns = sum(a != b for a, b in zip(speakers, speakers[1:]))
    assert turns >= 2


def test_word_times_cut_windows_that_hold_the_words() -> None:
    """By construction, and checked: in the dry render every gap between words is silent, and the audio between a
    word's start and end matches a fresh synthesis of that word (normalised correlation near 1)."""
    room = Room(100, 7000, 1000, 0, 0.1, 0.0, 30, 1.0, 0.08)
    plan = Plan("t-0", "train", "podcast", "music", (Speaker("en-us+m3", 160, 50),), room, 20.0, 1234)
    wave, words, _, _ = render(plan, dry=True)
    sr = 16000
    for a, b in zip(words, words[1:]):
        # times are written in milliseconds: allow that rounding (17 samples) at both edges
        gap = wave[int(round(a.end * sr)) + 17: int(round(b.start * sr)) - 17]
        assert np.abs(gap).max(initial=0) < 1e-6
    hits = 0
    for w in words:
        seg = wave[int(round(w.start * sr)): int(round(w.end * sr))]
        # the millisecond rounding may shift the cut by up to 8 samples: align by the best small lag
        best = 0.0
        for rate in (152, 168):  # the two renditions (rate -5% / +5%)
            ref = espeak(w.text, Speaker("en-us+m3", rate, 50))
            if abs(len(ref) - len(seg)) > 17:
                continue
            for lag in range(-8, 9):
                s0 = int(round(w.start * sr)) + lag
                cut = wave[s0: s0 + len(ref)]
                if len(cut) == len(ref):
                    best = max(best, float(np.dot(ref, cut) / (np.linalg.norm(ref) * np.linalg.norm(cut) + 1e-12)))
        hits += best > 0.99
    assert hits == len(words)


@pytest.mark.slow
def test_cli_writes_the_documented_layout(tmp_path: Path) -> None:
    out = tmp_path / "c"
    r = subprocess.run([sys.executable, "-m", "asr_core", "synth", str(out), "--hours", "0.005", "--eval-hours",
                        "0.003", "--seed", "7", "--min-minutes", "0.2", "--max-minutes", "0.3", "--jobs", "1",
                        "--splits", "train,test-shifted"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "podcast:" in r.stdout and "synth: [" in r.stderr  # summary table and progress
    stamp = json.loads((out / "synth.json").read_text())
    assert stamp["complete"] and set(stamp["splits"]) == {"train", "test-shifted"}
    assert list((out / "train").glob("*.wav")) and list((out / "test-shifted").glob("*.json"))
    bad = subprocess.run([sys.executable, "-m", "asr_core", "synth", str(out), "--hours", "0.01", "--seed", "7"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "different arguments" in bad.stderr


def test_topics_are_dealt_evenly_so_small_splits_cover_them() -> None:
    plans = make_plans("train", 1.0, seed=4, min_minutes=2, max_minutes=3)
    first = [p.topic for p in plans[: len(TOPICS)]]
    assert sorted(first) == sorted(TOPICS)
