"""FastConformer subsampling: 8x in time with depthwise-separable 2-D convolutions (paper 000 §2.1, §3.2).

The first stage is an ordinary 3x3 convolution from 1 to C channels; every further stage is a depthwise 3x3
convolution followed by a pointwise 1x1 one, so the module stays small (C=256 rather than d_model) while cutting the
sequence eight-fold before the first attention layer. Every stage halves time and frequency (stride 2, padding 1),
so a recording of T frames becomes ceil(T / 8) frames.

Padding invariance: before every convolution the frames beyond each recording's length are set to zero, which is
exactly what the convolution's own zero padding supplies at the end of an unpadded recording; a padded batch
therefore produces the same valid frames as each recording alone.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def conv_out_length(lengths: torch.Tensor) -> torch.Tensor:
    """Frames after one stride-2, kernel-3, padding-1 stage: ceil(L / 2). ``lengths`` (B,) long."""
    return torch.div(lengths + 1, 2, rounding_mode="floor")


def time_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B, max_len) bool, True on valid frames."""
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


class DepthwiseSeparableSubsampling(nn.Module):
    """(B, T, n_mels) features -> (B, ceil(T/factor), d_model) with SiLU between stages (as the authors' code)."""

    def __init__(self, n_mels: int, channels: int, d_model: int, factor: int = 8) -> None:
        super().__init__()
        stages = int(math.log2(factor))
        if 2**stages != factor:
            raise ValueError(f"subsampling factor must be a power of two, got {factor}")
        self.factor = factor
        self.convs = nn.ModuleList()
        self.convs.append(nn.Conv2d(1, channels, kernel_size=3, stride=2, padding=1))
        for _ in range(stages - 1):
            self.convs.append(nn.Sequential(
                nn.Conv2d(channels, channels, kernel_size=3, stride=2, padding=1, groups=channels),
                nn.Conv2d(channels, channels, kernel_size=1),
            ))
        freq = n_mels
        for _ in range(stages):
            freq = (freq + 1) // 2
        self.out = nn.Linear(channels * freq, d_model)
        self.act = nn.SiLU()

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        for _ in self.convs:
            lengths = conv_out_length(lengths)
        return lengths

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, F), lengths (B,) -> (B, T', d_model) zero beyond each length, lengths (B,)."""
        h = x.unsqueeze(1)  # (B, 1, T, F)
        for conv in self.convs:
            h = h * time_mask(lengths, h.shape[2])[:, None, :, None].to(h.dtype)
            h = self.act(conv(h))
            lengths = conv_out_length(lengths)
        b, c, t, f = h.shape
        h = h.permute(0, 2, 1, 3).reshape(b, t, c * f)
        h = self.out(h)
        h = h * time_mask(lengths, t)[:, :, None].to(h.dtype)
        return h, lengths
