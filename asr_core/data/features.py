"""Mel features normalised per recording (paper 000 §3.1).

``variant='code'`` (the default): the authors' release, n_fft 512 (window 400) and no log.
``variant='paper'``: torchaudio MelSpectrogram, 16 kHz, 80 bins, window 400 = n_fft, hop 160, then the log.
Both z-normalise every mel bin with the mean and standard deviation over the whole recording, so a window cut
from a long recording is normalised with that recording's statistics, as in training on whole podcasts.

:meth:`FeatureExtractor.frames` computes frames ``[a, b)`` of a recording from only the samples they cover (the
recording's edges reflected, as the whole-recording transform pads them), for loaders that read a window at a time
and normalise it with statistics kept per recording (:func:`statistics`).
"""

from __future__ import annotations

from typing import Iterable

import torch
import torchaudio

from asr_core.config import FeatureConfig

LOG_FLOOR = 1e-6  # keeps log() finite on digital silence


class FeatureExtractor:
    """``__call__(wave (N,)) -> (T, n_mels)`` float32, ``T = N // hop + 1``."""

    def __init__(self, cfg: FeatureConfig) -> None:
        self.cfg = cfg
        n_fft = cfg.win_length if cfg.variant == "paper" else 512
        self.mel = torchaudio.transforms.MelSpectrogram(
            sample_rate=cfg.sample_rate, n_fft=n_fft, win_length=cfg.win_length, hop_length=cfg.hop_length,
            n_mels=cfg.n_mels, power=2.0, center=True)

        self.n_fft = n_fft
        self.framed = torchaudio.transforms.MelSpectrogram(
            sample_rate=cfg.sample_rate, n_fft=n_fft, win_length=cfg.win_length, hop_length=cfg.hop_length,
            n_mels=cfg.n_mels, power=2.0, center=False)

    @property
    def frames_per_second(self) -> float:
        return self.cfg.frames_per_second

    def n_frames(self, samples: int) -> int:
        """Frames of a recording of ``samples`` samples (``samples // hop + 1``)."""
        return samples // self.cfg.hop_length + 1

    def sample_span(self, a: int, b: int) -> tuple[int, int]:
        """Samples ``[lo, hi)`` that frames ``[a, b)`` cover (may reach past either end of the recording)."""
        half = self.n_fft // 2
        return a * self.cfg.hop_length - half, (b - 1) * self.cfg.hop_length - half + self.n_fft

    def frames(self, segment: torch.Tensor, a: int, b: int, samples: int) -> torch.Tensor:
        """Un-normalised frames ``[a, b)`` (b - a, n_mels) of a recording of ``samples`` samples, from ``segment``:
        its samples ``[max(0, lo), min(samples, hi))`` of :meth:`sample_span`. Equal to ``raw(wave)[a:b]``."""
        lo, hi = self.sample_span(a, b)
        left, right = max(0, -lo), max(0, hi - samples)
        x = segment.float()
        if left or right:
            x = torch.nn.functional.pad(x[None, None], (left, right), mode="reflect")[0, 0]
        spec = self.framed(x).T
        if self.cfg.variant == "paper":
            spec = torch.log(spec + LOG_FLOOR)
        return spec

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


def statistics(feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-bin (mean, std) over time of un-normalised (T, F) features, each (1, F)."""
    return feats.mean(dim=0, keepdim=True), feats.std(dim=0, keepdim=True, unbiased=False)


def normalise(feats: torch.Tensor, eps: float = 1e-5, stats: tuple[torch.Tensor, torch.Tensor] | None = None
              ) -> torch.Tensor:
    """Per-bin z-normalisation over time, with ``feats``' own statistics or the recording's ``stats``.
    (T, F) -> (T, F)."""
    mean, std = statistics(feats) if stats is None else stats
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
