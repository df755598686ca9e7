"""The training objective of one optimiser step: CTC summed over the step's windows, normalised one of two ways
(``train.loss_norm``).

* ``audio`` (default; the authors' ``exp/train.py``): ``CTCLoss(reduction='sum')`` over the windows of the step,
  divided by ``window frames x B`` (the step's window length in input frames times the group size B it was made
  for, :func:`asr_core.data.chunking.group_size`) and multiplied by 100: about nats per second of audio the step was
  made for. A step with fewer windows (the last steps of an interleaved group) weighs less, and a window counts by
  its audio, not by how many words it holds.
* ``tokens``: the mean over windows of each window's loss per target token (``reduction='mean'``): every window
  weighs the same, so windows with few words weigh more per word.

Both are computed in float32 whatever the autocast precision; windows whose targets cannot fit their frames give 0
(``zero_infinity``). With gradient accumulation each pass adds its part: ``audio`` divides every pass by the same
constant, ``tokens`` scales each pass's mean by its share of the step's windows, so the passes sum to the step.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from asr_core.data.chunking import Window, group_size
from asr_core.config import DataConfig

LOSS_SCALE = 100.0  # exp/train.py: (loss / (chunk_size * batch_size)) * 100


def _ctc(logits: torch.Tensor, out_lengths: torch.Tensor, targets: list[list[int]], blank: int,
         reduction: str) -> torch.Tensor:
    logp = F.log_softmax(logits.float(), dim=-1).transpose(0, 1)  # (T, B, V)
    # targets go to the device without waiting for it; lengths stay on the host, where the CTC kernel reads them
    # (lengths on a GPU would be copied back, a host synchronisation in the middle of the step)
    flat = torch.tensor([t for seq in targets for t in seq], dtype=torch.long).to(logits.device, non_blocking=True)
    tlen = torch.tensor([len(seq) for seq in targets], dtype=torch.long)
    return F.ctc_loss(logp, flat, out_lengths, tlen, blank=blank, reduction=reduction, zero_infinity=True)


def ctc_loss(logits: torch.Tensor, out_lengths: torch.Tensor, targets: list[list[int]], blank: int) -> torch.Tensor:
    """Mean over windows of the per-token CTC loss (``tokens``). logits (B, T, V); one id list per window."""
    return _ctc(logits, out_lengths, targets, blank, "mean")


def ctc_loss_sum(logits: torch.Tensor, out_lengths: torch.Tensor, targets: list[list[int]], blank: int
                 ) -> torch.Tensor:
    """CTC loss summed over windows, in nats. logits (B, T, V); one id list per window."""
    return _ctc(logits, out_lengths, targets, blank, "sum")


def step_frames(windows: Sequence[Window], data: DataConfig) -> float:
    """``window frames x B`` of the step: what ``audio`` divides the summed loss by (before the x100).

    The window length is the one the step was cut at (its windows' ``seq``; the longest window if unknown),
    in input frames (``data.features`` frames per second), and B the group size for it."""
    seq = max((w.seq or w.duration) for w in windows)
    return round(seq * data.features.frames_per_second) * group_size(seq, data)


def pass_loss(logits: torch.Tensor, out_lengths: torch.Tensor, targets: list[list[int]], blank: int, norm: str,
              share: float, frames: float) -> torch.Tensor:
    """One forward pass's part of the step objective: ``audio`` sum x 100 / ``frames``; ``tokens`` the pass's
    mean x ``share`` (its windows / the step's windows)."""
    if norm == "audio":
        return ctc_loss_sum(logits, out_lengths, targets, blank) * (LOSS_SCALE / frames)
    if norm == "tokens":
        return ctc_loss(logits, out_lengths, targets, blank) * share
    raise ValueError(f"unknown train.loss_norm {norm!r}; valid: audio, tokens")
