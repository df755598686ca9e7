"""analysis.significance.stats: known answers (enumeration, zero difference, constant shift) and agreement with SciPy."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from analysis.significance import stats


def _brute_force_sign_flip(d: np.ndarray) -> float:
    """Two-sided p by listing every sign pattern with itertools (independent of the vectorised code)."""
    obs = abs(sum(d))
    hits = 0
    patterns = list(itertools.product((1, -1), repeat=len(d)))
    for signs in patterns:
        if abs(sum(s * x for s, x in zip(signs, d))) >= obs - 1e-12:
            hits += 1
    return hits / len(patterns)


# ---- sign-flip permutation test ------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_exact_sign_flip_matches_enumeration_and_scipy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    d = rng.integers(-6, 9, size=10).astype(float)
    res = stats.sign_flip_test(d)
    assert res.exact
    nonzero = d[d != 0]
    assert res.resamples == 2 ** nonzero.size
    assert res.pvalue == pytest.approx(_brute_force_sign_flip(list(nonzero)), abs=1e-12)
    # SciPy: pairing (x, y) and swapping within pairs is flipping the sign of x - y
    x, y = d, np.zeros_like(d)
    ref = sps.permutation_test((x, y), lambda a, b, axis: np.sum(a - b, axis=axis), permutation_type="samples",
                               n_resamples=np.inf, alternative="two-sided")
    assert res.pvalue == pytest.approx(ref.pvalue, abs=1e-12)


def test_sign_flip_known_small_case() -> None:
    # d = (1, 2, 3): sums over the 8 sign patterns are ±6, ±4, ±2, ±0 -> |sum| >= 6 in 2 of 8
    assert stats.sign_flip_test(np.array([1.0, 2.0, 3.0])).pvalue == pytest.approx(0.25)
    # half-integer differences (errors averaged over two seeds) are handled without rounding trouble
    assert stats.sign_flip_test(np.array([0.5, 1.0, 1.5])).pvalue == pytest.approx(0.25)


def test_sign_flip_zero_difference_is_p_one() -> None:
    res = stats.sign_flip_test(np.zeros(40))
    assert res.pvalue == 1.0 and res.statistic == 0.0


def test_sign_flip_constant_shift_reaches_the_smallest_exact_p() -> None:
    n = 12
    res = stats.sign_flip_test(np.full(n, -3.0))
    assert res.exact and res.pvalue == pytest.approx(2 / 2 ** n)


def test_sign_flip_monte_carlo_agrees_with_scipy_and_is_reproducible() -> None:
    rng = np.random.default_rng(7)
    d = rng.normal(0.4, 2.0, size=40)
    a = stats.sign_flip_test(d, resamples=20_000, seed=3)
    b = stats.sign_flip_test(d, resamples=20_000, seed=3)
    assert not a.exact and a.resamples == 20_000
    assert a.pvalue == b.pvalue
    ref = sps.permutation_test((d, np.zeros_like(d)), lambda x, y, axis: np.sum(x - y, axis=axis),
                               permutation_type="samples", n_resamples=40_000, alternative="two-sided",
                               rng=np.random.default_rng(11))
    assert a.pvalue == pytest.approx(ref.pvalue, abs=0.01)
    # the +1 correction: never zero, even when no flip reaches the observed sum
    strong = stats.sign_flip_test(np.full(40, 5.0), resamples=999, seed=0)
    assert strong.pvalue == pytest.approx(1 / 1000)


# ---- Wilcoxon and sign tests ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_wilcoxon_exact_matches_scipy_without_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    d = rng.normal(0.3, 1.0, size=18)
    mine = stats.wilcoxon_signed_rank(d)
    ref = sps.wilcoxon(d, method="exact")
    assert mine.method == "exact"
    assert min(mine.w_plus, mine.w_minus) == pytest.approx(ref.statistic)
    assert mine.pvalue == pytest.approx(ref.pvalue, rel=1e-9)


def test_wilcoxon_exact_with_ties_matches_scipy_permutation() -> None:
    d = np.array([1.0, 1.0, -2.0, 3.0, 3.0, 3.0, 0.5, -0.5, 4.0, 2.0, 1.0])
    mine = stats.wilcoxon_signed_rank(d, method="exact")
    ref = sps.wilcoxon(d, method=sps.PermutationMethod(n_resamples=np.inf))
    assert mine.pvalue == pytest.approx(ref.pvalue, rel=1e-9)


def test_wilcoxon_drops_zeros_like_scipy() -> None:
    d = np.array([0.0, 0.0, 1.3, -0.2, 2.1, 0.7, 1.9, -0.4, 0.9, 1.1])
    mine = stats.wilcoxon_signed_rank(d)
    ref = sps.wilcoxon(d[d != 0], method="exact")
    assert mine.n == 8 and mine.pvalue == pytest.approx(ref.pvalue, rel=1e-9)


def test_wilcoxon_asymptotic_matches_scipy_with_tie_correction() -> None:
    rng = np.random.default_rng(5)
    d = np.round(rng.normal(0.2, 1.0, size=90), 1)  # rounding makes ties
    d = d[d != 0]
    mine = stats.wilcoxon_signed_rank(d, method="asymptotic")
    ref = sps.wilcoxon(d, method="asymptotic", correction=False)
    assert mine.pvalue == pytest.approx(ref.pvalue, rel=1e-9)
    # and the exact distribution is close to the approximation at this size
    assert stats.wilcoxon_signed_rank(d, method="exact").pvalue == pytest.approx(ref.pvalue, abs=0.01)


def test_wilcoxon_constant_shift_and_zero_difference() -> None:
    n = 10
    assert stats.wilcoxon_signed_rank(np.full(n, 0.02)).pvalue == pytest.approx(2 / 2 ** n)
    assert stats.wilcoxon_signed_rank(np.zeros(n)).pvalue == 1.0


@pytest.mark.parametrize("pos,neg,ties", [(9, 3, 2), (0, 12, 0), (5, 5, 4), (30, 14, 1)])
def test_sign_test_matches_binomtest(pos: int, neg: int, ties: int) -> None:
    d = np.array([1.0] * pos + [-1.0] * neg + [0.0] * ties)
    res = stats.sign_test(d)
    assert (res.n_positive, res.n_negative, res.n_ties) == (pos, neg, ties)
    assert res.pvalue == pytest.approx(sps.binomtest(pos, pos + neg, 0.5).pvalue, rel=1e-9)


# ---- Welch, Holm ---------------------------------------------------------------------------------------------

def test_welch_matches_scipy() -> None:
    x, y = [27.6, 27.9, 27.5], [24.5, 24.1, 24.9, 24.3]
    mine = stats.welch_t(x, y)
    ref = sps.ttest_ind(y, x, equal_var=False)
    assert mine.t == pytest.approx(ref.statistic, rel=1e-9)
    assert mine.df == pytest.approx(ref.df, rel=1e-9)
    assert mine.pvalue == pytest.approx(ref.pvalue, rel=1e-9)


def test_welch_needs_two_seeds_per_side() -> None:
    assert math.isnan(stats.welch_t([1.0], [2.0, 3.0]).pvalue)
    assert math.isnan(stats.welch_t([1.0, 1.0], [1.0, 1.0]).pvalue)


def test_holm_known_values_and_nan() -> None:
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1=0.04 -> monotone 0.06
    assert stats.holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    out = stats.holm([0.2, float("nan"), 0.01])
    assert math.isnan(out[1]) and out[0] == pytest.approx(0.2) and out[2] == pytest.approx(0.02)
    assert stats.holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # 2 * 0.8 is capped at 1
    assert stats.holm([0.3, 0.01]) == pytest.approx([0.3, 0.02])


# ---- bootstrap and the full comparison -----------------------------------------------------------------------

def _paired(errors_a: np.ndarray, errors_b: np.ndarray, words: np.ndarray) -> stats.PairedCounts:
    recs = tuple(f"r{i}" for i in range(words.size))
    return stats.PairedCounts(recs, words.astype(float), errors_a.astype(float), errors_b.astype(float),
                              tuple(range(errors_a.shape[0])), tuple(range(errors_b.shape[0])))


def test_bootstrap_matches_a_resample_by_resample_loop() -> None:
    rng = np.random.default_rng(0)
    words = rng.integers(200, 2000, size=9).astype(float)
    ea = rng.binomial(words.astype(int), 0.2, size=(3, 9)).astype(float)
    eb = rng.binomial(words.astype(int), 0.18, size=(2, 9)).astype(float)
    pc = _paired(ea, eb, words)
    got = stats.paired_bootstrap(pc, resamples=50, seed=4)
    # redo the same draws and compute every resample by explicit index lists
    rng = np.random.default_rng(4)
    rec_draws = rng.integers(0, 9, size=(50, 9))
    seed_a_draws = rng.integers(0, 3, size=(50, 3))
    seed_b_draws = rng.integers(0, 2, size=(50, 2))
    for b in range(50):
        recs, seeds_a, seeds_b = rec_draws[b], seed_a_draws[b], seed_b_draws[b]
        n = words[recs].sum()
        wer_a = 100 * np.mean([ea[s, recs].sum() for s in seeds_a]) / n
        wer_b = 100 * np.mean([eb[s, recs].sum() for s in seeds_b]) / n
        assert got.delta[b] == pytest.approx(wer_b - wer_a)
        assert got.werr[b] == pytest.approx(100 * (wer_a - wer_b) / wer_a)


def test_comparison_of_identical_systems_finds_nothing() -> None:
    rng = np.random.default_rng(1)
    words = rng.integers(100, 900, size=14).astype(float)
    ea = rng.binomial(words.astype(int), 0.15, size=(1, 14)).astype(float)
    res = stats.compare(_paired(ea, ea.copy(), words))
    assert res.delta == 0 and res.werr == 0
    assert res.permutation.pvalue == 1.0 and res.wilcoxon.pvalue == 1.0 and res.sign.pvalue == 1.0
    assert res.delta_ci == (0.0, 0.0) and res.werr_ci == (0.0, 0.0)


def test_comparison_of_a_proportional_reduction() -> None:
    words = np.arange(100, 1300, 100).astype(float)  # 12 recordings
    ea = np.vstack([0.2 * words, 0.2 * words])
    eb = 0.9 * ea  # 10% fewer errors on every recording and seed
    res = stats.compare(_paired(ea, eb, words))
    assert res.werr == pytest.approx(10.0)
    assert res.werr_ci == pytest.approx((10.0, 10.0))
    assert res.delta == pytest.approx(-2.0) and res.delta_ci == pytest.approx((-2.0, -2.0))
    assert res.permutation.exact and res.permutation.pvalue == pytest.approx(2 / 2 ** 12)
    assert res.sign.n_negative == 12 and res.sign.pvalue == pytest.approx(2 / 2 ** 12)
    assert res.prob_improvement == 1.0


def test_seed_resampling_widens_the_interval() -> None:
    rng = np.random.default_rng(2)
    words = rng.integers(300, 800, size=20).astype(float)
    base = rng.binomial(words.astype(int), 0.2).astype(float)
    ea = np.vstack([base * f for f in (0.85, 1.0, 1.15)])  # seeds disagree strongly
    eb = np.vstack([base * 0.95 * f for f in (0.85, 1.0, 1.15)])
    spread = stats.paired_bootstrap(_paired(ea, eb, words), seed=0).interval("delta")
    averaged = stats.paired_bootstrap(_paired(ea.mean(0, keepdims=True), eb.mean(0, keepdims=True), words),
                                      seed=0).interval("delta")
    assert spread[1] - spread[0] > 2 * (averaged[1] - averaged[0])


# ---- pairing errors ------------------------------------------------------------------------------------------

def test_pairing_names_missing_recordings_and_seeds() -> None:
    a = {0: {"talk1": (3, 100), "talk2": (5, 200)}, 1: {"talk1": (4, 100), "talk2": (6, 200)}}
    b = {0: {"talk1": (2, 100), "talk2": (5, 200)}, 2: {"talk1": (3, 100)}}
    with pytest.raises(stats.PairingError, match=r"ctx20 seed 2 lacks recordings \['talk2'\]"):
        stats.pair_counts(a, b, name_a="ctx10", name_b="ctx20")
    b[2]["talk2"] = (1, 200)
    b[2]["talk9"] = (1, 50)
    with pytest.raises(stats.PairingError, match=r"seed 2 has recordings \['talk9'\]"):
        stats.pair_counts(a, b)
    del b[2]["talk9"]
    b[2]["talk2"] = (1, 210)
    with pytest.raises(stats.PairingError, match="different reference word counts.*'talk2'"):
        stats.pair_counts(a, b)
    with pytest.raises(stats.PairingError, match="configuration B has no seeds"):
        stats.pair_counts(a, {})
    b[2]["talk2"] = (1, 200)
    pc = stats.pair_counts(a, b)
    assert pc.seeds_a == (0, 1) and pc.seeds_b == (0, 2) and pc.recordings == ("talk1", "talk2")
    assert pc.mean_errors_b.tolist() == [2.5, 3.0]


def test_seed_sd_leaves_out_missing_values_and_needs_two() -> None:
    """The spread over seeds every report table prints: ddof 1, NaN skipped, NaN below two values."""
    assert stats.seed_sd([1.0, 3.0]) == pytest.approx(math.sqrt(2.0))
    assert stats.seed_sd([1.0, float("nan"), 3.0]) == pytest.approx(math.sqrt(2.0))
    assert math.isnan(stats.seed_sd([2.0, float("nan")])) and math.isnan(stats.seed_sd([]))
