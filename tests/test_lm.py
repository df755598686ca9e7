"""The Transformer LM (paper 004 §3.2): size of the paper preset, the vocabulary convention, and the key-value cache:
incremental decoding equals a full pass, batched rows equal rows alone, selection by parent, trimming."""

from __future__ import annotations

import pytest
import torch

from asr_core.config.parse import ConfigError
from asr_core.lm import KVCache, LMConfig, TransformerLM, build_lm, parameter_count, preset

torch.set_num_threads(1)

V = 11  # 10 pieces + the id that is the acoustic model's blank and the LM's beginning-of-document token


def tiny(dtype: torch.dtype = torch.float64, seed: int = 0, **overrides) -> TransformerLM:
    torch.manual_seed(seed)
    model = build_lm(preset("tiny", vocab_size=V, **overrides)).to(dtype).eval()
    with torch.no_grad():  # a trained-looking position bias: nonzero and varying with distance
        for p in model.position_bias.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def run(model: TransformerLM, seq: list[int], cache: KVCache | None = None, window: int | None = None):
    tokens = torch.tensor([seq], dtype=torch.long)
    return model(tokens, torch.tensor([len(seq)]), cache, window=window)


# ---- configuration ---------------------------------------------------------------------------------------------
def test_paper_preset_has_about_72M_parameters_on_the_acoustic_vocabulary() -> None:
    cfg = preset("paper")
    assert (cfg.layers, cfg.d_model, cfg.heads, cfg.vocab_size) == (6, 1024, 16, 4096)
    n = parameter_count(cfg)
    assert abs(n / 1e6 - 72.0) < 1.0, f"{n / 1e6:.2f}M parameters, the paper's LM has 72M"
    # a GEGLU 4d wide (not parameter-matched) would be far from the paper's figure
    assert n - parameter_count(preset("paper", ff_expansion=6)) < -20e6


def test_vocabulary_reads_every_id_and_predicts_the_pieces() -> None:
    model = tiny()
    assert model.bos_id == V - 1 and model.pieces == V - 1
    logits, cache = run(model, [model.bos_id, 3, 9, 0])
    assert logits.shape == (1, 4, V - 1)
    assert cache.keys.shape == (2, 1, 4, model.cfg.head_dim) and cache.lengths.tolist() == [4]


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match="lm.heads"):
        LMConfig(d_model=100, heads=16)
    with pytest.raises(ConfigError, match="lm.vocab_size"):
        LMConfig(vocab_size=2)
    with pytest.raises(ConfigError, match="unknown LM preset 'huge'.*paper, tiny"):
        preset("huge")
    with pytest.raises(ConfigError, match="unknown LM config key.*colour"):
        preset("tiny", colour=3)
    with pytest.raises(ConfigError, match="ckpt: unknown LM config key.*depth"):
        LMConfig.from_dict({"depth": 6}, source="ckpt")
    cfg = preset("tiny", vocab_size=V)
    assert LMConfig.from_dict(cfg.to_dict()) == cfg


# ---- the cache ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cached_incremental_scores_equal_a_full_forward_pass(dtype: torch.dtype) -> None:
    model = tiny(dtype)
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([13, 7, 10, 1])
    tokens = torch.randint(0, V, (4, 13), generator=g)
    with torch.no_grad():
        full, full_cache = model(tokens, lengths)
        pieces, cache, at = [], None, 0
        for size in (1, 3, 1, 2, 4, 2):  # chunks of several sizes; rows run out of tokens at different steps
            step = tokens[:, at: at + size]
            n = (lengths - at).clamp(0, size)
            out, cache = model(step, n, cache)
            pieces.append(out)
            at += size
    inc = torch.cat(pieces, 1)
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(inc[b, :n], full[b, :n], atol=1e-5, rtol=0)
    assert cache.lengths.tolist() == lengths.tolist() == full_cache.lengths.tolist()
    assert torch.isfinite(inc).all() and torch.isfinite(full).all()  # padded queries give finite garbage, not NaN


