"""The acoustic model: the paper's sizes, padding invariance, rotary relative positions, output lengths."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from asr_core.config import ModelConfig, preset
from asr_core.model.acoustic import build_model
from asr_core.model.size import parameter_table
from asr_core.model.posenc import RotaryEncoding



@pytest.mark.parametrize("name,expected", [("main", 90e6), ("9L-768", 130e6), ("3L-2048-16H", 315e6)])
def test_paper_sizes_within_5_percent(name: str, expected: float) -> None:
    cfg = preset(name)
    assert cfg.model.vocab_size == 4096
    total = parameter_table(cfg)["total"]
    assert abs(total - expected) / expected < 0.05, f"{name}: {total:,} parameters, paper says ~{expected:,.0f}"


@pytest.mark.slow
def test_params_cli_prints_modules_and_total() -> None:
    out = subprocess.run([sys.executable, "-m", "asr_core", "params", "main", "--set", "model.layers=9"],
                         capture_output=True, text=True, check=True).stdout
    assert "layers.8" in out and "subsampling" in out and "130.7M" in out  # 130.8M before FF biases went (ff_bias)


def _small(posenc: str = "rotary", **kw) -> ModelConfig:
    return ModelConfig(d_model=32, layers=2, heads=4, subsampling_channels=16, vocab_size=11, posenc=posenc,
                       batch_renorm_warmup_steps=3, **kw)


def _batch(lengths: list[int], extra: int, n_mels: int = 80, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = max(lengths) + extra
    x = torch.zeros(len(lengths), t, n_mels)
    for i, n in enumerate(lengths):
        x[i, :n] = torch.randn(n, n_mels, generator=g)
    for i, n in enumerate(lengths):
        x[i, n:] = 1e3 * torch.randn(t - n, n_mels, generator=g)  # garbage in the padding must not matter
    return x, torch.tensor(lengths)


@pytest.mark.parametrize("posenc", ["rotary", "learnable-fourier", "sinusoidal", "fourier", "none"])
def test_eval_mode_recording_alone_equals_padded_in_batch(posenc: str) -> None:
    torch.manual_seed(0)
    model = build_model(_small(posenc)).eval()
    # give batch renorm non-trivial running statistics
    model.train()
    with torch.no_grad():
        model(*_batch([50, 37], 0, seed=5))
    model.eval()
    lengths = [61, 23, 40]
    x, lens = _batch(lengths, extra=17)
    with torch.no_grad():
        logits, out_lens = model(x, lens)
        for i, n in enumerate(lengths):
            alone, alone_len = model(x[i : i + 1, :n], lens[i : i + 1])
            assert int(alone_len) == int(out_lens[i]) == -(-n // 8)
            torch.testing.assert_close(logits[i, : out_lens[i]], alone[0], atol=1e-5, rtol=1e-5)


def test_train_mode_padding_changes_neither_outputs_nor_running_stats() -> None:
    torch.manual_seed(0)
    a = build_model(_small()).train()
    b = copy.deepcopy(a)
    lengths = [64, 41, 9]
    x, lens = _batch(lengths, extra=0)
    xp, _ = _batch(lengths, extra=29)
    la, oa = a(x, lens)
    lb, ob = b(xp, lens)
    for i in range(len(lengths)):
        torch.testing.assert_close(la[i, : oa[i]], lb[i, : ob[i]], atol=1e-5, rtol=1e-5)
    # gradients agree too: padding never enters the loss either
    (la[0, : oa[0]].sum() + la[2, : oa[2]].sum()).backward()
    (lb[0, : ob[0]].sum() + lb[2, : ob[2]].sum()).backward()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-4, rtol=1e-4, msg=n)  # sums of ~100-sized terms
    for (n, ba), bb in zip(a.named_buffers(), b.buffers()):
        torch.testing.assert_close(ba, bb, atol=1e-6, rtol=1e-5, msg=n)
    # a single recording padded behaves as itself unpadded, statistics included
    c, d = copy.deepcopy(a), copy.deepcopy(a)
    x1, l1 = _batch([33], extra=0, seed=3)
    x1p, _ = _batch([33], extra=40, seed=3)
    lc, _ = c(x1, l1)
    ld, od = d(x1p, l1)
    torch.testing.assert_close(lc[0], ld[0, : od[0]], atol=1e-5, rtol=1e-5)
    for ba, bb in zip(c.buffers(), d.buffers()):
        torch.testing.assert_close(ba, bb, atol=1e-6, rtol=1e-5)
    # c continued from a (one forward): its second forward used r, d clipped at r_max > 1, d_max > 0
    assert int(c.layers[0].conv.norm_bn.num_batches_tracked) == 2


def test_learnable_fourier_is_the_authors_definition() -> None:
    """The authors' LearnableFourierPosEnc(d_model) (ESPnet's; gamma 1, no MLP, no scaling of x): d/2 frequencies
    from N(0, 1) on the raw frame index, [cos, sin] / sqrt(d), added; written out here by hand."""
    import math

    from asr_core.model.posenc import LearnableFourierEncoding

    torch.manual_seed(12345)
    enc = LearnableFourierEncoding(768)
    torch.manual_seed(12345)
    w = torch.normal(0, 1.0, (1, 384))  # the authors' _reset: torch.normal(0, 1 / sqrt(gamma), (1, d_model // 2))
    assert enc.w_r.shape == (1, 384) and torch.equal(enc.w_r.data, w)
    assert [n for n, _ in enc.named_parameters()] == ["w_r"]  # nothing else is learnt
    x = torch.randn(2, 50, 768)
    t = torch.arange(50, dtype=torch.float32)[:, None]
    want = x + (torch.cat((torch.cos(t @ w), torch.sin(t @ w)), -1) / math.sqrt(768))[None]
    torch.testing.assert_close(enc.add_to_input(x), want)
    with pytest.raises(ValueError, match="even d_model"):
        LearnableFourierEncoding(7)


def test_rotary_scores_depend_only_on_relative_position() -> None:
    torch.manual_seed(0)
    rot = RotaryEncoding(head_dim=16, theta=1.5e6)
    t = 40
    qv, kv = torch.randn(16), torch.randn(16)
    q = qv.expand(1, t, 1, 16).clone()
    k = kv.expand(1, t, 1, 16).clone()
    qr, kr = rot.rotate(q, k)
    s = torch.einsum("d,jd->j", qr[0, 7, 0], kr[0, :, 0])
    scores = qr[0, :, 0] @ kr[0, :, 0].T  # (T, T)
    for shift in (1, 5, 13):
        torch.testing.assert_close(scores[shift:, shift:], scores[:-shift, :-shift], atol=1e-4, rtol=1e-5)
    # and the position is actually encoded: different offsets give different scores
    assert not torch.allclose(s[7], s[20])
    # a different theta changes the scores (theta is used)
    q2, k2 = RotaryEncoding(16, 1e4).rotate(q, k)
    assert not torch.allclose(q2[0, :, 0] @ k2[0, :, 0].T, scores)


def test_rotary_attention_layer_is_shift_equivariant_in_relative_sense() -> None:
    """Attention scores inside the model's layer: shifting both q and k positions leaves q.k unchanged."""
    rot = RotaryEncoding(8, 1.5e6)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 30, 2, 8, generator=g), torch.randn(1, 30, 2, 8, generator=g)
    pad = torch.zeros(1, 6, 2, 8)
    qs, ks = rot.rotate(torch.cat((pad, q), 1), torch.cat((pad, k), 1))
    q0, k0 = rot.rotate(q, k)
    s0 = torch.einsum("bihd,bjhd->bhij", q0, k0)
    s1 = torch.einsum("bihd,bjhd->bhij", qs[:, 6:], ks[:, 6:])
    torch.testing.assert_close(s0, s1, atol=1e-4, rtol=1e-5)


def test_activation_checkpointing_matches_plain_forward_backward() -> None:
    torch.manual_seed(0)
    plain = build_model(_small()).train()
    ckpt = copy.deepcopy(plain)
    ckpt.activation_checkpointing = True
    x, lens = _batch([40, 25], extra=3)
    for m in (plain, ckpt):
        logits, ol = m(x, lens)
        logits.square().mean().backward()
    for (n, a), b in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=n)
    for (n, a), b in zip(plain.named_buffers(), ckpt.buffers()):
        torch.testing.assert_close(a, b, msg=n)


def test_subsampling_factor_and_blank() -> None:
    model = build_model(_small())
    assert model.subsampling_factor == 8 and model.blank_id == 10
    logits, ol = model.eval()(torch.randn(2, 100, 80), torch.tensor([100, 57]))
    assert logits.shape == (2, 13, 11) and ol.tolist() == [13, 8]
