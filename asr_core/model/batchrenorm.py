"""Batch renormalisation (Ioffe, 2017) over valid frames only (paper 000 §3.2).

Training normalises with the batch statistics and corrects them towards the running statistics:
``y = (x - mu_B) / sigma_B * r + d`` with ``r = clip(sigma_B / sigma, 1/r_max, r_max)`` and
``d = clip((mu_B - mu) / sigma, -d_max, d_max)`` (no gradient through r, d). eps 1e-3 and momentum 0.01 are the
code's (``lcasr/components/batchrenorm.py``; the paper names batch renormalisation but gives no values).

How ``r_max`` and ``d_max`` grow with ``n`` = ``num_batches_tracked`` (training forwards, which the trainer sets to
the optimiser step) is ``model.batch_renorm_schedule``, scaled by W = ``model.batch_renorm_warmup_steps``:

- ``"code"`` (default; the authors' code, ``lcasr/components/batchrenorm.py`` properties ``rmax``/``dmax``):
  plain batch norm (r_max = 1, d_max = 0, so r = 1 and d = 0) until n = W/8, then r_max rises linearly 1 -> 3 from
  W/8 to W and d_max 0 -> 5 from W/8 to 5W/8. At W = 40,000 (the default) this is exactly the code's hard-coded
  ``rmax = clamp(2/35000 n + 25/35, 1, 3)`` and ``dmax = clamp(5/20000 n - 25/20, 0, 5)``: 5k, 40k and 25k.
- ``"linear"`` (the project's earlier reading): r_max 1 -> 3 and d_max 0 -> 5 both linearly from 0 to W.

W = 0 means r_max = 3, d_max = 5 from the first forward under either schedule.

Two departures from that code, both deliberate: the statistics are taken over the valid frames only (the code lets
padded frames in), so a padded batch gives the same outputs and the same running statistics as the same recordings
unpadded; and eps is added to the variance with a running variance kept (the code adds eps to the standard deviation
and keeps a running standard deviation).

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


SCHEDULES = ("code", "linear")


def _ramp(n: float | torch.Tensor, start: float, end: float) -> float | torch.Tensor:
    """0 before ``start``, 1 from ``end``, linear in between (``n`` a number, or a 0-dim float64 tensor)."""
    x = (n - start) / (end - start)
    return x.clamp(0.0, 1.0) if isinstance(x, torch.Tensor) else min(max(x, 0.0), 1.0)


def renorm_limits(n: int | torch.Tensor, warmup_steps: int, schedule: str = "code"
                  ) -> tuple[float | torch.Tensor, float | torch.Tensor]:
    """(r_max, d_max) after ``n`` training forwards under ``schedule`` scaled by ``warmup_steps`` = W.

    ``code``: r_max 1 -> 3 over [W/8, W], d_max 0 -> 5 over [W/8, 5W/8] (plain batch norm up to W/8);
    ``linear``: both over [0, W]. W = 0: (3, 5) at once. ``n`` may be a 0-dim float64 tensor on the model's device
    (the training forward's own counter): the limits are then tensors computed there, in the same float64
    arithmetic, so training never reads the counter back to the host."""
    w = warmup_steps
    if w == 0:
        return 3.0, 5.0
    if schedule == "code":
        start = w / 8
        return 1.0 + 2.0 * _ramp(n, start, w), 5.0 * _ramp(n, start, 5 * w / 8)
    if schedule == "linear":
        frac = _ramp(n, 0.0, w)
        return 1.0 + 2.0 * frac, 5.0 * frac
    raise ValueError(f"unknown batch renorm schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")


class MaskedBatchRenorm(nn.Module):
    """Normalises channels of (B, T, C) over the frames where ``mask`` (B, T) is True."""

    def __init__(self, channels: int, eps: float = 1e-3, momentum: float = 0.01, warmup_steps: int = 40_000,
                 schedule: str = "code") -> None:
        super().__init__()
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown batch renorm schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
        if warmup_steps < 0:
            raise ValueError(f"batch renorm warmup_steps must be >= 0, got {warmup_steps}")
        self.eps = eps
        self.momentum = momentum
        self.warmup_steps = warmup_steps
        self.schedule = schedule
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))
        self.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.long))
        self._replay: list[tuple[torch.Tensor, torch.Tensor]] = []

    def limits(self) -> tuple[float, float]:
        """(r_max, d_max) at the current number of training forwards (see the module docstring)."""
        return renorm_limits(int(self.num_batches_tracked), self.warmup_steps, self.schedule)

    def correction(self, mean: torch.Tensor, var: torch.Tensor, std: torch.Tensor, n: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """(r, d) of one training forward from its batch statistics (C,) (no gradient through them), and the running
        statistics moved towards those statistics, ``num_batches_tracked`` counted up; replayed in a recomputation
        (see :func:`recompute_context`).

        A compiled model runs this uncompiled (:func:`asr_core.training.compile.compile_model`): a compiled graph
        that moves the running statistics in place may recompute (r, d) for the backward pass from the statistics
        already moved, which gives other gradients (tests/test_compile.py); computed here, (r, d) reach the graph
        as inputs."""
        if _MODE[0] == "replay":
            return self._replay.pop(0)
        with torch.no_grad():  # the limits as device tensors: no host synchronisation in training
            r_max, d_max = renorm_limits(self.num_batches_tracked.double(), self.warmup_steps, self.schedule)
            run_std = (self.running_var + self.eps).sqrt()
            r = (std / run_std).clamp(1.0 / r_max, r_max)
            d = ((mean - self.running_mean) / run_std).clamp(-d_max, d_max)
            unbiased = var * n / (n - 1).clamp_min(1.0)
            self.running_mean.add_(self.momentum * (mean - self.running_mean))
            self.running_var.add_(self.momentum * (unbiased - self.running_var))
            self.num_batches_tracked.add_(1)
        if _MODE[0] == "record":
            self._replay.append((r, d))
        return r, d

    def forward(self, x: torch.Tensor, mask: torch.Tensor, full: bool | None = None) -> torch.Tensor:
        """x (B, T, C), mask (B, T) bool -> (B, T, C), zero on padded frames. ``full``: whether ``mask`` is all True,
        when the caller knows it (:class:`asr_core.model.acoustic.AcousticModel` works it out once per forward on the
        host); None reads it from ``mask``, a host synchronisation on a GPU."""
        if full is None:
            full = bool(mask.all())
        m = None if full else mask[:, :, None].to(torch.float32)
        xf = x.float()
        if self.training:
            if m is None:
                n = xf.new_full((), float(mask.numel()))  # a fill on the device, not a copy from the host
                var, mean = torch.var_mean(xf, dim=(0, 1), correction=0)
            else:
                n = m.sum().clamp_min(1.0)
                mean = (xf * m).sum(dim=(0, 1)) / n
                var = (((xf - mean) * m) ** 2).sum(dim=(0, 1)) / n
            std = (var + self.eps).sqrt()
            r, d = self.correction(mean.detach(), var.detach(), std.detach(), n)
            y = (xf - mean) / std * r + d
        else:
            y = (xf - self.running_mean) / (self.running_var + self.eps).sqrt()
        y = y * self.weight + self.bias
        return (y if m is None else y * m).to(x.dtype)