def test_batched_rows_equal_rows_decoded_one_at_a_time() -> None:
    model = tiny()
    histories = [[10, 1, 2, 3, 4, 5, 6], [10, 7], [10, 8, 8, 2, 1], [10]]
    new = [[3, 4], [5], [], [9, 9]]  # different cache lengths and new lengths, one row with nothing new
    with torch.no_grad():
        caches = [run(model, h)[1] for h in histories]
        batched = caches[0]
        for c in caches[1:]:
            batched = batched.concat(c)
        tokens = torch.tensor([(n + [0, 0])[:2] for n in new])
        out, after = model(tokens, torch.tensor([len(n) for n in new]), batched)
        probe, _ = model(torch.full((4, 1), 2), torch.ones(4, dtype=torch.long), after)  # the cache after, too
        for b, (h, n) in enumerate(zip(histories, new)):
            alone, alone_cache = run(model, h + n) if n else (None, caches[b])
            if n:
                torch.testing.assert_close(out[b, :len(n)], alone[0, len(h):], atol=1e-12, rtol=0)
            torch.testing.assert_close(probe[b], run(model, [2], alone_cache)[0][0], atol=1e-12, rtol=0)
    assert after.lengths.tolist() == [len(h) + len(n) for h, n in zip(histories, new)]


def test_select_gathers_rows_by_parent() -> None:
    model = tiny()
    histories = [[10, 1, 2], [10, 4, 4, 4, 4, 5], [10, 6, 2, 2]]
    with torch.no_grad():
        cache = run(model, histories[0])[1].concat(run(model, histories[1])[1]).concat(run(model, histories[2])[1])
        parents, nxt = [2, 0, 0, 2], [1, 3, 5, 7]
        out, _ = model(torch.tensor([[c] for c in nxt]), torch.ones(4, dtype=torch.long), cache.select(parents))
        for b, (p, c) in enumerate(zip(parents, nxt)):
            torch.testing.assert_close(out[b, 0], run(model, histories[p] + [c])[0][0, -1], atol=1e-12, rtol=0)
    assert cache.select([0, 2]).size == 4  # columns no selected row uses are dropped


