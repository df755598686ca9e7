"""CTC output head and SC-CTC self-conditioning (Nozaki & Komatsu, 2021); the loss is :mod:`asr_core.training.loss`.

The head is ``Linear(d_model, V)``, preceded by a LayerNorm(d_model) when ``model.decoder_norm`` is on (the
default: the code's ``decoder_norm: true`` in every paper config, ``lcasr/components/decoder.py``
``ASRLinearSCDecoder``, whose norm lives inside the decoder; the paper is silent). Because the norm is part of the
head, it applies both to the final logits and to the self-conditioning posteriors, as in the code, where
``decoder(x)`` computes both. The code's ``legasee_double_norm`` (default true, not set in its paper configs;
``lcasr/models/sconformer_xl.py`` lines 62, 246-247) applies that same norm a second time before the final logits
only, ``ff(norm(norm(x)))``: :meth:`CTCHead.final` does the same.

Self-conditioning without intermediate losses (paper 000 §3.2): after every layer but the last, the shared output
head's posterior ``softmax(head(h))`` is projected back to d_model by one shared linear map and added to the hidden
state; only the final layer's CTC loss is trained. The blank is the last output id (``vocab_size - 1``).
"""

from __future__ import annotations

import torch
from torch import nn


class CTCHead(nn.Module):
    """(B, T, d) -> logits (B, T, V): ``proj(norm(x))``, ``norm`` a LayerNorm when ``norm`` is True, else absent."""

    def __init__(self, d_model: int, vocab_size: int, norm: bool = True) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model) if norm else None
        self.proj = nn.Linear(d_model, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x if self.norm is None else self.norm(x))

    def final(self, x: torch.Tensor) -> torch.Tensor:
        """The final layer's logits: the norm twice, as the code's ``legasee_double_norm`` (once without a norm)."""
        return self(x if self.norm is None else self.norm(x))


class SelfConditioning(nn.Module):
    """x (B, T, d), logits (B, T, V), mask (B, T) -> x + Linear(softmax(logits)), zero on padded frames."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        self.back = nn.Linear(vocab_size, d_model)

    def forward(self, x: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        cond = self.back(logits.float().softmax(dim=-1).to(x.dtype))
        return x + cond * mask[:, :, None].to(x.dtype)
