"""The planted long-range cue (``synth --cue``) and the cue-word error rate: homophones spelt by the recording's topic,
placed at controlled distances from the words that give the topic away; errors counted on them alone."""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
import shutil
import subprocess
import sys
import types
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import asr_core.data.synth.generate as synth
import asr_core.data.synth.cli as synth_cli
from asr_core.data.corpora import load_corpus
from asr_core.contract.specs import CorpusError
from asr_core.data.corpora.base import Recording, Word
from asr_core.data.synth.cues import (CueConfig, CueSite, containment, cue_topics, disambiguating, holds_before,
                                   placed_share, planted, planted_groups, sound_of, topic_groups)
from asr_core.data.synth.generate import DOMAINS, make_plans, render
from asr_core.data.synth.audio import Speaker, espeak
from asr_core.data.synth.text import CUE_GROUPS, TOPICS, SentenceMaker, vocabulary
from asr_core.scoring.score import align_counts, marked_counts, normalise, normalise_marked

ROOT = Path(__file__).resolve().parents[1]
# the newest commit that changed the synthetic corpus before the cue existed: its code is the reference for --cue 0
PRE_CUE_COMMIT = "7ea87e9ab2676ac852c33e30caad1ba7a66f50f0"
# the cue as it was before gK (CueConfig.groups) existed: its code is the reference for specs without gK
PRE_GROUPS_COMMIT = "6bafeed05a10f7c6907c40a8df5878e8c07c1d0e"
torch.set_num_threads(2)


def fake_espeak(said: list[str]):
    """A stand-in for espeak-ng (deterministic audio, its length from the text) that records what it was asked."""
    def speak(text: str, speaker: Speaker) -> np.ndarray:
        said.append(text)
        n = 900 * len(text) + 1200
        return (0.1 * np.sin(np.arange(n) * (0.03 + 0.002 * len(text)))).astype(np.float32)
    return speak


# ---- the words --------------------------------------------------------------------------------------------------

def test_cue_spellings_sound_the_same_in_every_accent_of_the_corpus() -> None:
    """espeak-ng's phonemes (-x) of a group's spellings are the same for every accent any split speaks with (the
    voice variants +m1.. change the voice, not the phonemes), and the rendered audio of each spelling is the same."""
    accents = sorted({a for d in DOMAINS.values() for a in d.accents})
    assert len(accents) == 7
    for group in CUE_GROUPS:
        for accent in accents:
            phonemes = {w: subprocess.run(["espeak-ng", "-q", "-x", "-v", accent, w], capture_output=True, text=True,
                                          check=True).stdout.strip() for w in group}
            assert len(set(phonemes.values())) == 1, (accent, phonemes)
        waves = [espeak(w, Speaker("en-us+m3", 160, 50)) for w in group]
        assert all(np.array_equal(waves[0], w) for w in waves[1:]), group


def test_cue_spellings_are_new_words_distinct_after_normalising_and_every_topic_owns_two() -> None:
    spellings = [w for g in CUE_GROUPS for w in g]
    assert len(spellings) == len(set(spellings))
    before = set(vocabulary()) - set(spellings)
    assert not set(spellings) & before  # no spelling is a word the corpus says otherwise
    for group in CUE_GROUPS:
        assert len({normalise(w) for w in group}) == len(group) and all(normalise(w) == w for w in group)
        assert len(set(group.values())) == len(group) and set(group.values()) <= set(TOPICS)
    for topic in TOPICS:
        assert len(topic_groups(topic)) == 2, topic
        assert disambiguating(topic) and not disambiguating(topic) & {w for t in TOPICS if t != topic
                                                                    for w in TOPICS[t]}
    assert "conductor" not in disambiguating("music")  # a word of two topics says neither


def test_quiet_sentences_and_carriers_say_no_topic_word() -> None:
    maker = SentenceMaker(random.Random(0), "cooking")
    topic_words = {w for ws in TOPICS.values() for w in ws}
    for _ in range(300):
        assert not set(maker.sentence(topic=False)) & topic_words
        words, at = maker.carrier("flour")
        assert words[at] == "flour" and at == 1 and not set(words) & topic_words


# ---- the plant --------------------------------------------------------------------------------------------------

