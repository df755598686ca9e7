"""The training loop on a small espeak-ng corpus generated here: it learns, it logs to MLflow, the CLI runs."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from asr_core.audio import SAMPLE_RATE, load_audio, save_audio
from asr_core.checkpoint import load_checkpoint, load_for_eval
from asr_core.config import preset
from asr_core.corpora.base import Recording, Word
from asr_core.features import FeatureExtractor
from asr_core.train import train

WORDS = ("red green blue yellow black white cat dog bird fish one two three four five six seven eight nine ten "
         "up down left right stop go yes no").split()


def _speak(word: str, path: Path) -> np.ndarray:
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(path), word], check=True,
                   capture_output=True)
    wave = load_audio(path).numpy()
    loud = np.nonzero(np.abs(wave) > 0.02 * np.abs(wave).max())[0]
    return wave[max(0, loud[0] - 160) : loud[-1] + 160]  # trim espeak's silence, keep 10 ms margins


def make_corpus(folder: Path, n: int, seed: int = 0, words_per: tuple[int, int] = (3, 6)) -> list[Recording]:
    """``n`` recordings of random WORDS spoken by espeak-ng with exact word times (each word synthesised alone)."""
    folder.mkdir(parents=True, exist_ok=True)
    spoken = {w: _speak(w, folder / f"_{w}.wav") for w in WORDS}
    rng = random.Random(seed)
    recs = []
    for i in range(n):
        pieces, words, t = [np.zeros(int(0.2 * SAMPLE_RATE), np.float32)], [], 0.2
        for w in rng.choices(WORDS, k=rng.randint(*words_per)):
            audio = spoken[w]
            words.append(Word(w, round(t, 4), round(t + len(audio) / SAMPLE_RATE, 4)))
            gap = np.zeros(int(rng.uniform(0.1, 0.3) * SAMPLE_RATE), np.float32)
            pieces += [audio, gap]
            t += (len(audio) + len(gap)) / SAMPLE_RATE
        wave = np.concatenate(pieces) + 1e-3 * np.random.default_rng(i).standard_normal(1).astype(np.float32)
        path = folder / f"rec{i:03d}.wav"
        save_audio(path, wave)
        recs.append(Recording(f"rec{i:03d}", path, len(wave) / SAMPLE_RATE, tuple(words)))
    return recs


def tiny_cfg(**over: object):
    sets = [f"{k}={v}" for k, v in over.items()]
    return preset("tiny").with_overrides(["data.batch_audio_s=24", "data.seqlen_warmup=none", *sets])


def test_features_shape_and_normalisation(tmp_path: Path) -> None:
    recs = make_corpus(tmp_path, 1)
    fx = FeatureExtractor(tiny_cfg().data.features)
    wave = load_audio(recs[0].audio)
    feats = fx(wave)
    assert feats.shape == (len(wave) // 160 + 1, 80)
    assert feats.mean(0).abs().max() < 1e-4 and (feats.std(0, unbiased=False) - 1).abs().max() < 1e-2


def _greedy(model, x: torch.Tensor, blank: int) -> list[int]:
    with torch.no_grad():
        logits, _ = model(x[None], torch.tensor([x.shape[0]]))
    ids = logits[0].argmax(-1).tolist()
    out, prev = [], None
    for i in ids:
        if i != prev and i != blank:
            out.append(i)
        prev = i
    return out


def test_tiny_model_learns_its_training_utterances(tmp_path: Path) -> None:
    """A real learning test: the loss falls and greedy CTC transcribes the training set with WER < 10%."""
    import jiwer

    torch.set_num_threads(2)
    recs = make_corpus(tmp_path / "corpus", 48)
    cfg = tiny_cfg(**{"model.vocab_size": 48, "train.epochs": 60, "train.warmup_steps": 30, "train.lr": 0.004,
                      "train.checkpoint_every": 1000, "train.log_every": 50, "model.batch_renorm_warmup_steps": 50})
    result = train(cfg, tmp_path / "run", recordings=recs)
    state = load_checkpoint(result.checkpoint)
    assert state["step"] == result.steps > 100
    model, cfg2, tok = load_for_eval(result.checkpoint)
    assert cfg2 == cfg and tok.vocab_size == 48
    fx = FeatureExtractor(cfg.data.features)
    refs, hyps = [], []
    for r in recs:
        refs.append(r.text)
        hyps.append(tok.decode(_greedy(model, fx(load_audio(r.audio)), tok.blank_id)))
    wer = jiwer.wer(refs, hyps)
    assert result.final_loss < 0.5, result.final_loss
    assert wer < 0.10, (wer, list(zip(refs, hyps))[:5])
