"""Background music mixed into a recording at an exact signal-to-noise ratio (paper 000 §4.1, figure 2).

The authors looped one elevator-music recording with a fixed seed; that recording is not redistributable, so the
project synthesises its own music (pads of chords, a bass line, a melody and light percussion, all with
envelopes; key, tempo, progression and timbre drawn from the seed) or reads an audio file the user names.
Each recording gets its own fixed seed (a hash of its id and a base seed), and the same music at every SNR, so
robustness curves are reproducible anywhere and differ between SNRs only by the mixing level.

The SNR is the ratio of the mean power of the whole recording (speech and its pauses) to that of the added music.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from asr_core.data.audio import SAMPLE_RATE, load_audio

MAJOR = (0, 2, 4, 5, 7, 9, 11)
MINOR = (0, 2, 3, 5, 7, 8, 10)
# progressions as scale degrees (0-based) of triads
PROGRESSIONS = ((0, 4, 5, 3), (0, 5, 3, 4), (5, 3, 0, 4), (0, 3, 4, 4), (0, 3, 0, 4), (1, 4, 0, 0))
LOOP_BARS = 16  # the piece is this many bars long and loops seamlessly
_file_cache: dict[str, torch.Tensor] = {}


def recording_seed(recording_id: str, base_seed: int = 0) -> int:
    """A stable 63-bit seed for one recording (independent of Python's salted ``hash``)."""
    digest = hashlib.sha256(f"noise/{base_seed}/{recording_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _hz(midi: float) -> float:
    return 440.0 * 2 ** ((midi - 69) / 12)


def _tone(freq: float, n: int, sr: int, harmonics: np.ndarray, attack: float, decay: float,
          rng: np.random.Generator) -> np.ndarray:
    """One note: a few harmonics with an attack and exponential decay, random phases. Shape (n,)."""
    t = np.arange(n) / sr
    wave = np.zeros(n)
    for k, amp in enumerate(harmonics, 1):
        if k * freq < 0.45 * sr:
            wave += amp * np.sin(2 * np.pi * k * freq * t + rng.uniform(0, 2 * np.pi))
    env = np.minimum(1.0, t / max(attack, 1e-3)) * np.exp(-t / decay)
    env[-min(n, int(0.01 * sr)):] *= np.linspace(1, 0, min(n, int(0.01 * sr)))  # no click at the end
    return wave * env


def synth_music(n_samples: int, seed: int, sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """Deterministic music for ``seed``: (n_samples,) float32 with unit mean power.

    A loop of ``LOOP_BARS`` bars is composed and rendered once, then repeated; note tails wrap around the loop
    boundary so the repetition is seamless.
    """
    rng = np.random.default_rng(seed)
    sr = sample_rate
    bpm = rng.uniform(70, 130)
    beat = int(sr * 60 / bpm)
    bar = 4 * beat
    loop = np.zeros(LOOP_BARS * bar)
    root = int(rng.integers(45, 57))
    scale = MINOR if rng.random() < 0.4 else MAJOR
    prog = PROGRESSIONS[int(rng.integers(len(PROGRESSIONS)))]
    pad_h = rng.uniform(0.2, 1.0, size=4) / np.arange(1, 5)
    lead_h = rng.uniform(0.2, 1.0, size=6) / np.arange(1, 7) ** rng.uniform(0.7, 1.5)
    bass_h = np.array([1.0, 0.5, 0.2])

    def add(at: int, note: np.ndarray, gain: float) -> None:
        idx = (at + np.arange(len(note))) % len(loop)  # wrap tails around: seamless loop
        np.add.at(loop, idx, gain * note)

    def degree(d: int, octave: int = 0) -> int:
        return root + scale[d % 7] + 12 * (d // 7 + octave)

    melody = int(rng.integers(0, 7)) + 7
    for b in range(LOOP_BARS):
        chord = prog[b % len(prog)]
        start = b * bar
        for d in (chord, chord + 2, chord + 4):  # pad: the triad, held for the bar
            add(start, _tone(_hz(degree(d, 1)), bar, sr, pad_h, 0.15, 1.5, rng), 0.12)
        for q in range(4):  # bass: chord root on every beat, plucked
            add(start + q * beat, _tone(_hz(degree(chord, -1)), beat, sr, bass_h, 0.005, 0.25, rng), 0.3)
        pos = 0
        while pos < bar:  # melody: a random walk over the scale in eighths and quarters
            dur = beat // 2 if rng.random() < 0.6 else beat
            melody = int(np.clip(melody + rng.integers(-2, 3), 5, 16))
            if rng.random() < 0.85:
                add(start + pos, _tone(_hz(degree(melody, 1)), min(dur * 2, bar), sr, lead_h, 0.01, 0.3, rng), 0.2)
            pos += dur
        for e in range(8):  # hi-hat on eighths, kick on beats 1 and 3
            hat = rng.standard_normal(int(0.04 * sr)) * np.exp(-np.arange(int(0.04 * sr)) / (0.008 * sr))
            add(start + e * beat // 2, np.diff(hat, prepend=0.0), 0.05)
        for q in (0, 2):
            t = np.arange(int(0.15 * sr)) / sr
            add(start + q * beat, np.sin(2 * np.pi * (50 + 80 * np.exp(-t / 0.03)) * t) * np.exp(-t / 0.05), 0.4)
    loop /= np.sqrt(np.mean(loop ** 2)) + 1e-12
    reps = -(-n_samples // len(loop))
    return torch.from_numpy(np.tile(loop, max(reps, 1))[:n_samples].astype(np.float32))


def noise_for(n_samples: int, seed: int, source: str = "synthetic", sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """(n_samples,) of music: synthesised (``source="synthetic"``) or looped from the audio file ``source``,
    starting at an offset chosen by ``seed``."""
    if source == "synthetic":
        return synth_music(n_samples, seed, sample_rate)
    path = Path(source)
    if source not in _file_cache:
        if not path.is_file():
            raise FileNotFoundError(f"noise file {source} not found; use 'synthetic' or the path of an audio file")
        music = load_audio(path, sample_rate)
        if music.numel() == 0 or float(music.abs().max()) == 0.0:
            raise ValueError(f"noise file {source} is silent or empty")
        _file_cache[source] = music
    music = _file_cache[source]
    offset = int(np.random.default_rng(seed).integers(0, music.numel()))
    reps = -(-(n_samples + offset) // music.numel())
    return music.repeat(reps)[offset: offset + n_samples].clone()


def power(x: torch.Tensor) -> float:
    return float(x.double().pow(2).mean())


def measure_snr(signal: torch.Tensor, noise: torch.Tensor) -> float:
    """10 log10(P_signal / P_noise) in dB."""
    return 10 * np.log10(power(signal) / max(power(noise), 1e-30))


def mix_at_snr(signal: torch.Tensor, noise: torch.Tensor, snr_db: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``signal + g * noise`` with ``g`` chosen so that the SNR is exactly ``snr_db``; returns (mix, g * noise).
    Shapes (N,). The mix is not clipped: features are computed from floats, and clipping would change the SNR."""
    if signal.shape != noise.shape:
        raise ValueError(f"signal {tuple(signal.shape)} and noise {tuple(noise.shape)} must have the same shape")
    ps, pn = power(signal), power(noise)
    if ps == 0.0:
        raise ValueError("cannot mix at an SNR: the recording is silent")
    if pn == 0.0:
        raise ValueError("cannot mix at an SNR: the noise is silent")
    gain = np.sqrt(ps / (pn * 10 ** (snr_db / 10)))
    scaled = (noise.double() * gain).to(signal.dtype)
    return signal + scaled, scaled


def add_music(wave: torch.Tensor, recording_id: str, snr_db: float, source: str = "synthetic",
              base_seed: int = 0) -> torch.Tensor:
    """The recording (N,) with music at ``snr_db``; the music depends only on the recording id and base seed."""
    music = noise_for(wave.numel(), recording_seed(recording_id, base_seed), source)
    return mix_at_snr(wave, music, snr_db)[0]
