"""CTC output head, SC-CTC self-conditioning (Nozaki & Komatsu, 2021) and the CTC loss.

Self-conditioning without intermediate losses (paper 000 §3.2): after every layer but the last, the shared output
head's posterior ``softmax(W h)`` is projected back to d_model by one shared linear map and added to the hidden
state; only the final layer's CTC loss is trained. The blank is the last output id (``vocab_size - 1``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CTCHead(nn.Module):
    """(B, T, d) -> logits (B, T, V)."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class SelfConditioning(nn.Module):
    """x (B, T, d), logits (B, T, V), mask (B, T) -> x + Linear(softmax(logits)), zero on padded frames."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        self.back = nn.Linear(vocab_size, d_model)

    def forward(self, x: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        cond = self.back(logits.float().softmax(dim=-1).to(x.dtype))
        return x + cond * mask[:, :, None].to(x.dtype)


def ctc_loss(logits: torch.Tensor, out_lengths: torch.Tensor, targets: list[list[int]], blank: int) -> torch.Tensor:
    """Mean over recordings of the per-token CTC loss. logits (B, T, V); targets one id list per recording.

    Computed in float32 whatever the autocast precision. Windows whose targets cannot fit their frames give 0
    (``zero_infinity``) instead of poisoning the step.
    """
    logp = F.log_softmax(logits.float(), dim=-1).transpose(0, 1)  # (T, B, V)
    flat = torch.tensor([t for seq in targets for t in seq], dtype=torch.long, device=logits.device)
    tlen = torch.tensor([len(seq) for seq in targets], dtype=torch.long, device=logits.device)
    return F.ctc_loss(logp, flat, out_lengths, tlen, blank=blank, reduction="mean", zero_infinity=True)
