"""The Earnings-22 and Rev16 readers on the releases as downloaded: each test writes a tiny copy of the real layout of
github.com/revdotcom/speech-datasets (``earnings22/``, ``rev16/``): the same folders, file names, headers, relative
links and Git LFS pointers, with a few words per file and a second of audio."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asr_core.data.corpora import CorpusError, load_corpus, read_corpus
from asr_core.data.corpora.earnings22 import audio_dirs_for, parse_nlp, recording_id
from asr_core.data.corpora.rev16 import FILE_NUMBERS

E22_HEADER = "token|speaker|ts|endTs|punctuation|prepunctuation|case|tags"
ALIGNED_HEADER = E22_HEADER + "|oldTs|oldEndTs|ali_comment"
REV_HEADER = E22_HEADER + "|wer_tags|confidence"
LFS_POINTER = ("version https://git-lfs.github.com/spec/v1\n"
               "oid sha256:dc87791a57e111c886e93432bd12429febfe025147d1b48742df860da666f006\nsize 14225810\n")


def _mp3(path: Path, seconds: float = 1.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.random.default_rng(0).standard_normal(int(seconds * 16000)) * 0.01, 16000, format="MP3")


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


def _nlp(header: str, rows: list[str]) -> str:
    extra = header.count("|") - 7  # columns after 'tags'
    return header + "\n" + "\n".join(r + "|" * extra for r in rows) + "\n"


# the reference of each call (untimed, as released) and its force-aligned, verbalised copy
E22_CALLS = {
    "4420696": (["Greetings|1|||.||UC|[]", "I|1|||||CA|['131:CONTRACTION']", "am|1|||||LC|['131:CONTRACTION']",
                 "<inaudible>|1||||||[]", "KBFG|1|||||CA|['7:ORG']", "in|1|||||LC|[]", "2021|1|||.||CA|['0:YEAR']"],
                ["Greetings|1|10.88|11.6|.||UC|[]", "I|1|12.09|12.26|||CA|[]", "am|1|12.26|12.42|||LC|[]",
                 "k|1|12.5|12.6|||LC|[]", "b|1|12.6|12.7|||LC|[]", "f|1|12.7|12.8|||LC|[]", "g|1|12.8|12.9|||LC|[]",
                 "in|1|13.0|13.1|||LC|[]", "twenty|1|13.1|13.4|||LC|[]", "twenty|1|13.4|13.7|||LC|[]",
                 "one|1|13.7|14.0|.||LC|[]"]),
    "4453225": (["Good|0|||||UC|[]", "morning|0|||||LC|[]", "everyone|0|||.||LC|[]"],
                ["Good|0|1.0|1.2|||UC|[]", "morning|0|1.2|1.5|||LC|[]", "everyone|0|1.5|1.9|.||LC|[]"]),
    "MP3-A": (["Thank|2|||||UC|[]", "you|2|||.||LC|[]"],
              ["Thank|2|0.2|0.4|||UC|[]", "you|2|0.4|0.6|.||LC|[]"]),
}
SUBSET10 = ["4453225"]  # the calls the release repeats under subset10/
NONVERBATIM = {"4453225": ["Morning|0|||,||UC|[]", "everyone|0|||.||LC|[]"]}


def earnings22_release(root: Path, *, media: str = "mp3") -> Path:
    """``root`` as ``earnings22/`` of the speech-datasets repository: media (``mp3``, ``lfs`` pointers or ``none``),
    references, force-aligned copies, normalisations, and subset10 with its relative links."""
    for cid, (ref, aligned) in E22_CALLS.items():
        if media == "mp3":
            _mp3(root / "media" / f"{cid}.mp3", 15.0)  # the force-aligned times reach 14 s
        elif media == "lfs":
            _write(root / "media" / f"{cid}.mp3", LFS_POINTER)
        _write(root / "transcripts" / "nlp_references" / f"{cid}.nlp", _nlp(E22_HEADER, ref))
        _write(root / "transcripts" / "force_aligned_nlp_references" / f"{cid}.aligned.nlp",
               _nlp(ALIGNED_HEADER, aligned))
        _write(root / "transcripts" / "normalizations" / f"{cid}.norm.json", "{}\n")
    for cid in SUBSET10:
        sub = root / "subset10"
        _link(sub / "media" / f"{cid}.mp3", f"../../media/{cid}.mp3")
        _link(sub / "verbatim_transcripts" / "nlp_references" / f"{cid}.nlp",
              f"../../../transcripts/nlp_references/{cid}.nlp")
        _write(sub / "nonverbatim_transcripts" / "nlp_references" / f"{cid}.nlp", _nlp(E22_HEADER, NONVERBATIM[cid]))
        _write(sub / "verbatim_transcripts" / "normalizations" / f"{cid}.norm.json", "{}\n")
        _write(sub / "nonverbatim_transcripts" / "normalizations" / f"{cid}.norm.json", "{}\n")
        _write(sub / "README.md", "# Earnings-22 Subset 10\n")
    _write(root / "metadata.csv", "File ID,Ticker Symbol\n4420696,KB\n")
    _write(root / "README.md", "# Earnings 22\n")
    _write(root / "transcripts" / "README.md", "In this directory, you can find the un-normalized transcripts\n")
    return root


# ---- Earnings-22 -----------------------------------------------------------------------------------------------

def test_earnings22_release_reads_each_reference_once_with_its_media(tmp_path: Path, capsys) -> None:
    root = earnings22_release(tmp_path / "speech-datasets" / "earnings22")
    report = read_corpus(f"earnings22:{root}", strict=True)
    recs = {r.id: r for r in report.recordings}
    assert sorted(recs) == ["4420696", "4453225", "MP3-A"]
    assert recs["4420696"].text == "Greetings I am KBFG in 2021"  # the reference, not the verbalised copy
    assert recs["4453225"].text == "Good morning everyone"  # not subset10's nonverbatim one
    assert all(r.audio == root / "media" / f"{r.id}.mp3" and r.duration == pytest.approx(15.0, abs=0.1)
               for r in recs.values())
    assert recs["4420696"].meta["transcript"] == str(root / "transcripts" / "nlp_references" / "4420696.nlp")
    assert report.skipped == [] and report.warnings == []
    err = capsys.readouterr().err
    (note,) = report.notes  # what was not read, said once
    assert "transcripts/nlp_references/ (3 files)" in note
    for skipped in ("transcripts/force_aligned_nlp_references/ (3)", "subset10/nonverbatim_transcripts/"
                    "nlp_references/ (1)", "subset10/verbatim_transcripts/nlp_references/ (1)"):
        assert skipped in note
    assert err.count("not read") == 1
    # the repository's root, and paths inside the release, read the same recordings and find media/
    for spec in (f"earnings22:{root.parent}", f"earnings22:{root / 'transcripts'}",
                 f"earnings22:{root / 'transcripts' / 'nlp_references'}"):
        assert [(r.id, r.text, r.audio) for r in load_corpus(spec, strict=True)] == \
            [(r.id, r.text, r.audio) for r in report.recordings], spec


def test_earnings22_subset10_and_other_folders_read_what_they_hold(tmp_path: Path, capsys) -> None:
    root = earnings22_release(tmp_path / "earnings22")
    sub = load_corpus(f"earnings22:{root / 'subset10'}", strict=True)  # verbatim: the links to the references
    assert [(r.id, r.text, r.audio.resolve()) for r in sub] == \
        [("4453225", "Good morning everyone", (root / "media" / "4453225.mp3").resolve())]
    assert "not read: nonverbatim_transcripts/nlp_references/ (1)" in capsys.readouterr().err
    (nv,) = load_corpus(f"earnings22:{root / 'subset10' / 'nonverbatim_transcripts'}", strict=True)
    assert (nv.id, nv.text) == ("4453225", "Morning everyone")
    aligned = load_corpus(f"earnings22:{root / 'transcripts' / 'force_aligned_nlp_references'}", strict=True)
    assert [r.id for r in aligned] == ["4420696", "4453225", "MP3-A"]  # '.aligned' is not part of the id
    assert aligned[0].timed and aligned[0].words[-1].end == 14.0
    # a folder holding two copies of a call without the release layout: the second is named, never preferred
    mixed = tmp_path / "mixed"
    _write(mixed / "a" / "4453225.nlp", _nlp(E22_HEADER, E22_CALLS["4453225"][0]))
    _write(mixed / "b" / "4453225.nlp", _nlp(E22_HEADER, NONVERBATIM["4453225"]))
    _mp3(mixed / "media" / "4453225.mp3")
    report = read_corpus(f"earnings22:{mixed}")
    assert [r.text for r in report.recordings] == ["Good morning everyone"]
    assert report.skipped == [(str(mixed / "b" / "4453225.nlp"),
                               f"recording 4453225 is already read from {mixed / 'a' / '4453225.nlp'} (another copy "
                               f"of the transcripts; point the spec at the folder you want)")]
    with pytest.raises(CorpusError, match=r"b/4453225\.nlp: recording 4453225 is already read"):
        load_corpus(f"earnings22:{mixed}", strict=True)


def test_earnings22_names_git_lfs_pointers_and_reads_text_without_media(tmp_path: Path, capsys) -> None:
    root = earnings22_release(tmp_path / "earnings22", media="lfs")  # a clone without git lfs
    with pytest.raises(CorpusError, match=r"4420696\.nlp: audio file .*4420696\.mp3 is a Git LFS pointer.*git lfs "
                                          r"pull"):
        load_corpus(f"earnings22:{root}", strict=True)
    # transcripts only: nothing opened, the paths that would have been used, durations from the (untimed) text
    recs = load_corpus(f"earnings22:{root}", strict=True, audio=False)
    assert [(r.id, r.audio, r.duration) for r in recs] == \
        [(c, root / "media" / f"{c}.mp3", 0.0) for c in ("4420696", "4453225", "MP3-A")]
    bare = earnings22_release(tmp_path / "bare" / "earnings22", media="none")
    recs = load_corpus(f"earnings22:{bare}", strict=True, audio=False)
    assert [(r.id, r.audio, r.text) for r in recs][0] == ("4420696", Path(""), "Greetings I am KBFG in 2021")
    timed = load_corpus(f"earnings22:{bare / 'transcripts' / 'force_aligned_nlp_references'}", audio=False)
    assert timed[0].duration == 14.0  # the last word's end
    with pytest.raises(CorpusError, match="no audio file 4420696"):
        load_corpus(f"earnings22:{bare}", strict=True)  # with audio (the default) the media are required


def test_a_malformed_time_makes_one_word_untimed_and_keeps_the_call(tmp_path: Path, capsys) -> None:
    root = earnings22_release(tmp_path / "earnings22")
    bad = root / "transcripts" / "nlp_references" / "4453225.nlp"
    bad.write_text(_nlp(E22_HEADER, ["Good|0|0.5|0.9||||[]", "morning|0|1,2|1.5||||[]", "everyone|0|1.6|x2||||[]"]))
    report = read_corpus(f"earnings22:{root}")
    rec = {r.id: r for r in report.recordings}["4453225"]
    assert [(w.text, w.start, w.end) for w in rec.words] == [("Good", 0.5, 0.9), ("morning", None, None),
                                                             ("everyone", None, None)]
    assert report.skipped == []
    assert report.warnings == [(str(bad), "line 3: time '1,2' is not a number of seconds (and 1 more time fields); "
                                          "those words are kept untimed")]
    err = capsys.readouterr().err
    assert err.count("4453225.nlp: line 3: time '1,2'") == 1 and "1 files with warnings" in err
    with pytest.raises(CorpusError, match=r"4453225\.nlp: line 3: time '1,2' is not a number"):
        load_corpus(f"earnings22:{root}", strict=True)
    assert parse_nlp(bad.read_text()).bad_times == [(3, "1,2"), (4, "x2")]


def test_audio_search_reaches_above_the_spec_but_not_far() -> None:
    f = Path("/r/earnings22/transcripts/nlp_references/1.nlp")
    dirs = audio_dirs_for(f, Path("/r/earnings22/transcripts/nlp_references"))
    assert Path("/r/earnings22/media") in dirs and Path("/r/earnings22/audio") in dirs and Path("/r/media") not in dirs
    assert recording_id(Path("x/4420696.aligned.nlp")) == "4420696" and recording_id(Path("MP3-A.nlp")) == "MP3-A"


# ---- Rev16 -----------------------------------------------------------------------------------------------------

def rev16_release(root: Path, *, media: bool = True) -> Path:
    """``root`` as ``rev16/`` of the speech-datasets repository (verbatim and nonverbatim transcripts with their
    normalisations, podcasts.csv), with the episodes' MP3s put in ``media/`` as its README suggests."""
    rows = ["File number,Show Title,Episode Title,iTunes ID,MP3 file"]
    for n in FILE_NUMBERS:
        _write(root / "verbatim_transcripts" / "nlp_references" / f"{n}.nlp", _nlp(REV_HEADER, [
            "Hey|1|||||UC|[]", "guys|1|||.||LC|[]", "uh|1|||||LC|[]", "episode|1|||||LC|[]", f"{n}|1|||.||CA|[]"]))
        _write(root / "nonverbatim_transcripts" / "nlp_references" / f"{n}.nlp", _nlp(REV_HEADER, [
            "Hey|1|||||UC|[]", "guys|1|||,||LC|[]", "episode|1|||||LC|[]", f"{n}|1|||.||CA|[]"]))
        for style in ("verbatim", "nonverbatim"):
            _write(root / f"{style}_transcripts" / "normalizations" / f"{n}.norm.json", "{}\n")
        rows.append(f"{n},Show,Episode,https://itunes.apple.com/x,https://huggingface.co/datasets/sanchit-gandhi/"
                    f"rev16_csv/blob/main/{n}.mp3")
        if media:
            _mp3(root / "media" / f"{n}.mp3", 0.5)
    _write(root / "podcasts.csv", "\n".join(rows) + "\n")
    _write(root / "README.md", "# Rev16\n")
    return root


