"""Reading and writing audio. soundfile (libsndfile) is used rather than torchaudio.load, which in torchaudio 2.9+
needs torchcodec and FFmpeg libraries that are not part of the pinned environment."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio.functional as AF

SAMPLE_RATE = 16_000


def load_audio(path: str | Path, sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """Mono float32 waveform of ``path`` at ``sample_rate``. Returns shape (N,)."""
    try:
        data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError) as e:
        raise OSError(f"cannot read audio file {path}: {e}") from None
    wave = torch.from_numpy(np.ascontiguousarray(data.mean(axis=1)))
    if sr != sample_rate:
        wave = AF.resample(wave, sr, sample_rate)
    return wave


def read_segment(path: str | Path, start: int, stop: int, sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """Samples ``[start, stop)`` (clipped to the file) of ``load_audio(path, sample_rate)``, read by seeking. (N,)

    A file at another rate is read with a margin of whole resampling periods on both sides, resampled and cut, so
    the samples are those of the whole file resampled (up to float rounding in the filter)."""
    try:
        with sf.SoundFile(str(path)) as f:
            sr, total = f.samplerate, f.frames
            if sr == sample_rate:
                lo, hi = max(0, start), min(total, stop)
                f.seek(lo)
                data = f.read(max(0, hi - lo), dtype="float32", always_2d=True)
                return torch.from_numpy(np.ascontiguousarray(data.mean(axis=1)))
            g = math.gcd(sr, sample_rate)
            q_in, q_out = sr // g, sample_rate // g  # q_in input samples make q_out output samples
            margin = 8  # periods each side: wider than the resampling filter
            p0 = max(0, start // q_out - margin)
            p1 = min(math.ceil(total / q_in), math.ceil(stop / q_out) + margin)
            f.seek(p0 * q_in)
            data = f.read(max(0, min(total, p1 * q_in) - p0 * q_in), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError) as e:
        raise OSError(f"cannot read audio file {path}: {e}") from None
    wave = AF.resample(torch.from_numpy(np.ascontiguousarray(data.mean(axis=1))), sr, sample_rate)
    whole = math.ceil(total * sample_rate / sr)  # the length of the whole file resampled
    a = max(0, start) - p0 * q_out
    b = min(whole, stop) - p0 * q_out
    return wave[a:max(a, b)]


def save_audio(path: str | Path, wave: torch.Tensor | np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """Write a mono waveform (N,) as 16-bit PCM WAV."""
    arr = wave.detach().cpu().numpy() if isinstance(wave, torch.Tensor) else np.asarray(wave)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.clip(arr, -1.0, 1.0), sample_rate, subtype="PCM_16")


def audio_duration(path: str | Path) -> float:
    """Duration in seconds, read from the header only."""
    info = sf.info(str(path))
    return info.frames / info.samplerate
