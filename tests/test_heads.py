"""Attention-head similarity (paper 003): the measure's fixed points, padding, sampled rows of A, the auxiliary loss
and the hooks that collect Q, K, V, Y from a real model."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from asr_core.model.attention import SelfAttention
from asr_core.config import ModelConfig
from asr_core.model.heads import (REPRESENTATIONS, HeadCapture, attention_rows, diversity_loss, head_diversity_loss,
                            head_similarity, head_similarity_matrix, offdiagonal_mean, sample_query_rows)
from asr_core.model.acoustic import build_model

torch.set_num_threads(2)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _full_attention(q: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Every row of softmax(Q K^T / sqrt(D)) with padded keys excluded: (B, H, T, T), written independently."""
    t = q.shape[2]
    scores = torch.einsum("bhtd,bhsd->bhts", q.double(), k.double()) / math.sqrt(q.shape[-1])
    valid = torch.arange(t)[None, :] < lengths[:, None]
    return scores.masked_fill(~valid[:, None, None, :], -math.inf).softmax(-1).float()


def _row_cosines(a: torch.Tensor) -> torch.Tensor:
    """(B, H, T, X) -> (B, H, H, T): the cosine of every pair of heads at every row."""
    u = F.normalize(a.double(), dim=-1)
    return torch.einsum("bmtx,bntx->bmnt", u, u)


