"""One Conformer layer (Gulati et al., 2020) as used in paper 000 §3.2.

Pre-LayerNorm residual blocks in macaron order: half-step feed-forward, self-attention, convolution module,
half-step feed-forward, final LayerNorm. No dropout (the paper trains one epoch without regularisation; the code's
configs set every dropout to 0).

Feed-forward modules (macaron, x0.5): LN, Linear d -> e*d, activation, Linear e*d -> d, with
- ``model.ff_activation``: ``"gelu_tanh"`` (default; the code: ``lcasr/components/fused_dense.py`` ``FusedMLP``
  with ``activation='gelu_approx'``, i.e. ``GELU(approximate='tanh')``) or ``"silu"`` (Swish, as the Conformer
  paper and the project's earlier reading);
- ``model.ff_bias``: biases of both linears; default off (the code: ``bias_in_ff: false`` in every paper config,
  passed as ``bias1``/``bias2`` of ``FusedMLP``).
The expansion e is ``model.ff_expansion`` (4: paper and code, where ``FusedMLP`` hard-codes ``4 * d``).

The convolution module is pointwise d -> 2d, GLU, depthwise (kernel 9), batch renormalisation
(:mod:`asr_core.model.batchrenorm`, schedule ``model.batch_renorm_schedule``), SiLU, pointwise d -> d (SiLU here is the
code's ``ConformerConvolution`` and the paper's; ``model.ff_activation`` does not touch it).

Every block's output is zeroed on padded frames and the depthwise convolution's input is masked first, so a padded
batch never mixes padding into valid frames.
"""

from __future__ import annotations

import torch
from torch import nn

from asr_core.model.attention import SelfAttention
from asr_core.model.batchrenorm import MaskedBatchRenorm
from asr_core.config import ModelConfig
from asr_core.model.posenc import PositionalEncoding


def ff_activation(name: str) -> nn.Module:
    """The feed-forward activation named by ``model.ff_activation``."""
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "silu":
        return nn.SiLU()
    raise ValueError(f"unknown feed-forward activation {name!r}; valid: gelu_tanh, silu")


class FeedForward(nn.Module):
    """LN, d -> e*d, activation, e*d -> d. (B, T, d) -> (B, T, d)."""

    def __init__(self, d_model: int, expansion: int, activation: str = "gelu_tanh", bias: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, expansion * d_model, bias=bias)
        self.act = ff_activation(activation)
        self.down = nn.Linear(expansion * d_model, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(self.norm(x))))


class ConvModule(nn.Module):
    """(B, T, d) with mask (B, T) -> (B, T, d)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.norm = nn.LayerNorm(d)
        self.pointwise_in = nn.Linear(d, 2 * d)
        self.glu = nn.GLU(dim=-1)
        self.depthwise = nn.Conv1d(d, d, cfg.conv_kernel, padding=cfg.conv_kernel // 2, groups=d,
                                   bias=False)  # batch renorm follows: a bias would cancel
        self.norm_bn = MaskedBatchRenorm(d, cfg.batch_renorm_eps, cfg.batch_renorm_momentum,
                                         cfg.batch_renorm_warmup_steps, cfg.batch_renorm_schedule)
        self.act = nn.SiLU()
        self.pointwise_out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, fmask: torch.Tensor | None) -> torch.Tensor:
        h = self.glu(self.pointwise_in(self.norm(x)))
        if fmask is not None:
            h = h * fmask  # mask before the depthwise convolution
        h = self.depthwise(h.transpose(1, 2)).transpose(1, 2)
        h = self.act(self.norm_bn(h, mask, fmask is None))
        h = self.pointwise_out(h)
        return h if fmask is None else h * fmask


class ConformerLayer(nn.Module):
    """(B, T, d), mask (B, T), lengths (B,) -> (B, T, d), zero on padded frames; ``span``: the attention band in
    frames each side (None: the whole window; :mod:`asr_core.model.receptive`).

    ``full`` says whether ``mask`` is all True (no window of the batch is padded); :class:`asr_core.model.acoustic.
    AcousticModel` works it out once per forward on the host, so no layer reads a device value back (None: read
    here from ``mask``)."""

    def __init__(self, cfg: ModelConfig, posenc: PositionalEncoding, span: int | None = None) -> None:
        super().__init__()
        self.ff1 = FeedForward(cfg.d_model, cfg.ff_expansion, cfg.ff_activation, cfg.ff_bias)
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.attn = SelfAttention(cfg.d_model, cfg.heads, posenc, cfg.attention_backend, span)
        self.conv = ConvModule(cfg)
        self.ff2 = FeedForward(cfg.d_model, cfg.ff_expansion, cfg.ff_activation, cfg.ff_bias)
        self.out_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor,
                full: bool | None = None) -> torch.Tensor:
        if full is None:
            full = bool(mask.all())
        # an unpadded batch (one long recording, or windows of equal length) skips every masking multiply
        fmask = None if full else mask[:, :, None].to(x.dtype)
        x = x + 0.5 * self.ff1(x) if fmask is None else torch.addcmul(x, self.ff1(x), fmask, value=0.5)
        x = x + self.attn(self.attn_norm(x), mask, lengths, full)
        x = x + self.conv(x, mask, fmask)
        x = x + 0.5 * self.ff2(x) if fmask is None else torch.addcmul(x, self.ff2(x), fmask, value=0.5)
        x = self.out_norm(x)
        return x if fmask is None else x * fmask
