"""The FastConformer-CTC acoustic model: ``build_model(ModelConfig) -> AcousticModel``.

features (B, T, n_mels) -> 8x depthwise-separable subsampling -> absolute position (if any) -> N Conformer layers
with SC-CTC self-conditioning between them -> shared CTC head -> logits (B, ceil(T/8), V), blank = V - 1.

The shared head (:class:`asr_core.model.ctc.CTCHead`) is [LayerNorm if ``model.decoder_norm``] then Linear, and serves
both the self-conditioning posteriors after every layer but the last and the final logits (the code's
``decoder(x)``, ``lcasr/models/sconformer_xl.py``); the final logits take the norm twice, as the code's default
``legasee_double_norm`` does (:meth:`asr_core.model.ctc.CTCHead.final`). Feed-forward activation and biases (``model.ff_activation``,
``model.ff_bias``) are in :mod:`asr_core.model.conformer`, the batch renorm schedule in :mod:`asr_core.model.batchrenorm`.
Sizes with the defaults: main 89.9M, 9L-768 130.7M, 3L-2048-16H (512 subsampling channels) 317.4M parameters (paper: ~90M, 130M, 315M).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from asr_core.model.batchrenorm import recompute_context
from asr_core.config import ModelConfig
from asr_core.model.conformer import ConformerLayer
from asr_core.model.ctc import CTCHead, SelfConditioning
from asr_core.model.posenc import build_posenc
from asr_core.model.receptive import FRAMES_PER_SECOND, span_frames
from asr_core.model.subsampling import DepthwiseSeparableSubsampling, time_mask


class AcousticModel(nn.Module):
    """``frames_per_second``: the features' rate (``data.features.frames_per_second``), which turns
    ``model.attention_span_s`` into frames (:func:`asr_core.model.receptive.span_frames`)."""

    def __init__(self, cfg: ModelConfig, n_mels: int = 80, frames_per_second: float = FRAMES_PER_SECOND) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = cfg.vocab_size
        self.blank_id = cfg.vocab_size - 1
        self.subsampling_factor = cfg.subsampling_factor
        self.subsampling = DepthwiseSeparableSubsampling(n_mels, cfg.subsampling_channels, cfg.d_model,
                                                         cfg.subsampling_factor)
        self.posenc = build_posenc(cfg)
        self.span = span_frames(cfg, frames_per_second)
        self.layers = nn.ModuleList(ConformerLayer(cfg, self.posenc, self.span) for _ in range(cfg.layers))
        self.head = CTCHead(cfg.d_model, cfg.vocab_size, cfg.decoder_norm)
        self.self_conditioning = SelfConditioning(cfg.d_model, cfg.vocab_size) if cfg.self_conditioning else None
        self.activation_checkpointing = cfg.activation_checkpointing

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """(B,) input frames -> (B,) output frames, ceil(L / subsampling_factor)."""
        return self.subsampling.output_lengths(lengths)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features (B, T, n_mels) float, lengths (B,) long -> logits (B, T', V), out_lengths (B,).

        ``lengths`` may stay on the host when ``features`` are on a GPU (the trainer passes them so): whether the
        batch is padded is then worked out there, once, and no layer reads a device value back to the host. Lengths
        on the device cost one synchronisation per forward."""
        if lengths.device != features.device:
            full = bool((self.output_lengths(lengths) >= self.output_lengths(lengths.new_tensor([features.shape[1]])))
                        .all())
            lengths = lengths.to(features.device, non_blocking=True)
        else:
            full = None
        x, out_lengths = self.subsampling(features, lengths)
        mask = time_mask(out_lengths, x.shape[1])
        if full is None:
            full = bool(mask.all())
        x = self.posenc.add_to_input(x) * mask[:, :, None].to(x.dtype)
        for i, layer in enumerate(self.layers):
            if self.activation_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, mask, out_lengths, full, use_reentrant=False, context_fn=recompute_context)
            else:
                x = layer(x, mask, out_lengths, full)
            if self.self_conditioning is not None and i < len(self.layers) - 1:
                x = self.self_conditioning(x, self.head(x), mask)
        return self.head.final(x), out_lengths


def build_model(cfg: ModelConfig, n_mels: int = 80, frames_per_second: float = FRAMES_PER_SECOND) -> AcousticModel:
    """A freshly initialised model; seed torch beforehand for reproducible weights."""
    return AcousticModel(cfg, n_mels, frames_per_second)


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Trainable parameters per top-level module (layers listed one by one) plus ``total``."""
    out: dict[str, int] = {}
    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList):
            for i, sub in enumerate(child):
                out[f"{name}.{i}"] = sum(p.numel() for p in sub.parameters())
        else:
            out[name] = sum(p.numel() for p in child.parameters())
    out["total"] = sum(p.numel() for p in model.parameters())
    return out
