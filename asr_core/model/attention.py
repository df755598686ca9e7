"""Multi-head self-attention over variable-length recordings.

Two kernels compute the same thing:
- flash-attn's variable-length kernel (``flash_attn_varlen_func``) when the package is installed and the tensors
  are on CUDA: valid frames of all recordings are packed into one (total, H, D) tensor with ``cu_seqlens``, so
  padding is never computed at all and memory grows linearly with context (paper 000 Table 1);
- PyTorch's ``scaled_dot_product_attention`` otherwise, with a key-padding mask only when the batch is padded
  (unpadded batches, e.g. one long recording, take the mask-free fused path).
Padded query rows are zeroed on the way out, so padding never reaches the output.

With a band (``span``, ``model.attention_span_s`` in output frames, :mod:`asr_core.model.receptive`) a frame attends
to frames ``|i - j| <= span`` only: flash-attn's local window (``window_size=(span, span)``), or SDPA over blocks of
:data:`BAND_BLOCK` queries, each against the keys its band can reach, so memory grows with the window, not its
square. Keys beyond the band get exactly zero weight: audio there cannot move the frame at all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from asr_core.model.posenc import PositionalEncoding

try:  # optional: only builds on CUDA machines (pyproject extra "cuda")
    from flash_attn import flash_attn_varlen_func as _flash_varlen
except Exception:  # ImportError, or a broken CUDA build
    _flash_varlen = None


BAND_BLOCK = 512  # queries per SDPA call of a banded attention


def flash_available() -> bool:
    return _flash_varlen is not None


def banded_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, span: int, mask: torch.Tensor | None,
                block: int = BAND_BLOCK) -> torch.Tensor:
    """SDPA with frame ``i`` attending to frames ``|i - j| <= span``; q, k, v (B, H, T, D) -> (B, H, T, D).

    ``mask`` (B, T) True on valid frames, or None when none is padded. Valid queries attend to valid keys in their
    band (themselves at least); padded queries to their whole band, so no row is empty (their output is zeroed by
    the caller). Queries go in blocks of ``block``, each against keys ``[start - span, end + span)``."""
    t = q.shape[2]
    pos = torch.arange(t, device=q.device)
    outs = []
    for a in range(0, t, block):
        b = min(t, a + block)
        ka, kb = max(0, a - span), min(t, b + span)
        allowed = (pos[a:b, None] - pos[None, ka:kb]).abs() <= span  # (bq, bk)
        if mask is None:
            attn_mask = allowed[None, None]
        else:
            keys = mask[:, None, ka:kb] | ~mask[:, a:b, None]  # (B, bq, bk): padded queries see every key
            attn_mask = (allowed[None] & keys)[:, None]
        outs.append(F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, ka:kb], v[:, :, ka:kb],
                                                   attn_mask=attn_mask))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


class SelfAttention(nn.Module):
    """x (B, T, d) with valid-frame mask (B, T) -> (B, T, d)."""

    def __init__(self, d_model: int, heads: int, posenc: PositionalEncoding, backend: str = "auto",
                 span: int | None = None) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
        if backend not in ("auto", "sdpa", "flash"):
            raise ValueError(f"unknown attention backend {backend!r}; valid: auto, sdpa, flash")
        self.heads = heads
        self.head_dim = d_model // heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.posenc = [posenc]  # a list so the shared encoding is not registered once per layer
        self.backend = backend
        self.span = span  # attention band in frames each side (None: the whole window)

    def _use_flash(self, x: torch.Tensor) -> bool:
        if self.backend == "sdpa":
            return False
        ok = _flash_varlen is not None and x.is_cuda
        if self.backend == "flash" and not ok:
            raise RuntimeError("model.attention_backend='flash' needs the flash-attn package and CUDA tensors; "
                               "install the 'cuda' extra or use attention_backend='auto'")
        return ok

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor,
                full: bool | None = None) -> torch.Tensor:
        """``full``: whether ``mask`` is all True, when the caller knows it (None: read from ``mask``, a host
        synchronisation on a GPU)."""
        b, t, d = x.shape
        if full is None:
            full = bool(mask.all())
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).unbind(2)  # each (B, T, H, D)
        q, k = self.posenc[0].rotate(q, k)
        if self._use_flash(x):
            out = self.flash(q, k, v, mask, lengths)
        else:
            out = self._sdpa(q, k, v, mask, full)
        out = self.out(out.reshape(b, t, d))
        return out if full else out * mask[:, :, None].to(out.dtype)

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
              full: bool) -> torch.Tensor:
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # (B, H, T, D)
        if self.span is not None:
            return banded_sdpa(q, k, v, self.span, None if full else mask).transpose(1, 2)
        attn_mask = None if full else mask[:, None, None, :]  # True = may attend
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return out.transpose(1, 2)  # (B, T, H, D)

    def flash(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
              lengths: torch.Tensor) -> torch.Tensor:
        """flash-attn's variable-length kernel over the packed valid frames; (B, T, H, D) in and out. A compiled
        model calls it uncompiled (:func:`asr_core.training.compile.compile_model`): the kernel is opaque to the
        compiler."""
        b, t, h, dh = q.shape
        idx = mask.reshape(-1).nonzero(as_tuple=True)[0]
        dtype = q.dtype if q.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
        pack = [z.reshape(b * t, h, dh).index_select(0, idx).to(dtype) for z in (q, k, v)]
        cu = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
        window = (-1, -1) if self.span is None else (self.span, self.span)  # flash-attn's local (banded) attention
        out = _flash_varlen(pack[0], pack[1], pack[2], cu, cu, int(lengths.max()), int(lengths.max()),
                            window_size=window)
        full = out.new_zeros(b * t, h, dh)
        full.index_copy_(0, idx, out)
        return full.view(b, t, h, dh).to(q.dtype)
