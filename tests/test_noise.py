"""Music noise: exact SNR, fixed per recording, synthesised or read from a file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from asr_core.data.audio import save_audio
from asr_core.data.synth.audio import Speaker, espeak
from asr_core.data.noise import add_music, measure_snr, mix_at_snr, noise_for, recording_seed, synth_music


@pytest.fixture(scope="module")
def speech() -> torch.Tensor:
    """Real speech with pauses (espeak-ng), about 4 s."""
    words = [espeak(w, Speaker("en-us+m3", 160, 50)) for w in "the quiet telescope found a comet".split()]
    gap = np.zeros(2400, dtype=np.float32)
    return torch.from_numpy(np.concatenate([np.concatenate([w, gap]) for w in words]))


@pytest.mark.parametrize("snr", [-7.5, -5.0, -2.5, 0.0, 2.5, 5.0, 7.5, 10.0, 23.0])
def test_snr_measured_back_is_within_a_tenth_of_a_db(speech: torch.Tensor, snr: float) -> None:
    mixed = add_music(speech, "rec-1", snr)
    assert abs(measure_snr(speech, mixed - speech) - snr) < 0.1
    assert mixed.dtype == speech.dtype and mixed.shape == speech.shape


def test_music_is_fixed_per_recording_and_differs_between_recordings(speech: torch.Tensor) -> None:
    a = add_music(speech, "rec-1", 0.0) - speech
    again = add_music(speech, "rec-1", 0.0) - speech
    other = add_music(speech, "rec-2", 0.0) - speech
    other_seed = add_music(speech, "rec-1", 0.0, base_seed=1) - speech
    torch.testing.assert_close(a, again, rtol=0, atol=0)
    for b in (other, other_seed):
        corr = float(torch.dot(a, b) / (a.norm() * b.norm()))
        assert abs(corr) < 0.3
    # the same music at every SNR: only the level changes
    louder = add_music(speech, "rec-1", -5.0) - speech
    assert float(torch.dot(a, louder) / (a.norm() * louder.norm())) > 0.999
    assert recording_seed("rec-1") == recording_seed("rec-1") != recording_seed("rec-2")


def test_synthetic_music_is_tonal_and_loud_throughout() -> None:
    sr = 16000
    m = synth_music(sr * 40, seed=5)
    assert m.shape == (sr * 40,) and abs(float(m.pow(2).mean()) - 1.0) < 0.01
    frames = m[: sr * 40 // 1600 * 1600].reshape(-1, 1600).pow(2).mean(1)
    assert float(frames.min()) > 0.01  # no silent 0.1 s anywhere
    spec = torch.fft.rfft(m[: sr * 4]).abs()
    top = spec.topk(50).values.sum() / spec.sum()
    assert top > 0.05  # energy concentrated in a few partials (notes), unlike noise
    assert not torch.equal(synth_music(sr, 5), synth_music(sr, 6))
    torch.testing.assert_close(synth_music(sr * 2, 5), m[: sr * 2])


def test_music_from_a_file_loops_from_a_seeded_offset(tmp_path: Path) -> None:
    path = tmp_path / "music.wav"
    save_audio(path, synth_music(16000 * 3, seed=1) * 0.3)
    a = noise_for(16000 * 10, seed=1, source=str(path))
    b = noise_for(16000 * 10, seed=1, source=str(path))
    c = noise_for(16000 * 10, seed=2, source=str(path))
    assert a.shape == (160000,) and torch.equal(a, b) and not torch.equal(a, c)
    torch.testing.assert_close(a[:48000], a[48000:96000])  # loops with the file's period
    speech = torch.randn(160000) * 0.1
    mixed, scaled = mix_at_snr(speech, a, -2.5)
    assert abs(measure_snr(speech, scaled) + 2.5) < 0.1


def test_bad_inputs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere.wav"):
        noise_for(100, 0, str(tmp_path / "nowhere.wav"))
    with pytest.raises(ValueError, match="silent"):
        mix_at_snr(torch.zeros(100), torch.randn(100), 0.0)
    with pytest.raises(ValueError, match="same shape"):
        mix_at_snr(torch.randn(100), torch.randn(99), 0.0)
