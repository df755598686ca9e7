"""The authors' model recipe (asr_core.model.batchrenorm, conformer, ctc, model): batch renorm schedule, decoder norm,
feed-forward activation and biases, and what they do to the parameter counts."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from asr_core.model.batchrenorm import MaskedBatchRenorm, renorm_limits
from asr_core.config import ModelConfig, preset
from asr_core.model.acoustic import build_model, count_parameters
from asr_core.model.size import parameter_table
from tests.test_model import _batch, _small



# ---- batch renorm schedule ------------------------------------------------------------------------------------
def _lcasr_rmax(n: int) -> float:  # lcasr/components/batchrenorm.py BatchRenorm.rmax
    return min(max(2 / 35000 * n + 25 / 35, 1.0), 3.0)


def _lcasr_dmax(n: int) -> float:  # lcasr/components/batchrenorm.py BatchRenorm.dmax
    return min(max(5 / 20000 * n - 25 / 20, 0.0), 5.0)


STEPS = (0, 4999, 5000, 10000, 25000, 40000, 50000)


@pytest.mark.parametrize("n", STEPS)
def test_code_schedule_is_lcasr_rmax_dmax_at_40k(n: int) -> None:
    bn = MaskedBatchRenorm(4, warmup_steps=40_000, schedule="code")
    bn.num_batches_tracked.fill_(n)
    r_max, d_max = bn.limits()
    assert r_max == pytest.approx(_lcasr_rmax(n), rel=1e-12, abs=1e-12)
    assert d_max == pytest.approx(_lcasr_dmax(n), rel=1e-12, abs=1e-12)


def test_code_schedule_landmarks_and_defaults() -> None:
    assert ModelConfig().batch_renorm_schedule == "code" and ModelConfig().batch_renorm_warmup_steps == 40_000
    bn = MaskedBatchRenorm(4)
    assert (bn.schedule, bn.warmup_steps) == ("code", 40_000)
    assert renorm_limits(5_000, 40_000) == (1.0, 0.0)  # plain batch norm up to W/8
    assert renorm_limits(25_000, 40_000)[1] == 5.0  # d_max full at 5W/8
    assert renorm_limits(40_000, 40_000)[0] == 3.0  # r_max full at W
    # scaled by W: the tiny preset's W = 100 -> 12.5, 62.5, 100
    assert preset("tiny").model.batch_renorm_warmup_steps == 100
    assert renorm_limits(12, 100) == (1.0, 0.0)
    r, d = renorm_limits(13, 100)
    assert 1.0 < r < 3.0 and 0.0 < d < 5.0
    assert renorm_limits(63, 100)[1] == 5.0 and renorm_limits(99, 100)[0] < 3.0 and renorm_limits(100, 100)[0] == 3.0
    # the model's layers get the configured schedule
    m = build_model(_small(batch_renorm_schedule="linear"))
    assert {x.schedule for x in m.modules() if isinstance(x, MaskedBatchRenorm)} == {"linear"}
    assert {x.warmup_steps for x in m.modules() if isinstance(x, MaskedBatchRenorm)} == {3}


@pytest.mark.parametrize("n", STEPS)
def test_linear_schedule_is_unchanged(n: int) -> None:
    w = 40_000
    frac = min(n / w, 1.0)
    assert renorm_limits(n, w, "linear") == pytest.approx((1.0 + 2.0 * frac, 5.0 * frac), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("schedule", ["code", "linear"])
def test_zero_warmup_is_full_renorm_from_the_start(schedule: str) -> None:
    assert renorm_limits(0, 0, schedule) == (3.0, 5.0)
    assert renorm_limits(7, 0, schedule) == (3.0, 5.0)


def test_bad_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="schedule"):
        MaskedBatchRenorm(4, schedule="cosine")


def _renorm_with_history(schedule: str, n: int, channels: int = 6) -> MaskedBatchRenorm:
    g = torch.Generator().manual_seed(11)
    bn = MaskedBatchRenorm(channels, warmup_steps=80, schedule=schedule).train()
    with torch.no_grad():  # running statistics far from any batch's, so r and d would be clipped if allowed
        bn.running_mean.copy_(3.0 + torch.randn(channels, generator=g))
        bn.running_var.copy_(0.05 + torch.rand(channels, generator=g))
        bn.weight.copy_(torch.randn(channels, generator=g))
        bn.bias.copy_(torch.randn(channels, generator=g))
    bn.num_batches_tracked.fill_(n)
    return bn


@pytest.mark.parametrize("n", [0, 5, 10])  # W = 80: W/8 = 10, still plain batch norm at n = 10
def test_code_schedule_before_w_over_8_is_plain_batch_norm(n: int) -> None:
    lengths = [30, 17, 5]
    x, lens = _batch(lengths, extra=9, n_mels=6, seed=2)
    x = 2.0 * x + 0.5
    mask = torch.arange(x.shape[1])[None, :] < lens[:, None]
    bn = _renorm_with_history("code", n)
    y = bn(x, mask)
    valid = x[mask]  # (frames, C): the valid frames only
    var, mean = torch.var_mean(valid, dim=0, correction=0)
    expected = (valid - mean) / (var + bn.eps).sqrt() * bn.weight + bn.bias
    torch.testing.assert_close(y[mask], expected, atol=1e-5, rtol=1e-5)
    assert bool((y[~mask] == 0).all())
    assert int(bn.num_batches_tracked) == n + 1
    # the same layer under the linear schedule is already clipping towards the running statistics
    other = _renorm_with_history("linear", n)
    if n > 0:
        assert not torch.allclose(other(x, mask)[mask], expected, atol=1e-3)
    # and one step past W/8 the code schedule starts to renormalise
    late = _renorm_with_history("code", 11)
    assert not torch.allclose(late(x, mask)[mask], expected, atol=1e-4)


# ---- decoder norm ---------------------------------------------------------------------------------------------
def test_decoder_norm_layernorm_in_head_or_none() -> None:
    on, off = build_model(_small(decoder_norm=True)), build_model(_small(decoder_norm=False))
    assert ModelConfig().decoder_norm is True
    assert isinstance(on.head.norm, nn.LayerNorm) and on.head.norm.normalized_shape == (32,)
    assert not any(isinstance(m, nn.LayerNorm) for m in off.head.modules())
    # everything else is the same model: same parameters bar the norm, and the same weights from the same seed
    torch.manual_seed(0)
    on = build_model(_small(decoder_norm=True)).eval()
    torch.manual_seed(0)
    off = build_model(_small(decoder_norm=False)).eval()
    assert count_parameters(on)["total"] - count_parameters(off)["total"] == 2 * 32
    for name, p in off.named_parameters():
        torch.testing.assert_close(p, on.get_parameter(name), msg=name)
    x, lens = _batch([40, 33], extra=0)
    with torch.no_grad():
        # at init the head's norm is nearly the identity: every layer ends with a LayerNorm of weight 1, bias 0
        torch.testing.assert_close(on(x, lens)[0], off(x, lens)[0], atol=1e-3, rtol=1e-3)
        # once those final norms have learnt a scale and shift (the same in both models), the head's norm matters
        g = torch.Generator().manual_seed(4)
        for la, lb in zip(on.layers, off.layers):
            w, b = 0.5 + torch.rand(32, generator=g), torch.randn(32, generator=g)
            for layer in (la, lb):
                layer.out_norm.weight.copy_(w)
                layer.out_norm.bias.copy_(b)
        lo, _ = on(x, lens)
        lf, _ = off(x, lens)
    assert not torch.allclose(lo, lf, atol=1e-2)


@pytest.mark.parametrize("self_conditioning", [True, False])
def test_decoder_norm_applies_to_self_conditioning_posteriors_and_final_logits(self_conditioning: bool) -> None:
    torch.manual_seed(0)
    cfg = dataclasses.replace(_small(decoder_norm=True), layers=3, self_conditioning=self_conditioning)
    model = build_model(cfg).eval()
    with torch.no_grad():  # a norm that is not the identity at init, so its use shows in the output
        model.head.norm.weight.uniform_(0.5, 2.0)
        model.head.norm.bias.normal_()
    seen: list[torch.Tensor] = []
    hook = model.head.norm.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    x, lens = _batch([40, 33], extra=0)
    with torch.no_grad():
        logits, out_lens = model(x, lens)
    hook.remove()
    # one call of the one norm per self-conditioning point (layers - 1) plus two for the final logits (the code's
    # legasee_double_norm: ff(norm(norm(h))))
    assert len(seen) == (cfg.layers + 1 if self_conditioning else 2)
    with torch.no_grad():
        # recompute by hand: the SC posteriors are softmax(proj(norm(h))), the final logits proj(norm(norm(h)))
        h, ol = model.subsampling(x, lens)
        mask = torch.arange(h.shape[1])[None, :] < ol[:, None]
        h = model.posenc.add_to_input(h) * mask[:, :, None]
        for i, layer in enumerate(model.layers):
            h = layer(h, mask, ol)
            if self_conditioning and i < cfg.layers - 1:
                post = model.head.proj(model.head.norm(h)).softmax(-1)
                h = h + model.self_conditioning.back(post) * mask[:, :, None]
        expected = model.head.proj(model.head.norm(model.head.norm(h)))
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


# ---- feed-forward activation and biases -----------------------------------------------------------------------
def test_ff_activation_gelu_tanh_default_and_silu_option() -> None:
    assert ModelConfig().ff_activation == "gelu_tanh" and ModelConfig().ff_bias is False
    torch.manual_seed(0)
    gelu = build_model(_small()).eval()
    torch.manual_seed(0)
    silu = build_model(_small(ff_activation="silu")).eval()
    for layer in gelu.layers:
        for ff in (layer.ff1, layer.ff2):
            assert isinstance(ff.act, nn.GELU) and ff.act.approximate == "tanh"
        assert isinstance(layer.conv.act, nn.SiLU)  # the convolution module keeps SiLU
    for layer in silu.layers:
        assert isinstance(layer.ff1.act, nn.SiLU) and isinstance(layer.ff2.act, nn.SiLU)
        assert isinstance(layer.conv.act, nn.SiLU)
    assert isinstance(gelu.subsampling.act, nn.SiLU) and isinstance(silu.subsampling.act, nn.SiLU)
    # the feed-forward computes down(gelu_tanh(up(LN(x)))) -- FusedMLP's gelu_approx
    ff = gelu.layers[0].ff1
    h = torch.randn(2, 7, 32)
    with torch.no_grad():
        want = ff.down(torch.nn.functional.gelu(ff.up(ff.norm(h)), approximate="tanh"))
        torch.testing.assert_close(ff(h), want)
    # same weights, different activation, different outputs
    for name, p in silu.named_parameters():
        torch.testing.assert_close(p, gelu.get_parameter(name), msg=name)
    x, lens = _batch([40, 33], extra=0)
    with torch.no_grad():
        assert not torch.allclose(gelu(x, lens)[0], silu(x, lens)[0], atol=1e-4)


def test_ff_bias_off_by_default_and_optional() -> None:
    off, on = build_model(_small()), build_model(_small(ff_bias=True))
    for layer in off.layers:
        for ff in (layer.ff1, layer.ff2):
            assert ff.up.bias is None and ff.down.bias is None
    for layer in on.layers:
        for ff in (layer.ff1, layer.ff2):
            assert ff.up.bias is not None and ff.down.bias is not None
    # the other linears keep their biases either way (attention, conv module, head, self-conditioning)
    assert off.layers[0].conv.pointwise_in.bias is not None and off.head.proj.bias is not None
    d, e, layers = 32, 4, 2
    assert count_parameters(on)["total"] - count_parameters(off)["total"] == layers * 2 * (e * d + d)


ALTERNATIVES = [
    dict(),  # the recipe's defaults: code schedule, decoder norm, GELU (tanh), no FF biases
    dict(ff_activation="silu", ff_bias=True, decoder_norm=False, batch_renorm_schedule="linear"),  # the old model
    dict(ff_activation="silu", decoder_norm=True, batch_renorm_schedule="code", batch_renorm_warmup_steps=0),
]


@pytest.mark.parametrize("kw", ALTERNATIVES)
def test_padding_invariance_under_every_option(kw: dict) -> None:
    torch.manual_seed(0)
    a = build_model(dataclasses.replace(_small(), **kw)).train()
    b = copy.deepcopy(a)
    lengths = [64, 41, 9]
    x, lens = _batch(lengths, extra=0)
    xp, _ = _batch(lengths, extra=29)
    for _ in range(2):  # the second forward runs with non-trivial running statistics and r/d limits
        la, oa = a(x, lens)
        lb, ob = b(xp, lens)
        for i in range(len(lengths)):
            torch.testing.assert_close(la[i, : oa[i]], lb[i, : ob[i]], atol=1e-5, rtol=1e-5)
    for (n, ba), bb in zip(a.named_buffers(), b.buffers()):
        torch.testing.assert_close(ba, bb, atol=1e-6, rtol=1e-5, msg=n)
    a.eval()
    with torch.no_grad():
        logits, out_lens = a(xp, lens)
        for i, n in enumerate(lengths):
            alone, _ = a(xp[i : i + 1, :n], lens[i : i + 1])
            torch.testing.assert_close(logits[i, : out_lens[i]], alone[0], atol=1e-5, rtol=1e-5)


# ---- sizes ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,d,layers", [("main", 768, 6), ("9L-768", 768, 9), ("3L-2048-16H", 2048, 3)])
def test_recipe_parameter_count_moves_by_ff_biases_and_decoder_norm_only(name: str, d: int, layers: int) -> None:
    new = parameter_table(preset(name))["total"]
    old = parameter_table(preset(name).with_overrides(["model.ff_bias=true", "model.decoder_norm=false"]))["total"]
    assert old - new == layers * 2 * (4 * d + d) - 2 * d  # FF biases gone, one LayerNorm(d) added


def test_recipe_parameter_counts() -> None:
    """The counts as built today (paper: ~90M, 130M, 315M; within 5 % is test_model's check)."""
    assert parameter_table(preset("main"))["total"] == 89_928_704
    assert parameter_table(preset("9L-768"))["total"] == 130_691_072
    assert parameter_table(preset("3L-2048-16H"))["total"] == 317_394_944  # 512 subsampling channels, as the code
