"""Reading and writing audio. soundfile (libsndfile) is used rather than torchaudio.load, which in torchaudio 2.9+
needs torchcodec and FFmpeg libraries that are not part of the pinned environment."""

from __future__ import annotations

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


def save_audio(path: str | Path, wave: torch.Tensor | np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """Write a mono waveform (N,) as 16-bit PCM WAV."""
    arr = wave.detach().cpu().numpy() if isinstance(wave, torch.Tensor) else np.asarray(wave)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.clip(arr, -1.0, 1.0), sample_rate, subtype="PCM_16")


def audio_duration(path: str | Path) -> float:
    """Duration in seconds, read from the header only."""
    info = sf.info(str(path))
    return info.frames / info.samplerate
