"""One optimiser step: the step's gradient over its micro-batches (:func:`step_gradients`, with paper 003's
head-diversity loss when :class:`HeadDiversity` asks for it), then the learning rate of the schedule, gradient
clipping and the optimiser's update (:func:`optimizer_step`). The optimiser itself: :func:`build_optimizer`.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from madgrad import MADGRAD

from asr_core.config import DataConfig, TrainConfig
from asr_core.data.batching import MicroBatch, Step
from asr_core.model.acoustic import AcousticModel
from asr_core.model.batchrenorm import MaskedBatchRenorm
from asr_core.model.heads import HeadCapture, head_diversity_loss
from asr_core.schedules import learning_rate, learning_rate_by_recordings
from asr_core.training.loss import pass_loss, step_frames


@dataclass(frozen=True)
class HeadDiversity:
    """Paper 003's auxiliary loss as the trainer adds it (``train.head_diversity_*``): ``weight`` x the diversity
    loss of ``representation`` (:func:`asr_core.model.heads.head_diversity_loss`: eq. 6 summed over layers, mean over
    windows), A over ``rows`` sampled query rows per window."""

    weight: float
    representation: str
    rows: int
    seed: int

    @classmethod
    def of(cls, t: TrainConfig) -> "HeadDiversity | None":
        """The loss of a training config; None when its weight is 0 (training exactly as without it)."""
        if t.head_diversity_weight <= 0:
            return None
        return cls(t.head_diversity_weight, t.head_diversity_repr, t.head_diversity_rows, t.seed)

    def generator(self, step: int) -> torch.Generator:
        """The CPU generator drawing the rows of A at ``step``: a function of (seed, step) only, so a resumed run
        draws what the uninterrupted one would have."""
        digest = hashlib.sha256(f"head-diversity:{self.seed}:{step}".encode()).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


@dataclass(frozen=True)
class StepLoss:
    """What one step's gradient pass logs: ``ctc`` (``train/loss``) and, with the auxiliary loss, ``head_div``
    (``train/head_div_loss``: the diversity loss before its weight, mean over the step's windows)."""

    ctc: float
    head_div: float | None = None


def step_gradients(model: AcousticModel, micro: Sequence[MicroBatch], device: torch.device, bf16: bool, step: int,
                   loss_norm: str = "audio", frames: float = 0.0, head_diversity: HeadDiversity | None = None
                   ) -> StepLoss:
    """Set ``.grad`` of every parameter to the gradient of the whole step's loss; return the losses to log.

    The step's objective is :mod:`asr_core.training.loss` over all ``B`` windows of the step: ``audio`` (the authors') the
    summed CTC loss x 100 / ``frames`` (:func:`asr_core.training.loss.step_frames`), ``tokens`` the mean over windows of
    each window's loss per token. Micro-batch ``m`` of ``B_m`` windows (features (B_m, T_m, F)) runs forward and
    backward on its own and adds its part, so the gradients summed over the passes are the whole-step gradient up
    to float rounding while only one pass's activations are alive at a time. One micro-batch is exactly the
    unsplit step. What accumulation cannot keep: batch renormalisation normalises each pass with that pass's
    statistics and updates its running statistics once per pass. Its r/d warmup is kept on optimiser steps (each
    layer's ``num_batches_tracked`` is set to ``step`` before every pass).
    The model's train/eval modes are the caller's (:func:`asr_core.training.loop.run_loop` sets train mode once).

    ``head_diversity`` (paper 003 eq. 7) adds ``weight`` x the diversity loss of each pass's windows x the pass's
    share ``B_m / B`` of the step, so the term is the step's mean over windows however the step is split. The
    per-head tensors are collected by :class:`asr_core.model.heads.HeadCapture` during the forward pass and the backward
    pass runs after leaving it (activation checkpointing recomputes layers unobserved). A's rows are drawn with
    :meth:`HeadDiversity.generator` of ``step``. Without it nothing else runs: the gradient is bit for bit the one
    of the CTC loss alone.

    Logged: ``tokens`` its objective; ``audio`` the summed loss x 100 per input frame the windows really hold (what
    the authors logged: comparable between full and partial steps). The values are read back from the device here;
    :func:`step_gradient_tensors` leaves them there.
    """
    ctc, head = step_gradient_tensors(model, micro, device, bf16, step, loss_norm, frames, head_diversity)
    return StepLoss(float(ctc), float(head) if head is not None else None)


def step_gradient_tensors(model: AcousticModel, micro: Sequence[MicroBatch], device: torch.device, bf16: bool,
                          step: int, loss_norm: str = "audio", frames: float = 0.0,
                          head_diversity: HeadDiversity | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`step_gradients` without reading anything back to the host: the CTC loss to log and the head-diversity
    loss (None without it) as 0-dim float32 tensors on ``device``. Features and targets go to the device without
    waiting for it, lengths stay on the host (the model and the CTC kernel read them there), so the whole
    forward and backward of every pass is queued without a host synchronisation."""
    if loss_norm == "audio" and frames <= 0:
        raise ValueError("the audio loss normalisation needs the step's frames (asr_core.training.loss.step_frames)")
    total = sum(mb.size for mb in micro)
    renorms = [m for m in model.modules() if isinstance(m, MaskedBatchRenorm)]
    model.zero_grad(set_to_none=True)
    generator = head_diversity.generator(step) if head_diversity is not None else None
    loss_sum = torch.zeros((), device=device)
    head_sum = torch.zeros((), device=device) if head_diversity is not None else None
    for mb in micro:
        for m in renorms:
            m.num_batches_tracked.fill_(step)
        share = mb.size / total
        head: torch.Tensor | None = None
        features = mb.features.to(device, non_blocking=True)
        lengths = mb.lengths.cpu()  # the model moves them; kept here for the loss
        with (HeadCapture(model, (head_diversity.representation,)) if head_diversity is not None
              else contextlib.nullcontext()) as capture:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits, _ = model(features, lengths)
            if head_diversity is not None:
                head = head_diversity_loss(capture.layers, head_diversity.representation,
                                           sample_rows=head_diversity.rows, generator=generator)
        loss = pass_loss(logits, model.output_lengths(lengths), mb.targets, model.blank_id, loss_norm, share,
                         frames)
        if head is None:
            loss.backward()
        else:  # after leaving the capture (see HeadCapture)
            (loss + (head_diversity.weight * share) * head).backward()  # type: ignore[union-attr]
            head_sum = head_sum + head.detach().float() * share  # type: ignore[operator]
        loss_sum = loss_sum + loss.detach().float()
        del logits, loss, head, capture, features  # free this pass's outputs before the next pass allocates
    if loss_norm == "audio":
        real = sum(int(mb.lengths.sum()) for mb in micro)  # host tensors: no synchronisation
        loss_sum = loss_sum * (frames / max(real, 1))
    return loss_sum, head_sum


def accumulate_gradients(model: AcousticModel, micro: Sequence[MicroBatch], device: torch.device, bf16: bool,
                         step: int, loss_norm: str = "audio", frames: float = 0.0) -> float:
    """:func:`step_gradients` of the step's CTC loss alone; returns the loss to log (``train/loss``)."""
    return step_gradients(model, micro, device, bf16, step, loss_norm, frames).ctc


@dataclass(frozen=True)
class LRSchedule:
    """The learning rate of every optimiser step of one run (``train.lr_decay_over``): over ``steps``, a function of
    the step alone; over ``recordings``, of the recordings the stream used before each step's group
    (``recordings_before``, from :meth:`asr_core.data.chunking.WindowStream.step_recordings`), the recordings up to
    the first group started after the warmup (``decay_start``) and the run's recordings (``total_recordings``)."""

    t: TrainConfig
    total_steps: int
    recordings_before: tuple[int, ...] = ()
    decay_start: int = 0
    total_recordings: int = 0

    @classmethod
    def of(cls, t: TrainConfig, total_steps: int, stream=None, n_recordings: int = 0) -> "LRSchedule":
        """The run's schedule; ``stream`` (a WindowStream) and ``n_recordings`` are read for decay over recordings:
        the run's recordings are ``n_recordings * train.epochs`` (with ``train.max_steps``, those its steps use)."""
        if t.lr_decay_over == "steps" or stream is None:
            return cls(t, total_steps)
        before, after = stream.step_recordings(total_steps)
        w = t.warmup_steps
        # the first group that starts once the warmup's steps are done, and the recordings up to its end
        starts = [s for s in range(len(before)) if s >= w and (s == 0 or before[s] != before[s - 1])]
        decay_start = int(after[starts[0]]) if starts else int(after[-1]) if len(after) else 0
        total = int(after[-1]) if t.max_steps and len(after) else n_recordings * t.epochs
        return cls(t, total_steps, tuple(int(b) for b in before), decay_start, total)

    def __call__(self, step: int) -> float:
        t = self.t
        if t.lr_decay_over == "steps" or not self.recordings_before:
            return learning_rate(step, t.lr, t.warmup_steps, self.total_steps)
        before = self.recordings_before[min(step, len(self.recordings_before) - 1)]
        return learning_rate_by_recordings(step, t.lr, t.warmup_steps, before, self.decay_start,
                                           self.total_recordings)


def optimizer_step(model: AcousticModel, opt: torch.optim.Optimizer, batch: Step, step: int, total_steps: int,
                   t: TrainConfig, data: DataConfig, device: torch.device, bf16: bool,
                   head_diversity: HeadDiversity | None = None, lr: float | None = None) -> dict[str, float]:
    """Train optimiser step ``step + 1`` of ``total_steps`` on ``batch``: the schedule's learning rate ``lr``
    (:class:`LRSchedule`; None: :func:`asr_core.schedules.learning_rate` over steps), the step's gradient (:func:`step_gradients`), clipping at
    ``t.grad_clip``, the update. Returns the step's metrics (``train/loss`` is the CTC loss).

    A step whose loss or gradient norm is not finite makes no update: clipping would scale every gradient by
    ``grad_clip / nan`` and the optimiser would write NaN into every weight and its own state (bf16 autocast has no
    loss scaler that would skip it). Its gradients are dropped, the weights, the buffers (batch renormalisation's
    running statistics, which the forward pass already moved towards NaN) and the optimiser's state stay as they
    were, and its metrics carry ``train/update_skipped`` = 1 (the loop counts such steps in a row:
    ``train.max_nonfinite_steps``)."""
    if lr is None:
        lr = learning_rate(step, t.lr, t.warmup_steps, total_steps)
    for g in opt.param_groups:
        g["lr"] = lr
    buffers = [(b, b.detach().clone()) for b in model.buffers()]  # per-channel statistics: small
    ctc, head = step_gradient_tensors(model, batch.micro, device, bf16, step, t.loss_norm,
                                      step_frames(batch.windows, data), head_diversity)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
    # the step's one host synchronisation: whether to update depends on the values
    read = torch.stack([ctc, norm.float()] + ([head] if head is not None else [])).tolist()
    losses = StepLoss(read[0], read[2] if head is not None else None)
    grad_norm = read[1]
    finite = all(math.isfinite(v) for v in read)
    if finite:
        opt.step()
    else:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for b, before in buffers:
                b.copy_(before)
    seq = max((w.seq or w.duration) for w in batch.windows)
    values = {"train/loss": losses.ctc, "train/lr": lr, "train/seq_len_s": seq,
              "train/batch_size": float(batch.size), "train/grad_norm": grad_norm,
              "train/micro_batches": float(len(batch.micro))}
    if not finite:
        values["train/update_skipped"] = 1.0
    if losses.head_div is not None:
        values["train/head_div_loss"] = losses.head_div
    return values


def build_optimizer(model: torch.nn.Module, t: TrainConfig) -> torch.optim.Optimizer:
    """The paper's Madgrad, or AdamW (betas ``(momentum, 0.98)``) where ``train.optimizer`` asks for it."""
    if t.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=t.lr, betas=(t.momentum, 0.98), eps=t.eps,
                                 weight_decay=t.weight_decay)
    return MADGRAD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay, eps=t.eps)