def test_rev16_release_reads_the_verbatim_transcripts_and_says_so_once(tmp_path: Path, capsys) -> None:
    root = rev16_release(tmp_path / "speech-datasets" / "rev16")
    report = read_corpus(f"rev16:{root}", strict=True)
    assert [r.id for r in report.recordings] == [str(n) for n in FILE_NUMBERS]
    assert all(r.text == f"Hey guys uh episode {r.id}" for r in report.recordings)  # verbatim: the filler is there
    assert all(r.audio == root / "media" / f"{r.id}.mp3" for r in report.recordings)
    assert report.skipped == []
    err = capsys.readouterr().err
    assert err.count("VERBATIM") == 1 and f"rev16:{root / 'nonverbatim_transcripts'}" in err
    assert "nonverbatim_transcripts/nlp_references/ (16)" in err  # named as not read
    # the nonverbatim ones when the spec points at them, without the note
    nonverbatim = load_corpus(f"rev16:{root / 'nonverbatim_transcripts'}", strict=True)
    assert [r.text for r in nonverbatim][:1] == ["Hey guys episode 3"] and len(nonverbatim) == 16
    assert "VERBATIM" not in capsys.readouterr().err
    # the repository's root reads the same
    assert [r.text for r in load_corpus(f"rev16:{root.parent}", strict=True)] == \
        [r.text for r in report.recordings]


def test_rev16_transcripts_without_audio(tmp_path: Path) -> None:
    root = rev16_release(tmp_path / "rev16", media=False)
    recs = load_corpus(f"rev16:{root}", strict=True, audio=False)
    assert [(r.id, r.audio, r.duration) for r in recs] == [(str(n), Path(""), 0.0) for n in FILE_NUMBERS]
    with pytest.raises(CorpusError, match=r"3\.nlp: no audio file 3\."):
        load_corpus(f"rev16:{root}", strict=True)