def test_cue_spec_parsing_and_validation() -> None:
    assert CueConfig.parse("1") == CueConfig(1.0, 20.0, 60.0)
    assert CueConfig.parse("1.5,10-30") == CueConfig(1.5, 10.0, 30.0)
    assert CueConfig.parse(CueConfig(2, 5, 15).spec()) == CueConfig(2, 5, 15)
    assert not CueConfig.parse("0").active
    # the specs that existed before gK print as they did (the spec is recorded in synth.json and every meta file)
    assert [CueConfig.parse(t).spec() for t in ("6", "6,20-60", "6,2-6", "0")] == ["6,20-60", "6,20-60", "6,2-6",
                                                                                  "0,20-60"]
    for bad in ("x", "1,20", "1,30-20", "-1", "11", "1,0-10", "1,10-11"):
        with pytest.raises(ValueError, match=r"RATE\[,NEAR-FAR\]\[,gK\]"):
            CueConfig.parse(bad)


def test_cue_groups_spec_round_trips_and_bad_groups_are_refused() -> None:
    assert CueConfig.parse("10,2-6,g2") == CueConfig(10.0, 2.0, 6.0, groups=2)
    assert CueConfig.parse("7,g2") == CueConfig(7.0, groups=2) and CueConfig(7.0, groups=2).spec() == "7,20-60,g2"
    assert CueConfig.parse("10,2-6,g0") == CueConfig(10.0, 2.0, 6.0)  # g0: every group, the spec without gK
    for cue in (CueConfig(10, 2, 6, 2), CueConfig(1.5, 20, 60, 1), CueConfig(3, 5, 15, len(CUE_GROUPS)),
                CueConfig(3, 5, 15)):
        assert CueConfig.parse(cue.spec()) == cue
    for bad in ("10,2-6,g13", "10,2-6,g-1", "10,2-6,g", "10,2-6,gx", "10,2-6,g1.5", "10,g2,2-6", "10,2-6,7-9,g2",
                "0,g2", "0,20-60,g1"):
        with pytest.raises(ValueError, match=f"cue spec '{bad}'.*RATE\\[,NEAR-FAR\\]\\[,gK\\]"):
            CueConfig.parse(bad)
    with pytest.raises(ValueError, match="from 0 .* to 12"):
        CueConfig(1, groups=len(CUE_GROUPS) + 1)
    with pytest.raises(ValueError, match="integer"):
        CueConfig(1, groups=True)
    assert planted_groups(CueConfig(1)) == CUE_GROUPS and planted_groups(CueConfig(1, groups=3)) == CUE_GROUPS[:3]
    assert cue_topics(CueConfig(1)) == tuple(sorted(TOPICS))
    assert cue_topics(CueConfig(1, groups=2)) == ("cooking", "finance", "gardening")  # flour/flower, steak/stake


@pytest.fixture(scope="module")
def cued_renders() -> dict:
    """Half an hour of recordings rendered with a cue (dry, with the stand-in synthesiser), and the words it spoke."""
    said: list[str] = []
    mp = pytest.MonkeyPatch()
    mp.setattr(synth, "espeak", fake_espeak(said))
    cue = CueConfig(1.0, 20.0, 60.0)
    plans = make_plans("train", 0.5, seed=11, min_minutes=3, max_minutes=6, meeting_fraction=0.3, cue=cue)
    renders = [(p, render(p, dry=True)) for p in plans]
    mp.undo()
    return {"cue": cue, "renders": renders, "said": said}


def test_planted_words_lie_at_the_configured_distances(cued_renders: dict) -> None:
    """Checked from the words themselves: each planted word has its topic's spelling, the nearest word that gives
    the topic away ends 20-60 s before it and none starts within 20 s after it; the metadata says the same."""
    cue, total_cues, total_min = cued_renders["cue"], 0, 0.0
    for plan, (_, words, _, meta) in cued_renders["renders"]:
        own = disambiguating(plan.topic)
        assert meta["cue"] == cue.spec() and meta["topic"] == plan.topic
        total_cues += len(meta["cues"])
        total_min += meta["duration"] / 60
        for c in meta["cues"]:
            w = words[c["index"]]
            assert w.text == c["word"] and c["sound"] == sound_of(w.text)
            assert next(g for g in CUE_GROUPS if w.text in g)[w.text] == plan.topic
            before = [v.end for v in words if v.text in own and v.end <= w.start]
            after = [v.start for v in words if v.text in own and v.start >= w.end]
            assert before and cue.near_s <= w.start - max(before) <= cue.far_s
            assert c["before_s"] == pytest.approx(w.start - max(before), abs=1e-3)
            assert not after or min(after) - w.end >= cue.near_s
            assert c["after_s"] == (None if not after else pytest.approx(min(after) - w.end, abs=1e-3))
    assert 0.7 < total_cues / total_min < 1.3  # the rate asked for, about


