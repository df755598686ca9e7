"""The lookup-dictionary memory of paper 002 (§2): bucket ids against a brute-force Eq. 2, the reach of the sum hash,
incremental ids, the read against a hand softmax, the update rule (Eq. 3-4) and its vectorised form against the
reference loop, warm-up and eval gating, read-before-update, gradients, and save/restore of the update stream."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from asr_core.config.parse import ConfigError
from asr_core.lm.memory import (ORDERED_MODULUS, ORDERED_MULTIPLIER, LookupMemory, MemoryConfig, bucket_ids,
                                dictionary_elements, next_history, occupancy, update_probabilities)

torch.set_num_threads(1)

V = 48  # the demo's vocabulary
BOS = V - 1
D_MODEL = 8


def memory(trained: bool = True, counts: torch.Tensor | None = None, **overrides) -> LookupMemory:
    """A small memory in training mode, past warm-up unless ``warmup_steps`` is given, counts set."""
    cfg = MemoryConfig(**{"buckets": 7, "slots": 4, "warmup_steps": 0, **overrides})
    mem = LookupMemory(cfg, D_MODEL, V).train(trained)
    mem.set_counts(torch.ones(V, dtype=torch.long) if counts is None else counts)
    return mem


def embedding(seed: int = 1) -> torch.Tensor:
    return torch.randn(V, D_MODEL, generator=torch.Generator().manual_seed(seed))


def tokens(b: int, t: int, seed: int = 2) -> torch.Tensor:
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


def brute_ids(seq: list[int], cfg: MemoryConfig, before: list[int]) -> list[int]:
    """Eq. 2 (or the ordered hash) position by position with Python integers."""
    ext = before + seq
    out = []
    for k in range(len(seq)):
        window = ext[k: k + cfg.order]
        if cfg.hash == "sum":
            out.append(sum(window) % cfg.buckets)
        else:
            h = sum(x * ORDERED_MULTIPLIER ** (cfg.order - 1 - j) for j, x in enumerate(window)) % ORDERED_MODULUS
            h ^= h >> 16
            h = h * ORDERED_MULTIPLIER % ORDERED_MODULUS
            out.append((h ^ (h >> 16)) % cfg.buckets)
    return out


# ---- configuration ---------------------------------------------------------------------------------------------
def test_defaults_are_the_papers_librispeech_setting() -> None:
    cfg = MemoryConfig()
    assert (cfg.buckets, cfg.slots, cfg.order, cfg.hash, cfg.alpha, cfg.warmup_steps) == (5000, 64, 2, "sum", 0.5,
                                                                                             1000)
    assert (cfg.combine, cfg.trainable, cfg.draw) == ("replace", False, "vector")


@pytest.mark.parametrize("field,value", [("buckets", 0), ("slots", 0), ("order", 0), ("hash", "xor"),
                                         ("combine", "mean"), ("trainable", 1), ("draw", "row"),
                                         ("warmup_steps", -1), ("alpha", 1.0), ("init_std", 0.0), ("seed", -1)])
def test_config_errors_name_the_field_and_what_is_valid(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"'lm\.memory\.{field}'.*valid: "):
        MemoryConfig(**{field: value})


# ---- indexing ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hash_", ["sum", "ordered"])
@pytest.mark.parametrize("order", [1, 2, 3])
def test_bucket_ids_equal_a_brute_force_loop(hash_: str, order: int) -> None:
    cfg = MemoryConfig(buckets=13, order=order, hash=hash_)
    toks = tokens(3, 9)
    ids = bucket_ids(toks, BOS, cfg)
    assert ids.shape == (3, 9) and ids.dtype == torch.long
    for b in range(3):
        assert ids[b].tolist() == brute_ids(toks[b].tolist(), cfg, [BOS] * (order - 1))


def test_ordered_hash_tells_the_order_and_the_sum_hash_does_not() -> None:
    pairs = torch.tensor([[a, b] for a in range(V) for b in range(V) if a != b])
    swapped = pairs.flip(1)
    for hash_, expect_same in (("sum", True), ("ordered", False)):
        cfg = MemoryConfig(buckets=5000, hash=hash_)
        last = lambda p: bucket_ids(p, BOS, cfg)[:, -1]  # noqa: E731  the bucket of the 2-gram "p[0] p[1]"
        same = last(pairs) == last(swapped)
        if expect_same:
            assert bool(same.all())
        else:
            assert int(same.sum()) <= 4, "the ordered hash should almost never confuse 'a b' with 'b a'"
            assert int(last(torch.tensor([[3, 5]]))) != int(last(torch.tensor([[5, 3]])))


@pytest.mark.parametrize("buckets", [50, 94, 95, 96, 5000, 10000, 10**6])
def test_sum_hash_on_48_ids_reaches_at_most_95_buckets_whatever_u(buckets: int) -> None:
    pairs = torch.tensor([[a, b] for a in range(V) for b in range(V)])
    reached = torch.unique(bucket_ids(pairs, BOS, MemoryConfig(buckets=buckets))[:, -1]).numel()
    assert reached == min(buckets, 2 * (V - 1) + 1)  # sums 0 .. 94
    if buckets >= 5000:
        ordered = bucket_ids(pairs, BOS, MemoryConfig(buckets=buckets, hash="ordered"))[:, -1]
        assert torch.unique(ordered).numel() > 1800  # about what a random function of the pair reaches


@pytest.mark.parametrize("hash_", ["sum", "ordered"])
@pytest.mark.parametrize("order", [1, 2, 3])
def test_incremental_ids_with_history_equal_the_full_pass(hash_: str, order: int) -> None:
    cfg = MemoryConfig(buckets=31, order=order, hash=hash_)
    toks = tokens(2, 11)
    full = bucket_ids(toks, BOS, cfg)
    hist = torch.full((2, order - 1), BOS, dtype=torch.long)
    steps = []
    for k in range(11):  # one token at a time, as a key-value-cached decoder runs
        steps.append(bucket_ids(toks[:, k: k + 1], BOS, cfg, history=hist))
        hist = next_history(hist, toks[:, k: k + 1])
    assert torch.equal(torch.cat(steps, 1), full)
    # ragged chunks: row 0 takes 4 then 7 tokens, row 1 takes 6 then 5 (right-padded with junk)
    lengths = torch.tensor([4, 6])
    first = torch.stack([torch.cat([toks[0, :4], torch.tensor([1, 1])]), toks[1, :6]])
    hist0 = torch.full((2, order - 1), BOS, dtype=torch.long)
    ids1 = bucket_ids(first, BOS, cfg, history=hist0)
    hist1 = next_history(hist0, first, lengths)
    second = torch.stack([toks[0, 4:], torch.cat([toks[1, 6:], torch.tensor([1, 1])])])
    ids2 = bucket_ids(second, BOS, cfg, history=hist1)
    assert torch.equal(torch.cat([ids1[0, :4], ids2[0]]), full[0])
    assert torch.equal(torch.cat([ids1[1, :6], ids2[1, :5]]), full[1])


def test_bad_history_says_what_shape_it_needs() -> None:
    with pytest.raises(ValueError, match=r"history must be \(B, N - 1\) = \(2, 1\)"):
        bucket_ids(tokens(2, 3), BOS, MemoryConfig(), history=torch.zeros(2, 2, dtype=torch.long))


def test_occupancy_is_the_share_of_buckets_reached() -> None:
    ids = torch.tensor([[0, 1, 1, 3], [3, 3, 9, 9]])
    assert occupancy(ids, 10) == pytest.approx(0.4)
    assert occupancy(ids, 10, valid=torch.tensor([[True] * 4, [True, False, False, False]])) == pytest.approx(0.3)


# ---- reading -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("combine", ["replace", "add"])
def test_read_equals_a_hand_softmax(combine: str) -> None:
    mem = memory(combine=combine).double()
    c = torch.randn(2, 5, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ids = bucket_ids(tokens(2, 5), BOS, mem.cfg)
    out = mem.read(c, ids)
    for b in range(2):
        for k in range(5):
            d_i = mem.D[int(ids[b, k])]  # (M, d)
            w = [math.exp(float(d_i[m] @ c[b, k]) / math.sqrt(D_MODEL)) for m in range(mem.cfg.slots)]
            want = sum(wm / sum(w) * d_i[m] for m, wm in enumerate(w))
            if combine == "add":
                want = want + c[b, k]
            torch.testing.assert_close(out[b, k], want)


def test_trainable_false_gives_d_no_gradient_and_true_does() -> None:
    c = torch.randn(1, 3, D_MODEL, requires_grad=True)
    frozen = memory()
    assert not frozen.D.requires_grad and "D" not in dict(frozen.named_parameters())
    frozen.read(c, torch.tensor([[0, 1, 2]])).sum().backward()
    assert c.grad is not None and frozen.D.grad is None
    learned = memory(trainable=True)
    assert "D" in dict(learned.named_parameters())
    learned.read(c, torch.tensor([[0, 1, 2]])).sum().backward()
    assert learned.D.grad is not None and float(learned.D.grad[:3].abs().sum()) > 0


# ---- the update rule ---------------------------------------------------------------------------------------------
def test_update_probability_is_one_over_ln_count_clamped_at_one() -> None:
    p = update_probabilities(torch.tensor([0, 1, 2, 1000, 55]))
    assert p[:3].tolist() == [1.0, 1.0, 1.0]  # count <= 1, and 1 < count < e, where 1 / ln count > 1
    assert float(p[3]) == pytest.approx(1 / math.log(1000), rel=1e-12)
    assert float(p[4]) == pytest.approx(1 / math.log(55), rel=1e-12)  # natural log: about 0.2495


def test_with_p_one_every_slot_of_the_bucket_becomes_the_average_with_the_next_embedding() -> None:
    mem, emb = memory(), embedding()
    before = mem.D.clone()
    ids, nxt = torch.tensor([[2, 5]]), torch.tensor([[10, 11]])
    mem.update(ids, nxt, emb)
    torch.testing.assert_close(mem.D[2], 0.5 * before[2] + 0.5 * emb[10].expand(4, -1))
    torch.testing.assert_close(mem.D[5], 0.5 * before[5] + 0.5 * emb[11].expand(4, -1))
    untouched = [i for i in range(7) if i not in (2, 5)]
    assert torch.equal(mem.D[untouched], before[untouched])


def test_with_p_zero_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    mem = memory()
    monkeypatch.setattr(mem, "update_probability", lambda nxt: torch.zeros(nxt.shape, dtype=torch.float64))
    before = mem.D.clone()
    mem.update(bucket_ids(tokens(3, 10), BOS, mem.cfg), tokens(3, 10, seed=4), embedding())
    assert torch.equal(mem.D, before) and int(mem.step) == 1


def test_padding_positions_are_skipped() -> None:
    mem = memory()
    before = mem.D.clone()
    mem.update(torch.tensor([[1, 2]]), torch.tensor([[3, 4]]), embedding(), valid=torch.tensor([[True, False]]))
    assert not torch.equal(mem.D[1], before[1]) and torch.equal(mem.D[2], before[2])


@pytest.mark.parametrize("draw", ["vector", "bucket"])
def test_batched_update_equals_the_sequential_loop_with_repeated_hits(draw: str) -> None:
    counts = torch.randint(1, 5000, (V,), generator=torch.Generator().manual_seed(5))  # P from 0.12 to 1
    fast = memory(counts=counts, buckets=3, draw=draw)
    slow = copy.deepcopy(fast)
    emb = embedding()
    for step in range(3):
        toks, nxt = tokens(3, 20, seed=10 + step), tokens(3, 20, seed=20 + step)
        ids = bucket_ids(toks, BOS, fast.cfg)
        valid = torch.ones(3, 20, dtype=torch.bool)
        valid[1, 15:] = False
        assert torch.equal(fast.generator_state(), slow.generator_state())  # both draw the same uniforms
        before = fast.D.clone()
        fast.update(ids, nxt, emb, valid)
        slow.update_loop(ids, nxt, emb, valid)
        torch.testing.assert_close(fast.D, slow.D, rtol=1e-5, atol=1e-6)
        changed = (fast.D != before).any(-1)  # (U, M): slots written this step
        assert int(changed.sum()) > 0
    # 3 buckets and 57 valid positions per step: every bucket was hit many times in each step
    assert torch.bincount(ids[valid], minlength=3).min() > 5


def test_no_update_before_warmup_or_in_eval_mode() -> None:
    mem, emb = memory(warmup_steps=2), embedding()
    ids, nxt = torch.tensor([[0, 1]]), torch.tensor([[2, 3]])
    before, gen = mem.D.clone(), mem.generator_state()
    for _ in range(2):
        mem.update(ids, nxt, emb)
        assert torch.equal(mem.D, before)
    assert int(mem.step) == 2 and torch.equal(mem.generator_state(), gen)  # counted, nothing drawn
    mem.eval()
    mem.update(ids, nxt, emb)
    assert torch.equal(mem.D, before) and int(mem.step) == 2  # eval: not even counted
    mem.train()
    mem.update(ids, nxt, emb)
    assert not torch.equal(mem.D, before) and int(mem.step) == 3


def test_unset_counts_are_refused_once_updates_start() -> None:
    mem = LookupMemory(MemoryConfig(buckets=7, slots=4, warmup_steps=0), D_MODEL, V)
    with pytest.raises(RuntimeError, match="set_counts"):
        mem.update(torch.tensor([[0]]), torch.tensor([[1]]), embedding())
    with pytest.raises(ValueError, match="bincount"):
        mem.set_counts(torch.ones(V))


def test_a_training_steps_read_uses_the_memory_before_that_steps_update() -> None:
    mem, emb = memory(), embedding()
    snapshot = copy.deepcopy(mem).eval()
    c = torch.randn(2, 6, D_MODEL, generator=torch.Generator().manual_seed(6))
    ids, nxt = bucket_ids(tokens(2, 6), BOS, mem.cfg), tokens(2, 6, seed=7)
    out = mem(c, ids, nxt, emb)
    assert torch.equal(out, snapshot.read(c, ids))
    assert not torch.equal(mem.D, snapshot.D)  # the step did update ...
    assert not torch.equal(mem.read(c, ids), out)  # ... and the next step reads the new memory


def test_state_dict_and_generator_state_reproduce_the_next_update_bit_for_bit() -> None:
    counts = torch.randint(1, 100000, (V,), generator=torch.Generator().manual_seed(8))
    mem, emb = memory(counts=counts), embedding()
    ids, nxt = bucket_ids(tokens(4, 16), BOS, mem.cfg), tokens(4, 16, seed=9)
    mem.update(ids, nxt, emb)
    saved, gen = copy.deepcopy(mem.state_dict()), mem.generator_state()
    mem.update(ids, nxt, emb)
    restored = LookupMemory(MemoryConfig(buckets=7, slots=4, warmup_steps=0, seed=99), D_MODEL, V).train()
    restored.load_state_dict(saved)
    restored.load_generator_state(gen)
    assert int(restored.step) == 1 and torch.equal(restored.counts, counts)
    restored.update(ids, nxt, emb)
    assert torch.equal(restored.D, mem.D) and int(restored.step) == 2


# ---- size ----------------------------------------------------------------------------------------------------------
def test_memory_size_is_reported_and_dwarfs_a_small_lm() -> None:
    assert dictionary_elements(MemoryConfig(), 1024) == 327_680_000  # 4.5x the paper-004 LM's 72M parameters
    mem = memory()
    sizes = mem.memory_bytes()
    assert sizes["dictionary"] == 7 * 4 * D_MODEL * 4 and sizes["parameters"] == 0
    assert sizes["total"] == sizes["buffers"] == sizes["dictionary"] + V * 8 + 8
    trainable = memory(trainable=True).memory_bytes()
    assert trainable["parameters"] == trainable["dictionary"]
