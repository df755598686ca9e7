"""Corpus readers against fixtures in the real formats (tests/fixtures/*), including their awkward lines.

Transcripts are checked-in fixture files; audio (of the right durations and formats: WAV, NIST SPHERE, MP3) is
written next to copies of them, so the fixtures stay small.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asr_core.contract.specs import parse_dataset_spec
from asr_core.data.corpora import CorpusError, load_corpus, read_corpus
from asr_core.data.corpora.tedlium import rejoin_clitics
from asr_core.scoring.score import normalise

FIXTURES = Path(__file__).parent / "fixtures"


def _audio(path: Path, seconds: float, fmt: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.random.default_rng(0).standard_normal(int(seconds * 16000)) * 0.01
    sf.write(str(path), data, 16000, format=fmt, subtype=None if fmt in ("MP3", "OGG") else "PCM_16")


@pytest.fixture
def corpus(tmp_path: Path):
    def make(name: str) -> Path:
        root = tmp_path / name
        shutil.copytree(FIXTURES / name, root)
        return root
    return make


# ---- podcast ---------------------------------------------------------------------------------------------------

def test_podcast_reads_speech_api_json(corpus, capsys) -> None:
    root = corpus("podcast")
    _audio(root / "show_a" / "ep_one.ogg", 5.0, "OGG")
    _audio(root / "show_a" / "ep_two.wav", 1.0)
    _audio(root / "show_a" / "ep_truncated.wav", 1.0)
    _audio(root / "show_a" / "ep_badtime.wav", 1.0)
    report = read_corpus(f"podcast:{root}")
    assert [r.id for r in report.recordings] == ["show_a/ep_one", "show_a/ep_two"]
    one = report.recordings[0]
    # the closing speaker summary repeats every word: not counted twice, its tags kept
    assert [w.text for w in one.words] == ["Hello", "and", "welcome", "to", "the", "show.", "Today:", "Zoë's",
                                            "café,", "in", "Zürich!"]
    assert one.meta["speakers"] == [1] * 6 + [2] * 5
    assert one.words[0].start == 0.0 and one.words[0].end == 0.4  # missing startTime is protobuf's zero
    assert one.words[2].end == 1.0 and one.words[-1].end == pytest.approx(4.3)
    assert one.duration == pytest.approx(5.0) and one.timed
    assert normalise(one.text) == "hello and welcome to the show today zoe is cafe in zurich"  # Whisper's rules
    bad = dict(report.skipped)
    assert set(bad) == {str(root / "show_a" / n) for n in ("ep_truncated.json", "ep_noaudio.json",
                                                           "ep_badtime.json")}
    assert "truncated" in bad[str(root / "show_a" / "ep_truncated.json")]
    assert "one second" in bad[str(root / "show_a" / "ep_badtime.json")]
    err = capsys.readouterr().err
    assert "ep_noaudio.json" in err and "skipped 3 bad files" in err
    with pytest.raises(CorpusError, match="ep_badtime.json"):
        load_corpus(f"podcast:{root}", strict=True)


def test_podcast_spotify_layout_finds_audio_in_the_audio_tree(tmp_path: Path) -> None:
    tr = tmp_path / "spotify-podcasts-2020" / "podcasts-transcripts" / "0" / "A" / "show_x"
    tr.mkdir(parents=True)
    shutil.copy(FIXTURES / "podcast" / "show_a" / "ep_two.json", tr / "ep.json")
    _audio(tmp_path / "spotify-podcasts-2020" / "podcasts-audio" / "0" / "A" / "show_x" / "ep.ogg", 1.0, "OGG")
    recs = load_corpus(f"podcast:{tmp_path / 'spotify-podcasts-2020' / 'podcasts-transcripts'}", strict=True)
    assert [r.id for r in recs] == ["0/A/show_x/ep"] and recs[0].audio.suffix == ".ogg"


# ---- manifest --------------------------------------------------------------------------------------------------

def test_manifest_reads_lines_and_reports_bad_ones_by_line(corpus) -> None:
    root = corpus("manifest")
    _audio(root / "audio" / "m1.wav", 2.0)
    _audio(root / "audio" / "m2.wav", 3.0)
    _audio(root / "audio" / "m3.wav", 2.5)
    report = read_corpus(f"manifest:{root / 'corpus.jsonl'}")
    recs = {r.id: r for r in report.recordings}
    assert sorted(recs) == ["m1", "m2", "m3"]
    assert recs["m1"].timed and recs["m1"].meta == {"speaker": "ann"} and recs["m1"].duration == pytest.approx(2.0)
    assert recs["m2"].duration == 3.0 and [w.text for w in recs["m2"].words] == ["untimed", "words", "here"]
    assert not recs["m2"].timed
    assert recs["m3"].ignore == ((1.0, 1.5),) and recs["m3"].text == "naïve café — ok"
    where = {k.rsplit(":", 1)[1]: v for k, v in report.skipped}
    assert set(where) == {"5", "6", "7", "8"}
    assert "audio" in where["5"] and "missing.wav" in where["6"] and "outside the recording" in where["7"]
    assert "truncated" in where["8"]
    with pytest.raises(CorpusError, match=r"corpus.jsonl:5"):
        load_corpus(f"manifest:{root}", strict=True)  # a folder reads its *.jsonl


def test_manifest_round_trips_through_write(tmp_path: Path) -> None:
    from asr_core.data.corpora import manifest
    from asr_core.data.corpora.base import Recording, Word

    _audio(tmp_path / "a.wav", 1.5)
    rec = Recording("a", tmp_path / "a.wav", 1.5, (Word("x", 0.1, 0.2), Word("y", 0.3, 0.5)), ((1.0, 1.2),),
                    {"lang": "en"})
    manifest.write(tmp_path / "m.jsonl", [rec])
    (back,) = load_corpus(f"manifest:{tmp_path / 'm.jsonl'}", strict=True)
    assert back == rec and back.meta == {"lang": "en"}


# ---- TED-LIUM --------------------------------------------------------------------------------------------------

def test_tedlium_joins_segments_rejoins_clitics_and_keeps_ignored_regions(corpus) -> None:
    root = corpus("tedlium")
    _audio(root / "sph" / "AliceSmith_2010.sph", 15.0, "NIST")
    _audio(root / "sph" / "BobJones_2012.sph", 8.5, "NIST")
    _audio(root / "sph" / "BrokenTalk_2011.sph", 3.0, "NIST")
    _audio(root / "sph" / "Orphan_2014.sph", 1.0, "NIST")
    report = read_corpus(f"tedlium:{root}")
    recs = {r.id: r for r in report.recordings}
    assert sorted(recs) == ["AliceSmith_2010", "BobJones_2012"]
    alice = recs["AliceSmith_2010"]
    # segments in time order (the file lists them out of order), the ignored one contributes no words
    assert alice.text == ("i'm going to talk about what we've learned it's a café in zürich and that's all "
                          "'cause people don't know")
    assert alice.ignore == ((4.0, 4.7), (12.5, 13.5))  # the ignored segments less 0.5 s at each end
    assert alice.meta["segments"][0] == [0.0, 3.5] and alice.duration == pytest.approx(15.0)
    assert recs["BobJones_2012"].text == "so here's the thing we couldn't"
    skipped = {Path(k.split(":")[0]).name: v for k, v in report.skipped}
    assert set(skipped) == {"BrokenTalk_2011.stm", "NoAudio_2013.stm", "Orphan_2014.sph"}
    assert "truncated" in skipped["BrokenTalk_2011.stm"]
    with pytest.raises(CorpusError, match="BrokenTalk_2011.stm:2"):
        load_corpus(f"tedlium:{root}", strict=True)


def test_clitics_rejoin_like_the_authors() -> None:
    assert rejoin_clitics("i 'd say it 's  fine") == "i'd say it's fine"
    assert rejoin_clitics("'cause we 're here") == "'cause we're here"
    assert rejoin_clitics("all 'cause they 'll go") == "all 'cause they'll go"


# ---- Earnings-22 -----------------------------------------------------------------------------------------------

def test_earnings22_strips_tags_and_reads_the_release_layout(corpus) -> None:
    root = corpus("earnings22")
    _audio(root / "media" / "4420696.mp3", 4.0, "MP3")
    _audio(root / "media" / "4420999.mp3", 2.0, "MP3")
    report = read_corpus(f"earnings22:{root}")
    (rec,) = report.recordings
    assert rec.id == "4420696" and rec.audio.name == "4420696.mp3"
    assert rec.text == "Good morning everyone Our revenue was $5.2 billion in Q3 Société Générale agreed"
    timed = [w for w in rec.words if w.start is not None]
    assert [(w.text, w.start, w.end) for w in timed] == [("everyone", 0.5, 0.9)]  # empty times stay unknown
    assert rec.meta["speakers"][:2] == ["1", "1"] and rec.meta["speakers"][-1] == "3"
    skipped = {Path(k).name: v for k, v in report.skipped}
    assert set(skipped) == {"4420999.nlp", "4421000.nlp"}
    assert "fields" in skipped["4420999.nlp"] and "no audio" in skipped["4421000.nlp"]


# ---- Rev16 -----------------------------------------------------------------------------------------------------

def test_rev16_reads_only_the_sixteen_files_and_reports_missing_ones(corpus, capsys) -> None:
    root = corpus("rev16")
    for n in (3, 4, 5):
        _audio(root / "audio" / f"{n}.mp3", 3.0, "MP3")
    report = read_corpus(f"rev16:{root}")
    assert [r.id for r in report.recordings] == ["3", "4"]
    three = report.recordings[0]
    assert three.text == "Welcome back to the show It's twenty-five degrees"
    assert three.timed and three.words[-1].end == 2.9
    assert len(report.skipped) == 14 and all("missing" in why for _, why in report.skipped)
    err = capsys.readouterr().err
    assert "not among the 16 Rev16 files" in err and "5.nlp" in err
    with pytest.raises(CorpusError, match=r"9\.nlp"):
        load_corpus(f"rev16:{root}", strict=True)


# ---- specs -----------------------------------------------------------------------------------------------------

def test_specs_are_validated_with_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="FORMAT:PATH"):
        load_corpus("podcast")
    with pytest.raises(CorpusError, match="unknown format 'wav'.*podcast"):
        load_corpus("wav:/data")
    with pytest.raises(CorpusError, match="does not exist"):
        load_corpus(f"podcast:{tmp_path / 'nope'}")
    with pytest.raises(CorpusError, match="no recordings"):
        load_corpus(f"podcast:{tmp_path}")
    assert parse_dataset_spec("dev=podcast:data/dev") == ("dev", "podcast:data/dev")
    with pytest.raises(CorpusError, match="NAME=FORMAT:PATH"):
        parse_dataset_spec("podcast:data/dev")
    with pytest.raises(CorpusError, match="may not contain"):
        parse_dataset_spec("a/b=podcast:x")


# ---- transcripts without audio -------------------------------------------------------------------------------

def test_transcripts_read_without_audio(corpus) -> None:
    """``audio=False`` (what ``score`` reads): no audio file needed or opened; durations from the transcript."""
    pod = corpus("podcast")  # no audio written at all
    with pytest.raises(CorpusError, match="no recordings"):
        load_corpus(f"podcast:{pod}")
    report = read_corpus(f"podcast:{pod}", audio=False)
    recs = {r.id: r for r in report.recordings}
    assert sorted(recs) == ["show_a/ep_noaudio", "show_a/ep_one", "show_a/ep_two"]  # corrupt files still skipped
    assert {Path(k).name for k, _ in report.skipped} == {"ep_truncated.json", "ep_badtime.json"}
    one = recs["show_a/ep_one"]
    assert one.audio == Path("") and one.duration == pytest.approx(4.3) and one.words[-1].text == "Zürich!"
    _audio(pod / "show_a" / "ep_two.wav", 1.0)
    assert load_corpus(f"podcast:{pod / 'show_a' / 'ep_two.json'}", audio=False)[0].audio == \
        pod / "show_a" / "ep_two.wav"  # the file that would have been used
    ted = corpus("tedlium")
    recs = {r.id: r for r in load_corpus(f"tedlium:{ted}", audio=False)}
    alice = recs["AliceSmith_2010"]
    assert alice.audio == Path("") and alice.ignore == ((4.0, 4.7), (12.5, 13.5))
    assert alice.duration == 14.0  # the last segment's end in the file, ignored or not
    man = corpus("manifest")
    recs = {r.id: r for r in load_corpus(f"manifest:{man / 'corpus.jsonl'}", audio=False)}
    assert recs["m2"].duration == 3.0 and recs["m2"].audio == man / "audio" / "m2.wav"  # the line's duration
    assert recs["m1"].duration == max(w.end for w in recs["m1"].words)