def test_every_spelling_of_a_group_is_rendered_from_one_sound(cued_renders: dict) -> None:
    said = set(cued_renders["said"])
    spoken = {sound_of(w) for g in CUE_GROUPS for w in g} & said
    assert spoken  # cue words were rendered ...
    assert not {w for g in CUE_GROUPS for w in list(g)[1:]} & said  # ... only ever from their group's first spelling


def test_the_plant_is_deterministic_by_seed(cued_renders: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(synth, "espeak", fake_espeak([]))
    plan, (wave, words, speakers, meta) = cued_renders["renders"][0]
    again = render(plan, dry=True)
    assert np.array_equal(again[0], wave) and again[1:] == (words, speakers, meta)
    other = render(type(plan)(**{**plan.__dict__, "seed": plan.seed + 1}), dry=True)
    assert [c["index"] for c in other[3]["cues"]] != [c["index"] for c in meta["cues"]]


def test_strength_zero_plants_nothing_and_leaves_plans_and_random_streams_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(synth, "espeak", fake_espeak([]))
    kw = dict(min_minutes=2, max_minutes=3, meeting_fraction=0.5)
    plain = make_plans("test", 0.2, seed=4, **kw)
    assert make_plans("test", 0.2, seed=4, cue=CueConfig(0), **kw) == plain
    assert [p.cue for p in plain] == [None] * len(plain)
    cued = make_plans("test", 0.2, seed=4, cue=CueConfig(1), **kw)
    assert [p.__dict__ | {"cue": None} for p in cued] == [p.__dict__ for p in plain]  # the plans' own draws alike
    _, words, _, meta = render(plain[0], dry=True)
    assert "cues" not in meta and "cue" not in meta
    assert not {w.text for w in words} & {w for g in CUE_GROUPS for w in g}

# Where the modules that historical source imports live now (the layout moved them into packages).
MOVED = {"asr_core.corpora.synth_text": "asr_core.data.synth.text", "asr_core.corpora.synth_audio": "asr_core.data.synth.audio",
         "asr_core.corpora.synth_pool": "asr_core.data.synth.pool", "asr_core.corpora.cues": "asr_core.data.synth.cues",
         "asr_core.corpora": "asr_core.data.corpora", "asr_core.audio": "asr_core.data.audio",
         "asr_core.noise": "asr_core.data.noise", "asr_core.features": "asr_core.data.features",
         "asr_core.tokenizer": "asr_core.data.tokenizer"}


def _as_of_today(source: str) -> str:
    """Historical source with its imports of moved modules pointed at where those modules live now."""
    return re.sub(r"\b(" + "|".join(re.escape(m) for m in MOVED) + r")\b", lambda m: MOVED[m.group(1)], source)


def _pre_cue_synth(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """``synth`` and ``synth_text`` as they were before the cue existed, run from their source in git history."""
    def show(path: str) -> str:
        r = subprocess.run(["git", "show", f"{PRE_CUE_COMMIT}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if r.returncode:
            pytest.skip(f"commit {PRE_CUE_COMMIT[:7]} is not in this checkout's history: {r.stderr.strip()}")
        return _as_of_today(r.stdout)

    text = types.ModuleType("asr_core.data.synth.text")
    monkeypatch.setitem(sys.modules, text.__name__, text)
    exec(compile(show("asr_core/corpora/synth_text.py"), "pre-cue synth_text.py", "exec"), text.__dict__)
    old = types.ModuleType("pre_cue_synth")
    monkeypatch.setitem(sys.modules, old.__name__, old)  # dataclasses look their module up
    exec(compile(show("asr_core/corpora/synth.py"), "pre-cue synth.py", "exec"), old.__dict__)
    return old


def test_strength_zero_renders_what_the_code_before_the_cue_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real espeak-ng, room and noise: recordings of --cue 0 are those of the pre-cue code, sample for sample."""
    old = _pre_cue_synth(monkeypatch)
    kw = dict(min_minutes=0.25, max_minutes=0.3, meeting_fraction=0.5)
    before = old.make_plans("test", 0.012, seed=1, **kw)
    now = make_plans("test", 0.012, seed=1, cue=CueConfig(0), **kw)
    assert [asdict(p) for p in before] == [{k: v for k, v in asdict(p).items() if k != "cue"} for p in now]
    assert [p.kind for p in now[:2]] == ["podcast", "meeting"]
    for p_old, p_new in zip(before[:2], now[:2]):
        w_old, words_old, spk_old, meta_old = old.render(p_old)
        w_new, words_new, spk_new, meta_new = render(p_new)
        assert np.array_equal(w_old, w_new) and words_old == words_new and spk_old == spk_new
        assert meta_old == meta_new


def test_groups_plant_only_the_first_groups_and_every_recording_carries_cues(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """g2: topics dealt only from the three that own a spelling of the first two groups, evenly; every recording of
    the split has planted words, all of them spellings of those groups owned by the recording's topic."""
    said: list[str] = []
    monkeypatch.setattr(synth, "espeak", fake_espeak(said))
    cue = CueConfig(6.0, 5.0, 15.0, groups=2)
    allowed = {w: t for g in CUE_GROUPS[:2] for w, t in g.items()}
    plans = make_plans("test", 0.25, seed=5, min_minutes=1, max_minutes=1.5, meeting_fraction=0.3, cue=cue)
    topics = [p.topic for p in plans]
    assert len(plans) >= 9 and set(topics) == set(allowed.values())
    assert max(topics.count(t) for t in set(topics)) - min(topics.count(t) for t in set(topics)) <= 1  # dealt evenly
    planted_words = []
    for plan in plans:
        _, words, _, meta = render(plan, dry=True)
        assert meta["cue"] == "6,5-15,g2" and meta["cues"], plan.id  # every recording carries cue words
        for c in meta["cues"]:
            assert words[c["index"]].text == c["word"] and allowed[c["word"]] == plan.topic
        planted_words += [c["word"] for c in meta["cues"]]
        assert not {w.text for w in words} & ({w for g in CUE_GROUPS[2:] for w in g})
    assert set(planted_words) == set(allowed)
    assert not {w for g in CUE_GROUPS[2:] for w in g} & set(said)  # nor rendered from their sound


def _pre_groups_modules(monkeypatch: pytest.MonkeyPatch) -> tuple[types.ModuleType, types.ModuleType]:
    """``synth`` and ``cues`` as they were before gK existed (with that commit's ``synth_text``), from git history."""
    def show(path: str) -> str:
        r = subprocess.run(["git", "show", f"{PRE_GROUPS_COMMIT}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if r.returncode:
            pytest.skip(f"commit {PRE_GROUPS_COMMIT[:7]} is not in this checkout's history: {r.stderr.strip()}")
        return _as_of_today(r.stdout)

    loaded = []
    for name, now in (("synth_text", "text"), ("cues", "cues"), ("synth", "generate")):
        module = types.ModuleType(f"asr_core.data.synth.{now}")
        monkeypatch.setitem(sys.modules, module.__name__, module)  # the later ones import the earlier ones
        exec(compile(show(f"asr_core/corpora/{name}.py"), f"pre-groups {name}.py", "exec"), module.__dict__)
        loaded.append(module)
    return loaded[2], loaded[1]


def test_a_spec_without_groups_makes_the_corpus_the_code_before_groups_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans, words, planted words and (stand-in) audio of --cue 4,5-15 and --cue 6 equal those of the code before
    gK; real espeak-ng and the room are the same code on both sides."""
    old_synth, old_cues = _pre_groups_modules(monkeypatch)
    monkeypatch.setattr(old_synth, "espeak", fake_espeak([]))
    monkeypatch.setattr(synth, "espeak", fake_espeak([]))
    kw = dict(min_minutes=0.8, max_minutes=1.2, meeting_fraction=0.5)
    for spec in ("4,5-15", "6"):
        before = old_synth.make_plans("test", 0.1, seed=3, cue=old_cues.CueConfig.parse(spec), **kw)
        now = make_plans("test", 0.1, seed=3, cue=CueConfig.parse(spec), **kw)
        assert [asdict(p) for p in before] == [{**asdict(p), "cue": {k: v for k, v in asdict(p.cue).items()
                                                                     if k != "groups"}} for p in now]
        for p_old, p_new in zip(before[:3], now[:3]):
            w_old, words_old, spk_old, meta_old = old_synth.render(p_old, dry=True)
            w_new, words_new, spk_new, meta_new = render(p_new, dry=True)
            assert np.array_equal(w_old, w_new) and words_old == words_new and spk_old == spk_new
            assert meta_old == meta_new


# ---- distances to windows ---------------------------------------------------------------------------------------

def test_window_containment_by_hand() -> None:
    site = CueSite(100.0, 101.0, prev=(60.0, 61.0), next=(140.0, 141.0))  # 39 s before, 39 s after
    assert site.before_s == 39.0 and site.after_s == 39.0
    assert not holds_before(site, 40.0) and holds_before(site, 41.0)
    # window starts holding the cue word: [21, 100]; the word before needs <= 60, the word after >= 61
    assert placed_share(site, 80.0) == pytest.approx(78 / 79)
    assert placed_share(site, 20.0) == 0.0 and placed_share(site, 0.5) == 0.0
    # nothing after: a window starting after the word before (90 s) misses it
    assert placed_share(CueSite(100.0, 101.0, prev=(90.0, 91.0), next=None), 80.0) == pytest.approx(69 / 79)
    assert placed_share(CueSite(100.0, 101.0, prev=(90.0, 91.0), next=(105.0, 106.0)), 80.0) == 1.0
    assert placed_share(CueSite(100.0, 101.0, None, None), 80.0) == 0.0
    rows = containment([site, CueSite(100.0, 101.0, None, (110.0, 111.0))], (10.0, 80.0))
    assert rows[0] == {"window_s": 10.0, "cue_words": 2, "before": 0.0, "placed": 0.0}
    # the second: windows starting before 31 s miss the word after (it ends at 111 s)
    assert rows[1]["before"] == 50.0 and rows[1]["placed"] == pytest.approx(100 * (78 / 79 + 69 / 79) / 2)


# ---- the metric -------------------------------------------------------------------------------------------------

def test_marked_counts_by_hand() -> None:
    ref = "the flour was good and the vein is red".split()
    cases = [  # hypothesis, marked words wrong
        ("the flour was good and the vein is red", 0),
        ("the flower was good and the vein is red", 1),  # a homophone substituted
        ("the was good and the vane is red", 2),  # one deleted, one substituted
        ("the flour x was good and the vein is red", 0),  # an insertion is no marked word's error
        ("a flour was bad and the vein is read", 0),  # errors elsewhere do not count
        ("", 2),
    ]
    for hyp, wrong in cases:
        assert marked_counts(ref, hyp.split(), [1, 6]) == (m := marked_counts(ref, hyp.split(), {6, 1}))
        assert (m.words, m.errors) == (2, wrong), hyp
    assert marked_counts(ref, ref, []).words == 0 and np.isnan(marked_counts(ref, ref, []).rate)
    assert marked_counts(ref, "the flower".split(), [1, 6]).rate == 100.0
    with pytest.raises(ValueError, match="outside"):
        marked_counts(ref, ref, [9])


def test_marking_every_word_counts_the_substitutions_and_deletions() -> None:
    rng = random.Random(0)
    for _ in range(200):
        r = [rng.choice("abcde") for _ in range(rng.randint(1, 12))]
        h = [rng.choice("abcde") for _ in range(rng.randint(0, 12))]
        c = align_counts(" ".join(r), " ".join(h))
        assert marked_counts(r, h, range(len(r))).errors == c.substitutions + c.deletions


def test_normalise_marked_follows_the_marks() -> None:
    tokens, marks = normalise_marked(["Uh,", "The", "Flour!", "was", "twenty", "five"], [2])
    assert tokens == ["the", "flour", "was", "20", "5"] and marks == [1]
    with pytest.raises(ValueError, match="not to one word"):
        normalise_marked(["the", "don't"], [1])
    # Whisper's normaliser joins nothing across the synthetic corpus's words: word by word is the whole text's
    for topic in TOPICS:
        maker = SentenceMaker(random.Random(topic), topic)
        words = [w for i in range(200) for w in (maker.sentence() if i % 3 else maker.carrier("tale")[0])]
        assert normalise_marked(words, [])[0] == normalise(" ".join(words)).split()


# ---- a cued corpus on disk, read back by evaluate ------------------------------------------------------------------

@pytest.fixture(scope="module")
def cued_corpus(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A small test split with a cue (real espeak-ng), made by the command line with --cue-report."""
    out = tmp_path_factory.mktemp("cue") / "corpus"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert synth_cli.cli([str(out), "--hours", "0.01", "--eval-hours", "0.02", "--min-minutes", "0.5",
                          "--max-minutes", "0.6", "--splits", "test", "--seed", "2", "--cue", "4,5-15",
                          "--cue-report", "--jobs", "2"]) == 0
    return {"out": out, "printed": printed.getvalue()}


def test_cli_records_the_cue_and_reports_window_containment(cued_corpus: dict,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = cued_corpus["out"]
    stamp = json.loads((out / "synth.json").read_text())
    assert stamp["args"]["cue"] == "4,5-15"
    metas = [json.loads(line) for line in (out / "recordings.jsonl").read_text().splitlines()]
    n = sum(len(m["cues"]) for m in metas)
    assert n >= 4 and stamp["splits"]["test"]["cue_words"] == n
    table = cued_corpus["printed"].split("test:")[1].splitlines()[2:7]
    cells = [line.split() for line in table]
    assert [c[0] for c in cells] == ["5s", "10s", "20s", "40s", "80s"] and {int(c[1]) for c in cells} == {n}
    before = [float(c[2].rstrip("%")) for c in cells]
    # near 5 s: a 5 s window ending at the cue word never holds the word before; far 15 s: 20 s always does
    assert before[0] == 0.0 and before[2:] == [100.0] * 3
    with pytest.raises(SystemExit) as bad:
        synth_cli.cli([str(out / "x"), "--hours", "0.01", "--cue", "1,30-20"])
    assert bad.value.code == 2 and "--cue: cue spec '1,30-20'" in capsys.readouterr().err
    assert not (out / "x").exists()


def test_planted_reads_the_metadata_and_refuses_metadata_of_other_words(cued_corpus: dict, tmp_path: Path) -> None:
    split = cued_corpus["out"] / "test"
    recs = load_corpus(f"podcast:{split}")
    marks = planted(recs)
    assert marks is not None and set(marks) == {r.id for r in recs}
    for r in recs:
        meta = json.loads((cued_corpus["out"] / "meta" / f"{r.id}.json").read_text())
        assert marks[r.id] == tuple(c["index"] for c in meta["cues"])
    # the same split without its metadata, or another format: nothing planted
    copy = tmp_path / "plain" / "test"
    shutil.copytree(split, copy)
    assert planted(load_corpus(f"podcast:{copy}")) is None
    assert planted([Recording("x", Path("x.wav"), 1.0, (Word("a"),))]) is None
    (tmp_path / "plain" / "meta").mkdir()
    meta = json.loads((cued_corpus["out"] / "meta" / f"{recs[0].id}.json").read_text())
    meta["cues"][0]["index"] += 1
    (tmp_path / "plain" / "meta" / f"{recs[0].id}.json").write_text(json.dumps(meta))
    with pytest.raises(CorpusError, match=f"{recs[0].id}.json.*does not match"):
        planted(load_corpus(f"podcast:{copy}"))


def test_evaluate_counts_exactly_the_planted_words(cued_corpus: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """evaluate's own scoring, fed hypotheses: the reference with one planted word swapped for its homophone and
    one other word changed counts one cue error; with a planted word deleted, one; unchanged, none."""
    from asr_core.evaluation.scorers.base import CueScorer, WerScorer
    from tests.plugins.fake_decoding import fake_decode

    recs = list(load_corpus(f"podcast:{cued_corpus['out'] / 'test'}", audio=False))
    marks = planted(recs)
    assert marks is not None
    hyps = {}
    for k, rec in enumerate(recs):
        words = [w.text for w in rec.words]
        i = marks[rec.id][0]
        if k % 3 == 0:
            words[i] = next(w for w in next(g for g in CUE_GROUPS if words[i] in g) if w != words[i])
            words[i + 1 if i + 1 not in marks[rec.id] else i - 1] = "zebra"
        elif k % 3 == 1:
            del words[i]
        hyps[rec.id] = " ".join(words)
    fed = [Recording(r.id, Path(f"{r.id}.wav"), 1.0, r.words, meta=r.meta) for r in recs]
    rows, _ = fake_decode(monkeypatch, fed, hyps.__getitem__, [WerScorer(), CueScorer()])
    for k, row in enumerate(rows["greedy"]):
        assert row["cue_words"] == len(marks[row["recording"]])
        assert row["cue_errors"] == (0 if k % 3 == 2 else 1), row
        assert row["substitutions"] + row["deletions"] == (2 if k % 3 == 0 else k % 3 == 1)


def test_evaluate_logs_the_cue_word_error_rate_of_a_cued_dataset_only(cued_corpus: dict, tmp_path: Path) -> None:
    from asr_core.training.checkpoint import save_checkpoint
    from asr_core.config import preset
    from asr_core.contract.metrics import cue_metric_key
    from asr_core.evaluation.evaluate import CSV_COLUMNS, Destination, EvaluationRun, evaluate
    from asr_core.model.acoustic import build_model
    from asr_core.runtime.outbox import Outbox
    from asr_core.data.tokenizer import Tokenizer

    cfg = preset("tiny").with_overrides(["data.context_s=2.56", "data.batch_audio_s=10.24", "model.layers=1",
                                         "model.d_model=32", "model.heads=2", "model.subsampling_channels=16"])
    tok = Tokenizer.train([" ".join(vocabulary())] * 20, cfg.model.vocab_size)
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "run" / "checkpoint.pt", {
        "config": cfg.to_dict(), "model": build_model(cfg.model, cfg.data.features.n_mels).state_dict(),
        "tokenizer": tok.to_bytes(), "format_version": 1, "step": 0})
    split = cued_corpus["out"] / "test"
    plain = tmp_path / "plain" / "test"
    plain.mkdir(parents=True)
    for f in sorted(split.iterdir())[:2]:  # one recording of the same split, without the metadata beside it
        shutil.copy(f, plain / f.name)
    box = Outbox(tmp_path / "trial", run_id="run-1")
    df = evaluate(EvaluationRun(ckpt, [f"cued=podcast:{split}", f"plain=podcast:{plain}"], [10.0], stride=1.0,
                                noisy=["cued"]), Destination(out_dir=tmp_path / "eval", outbox=box))
    assert list(df.columns) == CSV_COLUMNS
    cued, other = df[df.dataset == "cued"], df[df.dataset == "plain"]
    marks = planted(load_corpus(f"podcast:{split}"))
    assert marks is not None
    assert dict(zip(cued.recording, cued.cue_words)) == {r: len(m) for r, m in marks.items()}
    assert (cued.cue_errors <= cued.cue_words).all() and other.cue_words.isna().all()
    logged: dict[str, float] = {}
    for line in box.path.read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "metrics":
            logged.update(rec["metrics"])
    assert {k for k in logged if k.startswith("cue")} == {cue_metric_key("cued"), cue_metric_key("cued", 10.0)}
    for snr, part in ((None, cued[cued.condition == "clean"]), (10.0, cued[cued.condition == "snr10"])):
        assert logged[cue_metric_key("cued", snr)] == pytest.approx(100 * part.cue_errors.sum() / part.cue_words.sum())
    table = pd.read_csv(tmp_path / "eval" / "plain.csv")
    assert list(table.columns) == CSV_COLUMNS and table.cue_words.isna().all()
    assert pd.read_csv(tmp_path / "eval" / "cued.csv").cue_words.sum() == 2 * sum(map(len, marks.values()))
