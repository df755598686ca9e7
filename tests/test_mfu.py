"""Model FLOP utilisation (asr_core.bench.mfu): the FLOP count of a layer stack against torch's FLOP counter, the
peak table, and the arithmetic."""

from __future__ import annotations

import math

import pytest
import torch

from asr_core.bench.mfu import (FORWARD_BACKWARD, cpu_matmul_peak, device_peak, gpu_peak, mfu, stack_flops,
                                step_flops)


def test_stack_flops_agree_with_the_flop_counter(monkeypatch) -> None:
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from asr_core.config import ModelConfig
    from asr_core.model.acoustic import build_model
    from asr_core.model.subsampling import time_mask

    def math_sdpa(q, k, v, attn_mask=None):  # plain products, which the counter sees
        w = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        if attn_mask is not None:
            w = w.masked_fill(~attn_mask, float("-inf"))
        return w.softmax(-1) @ v

    monkeypatch.setattr(F, "scaled_dot_product_attention", math_sdpa)
    cfg = ModelConfig(d_model=64, layers=2, heads=2, vocab_size=32, ff_expansion=4, conv_kernel=9)
    model = build_model(cfg).eval()
    frames, batch = 48, 2
    x = torch.randn(batch, frames, 64)
    lengths = torch.tensor([frames] * batch)
    mask = time_mask(lengths, frames)
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        h = x
        for layer in model.layers:
            h = layer(h, mask, lengths)
    want = stack_flops(64, 2, 4, 9, batch * frames, frames) / FORWARD_BACKWARD
    assert fc.get_total_flops() == pytest.approx(want, rel=0.02)


def test_the_peak_table_knows_the_lent_gpus_and_says_when_it_does_not() -> None:
    assert gpu_peak("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert gpu_peak("NVIDIA H100 PCIe", "bf16") == 756e12  # the PCIe card before the SXM one
    assert gpu_peak("NVIDIA H200", "bf16") == 989e12 and gpu_peak("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert gpu_peak("NVIDIA GeForce GTX 1080", "bf16") is None and gpu_peak("Tesla V100-SXM2", "bf16") is None
    peak, source = device_peak("cpu", "fp32")
    assert peak and peak > 1e8 and "measured" in source
    assert cpu_matmul_peak(256, 1) > 0


def test_utilisation_is_model_flops_per_second_over_the_peak() -> None:
    flops = step_flops(1e9, 1e6, audio_s=10.0, window_s=5.0)
    assert flops == FORWARD_BACKWARD * 2 * (1e9 * 10 + 1e6 * 10 * 5)
    assert mfu(flops, 2.0, flops) == pytest.approx(0.5)
    assert mfu(flops, 1.0, None) is None and mfu(flops, 0.0, 1e12) is None
