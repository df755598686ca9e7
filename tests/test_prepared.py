"""Prepared corpora (``python -m asr_core prepare``): the same recordings as the source reader gives, the source's
fingerprint, a bitwise-identical trained model, and clear errors for what is not a finished prepared corpus."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from asr_core.training.checkpoint import load_checkpoint
from asr_core.data.chunking import duration_timed
from asr_core.config import preset
from asr_core.data.corpora import CorpusError, Recording, Word, load_corpus, read_corpus
from asr_core.data.corpora.fingerprint import fingerprint
from asr_core.data.corpora.prepared import PreparedCorpus, write_prepared
from asr_core.training.train import train
from tests.test_backend import smoke_corpus

__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend


def _odd_recordings(tmp_path: Path) -> list[Recording]:
    """Times that are not whole milliseconds, untimed words, a recording without words, ignore regions, and
    non-ASCII words; listed out of id order."""
    return [
        Recording("b", tmp_path / "b.wav", 12.25, (Word("naïve", 0.1234, 0.5), Word("über"), Word("x", 1.0, None)),
                  ignore=((2.0, 3.5), (4.0, 4.25))),
        Recording("a", tmp_path / "a.flac", 3.0, (Word("hello", 0.3333333, 0.6666667), Word("hello", 1.0, 1.5))),
        Recording("c", tmp_path / "c.wav", 1.0),
    ]


def test_prepared_recordings_equal_the_source_bit_for_bit_in_id_order(tmp_path: Path) -> None:
    recs = _odd_recordings(tmp_path)
    write_prepared(recs, tmp_path / "p", name="odd", source="manual")
    corpus = PreparedCorpus(tmp_path / "p")
    by_id = sorted(recs, key=lambda r: r.id)
    assert list(corpus) == by_id and corpus.ids == ["a", "b", "c"]
    assert corpus.manifest["time_unit"] == "s"  # 0.1234 s is not a whole millisecond: float64 seconds
    assert corpus.fingerprint == fingerprint(recs) == fingerprint(list(corpus))
    for i, r in enumerate(by_id):
        assert duration_timed(corpus, i) == (r.duration, r.timed)
    assert corpus[-1] == by_id[-1] and list(corpus[1:]) == by_id[1:] and corpus[1:].fingerprint == fingerprint(by_id[1:])
    with pytest.raises(IndexError):
        corpus[3]


def test_whole_millisecond_times_take_twelve_bytes_a_word(tmp_path: Path, smoke_corpus: Path) -> None:
    raw = load_corpus(f"podcast:{smoke_corpus}/train")
    out = write_prepared(raw, tmp_path / "p", name="smoke", source="podcast")
    corpus = read_corpus(f"prepared:{out}").recordings
    assert isinstance(corpus, PreparedCorpus) and corpus.manifest["time_unit"] == "ms"
    assert list(corpus) == sorted(raw, key=lambda r: r.id) and corpus.fingerprint == fingerprint(raw)
    words = corpus.manifest["words"]
    per_word = sum((out / f"word_{k}.npy").stat().st_size for k in ("start", "end", "type")) / words
    assert 12 <= per_word < 12.5  # three 4-byte numbers (plus the .npy headers)


@pytest.mark.slow
def test_a_trial_from_the_prepared_corpus_trains_the_same_model_bitwise(tmp_path: Path, smoke_corpus: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The raw corpus: read, sorted, its tokenizer trained by the trial. The prepared one: mapped, in stored order,
    the tokenizer trained once by ``prepare``. The same model, bit for bit."""
    torch.set_num_threads(2)
    out = tmp_path / "prepared"
    done = subprocess.run([sys.executable, "-m", "asr_core", "prepare", f"smoke=podcast:{smoke_corpus}/train",
                           str(out), "--vocab-size", "40"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"data.train=smoke=prepared:{out}" in done.stdout and (out / "tokenizer-40.model").is_file()
    states = {}
    for fmt, spec in (("raw", f"smoke=podcast:{smoke_corpus}/train"), ("prepared", f"smoke=prepared:{out}")):
        cfg = preset("tiny").with_overrides([f"data.train={spec}", "data.batch_audio_s=20.48", "data.context_s=5.12",
                                             "data.seqlen_warmup=none", "model.vocab_size=40", "train.max_steps=3",
                                             "train.device=cpu", "train.precision=fp32", "eval.datasets=[]"])
        result = train(cfg, tmp_path / fmt)
        states[fmt] = (result, load_checkpoint(result.checkpoint))
        assert ("tokenizer of the prepared corpus" in capsys.readouterr().out) == (fmt == "prepared")
    (r_raw, s_raw), (r_prep, s_prep) = states["raw"], states["prepared"]
    assert r_raw.steps == r_prep.steps == 3 and r_raw.final_loss == r_prep.final_loss
    assert s_raw["data_fingerprint"] == s_prep["data_fingerprint"]  # the same data identity: checkpoints carry over
    assert s_raw["data_position"] == s_prep["data_position"] and s_raw["tokenizer"] == s_prep["tokenizer"]
    for name, t in s_raw["model"].items():
        assert torch.equal(t, s_prep["model"][name]), name


def test_what_is_not_a_finished_prepared_corpus_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    out = write_prepared(_odd_recordings(tmp_path), tmp_path / "p", name="odd", source="manual")
    with pytest.raises(CorpusError, match="already holds a prepared corpus"):
        write_prepared(_odd_recordings(tmp_path), out, name="odd", source="manual")
    (tmp_path / "half").mkdir()
    np.save(tmp_path / "half" / "durations.npy", np.zeros(3))
    with pytest.raises(CorpusError, match="no prepared.json; an unfinished preparation"):
        load_corpus(f"prepared:{tmp_path / 'half'}")
    manifest = json.loads((out / "prepared.json").read_text())
    (out / "prepared.json").write_text(json.dumps({**manifest, "version": 99}))
    with pytest.raises(CorpusError, match="version 99; this code reads"):
        PreparedCorpus(out)
    bad = subprocess.run([sys.executable, "-m", "asr_core", "prepare", "x=podcast:/nonexistent", str(tmp_path / "q")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "/nonexistent does not exist" in bad.stderr and not (tmp_path / "q").exists()


@pytest.mark.slow
def test_a_sharded_preparation_killed_midway_continues_and_equals_the_source(tmp_path: Path,
                                                                            smoke_corpus: Path) -> None:
    """Podcast transcripts are read in shards by worker processes; a preparation killed after two shards continues
    from them, and the result equals the source, and a preparation in one piece, and one by two processes."""
    def cmd(out: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "asr_core", "prepare", f"smoke=podcast:{smoke_corpus}/train", str(out),
                "--vocab-size", "40", *extra]

    out = tmp_path / "killed"
    killed = subprocess.run(cmd(out, "--shard-size", "3", "--jobs", "1"), capture_output=True, text=True,
                            timeout=300, env={**os.environ, "ASR_CORE_FAULT": "kill-after-shards:2"},
                            start_new_session=True)  # killed with its workers, as SLURM kills a job
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / "prepared.json").exists()
    assert len([d for d in (out / "shards").iterdir() if (d / "prepared.json").exists()]) >= 2
    again = subprocess.run(cmd(out, "--shard-size", "3", "--jobs", "1"), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "shards done before; continuing" in again.stderr and not (out / "shards").exists()
    two = tmp_path / "two"
    assert subprocess.run(cmd(two, "--shard-size", "5", "--jobs", "2"), capture_output=True, timeout=300).returncode == 0
    raw = load_corpus(f"podcast:{smoke_corpus}/train")
    whole = write_prepared(raw, tmp_path / "whole", name="smoke", source=f"podcast:{smoke_corpus}/train",
                           vocab_sizes=[40])
    for folder in (out, two):
        corpus = PreparedCorpus(folder)
        assert list(corpus) == sorted(raw, key=lambda r: r.id) and corpus.fingerprint == fingerprint(raw)
        assert (folder / "tokenizer-40.model").read_bytes() == (whole / "tokenizer-40.model").read_bytes()
        for key in ("word_start", "word_end", "durations", "timed", "word_offsets"):
            assert np.array_equal(np.load(folder / f"{key}.npy"), np.load(whole / f"{key}.npy")), key


def test_submit_refuses_an_unfinished_prepared_corpus_before_anything_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A preparation that was stopped leaves a folder without ``prepared.json``: not a corpus yet."""
    from orchestrate.cli.commands import main

    half = tmp_path / "half"
    (half / "shards").mkdir(parents=True)
    root = tmp_path / "runs"
    rc = main(["submit", str(Path(__file__).resolve().parents[1] / "grids" / "smoke.yaml"), "--backend", "local",
               "--sweep-root", str(root), "--set", f"data.train=prepared:{half}"])
    assert rc == 2 and not root.exists()
    assert f"data not found: {half / 'prepared.json'} (data.train)" in capsys.readouterr().err
