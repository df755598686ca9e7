"""Mel features normalised per recording (paper 000 §3.1).

``variant='paper'``: torchaudio MelSpectrogram, 16 kHz, 80 bins, window 400 = n_fft, hop 160, then the log.
``variant='code'``: the authors' release, n_fft 512 (window 400) and no log.
Both z-normalise every mel bin with the mean and standard deviation over the whole recording, so a window cut
from a long recording is normalised with that recording's statistics, as in training on whole podcasts.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torchaudio

from .config import FeatureConfig

LOG_FLOOR = 1e-6  # keeps log() finite on digital silence


class FeatureExtractor:
    """``__call__(wave (N,)) -> (T, n_mels)`` float32, ``T = N // hop + 1``."""

    def __init__(self, cfg: FeatureConfig) -> None:
        self.cfg = cfg
        n_fft = cfg.win_length if cfg.variant == "paper" else 512
        self.mel = torchaudio.transforms.MelSpectrogram(
            sample_rate=cfg.sample_rate, n_fft=n_fft, win_length=cfg.win_length, hop_length=cfg.hop_length,
            n_mels=cfg.n_mels, power=2.0, center=True)

    @property
    def frames_per_second(self) -> float:
        return self.cfg.frames_per_second

    def raw(self, wave: torch.Tensor) -> torch.Tensor:
        """(N,) -> un-normalised (T, n_mels)."""
        if wave.dim() != 1:
            raise ValueError(f"expected a mono waveform of shape (N,), got {tuple(wave.shape)}")
        spec = self.mel(wave.float()).T  # (T, n_mels)
        if self.cfg.variant == "paper":
            spec = torch.log(spec + LOG_FLOOR)
        return spec

    def __call__(self, wave: torch.Tensor) -> torch.Tensor:
        return normalise(self.raw(wave))


def normalise(feats: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Per-bin z-normalisation over time. (T, F) -> (T, F)."""
    mean = feats.mean(dim=0, keepdim=True)
    std = feats.std(dim=0, keepdim=True, unbiased=False)
    return (feats - mean) / (std + eps)


def zero_regions(feats: torch.Tensor, regions_s: Iterable[tuple[float, float]], frames_per_second: float
                 ) -> torch.Tensor:
    """Copy of ``feats`` (T, F) with the frames of each (start, end) region in seconds set to zero (untranscribed
    speech such as TED-LIUM's ``ignore_time_segment_in_scoring``, paper 000 §3.1)."""
    out = feats.clone()
    for start, end in regions_s:
        if end < start:
            raise ValueError(f"region ({start}, {end}) ends before it starts")
        a = max(0, int(round(start * frames_per_second)))
        b = min(out.shape[0], int(round(end * frames_per_second)))
        if b > a:
            out[a:b] = 0.0
    return out
