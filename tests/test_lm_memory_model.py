"""The Transformer LM with paper 002's lookup memory (``lm.memory``) and tied embeddings (``lm.tie_embeddings``):
incremental decoding with the memory equals a full pass (select, concat, trim, forget included), a training step
reads the memory before updating it, a config without the new keys loads and scores as before, tied embeddings
share storage, the size report, config round trips and errors, and a resumed training run equals an uninterrupted
one bit for bit."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import signal
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from asr_core.config.parse import ConfigError
from asr_core.data.tokenizer import Tokenizer
from asr_core.lm.checkpoint import load_lm, load_tokenizer
from asr_core.lm.config import LMConfig, LMTrainConfig, resolve_config
from asr_core.lm.data import generate_documents, read_documents, write_documents
from asr_core.lm.memory import MemoryConfig, bucket_ids
from asr_core.lm.model import KVCache, TransformerLM, build_lm, lm_size, parameter_count
from asr_core.lm.ppl import score_documents
from asr_core.lm.train import Preempted, encode, next_token_counts, train_lm
from asr_core.runtime import signals
from asr_core.config.yaml_input import load_yaml_text

V = 11  # 10 pieces + the beginning-of-document id
BOS = V - 1
BASE = dict(vocab_size=V, d_model=16, layers=2, heads=2, dpb_width=8, qk_scale=10.0)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def mem_cfg(**overrides: object) -> MemoryConfig:
    """A small memory, past warm-up, with a D large enough that reading it changes the logits."""
    return MemoryConfig(**{"buckets": 7, "slots": 4, "order": 2, "init_std": 1.0, "warmup_steps": 0, **overrides})


def lm(seed: int = 0, dtype: torch.dtype = torch.float32, **memory: object) -> TransformerLM:
    torch.manual_seed(seed)
    model = build_lm(LMConfig(**BASE, memory=mem_cfg(**memory), tie_embeddings=True)).to(dtype).eval()
    model.memory.set_counts(torch.arange(1, V + 1))
    return model


def run(model: TransformerLM, seq: list[int], cache: KVCache | None = None, window: int | None = None):
    return model(torch.tensor([seq]), torch.tensor([len(seq)]), cache, window=window)


# ---- incremental decoding ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("order,hash_,dtype", [(1, "sum", torch.float32), (2, "sum", torch.float32),
                                               (3, "ordered", torch.float64)])
def test_incremental_decoding_with_the_memory_equals_a_full_pass(order: int, hash_: str, dtype: torch.dtype) -> None:
    model = lm(dtype=dtype, order=order, hash=hash_)
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([13, 7, 10, 1])
    tokens = torch.randint(0, V, (4, 13), generator=g)
    with torch.no_grad():
        full, full_cache = model(tokens, lengths)
        pieces, cache, at = [], None, 0
        for size in (1, 3, 1, 2, 4, 2):  # one token and chunks; rows run out at different steps
            n = (lengths - at).clamp(0, size)
            out, cache = model(tokens[:, at: at + size], n, cache)
            pieces.append(out)
            at += size
    inc = torch.cat(pieces, 1)
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(inc[b, :n], full[b, :n], atol=1e-5, rtol=0)
    assert cache.history.shape == (4, order - 1) and cache.bos_id == BOS
    assert torch.equal(cache.history, full_cache.history)
    # the memory matters: the same weights without it score otherwise
    bare = copy.deepcopy(model)
    bare.memory = None
    assert not torch.allclose(bare(tokens, lengths)[0], full, atol=1e-3)


def test_trimmed_cache_keeps_the_history_and_equals_a_windowed_full_pass() -> None:
    model = lm(order=3)
    seq = [BOS, 3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    with torch.no_grad():
        want, _ = run(model, seq, window=2)
        got, cache = [], None
        for tok in seq:
            out, cache = run(model, [tok], cache)
            cache = cache.trim(2)
            got.append(out[0, 0])
        assert cache.size == 2 and cache.history[0].tolist() == seq[-2:]
        torch.testing.assert_close(torch.stack(got), want[0], atol=1e-5, rtol=0)
        zero = cache.trim(0)  # no keys left, the history stays
        assert zero.size == 0 and torch.equal(zero.history, cache.history)


def test_select_concat_and_forget_keep_the_history_consistent() -> None:
    model = lm(order=3)
    histories = [[BOS, 1, 2, 3, 4, 5, 6], [BOS, 7], [BOS, 8, 8, 2, 1], [BOS]]
    with torch.no_grad():
        caches = [run(model, h)[1] for h in histories]
        batched = caches[0]
        for c in caches[1:]:
            batched = batched.concat(c)
        assert batched.history.tolist() == [[5, 6], [BOS, 7], [2, 1], [BOS, BOS]]
        picked = batched.select([2, 0, 0, 3])  # beams by parent, repeats allowed
        assert picked.history.tolist() == [[2, 1], [5, 6], [5, 6], [BOS, BOS]]
        fresh = picked.forget(torch.tensor([False, True, False, False]))
        assert fresh.history.tolist() == [[2, 1], [BOS, BOS], [5, 6], [BOS, BOS]]
        assert fresh.detach().history is fresh.history and fresh.to("cpu").history.tolist() == fresh.history.tolist()
        new = [[3, 4], [BOS, 9], [5], [9, 9]]  # row 1 starts a new document after forgetting
        tokens = torch.tensor([(n + [0])[:2] for n in new])
        out, after = model(tokens, torch.tensor([len(n) for n in new]), fresh)
        alone = [histories[2] + new[0], new[1], histories[0] + new[2], histories[3] + new[3]]
        for b, seq in enumerate(alone):
            want, want_cache = run(model, seq)
            k = len(new[b])
            torch.testing.assert_close(out[b, :k], want[0, -k:], atol=1e-5, rtol=0)
            assert after.history[b].tolist() == want_cache.history[0].tolist()
    plain = build_lm(LMConfig(**BASE)).eval()
    with pytest.raises(ValueError, match="different models"):
        batched.concat(run(plain, [BOS, 1])[1])
    with pytest.raises(ValueError, match="carries none"):
        run(model, [1], run(plain, [BOS, 1])[1])


# ---- training ----------------------------------------------------------------------------------------------------
def test_a_training_step_reads_the_memory_before_updating_it() -> None:
    model = lm(order=2).train()
    before = copy.deepcopy(model).eval()
    tokens = torch.tensor([[BOS, 3, 5, 7, 2], [BOS, 1, 4, 0, 0]])
    lengths = torch.tensor([5, 3])
    targets = torch.tensor([[3, 5, 7, 2, 8], [1, 4, 6, -100, -100]])  # padding holds anything
    ref = copy.deepcopy(model.memory)  # the update the step should make, done by hand
    logits, _ = model(tokens, lengths, targets=targets)
    want, _ = before(tokens, lengths)  # no update in eval mode; otherwise the same computation
    assert torch.equal(logits, want)  # the step's logits: the memory before the step
    valid = torch.arange(5)[None, :] < lengths[:, None]
    ref.update(bucket_ids(tokens, BOS, ref.cfg), torch.where(valid, targets, BOS), model.embed.weight, valid)
    assert torch.equal(model.memory.D, ref.D) and not torch.equal(model.memory.D, before.memory.D)
    assert int(model.memory.step) == 1
    F.cross_entropy(logits[valid], targets[valid]).backward()  # the in-place update leaves the graph intact
    assert model.embed.weight.grad is not None and model.memory.D.grad is None
    with torch.no_grad():
        assert not torch.equal(model.eval()(tokens, lengths)[0], want)  # the next step reads the update
    # without targets: the inputs shifted by one, each row's last position storing nothing
    shifted, ref2 = lm(order=2).train(), lm(order=2).train()
    shifted(tokens, lengths)
    nxt = torch.tensor([[3, 5, 7, 2, BOS], [1, 4, BOS, BOS, BOS]])
    ref2.memory.update(bucket_ids(tokens, BOS, ref2.memory.cfg), nxt, ref2.embed.weight, nxt != BOS)
    assert torch.equal(shifted.memory.D, ref2.memory.D)


# ---- configuration -------------------------------------------------------------------------------------------------
# logits of LMConfig(**BASE) built after torch.manual_seed(1234), computed before the memory existed
OLD_ROW0 = [[0.5241460204124451, -0.09421086311340332, 1.2148717641830444],
            [-0.1843474805355072, -0.11617816984653473, 0.1340615451335907],
            [0.1816278100013733, -0.3582463562488556, 0.20617154240608215],
            [-0.08497248589992523, 0.38569313287734985, -0.31022903323173523],
            [0.0013759732246398926, -0.3934290111064911, 0.0933210700750351],
            [-0.635169267654419, -1.1136304140090942, -0.25527486205101013]]
OLD_SUMS = (-5.859323412179947, 22.49910417199135)


def test_a_config_without_the_new_keys_loads_and_scores_as_before() -> None:
    old = {k: v for k, v in LMConfig(**BASE).to_dict().items() if k not in ("memory", "tie_embeddings")}
    cfg = LMConfig.from_dict(old)
    assert cfg == LMConfig(**BASE, memory=None, tie_embeddings=False)
    train_old = LMTrainConfig().to_dict()
    for k in ("memory", "tie_embeddings"):
        del train_old["lm"][k]
    assert LMTrainConfig.from_dict(train_old) == LMTrainConfig()
    tokens, lengths = torch.tensor([[10, 3, 5, 7, 2, 9], [10, 1, 1, 4, 0, 0]]), torch.tensor([6, 4])
    outs = []
    for c in (cfg, LMConfig(**BASE, memory=None, tie_embeddings=False)):
        torch.manual_seed(1234)
        model = build_lm(c).eval()
        assert model.memory is None and model.head is not None and "head.bias" in model.state_dict()
        assert not any(k.startswith("memory") for k in model.state_dict())
        with torch.no_grad():
            logits, cache = model(tokens, lengths)
        assert cache.history is None
        outs.append(logits)
    assert torch.equal(outs[0], outs[1])
    # values recorded before the memory existed, on another CPU: kernels of another instruction set sum in another
    # order, 1.3e-6 apart at most across ATEN_CPU_CAPABILITY default, avx2 and avx512 (logits up to 1.9); a model
    # that changed moves them by far more than the tolerance
    torch.testing.assert_close(outs[0][0, :, :3], torch.tensor(OLD_ROW0), atol=1e-5, rtol=0)
    sums = (float(outs[0][0].double().sum()), float(outs[0][1, :4].double().abs().sum()))
    assert sums == pytest.approx(OLD_SUMS, abs=1e-4)
    assert parameter_count(cfg) == 6302  # the count before the memory existed


def test_the_new_keys_round_trip_through_json_yaml_and_set() -> None:
    cfg = resolve_config("tiny", ["lm.memory.buckets=97", "lm.memory.hash=ordered", "lm.tie_embeddings=true",
                                  "lm.memory.alpha=0.25"], vocab_size=V)
    assert cfg.lm.memory == MemoryConfig(buckets=97, hash="ordered", alpha=0.25) and cfg.lm.tie_embeddings
    assert LMTrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    import yaml

    assert LMTrainConfig.from_dict(load_yaml_text(yaml.safe_dump(cfg.to_dict()), "t.yaml")) == cfg
    assert LMConfig.from_dict(cfg.lm.to_dict()) == cfg.lm
    flat = cfg.flat()
    assert flat["lm.memory.buckets"] == 97 and flat["lm.tie_embeddings"] is True and "lm.memory" not in flat
    assert resolve_config("tiny", vocab_size=V).flat()["lm.memory"] is None
    whole = resolve_config("tiny", ["lm.memory={slots: 8}", "lm.tie_embeddings=true"], vocab_size=V)
    assert whole.lm.memory == MemoryConfig(slots=8)


@pytest.mark.parametrize("sets,field", [
    (["lm.memory.buckets=97"], "lm.tie_embeddings"),  # a memory needs tied embeddings
    (["lm.tie_embeddings=true", "lm.memory.buckets=0"], "lm.memory.buckets"),
    (["lm.tie_embeddings=true", "lm.memory.order=1.5"], "lm.memory.order"),
    (["lm.tie_embeddings=true", "lm.memory.colour=1"], "lm.memory.colour"),
    (["lm.tie_embeddings=true", "lm.memory=5"], "lm.memory"),
    (["lm.tie_embeddings=3"], "lm.tie_embeddings"),
])
def test_a_bad_memory_config_is_refused_naming_the_field(sets: list[str], field: str) -> None:
    with pytest.raises(ConfigError, match=f"'{field}'"):
        resolve_config("tiny", sets, vocab_size=V)


def test_tied_embeddings_share_storage_and_drop_the_output_layer() -> None:
    torch.manual_seed(0)
    tied = build_lm(LMConfig(**BASE, tie_embeddings=True))
    assert tied.head is None and not any(k.startswith("head") for k in tied.state_dict())
    assert tied.output_weight.data_ptr() == tied.embed.weight.data_ptr()
    assert tied.output_weight.shape == (V - 1, 16)
    tokens, lengths = torch.tensor([[BOS, 1, 2]]), torch.tensor([3])
    logits, _ = tied(tokens, lengths)
    logits.sum().backward()
    assert tied.embed.weight.grad[5: V - 1].abs().sum() > 0  # ids never read: their gradient is the output layer's
    with torch.no_grad():
        tied.embed.weight[4].mul_(3.0)  # one storage: the output row of piece 4 moves too
    assert torch.equal(tied.output_weight[4], tied.embed.weight[4])
    untied = LMConfig(**BASE)
    assert parameter_count(untied) - parameter_count(LMConfig(**BASE, tie_embeddings=True)) == (V - 1) * 17


def test_the_size_report_counts_the_memory_apart() -> None:
    plain = LMConfig(**BASE, tie_embeddings=True)
    for trainable in (False, True):
        cfg = dataclasses.replace(plain, memory=MemoryConfig(buckets=50, slots=8, trainable=trainable))
        size = lm_size(cfg)
        assert size.parameters == parameter_count(cfg) == parameter_count(plain)
        assert size.memory == 50 * 8 * 16 and size.memory_bytes == 50 * 8 * 16 * 4 + (V + 1) * 8
        model = build_lm(cfg)
        assert model.memory.memory_bytes()["total"] == size.memory_bytes
        own = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("memory."))
        assert own == size.parameters
    assert lm_size(plain).memory == 0
    paper = lm_size(LMConfig(memory=MemoryConfig(), tie_embeddings=True))  # nothing allocated at the paper's size
    assert paper.memory == 5000 * 64 * 1024


# ---- training runs -----------------------------------------------------------------------------------------------
MICRO = ["batch=4", "chunk_len=16", "cache_len=32", "lm.d_model=32", "lm.heads=2", "lm.dpb_width=8",
         "warmup_steps=5", "lr=5e-3", "log_every=5", "lm.tie_embeddings=true", "lm.memory.buckets=31",
         "lm.memory.slots=4", "lm.memory.warmup_steps=2"]


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lmmemtext")
    docs = generate_documents(8, seed=4, min_words=12, max_words=20)
    write_documents(root / "short.jsonl", docs)
    Tokenizer.train([d.text for d in docs], 48, root / "tok.model")
    return {"train": root / "short.jsonl", "tok": root / "tok.model"}


def test_chunked_scoring_with_the_memory_equals_one_forward_pass() -> None:
    model = lm(order=2)
    docs = [torch.randint(0, V - 1, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (23, 9, 31)]
    want = 0.0
    with torch.no_grad():
        for d in docs:
            seq = torch.tensor([[BOS, *d]])
            logits, _ = model(seq[:, :-1], torch.tensor([len(d)]), window=6)
            want += float(F.cross_entropy(logits[0], seq[0, 1:], reduction="sum"))
    got = score_documents(model, docs, 6, chunk=5, batch=2)  # lanes forget their caches between documents
    assert got.nll == pytest.approx(want, rel=1e-5)


def test_resume_with_the_memory_equals_the_uninterrupted_run(text: dict[str, Path], tmp_path: Path) -> None:
    tok = load_tokenizer(text["tok"])
    cfg = resolve_config("tiny", [*MICRO, "max_steps=12", "checkpoint_every=6"], vocab_size=tok.vocab_size)
    texts = [f"text:{text['train']}"]
    straight: list[float] = []
    train_lm(cfg, texts, tok, tmp_path / "a", progress=lambda s, v: straight.append(v))

    def stop_at_6(step: int, loss: float) -> None:
        resumed.append(loss)
        if step == 6:
            os.kill(os.getpid(), signal.SIGUSR2)

    resumed: list[float] = []
    with pytest.raises(Preempted):
        train_lm(cfg, texts, tok, tmp_path / "b", progress=stop_at_6)
    signals.clear()
    mid = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    assert mid["step"] == 6 and mid["cache"]["history"].shape == (4, 1) and mid["memory_generator"] is not None
    train_lm(cfg, texts, tok, tmp_path / "b", progress=lambda s, v: resumed.append(v))
    assert resumed == straight
    a, b = (torch.load(tmp_path / d / "checkpoint.pt", weights_only=True) for d in "ab")
    assert a["model"].keys() == b["model"].keys() and "memory.D" in a["model"]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert torch.equal(a["memory_generator"], b["memory_generator"])
    assert torch.equal(a["cache"]["history"], b["cache"]["history"])
    assert int(a["model"]["memory.step"]) == 12  # one memory call a step; updates from step 3 on
    counts = next_token_counts(encode(tok, read_documents(texts[0])), tok.vocab_size)
    assert torch.equal(a["model"]["memory.counts"], counts) and int(counts[tok.vocab_size - 1]) == 0
    fresh = build_lm(cfg.lm)
    assert not torch.equal(fresh.memory.D, a["model"]["memory.D"])  # the run wrote the memory
    loaded = load_lm(tmp_path / "a" / "checkpoint.pt")
    assert loaded.model.memory is not None and torch.equal(loaded.model.memory.D, a["model"]["memory.D"])
