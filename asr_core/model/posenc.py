"""Positional encodings, selected by name from :data:`REGISTRY` (paper 000 §2.4, §4.2).

Two kinds exist and every encoding implements both hooks of :class:`PositionalEncoding`:
- absolute encodings (``learnable-fourier``, ``sinusoidal``, ``fourier``) are added once to the subsampled input
  (``add_to_input``);
- rotary encodings rotate queries and keys inside every attention layer (``rotate``), so attention scores depend
  only on the distance between frames. Positions restart at 0 in every window.
``none`` does neither and leaves position to the convolutions.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from asr_core.config import ModelConfig


class PositionalEncoding(nn.Module):
    """Identity hooks; subclasses override the one they use."""

    def add_to_input(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, d) -> (B, T, d)."""
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k (B, T, H, D) -> same shapes."""
        return q, k


class NoPositionalEncoding(PositionalEncoding):
    pass


class RotaryEncoding(PositionalEncoding):
    """RoFormer rotation of channel pairs (i, i + D/2) by angle ``pos * theta^(-2i/D)``.

    Angles are computed in float32 (``pos`` reaches 45,000 at one hour of context) and cached per length.
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary encodings need an even head dimension, got {head_dim}")
        self.head_dim = head_dim
        self.theta = theta
        inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self._cache: tuple[int, torch.device, torch.Tensor, torch.Tensor] | None = None

    def cos_sin(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(T, D/2) cosines and sines of the rotation angles for positions 0..T-1."""
        if torch.compiler.is_compiling():  # a compiled layer computes them in its graph (a cache would recompile it)
            ang = torch.outer(torch.arange(length, device=device, dtype=torch.float32), self.inv_freq.to(device))
            return ang.cos(), ang.sin()
        c = self._cache
        if c is None or c[0] < length or c[1] != device:
            pos = torch.arange(length, device=device, dtype=torch.float32)
            ang = torch.outer(pos, self.inv_freq.to(device))
            c = (length, device, ang.cos(), ang.sin())
            self._cache = c
        return c[2][:length], c[3][:length]

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin(q.shape[1], q.device)
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


class SinusoidalEncoding(PositionalEncoding):
    """Vaswani et al. absolute sinusoids added after subsampling."""

    def __init__(self, d_model: int, base: float = 10_000.0) -> None:
        super().__init__()
        self.d_model = d_model
        self.register_buffer("inv_freq", base ** (-torch.arange(0, d_model, 2).float() / d_model), persistent=False)

    def add_to_input(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device, dtype=torch.float32)
        ang = torch.outer(pos, self.inv_freq)
        pe = torch.zeros(x.shape[1], self.d_model, device=x.device)
        pe[:, 0::2] = ang.sin()
        pe[:, 1::2] = ang.cos()[:, : self.d_model // 2]
        return x + pe.to(x.dtype)[None]


class LearnableFourierEncoding(PositionalEncoding):
    """The authors' "sinusoidal" family of paper 000 §4.2 as they ran it (``fourier_pos_enc: true``:
    ``LearnableFourierPosEnc(d_model)`` of ``lcasr/components/positional_encodings.py``, from ESPnet; Li et al.,
    2021): d_model / 2 learnable frequencies ``w`` drawn from N(0, 1/gamma) (gamma = 1), applied to the raw output
    frame index ``t`` (0 at every window's start), ``[cos(t·w), sin(t·w)] / sqrt(d_model)`` added to the subsampled
    input, no MLP and no input scaling. Padding cannot move a frame's position: it follows the frames."""

    def __init__(self, d_model: int, gamma: float = 1.0) -> None:
        super().__init__()
        if d_model % 2:
            raise ValueError(f"learnable Fourier features need an even d_model, got {d_model}")
        self.d_model = d_model
        self.w_r = nn.Parameter(torch.randn(1, d_model // 2) / math.sqrt(gamma))

    def add_to_input(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device, dtype=torch.float32)[:, None]
        ang = pos @ self.w_r.float()
        pe = torch.cat((ang.cos(), ang.sin()), dim=-1) / math.sqrt(self.d_model)
        return x + pe.to(x.dtype)[None]


class FourierEncoding(PositionalEncoding):
    """This project's earlier learnable Fourier variant (not the authors': theirs is
    :class:`LearnableFourierEncoding`): a learnt linear map of the position to F/2 frequencies, cos/sin, then a small
    MLP to d_model. Positions are scaled to seconds-ish units (frame / 100) so initial frequencies cover both short
    and long ranges. Kept so that models trained with it load and run as before."""

    def __init__(self, d_model: int, features: int = 64, hidden: int = 256, gamma: float = 1.0) -> None:
        super().__init__()
        self.proj = nn.Linear(1, features // 2, bias=False)
        nn.init.normal_(self.proj.weight, std=gamma ** -2)
        self.mlp = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, d_model))
        self.scale = 1.0 / math.sqrt(features)

    def add_to_input(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device, dtype=torch.float32)[:, None] / 100.0
        f = self.proj(pos)
        pe = self.mlp(torch.cat((f.cos(), f.sin()), dim=-1) * self.scale)
        return x + pe.to(x.dtype)[None]


REGISTRY: dict[str, Callable[[ModelConfig], PositionalEncoding]] = {
    "rotary": lambda c: RotaryEncoding(c.head_dim, c.rotary_theta),
    "learnable-fourier": lambda c: LearnableFourierEncoding(c.d_model),
    "sinusoidal": lambda c: SinusoidalEncoding(c.d_model),
    "fourier": lambda c: FourierEncoding(c.d_model),
    "none": lambda c: NoPositionalEncoding(),
}


def build_posenc(cfg: ModelConfig) -> PositionalEncoding:
    if cfg.posenc not in REGISTRY:
        raise ValueError(f"unknown positional encoding {cfg.posenc!r}; valid: {', '.join(REGISTRY)}")
    return REGISTRY[cfg.posenc](cfg)