# ---- the measure --------------------------------------------------------------------------------------------
def test_identical_heads_give_one_and_orthogonal_heads_zero() -> None:
    b, h, t, d = 2, 4, 12, 8
    lengths = torch.tensor([12, 7])
    base = torch.randn(b, 1, t, d, generator=_gen(0))
    scales = torch.tensor([0.5, 1.0, 3.0, 7.0])[None, :, None, None]  # cosine ignores each head's scale
    same = head_similarity_matrix(base * scales, lengths)
    torch.testing.assert_close(same, torch.ones(b, h, h), atol=1e-6, rtol=0)
    assert diversity_loss(same) == pytest.approx([(h - 1) / h] * b, abs=1e-6)
    assert offdiagonal_mean(same) == pytest.approx([1.0] * b, abs=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a caller's autocast does not round the cosines to bf16
        torch.testing.assert_close(head_similarity_matrix(base * scales, lengths), torch.ones(b, h, h), atol=1e-6,
                                   rtol=0)

    ortho = torch.zeros(b, h, t, d)
    for i in range(h):  # head i lives in channels 2i, 2i+1 only
        ortho[:, i, :, 2 * i : 2 * i + 2] = torch.randn(b, t, 2, generator=_gen(i))
    sim = head_similarity_matrix(ortho, lengths)
    torch.testing.assert_close(sim, torch.eye(h).expand(b, h, h), atol=1e-6, rtol=0)
    assert diversity_loss(sim).abs().max() < 1e-10

    # attention probabilities: heads attending to disjoint keys are orthogonal, heads with one q and k identical
    q = torch.zeros(1, h, t, d)
    k = torch.zeros(1, h, t, d)
    for i in range(h):  # head i's keys 3i..3i+2 score 60 above the rest: e^-60 elsewhere
        q[0, i, :, i] = 1.0
        k[0, i, 3 * i : 3 * i + 3, i] = 60.0 * math.sqrt(d)
    full = torch.tensor([t])
    every = torch.arange(t)[None]
    torch.testing.assert_close(head_similarity_matrix(attention_rows(q, k, full, every), full), torch.eye(h)[None],
                               atol=1e-6, rtol=0)
    shared_q, shared_k = torch.randn(1, 1, t, d, generator=_gen(9)), torch.randn(1, 1, t, d, generator=_gen(10))
    a = attention_rows(shared_q.expand(1, h, t, d), shared_k.expand(1, h, t, d), full, every)
    torch.testing.assert_close(head_similarity_matrix(a, full), torch.ones(1, h, h), atol=1e-6, rtol=0)


def test_padding_does_not_change_the_metric() -> None:
    h, d = 3, 6
    lengths = torch.tensor([20, 9, 14])
    alone = [torch.randn(1, h, int(n), d, generator=_gen(i)) for i, n in enumerate(lengths)]
    for extra in (0, 11):
        t = int(lengths.max()) + extra
        padded = 1e3 * torch.randn(len(lengths), h, t, d, generator=_gen(99))  # garbage beyond each length
        for i, r in enumerate(alone):
            padded[i, :, : r.shape[2]] = r[0]
        batch = head_similarity_matrix(padded, lengths)
        for i, r in enumerate(alone):
            torch.testing.assert_close(batch[i], head_similarity_matrix(r, lengths[i : i + 1])[0])

    # A: garbage keys and queries beyond each length change neither the rows nor which rows are drawn
    q, k = torch.randn(3, h, 20, d, generator=_gen(1)), torch.randn(3, h, 20, d, generator=_gen(2))
    qp, kp = (torch.cat((z, 1e3 * torch.randn(3, h, 13, d, generator=_gen(3))), dim=2) for z in (q, k))
    for z, zp in ((q, qp), (k, kp)):
        for i, n in enumerate(lengths.tolist()):
            z[i, :, n:] = 1e3
            zp[i, :, n:] = -1e3
    sims = []
    for qq, kk in ((q, k), (qp, kp)):
        index, count = sample_query_rows(lengths, 5, _gen(4))
        sims.append(head_similarity_matrix(attention_rows(qq, kk, lengths, index), count))
    torch.testing.assert_close(sims[0], sims[1])


def test_sample_query_rows_draws_valid_distinct_frames() -> None:
    lengths = torch.tensor([100, 3, 40])
    index, count = sample_query_rows(lengths, 8, _gen(0))
    assert index.shape == (3, 8) and count.tolist() == [8, 3, 8]
    for i, n in enumerate(lengths.tolist()):
        rows = index[i, : count[i]]
        assert bool((rows < n).all()) and len(set(rows.tolist())) == len(rows) and bool((rows.diff() > 0).all())
    assert index[1, :3].tolist() == [0, 1, 2]  # a short recording gives all its rows
    again, _ = sample_query_rows(lengths, 8, _gen(0))
    other, _ = sample_query_rows(lengths, 8, _gen(1))
    assert torch.equal(index, again) and not torch.equal(index, other)
    with pytest.raises(ValueError, match="positive"):
        sample_query_rows(torch.tensor([5, 0]), 8, _gen(0))


def test_sampled_rows_of_a_agree_with_full_a() -> None:
    """Exact where nothing is left out; a sample of S rows within 4 standard errors of the full mean.

    The rows drawn are exact rows of A (float32 against a float64 softmax: 1e-6); similarities are means of float32
    cosines (1e-5). The sampled similarity is a mean of S of the T per-row cosines drawn without replacement, so its
    standard error is sd(row cosines) / sqrt(S) * sqrt((T - S) / (T - 1)); 4 of them leave a fair sampler a ~6e-5
    chance per entry.
    The heads share a component that grows along the recording, so a sampler biased to any part of it fails."""
    b, h, t, d = 2, 3, 300, 8
    lengths = torch.tensor([300, 217])
    ramp = torch.linspace(0, 3, t)[None, None, :, None]
    q = torch.randn(b, h, t, d, generator=_gen(0)) + ramp * torch.randn(b, 1, 1, d, generator=_gen(1))
    k = torch.randn(b, h, t, d, generator=_gen(2)) + ramp * torch.randn(b, 1, 1, d, generator=_gen(3))
    full = _full_attention(q, k, lengths)
    valid = (torch.arange(t)[None, :] < lengths[:, None]).double()
    cos = _row_cosines(full)  # (B, H, H, T)
    exact = (cos * valid[:, None, None]).sum(-1) / lengths[:, None, None]

    index, count = sample_query_rows(lengths, t, _gen(5))  # every valid row
    rows = attention_rows(q, k, lengths, index)
    torch.testing.assert_close(head_similarity_matrix(rows, count).double(), exact, atol=1e-5, rtol=0)

    s = 64
    index, count = sample_query_rows(lengths, s, _gen(6))
    rows = attention_rows(q, k, lengths, index)
    for i in range(b):
        torch.testing.assert_close(rows[i], full[i][:, index[i]], atol=1e-6, rtol=0)
    est = head_similarity_matrix(rows, count).double()
    for i, n in enumerate(lengths.tolist()):
        spread = cos[i, :, :, :n].std(dim=-1)
        se = spread / math.sqrt(s) * math.sqrt((n - s) / (n - 1))
        assert bool(((est[i] - exact[i]).abs() <= 4 * se + 1e-5).all()), (est[i] - exact[i]) / se
    first = head_similarity_matrix(attention_rows(q, k, lengths, torch.arange(s).expand(b, s)), count).double()
    assert not torch.allclose(first, exact, atol=0.05)  # the test can tell a biased sample (the first rows)


# ---- the loss -----------------------------------------------------------------------------------------------
def test_loss_is_zero_for_orthogonal_heads_and_a_step_pushes_heads_apart() -> None:
    b, h, t, d = 2, 4, 10, 8
    lengths = torch.tensor([10, 6])
    ortho = torch.zeros(b, h, t, d)
    for i in range(h):
        ortho[:, i, :, 2 * i : 2 * i + 2] = torch.randn(b, t, 2, generator=_gen(i))
    assert float(diversity_loss(head_similarity_matrix(ortho, lengths)).mean()) < 1e-10

    shared = torch.randn(b, 1, t, d, generator=_gen(7))
    r = (shared + 0.3 * torch.randn(b, h, t, d, generator=_gen(8))).requires_grad_()

    def loss_r() -> torch.Tensor:
        return diversity_loss(head_similarity_matrix(r, lengths)).mean()

    before = loss_r()
    before.backward()
    with torch.no_grad():
        off_before = offdiagonal_mean(head_similarity_matrix(r, lengths)).mean()
        r -= 0.5 * r.grad
        assert float(loss_r()) < float(before)
        assert float(offdiagonal_mean(head_similarity_matrix(r, lengths)).mean()) < float(off_before)

    # through A: queries and keys are moved so that the heads attend to different frames
    q = (torch.randn(b, 1, t, d, generator=_gen(1)) + 0.2 * torch.randn(b, h, t, d, generator=_gen(2))).requires_grad_()
    k = (torch.randn(b, 1, t, d, generator=_gen(3)) + 0.2 * torch.randn(b, h, t, d, generator=_gen(4))).requires_grad_()
    index, count = sample_query_rows(lengths, 4, _gen(5))

    def loss_a() -> torch.Tensor:
        return diversity_loss(head_similarity_matrix(attention_rows(q, k, lengths, index), count)).mean()

    before = loss_a()
    before.backward()
    with torch.no_grad():
        q -= 1.0 * q.grad
        k -= 1.0 * k.grad
        assert float(loss_a()) < float(before)


# ---- a real model -------------------------------------------------------------------------------------------
def _small(posenc: str = "rotary", **kw) -> ModelConfig:
    return ModelConfig(d_model=32, layers=2, heads=4, subsampling_channels=16, vocab_size=11, posenc=posenc,
                       batch_renorm_warmup_steps=3, **kw)


def _batch(lengths: list[int], extra: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    x = 1e3 * torch.randn(len(lengths), max(lengths) + extra, 80, generator=g)  # garbage in the padding
    for i, n in enumerate(lengths):
        x[i, :n] = torch.randn(n, 80, generator=g)
    return x, torch.tensor(lengths)


@pytest.mark.parametrize("posenc", ["rotary", "none"])
def test_hooks_collect_what_the_attention_module_computes(posenc: str) -> None:
    torch.manual_seed(0)
    model = build_model(_small(posenc)).eval()
    x, lens = _batch([90, 57], extra=13)
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    attns = [m for m in model.modules() if isinstance(m, SelfAttention)]
    probes = [a.register_forward_hook(lambda mod, args, out, i=i: seen.__setitem__(i, (args[0], out)))
              for i, a in enumerate(attns)]
    with torch.no_grad(), HeadCapture(model) as cap:
        _, out_lens = model(x, lens)
    for p in probes:
        p.remove()
    assert [layer.index for layer in cap.layers] == [0, 1]
    t = -(-x.shape[1] // 8)  # the padded batch's subsampled frames
    for layer, attn in zip(cap.layers, attns):
        assert torch.equal(layer.lengths, out_lens)
        q, k, v, y = (layer.get(n) for n in "QKVY")
        for z in (q, k, v, y):
            assert z.shape == (2, 4, t, 8)
        inp, out = seen[layer.index]
        # V is the module's own projection of its input; Q and K are too, up to the rotation
        b = inp.shape[0]
        qkv = F.linear(inp, attn.qkv.weight, attn.qkv.bias).view(b, t, 3, 4, 8)
        torch.testing.assert_close(v, qkv[:, :, 2].transpose(1, 2))
        if posenc == "none":
            torch.testing.assert_close(q, qkv[:, :, 0].transpose(1, 2))
        # softmax(Q K^T / sqrt(D)) V from the collected tensors is the module's context Y, and out(Y) its output:
        # so Q and K are what its kernel multiplied, rotation included
        index, _ = sample_query_rows(out_lens, t, _gen(0))  # every valid row
        a = attention_rows(q, k, out_lens, index)
        for i, n in enumerate(out_lens.tolist()):
            torch.testing.assert_close(a[i, :, :n] @ v[i], y[i, :, :n], atol=1e-5, rtol=1e-5)
            y_cat = y[i, :, :n].transpose(0, 1).reshape(n, 32)
            torch.testing.assert_close(attn.out(y_cat), out[i, :n], atol=1e-5, rtol=1e-5)
    for attn in attns:  # nothing left behind
        assert not (attn._forward_hooks or attn._forward_pre_hooks or attn.qkv._forward_hooks
                    or attn.out._forward_pre_hooks)


def test_head_similarity_of_a_model_ignores_padding_and_leaves_the_model_as_it_was() -> None:
    torch.manual_seed(0)
    model = build_model(_small())
    model.train()
    with torch.no_grad():
        model(*_batch([70, 40], extra=0, seed=5))  # non-trivial running statistics
    state = copy.deepcopy(model.state_dict())
    lengths = [77, 31, 50]
    x, lens = _batch(lengths, extra=21)
    got = head_similarity(model, x, lens, sample_rows=1000, generator=_gen(0))  # every row: exact A
    assert model.training
    for name, v in model.state_dict().items():
        assert torch.equal(v, state[name]), name
    assert (got["recordings"], got["layers"], got["heads"], got["sample_rows"]) == (3, 2, 4, 1000)
    for r in REPRESENTATIONS:
        per = got["per_recording"][r]
        assert per.shape == (3, 2, 4, 4)
        torch.testing.assert_close(per.diagonal(dim1=-2, dim2=-1), torch.ones(3, 2, 4), atol=1e-5, rtol=0)
        torch.testing.assert_close(got["matrix"][r], per.mean(0))
        torch.testing.assert_close(got["diversity"][r], diversity_loss(per).mean(0))
        assert got["diversity_sum"][r] == pytest.approx(float(got["diversity"][r].sum()))
        torch.testing.assert_close(got["similarity"][r], offdiagonal_mean(per).mean(0))
        assert got["diversity"][r].shape == (2,) and bool((got["diversity"][r] > 0).all())
    for i, n in enumerate(lengths):
        alone = head_similarity(model, x[i : i + 1, :n], lens[i : i + 1], sample_rows=1000, generator=_gen(0))
        for r in REPRESENTATIONS:
            torch.testing.assert_close(got["per_recording"][r][i], alone["per_recording"][r][0], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="Generator"):
        with HeadCapture(model, ["A"]) as cap:
            model(x, lens)
        head_diversity_loss(cap.layers, "A")


@pytest.mark.parametrize("representation", ["Y", "A"])
def test_auxiliary_loss_trains_a_model_apart_with_activation_checkpointing(representation: str) -> None:
    torch.manual_seed(0)
    plain = build_model(_small())
    ckpt = build_model(_small(activation_checkpointing=True))
    ckpt.load_state_dict(plain.state_dict())
    x, lens = _batch([64, 48], extra=0, seed=2)
    losses = []
    for model in (plain, ckpt):
        model.train()
        with HeadCapture(model, [representation]) as cap:
            model(x, lens)
            loss = head_diversity_loss(cap.layers, representation, sample_rows=4, generator=_gen(1))
        loss.backward()  # after the capture: checkpointing recomputes the layers unobserved
        losses.append(float(loss.detach()))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        if p.grad is None:
            assert q.grad is None, name
            continue
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-4, msg=name)

    with pytest.raises(RuntimeError, match="leave the capture before calling backward"):
        with HeadCapture(ckpt, [representation]) as cap:
            ckpt(x, lens)
            head_diversity_loss(cap.layers, representation, sample_rows=4, generator=_gen(1)).backward()

    # one plain gradient step on the loss alone lowers it on the same batch
    plain.eval()  # fixed statistics, so only the step moves the loss
    opt = torch.optim.SGD(plain.parameters(), lr=0.05)

    def measure() -> torch.Tensor:
        with HeadCapture(plain, [representation]) as cap:
            plain(x, lens)
            return head_diversity_loss(cap.layers, representation, sample_rows=4, generator=_gen(1))

    opt.zero_grad()
    before = measure()
    before.backward()
    opt.step()
    with torch.no_grad():
        assert float(measure()) < float(before)
