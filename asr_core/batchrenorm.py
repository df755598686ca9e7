"""Batch renormalisation (Ioffe, 2017) over valid frames only (paper 000 §3.2).

Training normalises with the batch statistics and corrects them towards the running statistics:
``y = (x - mu_B) / sigma_B * r + d`` with ``r = clip(sigma_B / sigma, 1/r_max, r_max)`` and
``d = clip((mu_B - mu) / sigma, -d_max, d_max)`` (no gradient through r, d). ``r_max`` ramps 1 -> 3 and
``d_max`` 0 -> 5 linearly over ``warmup_steps`` training forwards, as in the authors' code (eps 1e-3,
momentum 0.01). Unlike that code, the statistics are taken over the valid frames only, so a padded batch gives the
same outputs and the same running statistics as the same recordings unpadded.

Activation checkpointing re-runs the forward pass during backward. That second pass must neither update the
running statistics again nor see the updated ones, so :func:`recompute_context` lets
``torch.utils.checkpoint`` record (r, d) in the first pass and replay them in the recomputation.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

_MODE: list[str] = ["normal"]  # "normal" | "record" | "replay"


@contextlib.contextmanager
def _mode(name: str) -> Iterator[None]:
    prev = _MODE[0]
    _MODE[0] = name
    try:
        yield
    finally:
        _MODE[0] = prev


def recompute_context() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """``context_fn`` for ``torch.utils.checkpoint.checkpoint``: record in the forward, replay in the recompute."""
    return _mode("record"), _mode("replay")


class MaskedBatchRenorm(nn.Module):
    """Normalises channels of (B, T, C) over the frames where ``mask`` (B, T) is True."""

    def __init__(self, channels: int, eps: float = 1e-3, momentum: float = 0.01, warmup_steps: int = 25_000) -> None:
        super().__init__()
        self.eps = eps
        self.momentum = momentum
        self.warmup_steps = warmup_steps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))
        self.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.long))
        self._replay: list[tuple[torch.Tensor, torch.Tensor]] = []

    def limits(self) -> tuple[float, float]:
        """(r_max, d_max) at the current number of training forwards."""
        if self.warmup_steps == 0:
            return 3.0, 5.0
        frac = min(float(self.num_batches_tracked) / self.warmup_steps, 1.0)
        return 1.0 + 2.0 * frac, 5.0 * frac

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, T, C), mask (B, T) bool -> (B, T, C), zero on padded frames."""
        full = bool(mask.all())
        m = None if full else mask[:, :, None].to(torch.float32)
        xf = x.float()
        if self.training:
            if m is None:
                n = torch.tensor(float(mask.numel()), device=x.device)
                var, mean = torch.var_mean(xf, dim=(0, 1), correction=0)
            else:
                n = m.sum().clamp_min(1.0)
                mean = (xf * m).sum(dim=(0, 1)) / n
                var = (((xf - mean) * m) ** 2).sum(dim=(0, 1)) / n
            std = (var + self.eps).sqrt()
            if _MODE[0] == "replay":
                r, d = self._replay.pop(0)
            else:
                with torch.no_grad():
                    r_max, d_max = self.limits()
                    run_std = (self.running_var + self.eps).sqrt()
                    r = (std.detach() / run_std).clamp(1.0 / r_max, r_max)
                    d = ((mean.detach() - self.running_mean) / run_std).clamp(-d_max, d_max)
                    unbiased = var.detach() * n / (n - 1).clamp_min(1.0)
                    self.running_mean.add_(self.momentum * (mean.detach() - self.running_mean))
                    self.running_var.add_(self.momentum * (unbiased - self.running_var))
                    self.num_batches_tracked.add_(1)
                if _MODE[0] == "record":
                    self._replay.append((r, d))
            y = (xf - mean) / std * r + d
        else:
            y = (xf - self.running_mean) / (self.running_var + self.eps).sqrt()
        y = y * self.weight + self.bias
        return (y if m is None else y * m).to(x.dtype)