def test_trimmed_cache_equals_a_forward_pass_over_the_last_n_tokens() -> None:
    """Literally so for one layer: keys and values depend on their own token only, and the position bias on
    distances only, so cutting the cache moves nothing."""
    model = tiny(layers=1)
    seq, nxt, n = [10, 3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [8, 2], 4
    with torch.no_grad():
        cache = run(model, seq)[1]
        trimmed = cache.trim(n)
        assert trimmed.size == n and trimmed.lengths.tolist() == [n]
        got = run(model, nxt, trimmed)[0][0]
        want = run(model, seq[-n:] + nxt)[0][0, n:]
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
        assert (run(model, nxt, cache)[0][0] - want).abs().max() > 1e-3  # the cut mattered


def test_trimmed_cache_equals_a_windowed_forward_pass_at_any_depth() -> None:
    """With several layers a cached key carries what its token saw, so decoding with the cache cut to n after every
    step is the full pass in which every token sees at most n earlier tokens at every layer (Transformer-XL)."""
    model = tiny()
    g = torch.Generator().manual_seed(2)
    seq = [10] + torch.randint(0, V - 1, (20,), generator=g).tolist()
    n = 5
    with torch.no_grad():
        want = run(model, seq, window=n)[0][0]
        steps, cache = [], None
        for tok in seq:  # one token a step, as the beam search feeds them
            out, cache = run(model, [tok], cache)
            cache = cache.trim(n)
            steps.append(out[0, 0])
        torch.testing.assert_close(torch.stack(steps), want, atol=1e-12, rtol=0)
        chunked, cache = [], None
        for s in range(0, len(seq), 7):  # chunks, as a prompt is fed: the window applies inside a chunk too
            out, cache = run(model, seq[s: s + 7], cache, window=n)
            cache = cache.trim(n)
            chunked.append(out[0])
        torch.testing.assert_close(torch.cat(chunked), want, atol=1e-12, rtol=0)
        assert (run(model, seq)[0][0, -1] - want[-1]).abs().max() > 1e-3  # the window mattered


def test_a_row_with_no_new_tokens_keeps_its_cache() -> None:
    model = tiny()
    with torch.no_grad():
        cache = run(model, [10, 1, 2])[1].concat(run(model, [10, 5])[1])
        _, after = model(torch.tensor([[4], [0]]), torch.tensor([1, 0]), cache)
        assert after.lengths.tolist() == [4, 2]
        torch.testing.assert_close(after.select([1]).keys, cache.select([1]).keys, atol=0, rtol=0)
    with pytest.raises(ValueError, match="trim a cache to -1"):
        cache.trim(-1)
    with pytest.raises(ValueError, match="holds 2 rows but 1"):
        model(torch.tensor([[1]]), torch.tensor([1]), cache)


def test_forget_starts_a_row_afresh_and_detach_cuts_the_graph() -> None:
    model = tiny()
    cache = run(model, [10, 1, 2, 3])[1].concat(run(model, [10, 5])[1])
    fresh = cache.forget(torch.tensor([True, False]))
    assert fresh.lengths.tolist() == [0, 2] and fresh.size == 2
    with torch.no_grad():
        out, _ = model(torch.tensor([[10, 4], [6, 0]]), torch.tensor([2, 1]), fresh)
        torch.testing.assert_close(out[0], run(model, [10, 4])[0][0], atol=1e-12, rtol=0)
        torch.testing.assert_close(out[1, :1], run(model, [10, 5, 6])[0][0, 2:], atol=1e-12, rtol=0)
    assert cache.keys.requires_grad and not cache.detach().keys.requires_grad


def test_the_lm_remembers_1280_tokens_by_default_as_the_decoded_lm_did() -> None:
    """Paper 004 §3.3 and the authors' decoded LM (the 512_1280 run): a memory of 1280 tokens after each chunk."""
    from asr_core.lm.config import LMTrainConfig

    assert LMTrainConfig().cache_len == 1280 and LMTrainConfig().chunk_len == 512


def test_the_prompt_is_one_training_transcript_and_never_a_test_one(tmp_path, capsys) -> None:
    """``lm prompt``: the authors' episode where the training text holds it (else the first document), ended with a
    full stop; refused when it is a transcript of a --not-in text."""
    import json

    from asr_core.lm.cli import cli as lm_main
    from asr_core.lm.prompt import AUTHORS_EPISODE

    def write(path, docs):
        path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs.items()))
        return f"text:{path}"

    words = "one two three four five six seven eight nine ten eleven twelve".split()
    train = write(tmp_path / "train.jsonl", {"b-doc": " ".join(words[:10]), "a-doc": " ".join(reversed(words)),
                                             AUTHORS_EPISODE: " ".join(words[2:])})
    test = write(tmp_path / "test.jsonl", {"t1": " ".join(words[:10]) + " and more"})
    out = tmp_path / "prompt.txt"
    assert lm_main(["prompt", "--text", train, "--out", str(out), "--not-in", test]) == 0
    assert out.read_text() == " ".join(words[2:]) + ".\n"  # the authors' episode
    assert lm_main(["prompt", "--text", train, "--out", str(out), "--document", "a-doc"]) == 0
    assert out.read_text().startswith("twelve eleven")
    capsys.readouterr()
    # b-doc is the test transcript: refused, naming both
    assert lm_main(["prompt", "--text", train, "--out", str(out), "--document", "b-doc", "--not-in", test]) == 2
    err = capsys.readouterr().err
    assert "must not be a test transcript" in err and "b-doc" in err and test in err
    assert out.read_text().startswith("twelve eleven")  # nothing written
    assert lm_main(["prompt", "--text", train, "--out", str(out), "--document", "nope"]) == 2
