"""CTC prefix beam search (paper 004 §2.4, §3.4): greedy on peaked posteriors, the exact best labelling of a
brute-forced case (with and without the LM), batched cached LM scoring equal to an uncached LM asked one beam at a
time, the prompt, and the settings' checks."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from asr_core.decoding.beam import BeamConfig, beam_search
from asr_core.decoding.decode import greedy_ids
from asr_core.lm import TransformerLM, build_lm, preset

torch.set_num_threads(1)

WIDE = dict(beam_width=10_000, prune_threshold=math.inf, token_threshold=math.inf)


def tiny_lm(vocab: int, seed: int = 0, layers: int = 2) -> TransformerLM:
    torch.manual_seed(seed)
    model = build_lm(preset("tiny", vocab_size=vocab, layers=layers)).double().eval()
    with torch.no_grad():  # sharper next-token distributions than a fresh initialisation gives
        model.head.weight.mul_(8.0)
        for p in model.position_bias.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def random_posteriors(t: int, v: int, seed: int, sharpness: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(t, v, generator=g, dtype=torch.float64) * sharpness, -1)


def peaked_posteriors(t: int, v: int, seed: int, peak: float = 0.995) -> torch.Tensor:
    """Each frame puts ``peak`` on one class (the blank half the time, repeats common), the rest spread at random."""
    g = torch.Generator().manual_seed(seed)
    best = torch.where(torch.rand(t, generator=g) < 0.5, v - 1, torch.randint(0, v - 1, (t,), generator=g))
    rest = torch.rand(t, v, generator=g, dtype=torch.float64)
    rest[torch.arange(t), best] = 0
    probs = rest / rest.sum(1, keepdim=True) * (1 - peak)
    probs[torch.arange(t), best] = peak
    return probs


def collapse(path: tuple[int, ...], blank: int) -> tuple[int, ...]:
    return tuple(c for i, c in enumerate(path) if c != blank and (i == 0 or path[i - 1] != c))


def labelling_log_probs(probs: torch.Tensor, blank: int) -> dict[tuple[int, ...], float]:
    """log P(labelling) summed over every alignment, by enumerating all V^T paths."""
    t, v = probs.shape
    total: dict[tuple[int, ...], float] = {}
    p = probs.tolist()
    for path in itertools.product(range(v), repeat=t):
        lab = collapse(path, blank)
        total[lab] = total.get(lab, 0.0) + math.prod(p[i][c] for i, c in enumerate(path))
    return {lab: math.log(s) for lab, s in total.items() if s > 0}


@torch.no_grad()
def lm_log_prob(lm: TransformerLM, context: list[int], ids: tuple[int, ...]) -> float:
    """log P_LM(ids | context) from one uncached forward pass."""
    seq = context + list(ids)
    logits, _ = lm(torch.tensor([seq]), torch.tensor([len(seq)]))
    lp = torch.log_softmax(logits[0].double(), -1)
    return sum(float(lp[len(context) - 1 + k, tok]) for k, tok in enumerate(ids))


# ---- exactness -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_alpha_beta_zero_and_a_wide_beam_return_the_greedy_result_on_peaked_posteriors(seed: int) -> None:
    v = 8
    probs = peaked_posteriors(60, v, seed)
    greedy = greedy_ids(probs, v - 1)
    assert len(greedy) >= 10  # the case has something to decode
    cfg = BeamConfig(beam_width=64, alpha=0.0, beta=0.0)
    assert list(beam_search(probs, blank=v - 1, config=cfg).ids) == greedy
    with_lm = beam_search(probs, blank=v - 1, lm=tiny_lm(v, seed), config=cfg)
    assert list(with_lm.ids) == greedy and with_lm.lm_calls > 0


@pytest.mark.parametrize("seed", range(5))
def test_returns_the_exact_best_labelling_of_a_brute_forced_case(seed: int) -> None:
    v, blank = 4, 3  # three tokens and the blank, five frames: 1024 alignments
    probs = random_posteriors(5, v, seed)
    truth = labelling_log_probs(probs, blank)
    best = max(truth, key=truth.get)
    got = beam_search(probs, blank=blank, config=BeamConfig(alpha=0.0, beta=0.0, **WIDE))
    assert got.ids == best
    assert got.score == pytest.approx(truth[best], abs=1e-9) and got.am_score == pytest.approx(truth[best], abs=1e-9)
    assert math.log(sum(math.exp(s) for s in truth.values())) == pytest.approx(0.0, abs=1e-9)  # all paths counted


@pytest.mark.parametrize("seed", range(3))
def test_returns_the_exact_best_of_am_plus_lm_plus_length(seed: int) -> None:
    v, blank, alpha, beta = 4, 3, 0.8, 0.4
    probs = random_posteriors(5, v, seed + 10, sharpness=1.0)
    lm = tiny_lm(v, seed)
    prompt = [2, 0, 1]
    truth = labelling_log_probs(probs, blank)
    total = {lab: am + alpha * lm_log_prob(lm, [lm.bos_id] + prompt, lab) + beta * len(lab)
             for lab, am in truth.items()}
    best = max(total, key=total.get)
    am_best = max(truth, key=truth.get)
    got = beam_search(probs, blank=blank, lm=lm, config=BeamConfig(alpha=alpha, beta=beta, **WIDE), prompt=prompt)
    assert got.ids == best
    assert got.score == pytest.approx(total[best], abs=1e-9)
    assert got.lm_score == pytest.approx(lm_log_prob(lm, [lm.bos_id] + prompt, best), abs=1e-9)
    if best != am_best:  # the LM can overturn the acoustic model's choice
        assert got.am_score < truth[am_best]


def test_token_threshold_zero_keeps_only_each_frames_best_token() -> None:
    v = 6
    probs = random_posteriors(40, v, 3, sharpness=1.0)  # not peaked: beam search and greedy differ here
    cfg = BeamConfig(beam_width=25, alpha=0.0, beta=0.0, token_threshold=0.0)
    assert list(beam_search(probs, blank=v - 1, config=cfg).ids) == greedy_ids(probs, v - 1)
    wider = BeamConfig(beam_width=25, alpha=0.0, beta=0.0, token_threshold=6.0)
    assert beam_search(probs, blank=v - 1, config=wider).ids != tuple(greedy_ids(probs, v - 1))


# ---- the LM in the search --------------------------------------------------------------------------------------
class _Histories:
    """An uncached LM's state: every row's token history."""

    def __init__(self, rows: list[list[int]]) -> None:
        self.rows = rows

    def select(self, index: torch.Tensor) -> "_Histories":
        return _Histories([self.rows[i] for i in index.tolist()])

    def trim(self, n: int) -> "_Histories":
        return self  # the whole history is kept; the window of each full pass limits what a token sees

    def concat(self, other: "_Histories") -> "_Histories":
        return _Histories(self.rows + other.rows)


class OneAtATime:
    """The same LM without a cache or batching: each row is a separate full forward pass over its whole history."""

    def __init__(self, model: TransformerLM) -> None:
        self.model, self.bos_id, self.rows_seen = model, model.bos_id, 0

    def parameters(self):
        return self.model.parameters()

    def __call__(self, tokens, lengths, cache=None, *, window=None):
        rows = cache.rows if cache is not None else [[] for _ in range(tokens.shape[0])]
        out = torch.zeros(tokens.shape[0], tokens.shape[1], self.model.pieces, dtype=torch.float64)
        grown = []
        for b, n in enumerate(lengths.tolist()):
            hist = rows[b] + tokens[b, :n].tolist()
            logits, _ = self.model(torch.tensor([hist]), torch.tensor([len(hist)]), window=window)
            out[b, :n] = logits[0, len(rows[b]):]
            grown.append(hist)
            self.rows_seen += 1
        return out, _Histories(grown)


@pytest.mark.parametrize("context", [3, 1024])
def test_batched_cached_beams_equal_beams_scored_one_at_a_time(context: int) -> None:
    v = 6
    probs = random_posteriors(30, v, 7, sharpness=2.0)
    lm = tiny_lm(v, 1)
    cfg = BeamConfig(beam_width=6, alpha=0.7, beta=0.5, prune_threshold=8.0, token_threshold=4.0, lm_context=context)
    prompt = [1, 2, 3, 4, 0, 1, 2]  # longer than the short context
    batched = beam_search(probs, blank=v - 1, lm=lm, config=cfg, prompt=prompt)
    oracle = OneAtATime(lm)
    alone = beam_search(probs, blank=v - 1, lm=oracle, config=cfg, prompt=prompt)
    assert batched.ids == alone.ids and len(batched.ids) >= 5
    assert batched.score == pytest.approx(alone.score, abs=1e-9)
    assert batched.lm_score == pytest.approx(alone.lm_score, abs=1e-9)
    assert (batched.lm_calls, batched.lm_rows) == (alone.lm_calls, alone.lm_rows)
    assert batched.lm_rows > batched.lm_calls  # several beams grew in one frame: the calls were batched
    assert oracle.rows_seen == 1 + alone.lm_rows  # the prompt, then one row per grown beam


def test_the_lm_cache_never_holds_more_than_lm_context_tokens() -> None:
    v, context = 6, 4
    model = tiny_lm(v, 3)
    sizes: list[int] = []

    class Recording:
        bos_id = model.bos_id

        def parameters(self):
            return model.parameters()

        def __call__(self, tokens, lengths, cache=None, *, window=None):
            assert window == context
            sizes.append(0 if cache is None else cache.size)
            return model(tokens, lengths, cache, window=window)

    probs = random_posteriors(30, v, 8, sharpness=2.0)
    got = beam_search(probs, blank=v - 1, lm=Recording(), config=BeamConfig(alpha=0.5, lm_context=context),
                      prompt=[1, 2, 3, 4, 0, 1, 2, 3])
    assert len(got.ids) > context and len(sizes) == 1 + got.lm_calls
    assert max(sizes) == context


def test_the_prompt_conditions_the_lm() -> None:
    v = 6
    probs = random_posteriors(20, v, 4, sharpness=2.5)
    lm = tiny_lm(v, 2)
    cfg = BeamConfig(alpha=0.5, beta=0.5)
    plain = beam_search(probs, blank=v - 1, lm=lm, config=cfg)
    primed = beam_search(probs, blank=v - 1, lm=lm, config=cfg, prompt=[3, 3, 1, 0, 2])
    assert plain.lm_score == pytest.approx(lm_log_prob(lm, [lm.bos_id], plain.ids), abs=1e-9)
    assert primed.lm_score == pytest.approx(lm_log_prob(lm, [lm.bos_id, 3, 3, 1, 0, 2], primed.ids), abs=1e-9)
    assert primed.lm_score != pytest.approx(lm_log_prob(lm, [lm.bos_id], primed.ids), abs=1e-6)


def test_without_an_lm_alpha_is_ignored_and_beta_counts_tokens() -> None:
    v = 5
    probs = random_posteriors(5, v, 5)
    truth = labelling_log_probs(probs, v - 1)
    beta = 3.0
    best = max(truth, key=lambda lab: truth[lab] + beta * len(lab))
    got = beam_search(probs, blank=v - 1, config=BeamConfig(alpha=123.0, beta=beta, **WIDE))
    assert got.ids == best and got.lm_score == 0.0 and got.lm_calls == 0
    assert got.score == pytest.approx(truth[best] + beta * len(best), abs=1e-9)
    assert len(best) > len(max(truth, key=truth.get))  # the bonus changed the answer


def test_empty_posteriors_and_bad_inputs() -> None:
    empty = beam_search(torch.zeros(0, 5), blank=4)
    assert empty.ids == () and empty.score == 0.0
    with pytest.raises(ValueError, match=r"\(T', V\)"):
        beam_search(torch.zeros(3), blank=0)
    with pytest.raises(ValueError, match="blank id 7"):
        beam_search(torch.full((2, 5), 0.2), blank=7)
    with pytest.raises(ValueError, match="the LM predicts 5 tokens"):
        beam_search(torch.full((2, 5), 0.2), blank=4, lm=tiny_lm(6))
    with pytest.raises(ValueError, match="frame 1 .* probability 0"):
        beam_search(torch.tensor([[0.5, 0.5], [0.0, 0.0]]), blank=1)


@pytest.mark.parametrize("field, value", [("beam_width", 0), ("alpha", math.nan), ("prune_threshold", -1.0),
                                          ("token_threshold", math.nan), ("lm_context", 0)])
def test_config_rejects_bad_values_by_name(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        BeamConfig(**{field: value})
