"""Significance tests and confidence intervals for WER comparisons (pure functions, no I/O).

The unit of analysis is the **recording** (a talk, a meeting, a podcast), not the word: errors within a recording
are correlated, so tests over words overstate significance. For each configuration the per-recording error counts
(S + D + I) are averaged over its seeds, then two configurations A (the reference, e.g. the 10 s model) and B are
compared recording by recording (REFERENCE.md "Evaluation"):

* a paired sign-flip permutation test of ΔWER = WER_B − WER_A (exact enumeration when 2^n is small, Monte Carlo
  with a seed otherwise);
* Wilcoxon's signed-rank test and the sign test on per-recording WER, as checks that do not weight long
  recordings more;
* a paired bootstrap (Bisani & Ney, 2004) that resamples recordings and, within each configuration, seeds, giving
  percentile intervals for ΔWER and WERR and the "probability of improvement";
* Holm's step-down correction across the comparisons made against one baseline;
* Welch's t on the seed-level corpus WERs, the secondary figure the authors' code computed.

Array shapes: ``S`` seeds, ``R`` recordings. Error and word counts are floats so that seed-averaged counts work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from scipy import special

from analysis.ledger.defaults import BOOTSTRAP_RESAMPLES


def seed_sd(values: Sequence[float] | np.ndarray) -> float:
    """The sample standard deviation (ddof 1) of one figure over seeds, missing values (NaN) left out; NaN with fewer
    than two values. The spread every table of the report prints beside a mean of seeds."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    return float(x.std(ddof=1)) if x.size > 1 else math.nan


EXACT_PERMUTATION_MAX_N = 16  # enumerate all 2^n sign flips up to 65,536 of them
PERMUTATION_RESAMPLES = 20_000  # Monte Carlo sign flips otherwise; p is then no smaller than 1/20,001
WILCOXON_EXACT_MAX_N = 400  # the exact null distribution by dynamic programming costs O(n^3) additions


class PairingError(ValueError):
    """Two configurations cannot be compared recording by recording; the message says which items are missing."""


# ---- pairing -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PairedCounts:
    """Per-recording error counts of two configurations on the same recordings.

    ``errors_a``: (S_a, R) errors (S + D + I) of configuration A per seed; ``errors_b``: (S_b, R);
    ``ref_words``: (R,) reference words per recording (identical for both, by construction).
    """

    recordings: tuple[str, ...]
    ref_words: np.ndarray
    errors_a: np.ndarray
    errors_b: np.ndarray
    seeds_a: tuple[int, ...]
    seeds_b: tuple[int, ...]

    def __post_init__(self) -> None:
        r = len(self.recordings)
        if self.ref_words.shape != (r,):
            raise PairingError(f"ref_words has shape {self.ref_words.shape}, expected ({r},)")
        for name, arr, seeds in (("a", self.errors_a, self.seeds_a), ("b", self.errors_b, self.seeds_b)):
            if arr.ndim != 2 or arr.shape[1] != r or arr.shape[0] != len(seeds) or len(seeds) == 0:
                raise PairingError(f"errors_{name} has shape {arr.shape}, expected ({len(seeds)} seeds, {r})")
        if r == 0:
            raise PairingError("no recordings to compare")

    @property
    def mean_errors_a(self) -> np.ndarray:
        """(R,) errors of A averaged over its seeds."""
        return self.errors_a.mean(axis=0)

    @property
    def mean_errors_b(self) -> np.ndarray:
        return self.errors_b.mean(axis=0)


SeedTable = Mapping[int, Mapping[str, tuple[float, float]]]  # seed -> recording -> (errors, ref_words)


def pair_counts(a: SeedTable, b: SeedTable, *, name_a: str = "A", name_b: str = "B") -> PairedCounts:
    """Align two configurations' per-seed, per-recording ``(errors, ref_words)`` into :class:`PairedCounts`.

    Every seed of both configurations must cover the same recordings with the same reference word counts; if not,
    :class:`PairingError` names the configuration, the seed and the recordings that are missing or disagree.
    """
    for name, table in ((name_a, a), (name_b, b)):
        if not table:
            raise PairingError(f"configuration {name} has no seeds with per-recording results")
    reference = sorted(next(iter(a.values())).keys())
    if not reference:
        raise PairingError(f"configuration {name_a} has no recordings")
    ref_set = set(reference)
    first = f"{name_a} seed {next(iter(a))}"
    words: dict[str, float] = {rec: float(n) for rec, (_, n) in next(iter(a.values())).items()}
    for name, table in ((name_a, a), (name_b, b)):
        for seed, recs in table.items():
            have = set(recs)
            missing, extra = sorted(ref_set - have), sorted(have - ref_set)
            if missing or extra:
                parts = []
                if missing:
                    parts.append(f"lacks recordings {_short_list(missing)} that {first} has")
                if extra:
                    parts.append(f"has recordings {_short_list(extra)} that {first} lacks")
                raise PairingError(f"cannot pair: {name} seed {seed} " + " and ".join(parts))
            bad = sorted(rec for rec, (_, n) in recs.items() if not math.isclose(float(n), words[rec]))
            if bad:
                raise PairingError(f"cannot pair: {name} seed {seed} has different reference word counts than "
                                   f"{first} for recordings {_short_list(bad)} (different references?)")
    seeds_a, seeds_b = tuple(sorted(a)), tuple(sorted(b))
    errors_a = np.array([[float(a[s][rec][0]) for rec in reference] for s in seeds_a])
    errors_b = np.array([[float(b[s][rec][0]) for rec in reference] for s in seeds_b])
    return PairedCounts(tuple(reference), np.array([words[r] for r in reference]), errors_a, errors_b,
                        seeds_a, seeds_b)


def _short_list(items: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(i) for i in items[:limit])
    return f"[{shown}{', ...' if len(items) > limit else ''}] ({len(items)})"


# ---- point estimates -----------------------------------------------------------------------------------------

def corpus_wer(errors: np.ndarray, ref_words: np.ndarray) -> float:
    """Corpus WER in percent: all errors / all reference words. ``errors``, ``ref_words``: (R,)."""
    total = float(np.sum(ref_words))
    if total <= 0:
        raise ValueError("corpus WER is undefined: the recordings have no reference words")
    return 100.0 * float(np.sum(errors)) / total


def werr(wer_reference: float, wer_new: float) -> float:
    """Relative WER reduction in percent of ``wer_new`` against ``wer_reference`` (positive = fewer errors)."""
    if wer_reference <= 0:
        return math.nan
    return 100.0 * (wer_reference - wer_new) / wer_reference


# ---- permutation (sign-flip) test ----------------------------------------------------------------------------

@dataclass(frozen=True)
class PermutationResult:
    statistic: float  # sum over recordings of (errors_b - errors_a)
    pvalue: float  # two-sided
    exact: bool
    resamples: int  # 2^n when exact


def sign_flip_test(diffs: np.ndarray, *, exact_max_n: int = EXACT_PERMUTATION_MAX_N,
                   resamples: int = PERMUTATION_RESAMPLES, seed: int = 0) -> PermutationResult:
    """Two-sided paired permutation test of ``sum(diffs) == 0`` by flipping the sign of each recording's difference.

    ``diffs``: (R,) per-recording differences (B − A) of seed-averaged error counts; under the null hypothesis
    that the two systems are exchangeable on every recording, each sign is equally likely. Zero differences do not
    change the statistic and are dropped before deciding between exact enumeration (n ≤ ``exact_max_n``, p =
    count / 2^n) and Monte Carlo (p = (count + 1) / (resamples + 1), never zero).
    """
    d = np.asarray(diffs, dtype=float)
    d = d[d != 0]
    observed = float(d.sum())
    n = d.size
    if n == 0:
        return PermutationResult(observed, 1.0, True, 1)
    # flipped sums that tie with |observed| up to rounding count as "at least as extreme"
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))
    threshold = abs(observed) - tol
    # T* = sum(s_r d_r) = 2 * sum(b_r d_r) - sum(d) with b = (s + 1) / 2 in {0, 1}. einsum, not BLAS: these
    # products are small, and threaded BLAS on a busy machine makes them tens of times slower.
    if n <= exact_max_n:
        count, total = 0, 1 << n
        chunk = 1 << 14
        bits = np.arange(n)
        for start in range(0, total, chunk):
            codes = np.arange(start, min(total, start + chunk))[:, None]
            b = ((codes >> bits) & 1).astype(float)  # (chunk, n)
            count += int(np.count_nonzero(np.abs(2.0 * np.einsum("mn,n->m", b, d) - observed) >= threshold))
        return PermutationResult(observed, count / total, True, total)
    rng = np.random.default_rng(seed)
    count, done = 0, 0
    nbytes = (n + 7) // 8
    chunk = max(1, min(resamples, 4_000_000 // n))
    while done < resamples:
        m = min(chunk, resamples - done)
        raw = np.frombuffer(rng.bytes(m * nbytes), dtype=np.uint8).reshape(m, nbytes)
        b = np.unpackbits(raw, axis=1, count=n).astype(float)  # (m, n) fair coin flips
        count += int(np.count_nonzero(np.abs(2.0 * np.einsum("mn,n->m", b, d) - observed) >= threshold))
        done += m
    return PermutationResult(observed, (count + 1) / (resamples + 1), False, resamples)


# ---- Wilcoxon signed-rank and sign tests ---------------------------------------------------------------------

@dataclass(frozen=True)
class WilcoxonResult:
    w_plus: float  # sum of ranks of positive differences (B worse than A when diffs = B − A)
    w_minus: float
    n: int  # non-zero differences
    pvalue: float  # two-sided
    method: str  # "exact" or "asymptotic"


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``x`` with ties given their average rank."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(x.size, dtype=float)
    xs = x[order]
    i = 0
    while i < xs.size:
        j = i
        while j + 1 < xs.size and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def wilcoxon_signed_rank(diffs: np.ndarray, *, method: str = "auto") -> WilcoxonResult:
    """Two-sided Wilcoxon signed-rank test on paired differences ``diffs`` (R,); zeros are dropped (Wilcoxon).

    ``method="exact"`` computes the null distribution of W+ by dynamic programming over the (possibly tied,
    hence half-integer) ranks, so it is exact with ties too; ``"asymptotic"`` is the normal approximation with the
    tie correction and no continuity correction; ``"auto"`` is exact up to ``WILCOXON_EXACT_MAX_N`` differences.
    """
    if method not in ("auto", "exact", "asymptotic"):
        raise ValueError(f"method must be 'auto', 'exact' or 'asymptotic', not {method!r}")
    d = np.asarray(diffs, dtype=float)
    d = d[d != 0]
    n = d.size
    if n == 0:
        return WilcoxonResult(0.0, 0.0, 0, 1.0, "exact")
    ranks = _average_ranks(np.abs(d))
    w_plus = float(ranks[d > 0].sum())
    w_minus = float(ranks[d < 0].sum())
    if method == "exact" or (method == "auto" and n <= WILCOXON_EXACT_MAX_N):
        doubled = np.rint(2 * ranks).astype(np.int64)  # average ranks are multiples of 1/2
        total = int(doubled.sum())
        dist = np.zeros(total + 1)
        dist[0] = 1.0
        for r in doubled:  # each rank joins W+ or not with probability 1/2
            dist[r:] = 0.5 * (dist[r:] + dist[:-r])
            dist[:r] *= 0.5
        k = int(round(2 * w_plus))
        cdf = float(dist[:k + 1].sum())
        sf = float(dist[k:].sum())
        return WilcoxonResult(w_plus, w_minus, n, min(1.0, 2.0 * min(cdf, sf)), "exact")
    mean = n * (n + 1) / 4.0
    _, counts = np.unique(np.abs(d), return_counts=True)
    var = n * (n + 1) * (2 * n + 1) / 24.0 - float(np.sum(counts ** 3 - counts)) / 48.0
    if var <= 0:
        return WilcoxonResult(w_plus, w_minus, n, 1.0, "asymptotic")
    z = (w_plus - mean) / math.sqrt(var)
    return WilcoxonResult(w_plus, w_minus, n, min(1.0, float(2.0 * special.ndtr(-abs(z)))), "asymptotic")


@dataclass(frozen=True)
class SignResult:
    n_positive: int  # recordings where B has the higher WER (diffs > 0)
    n_negative: int
    n_ties: int
    pvalue: float  # two-sided exact binomial


def sign_test(diffs: np.ndarray) -> SignResult:
    """Two-sided exact sign test (binomial, p = 1/2) on paired differences (R,); ties are dropped."""
    d = np.asarray(diffs, dtype=float)
    pos, neg = int(np.sum(d > 0)), int(np.sum(d < 0))
    ties = int(d.size - pos - neg)
    n = pos + neg
    if n == 0:
        return SignResult(pos, neg, ties, 1.0)
    k = min(pos, neg)
    # P(X <= k) for X ~ Binomial(n, 1/2); the distribution is symmetric, so two-sided = 2 * lower tail
    lower = float(special.bdtr(k, n, 0.5))
    return SignResult(pos, neg, ties, min(1.0, 2.0 * lower))


# ---- paired bootstrap ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BootstrapResult:
    delta: np.ndarray  # (B,) WER_B − WER_A in percentage points, per resample
    werr: np.ndarray  # (B,) WERR of B against A in percent, per resample

    def interval(self, which: str = "delta", level: float = 0.95) -> tuple[float, float]:
        """Percentile interval of the resampled ``delta`` or ``werr``."""
        values = self.delta if which == "delta" else self.werr
        values = values[np.isfinite(values)]
        if values.size == 0:
            return (math.nan, math.nan)
        alpha = (1.0 - level) / 2.0
        lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
        return (float(lo), float(hi))

    @property
    def prob_improvement(self) -> float:
        """Bisani & Ney's probability of improvement: the share of resamples where B has the lower WER."""
        return float(np.mean(self.delta < 0))


def _multiplicities(draws: np.ndarray, k: int) -> np.ndarray:
    """(B, m) indices drawn from range(k) -> (B, k) float counts of each index per row."""
    b = draws.shape[0]
    flat = (draws + np.arange(b)[:, None] * k).ravel()
    return np.bincount(flat, minlength=b * k).reshape(b, k).astype(float)


def paired_bootstrap(pc: PairedCounts, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> BootstrapResult:
    """Bootstrap ΔWER and WERR by resampling recordings (shared by A and B, which keeps the pairing) and, within
    each configuration independently, seeds; all resamples at once with matrix products.

    Per resample b: R recordings drawn with replacement (multiplicities ``c`` (R,)), then S_a seeds of A and S_b
    of B drawn with replacement (weights ``w_a`` (S_a,), ``w_b`` (S_b,) summing to 1);
    errors_A* = Σ_s w_a[s] Σ_r c[r] E_A[s, r], words* = Σ_r c[r] N[r].
    """
    rng = np.random.default_rng(seed)
    r, sa, sb = len(pc.recordings), len(pc.seeds_a), len(pc.seeds_b)
    counts = _multiplicities(rng.integers(0, r, size=(resamples, r)), r)  # (B, R)
    w_a = _multiplicities(rng.integers(0, sa, size=(resamples, sa)), sa) / sa  # (B, S_a)
    w_b = _multiplicities(rng.integers(0, sb, size=(resamples, sb)), sb) / sb  # (B, S_b)
    # einsum rather than BLAS matmul: see sign_flip_test
    err_a = np.einsum("br,sr,bs->b", counts, pc.errors_a, w_a)  # (B,)
    err_b = np.einsum("br,sr,bs->b", counts, pc.errors_b, w_b)
    words = np.einsum("br,r->b", counts, pc.ref_words)  # (B,)
    with np.errstate(divide="ignore", invalid="ignore"):
        wer_a = np.where(words > 0, 100.0 * err_a / words, np.nan)
        wer_b = np.where(words > 0, 100.0 * err_b / words, np.nan)
        rel = np.where(wer_a > 0, 100.0 * (wer_a - wer_b) / wer_a, np.nan)
    return BootstrapResult(wer_b - wer_a, rel)


def paired_bootstrap_shared_seeds(pc: PairedCounts, *, resamples: int = BOOTSTRAP_RESAMPLES,
                                  seed: int = 0) -> BootstrapResult:
    """:func:`paired_bootstrap` for two results of the *same* models (one trained model per seed decoded two ways:
    greedy and beam search): a drawn seed brings both its A and its B, so the seed-to-seed spread the two share
    does not widen the interval. Needs ``pc.seeds_a == pc.seeds_b``."""
    if pc.seeds_a != pc.seeds_b:
        raise PairingError(f"shared seeds need the same seeds on both sides, got {list(pc.seeds_a)} and "
                           f"{list(pc.seeds_b)}")
    rng = np.random.default_rng(seed)
    r, s = len(pc.recordings), len(pc.seeds_a)
    counts = _multiplicities(rng.integers(0, r, size=(resamples, r)), r)  # (B, R)
    w = _multiplicities(rng.integers(0, s, size=(resamples, s)), s) / s  # (B, S), one draw for both sides
    err_a = np.einsum("br,sr,bs->b", counts, pc.errors_a, w)
    err_b = np.einsum("br,sr,bs->b", counts, pc.errors_b, w)
    words = np.einsum("br,r->b", counts, pc.ref_words)
    with np.errstate(divide="ignore", invalid="ignore"):
        wer_a = np.where(words > 0, 100.0 * err_a / words, np.nan)
        wer_b = np.where(words > 0, 100.0 * err_b / words, np.nan)
        rel = np.where(wer_a > 0, 100.0 * (wer_a - wer_b) / wer_a, np.nan)
    return BootstrapResult(wer_b - wer_a, rel)


# ---- Welch's t on seed-level WERs ----------------------------------------------------------------------------

@dataclass(frozen=True)
class WelchResult:
    t: float
    df: float
    pvalue: float  # two-sided; NaN when either side has fewer than two seeds or both have zero variance


def welch_t(x: Sequence[float], y: Sequence[float]) -> WelchResult:
    """Welch's unequal-variance t test of mean(y) − mean(x) on seed-level WERs (one value per seed)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.size < 2 or b.size < 2:
        return WelchResult(math.nan, math.nan, math.nan)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se2 = va + vb
    if se2 == 0:
        return WelchResult(math.nan, math.nan, math.nan)
    t = float((b.mean() - a.mean()) / math.sqrt(se2))
    df = float(se2 ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1)))
    return WelchResult(t, df, float(2.0 * special.stdtr(df, -abs(t))))


# ---- rank correlation of two measures across conditions -----------------------------------------------------

@dataclass(frozen=True)
class RankCorrelation:
    rho: float  # Spearman's rank correlation; NaN with fewer than 3 pairs or a constant side
    pvalue: float  # two-sided permutation p-value; NaN with rho
    n: int  # pairs
    exact: bool  # every pairing enumerated (n! <= resamples), else random ones: p = 2 (k + 1)/(N + 1), k the
    # random pairings in the smaller tail (scipy's permutation_test)


def rank_correlation(x: Sequence[float], y: Sequence[float], *, resamples: int = PERMUTATION_RESAMPLES,
                     seed: int = 0) -> RankCorrelation:
    """Spearman's ρ between paired values ``x`` and ``y`` (n,) (e.g. head similarity and WER of one configuration at
    n context lengths) and its two-sided permutation test: under the null hypothesis every pairing of ``x`` with a
    reordering of ``y`` is equally likely; p is twice the smaller tail of ρ over the pairings (scipy's
    ``permutation_test``; every pairing when n! <= ``resamples``), which for ρ's symmetric null distribution is the
    share of pairings with |ρ| at least the observed one. With n = 4 the smallest possible p is 1/12: few conditions
    cannot make a correlation significant, whatever its size."""
    from scipy import stats as sps

    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"x and y must be 1-D and of one length, got shapes {a.shape} and {b.shape}")
    n = a.size
    if n < 3 or np.ptp(a) == 0 or np.ptp(b) == 0 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return RankCorrelation(math.nan, math.nan, n, True)
    ra = sps.rankdata(a)
    ra = (ra - ra.mean()) / np.sqrt(np.sum((ra - ra.mean()) ** 2))

    def rho(values: np.ndarray, axis: int = -1) -> np.ndarray:
        rv = sps.rankdata(values, axis=axis)
        rv = rv - rv.mean(axis=axis, keepdims=True)
        return np.sum(rv * ra, axis=axis) / np.sqrt(np.sum(rv ** 2, axis=axis))

    res = sps.permutation_test((b,), rho, permutation_type="pairings", vectorized=True, n_resamples=resamples,
                               alternative="two-sided", rng=np.random.default_rng(seed))
    return RankCorrelation(float(res.statistic), float(res.pvalue), n, math.factorial(n) <= resamples)


# ---- multiple comparisons ------------------------------------------------------------------------------------

def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (same order as given); NaN entries stay NaN and are not counted."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = idx.size
    if m == 0:
        return out
    order = idx[np.argsort(p[idx], kind="mergesort")]
    running = 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[j]))
        out[j] = running
    return out


# ---- one comparison, every figure ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Comparison:
    """Configuration B against reference A on one dataset and condition (recordings as the unit)."""

    n_recordings: int
    seeds_a: tuple[int, ...]
    seeds_b: tuple[int, ...]
    wer_a: float  # corpus WER of seed-averaged counts, percent (= mean over seeds of the corpus WER)
    wer_b: float
    delta: float  # WER_B − WER_A, percentage points (negative: B is better)
    delta_ci: tuple[float, float]
    werr: float  # relative reduction of B against A, percent (positive: B is better)
    werr_ci: tuple[float, float]
    prob_improvement: float
    permutation: PermutationResult
    wilcoxon: WilcoxonResult
    sign: SignResult
    welch: WelchResult
    level: float

    def summary(self) -> str:
        lv = f"{100 * self.level:g}%"
        perm = "exact" if self.permutation.exact else f"{self.permutation.resamples} random sign flips"
        return (f"WER {self.wer_a:.2f}% -> {self.wer_b:.2f}%  ΔWER {self.delta:+.2f} pts "
                f"[{lv} CI {self.delta_ci[0]:+.2f}, {self.delta_ci[1]:+.2f}]  WERR {self.werr:+.1f}% "
                f"[{lv} CI {self.werr_ci[0]:+.1f}, {self.werr_ci[1]:+.1f}]\n"
                f"permutation p={self.permutation.pvalue:.4g} ({perm}, {self.n_recordings} recordings)  "
                f"Wilcoxon p={self.wilcoxon.pvalue:.4g} ({self.wilcoxon.method})  "
                f"sign p={self.sign.pvalue:.4g} (B better on {self.sign.n_negative}, worse on "
                f"{self.sign.n_positive}, tied on {self.sign.n_ties})  "
                f"Welch t={self.welch.t:.3g} df={self.welch.df:.3g} p={self.welch.pvalue:.4g} (seed level)  "
                f"P(B better)={self.prob_improvement:.3f}")


def compare(pc: PairedCounts, *, level: float = 0.95, bootstrap_resamples: int = BOOTSTRAP_RESAMPLES,
            permutation_resamples: int = PERMUTATION_RESAMPLES, exact_max_n: int = EXACT_PERMUTATION_MAX_N,
            seed: int = 0, shared_seeds: bool = False) -> Comparison:
    """Every test and interval for B against A (see the module docstring). ``shared_seeds``: A and B are the same
    models decoded two ways, so the bootstrap draws seeds for both at once (:func:`paired_bootstrap_shared_seeds`)."""
    ea, eb = pc.mean_errors_a, pc.mean_errors_b
    wer_a, wer_b = corpus_wer(ea, pc.ref_words), corpus_wer(eb, pc.ref_words)
    perm = sign_flip_test(eb - ea, exact_max_n=exact_max_n, resamples=permutation_resamples, seed=seed)
    # per-recording WER for the rank tests; recordings without reference words have no WER and are left out
    has_words = pc.ref_words > 0
    rec_diff = (eb[has_words] - ea[has_words]) / pc.ref_words[has_words]
    boot = (paired_bootstrap_shared_seeds if shared_seeds else paired_bootstrap)(pc, resamples=bootstrap_resamples,
                                                                                 seed=seed + 1)
    total = float(pc.ref_words.sum())
    seed_wer_a = 100.0 * pc.errors_a.sum(axis=1) / total
    seed_wer_b = 100.0 * pc.errors_b.sum(axis=1) / total
    return Comparison(
        n_recordings=len(pc.recordings), seeds_a=pc.seeds_a, seeds_b=pc.seeds_b, wer_a=wer_a, wer_b=wer_b,
        delta=wer_b - wer_a, delta_ci=boot.interval("delta", level), werr=werr(wer_a, wer_b),
        werr_ci=boot.interval("werr", level), prob_improvement=boot.prob_improvement, permutation=perm,
        wilcoxon=wilcoxon_signed_rank(rec_diff), sign=sign_test(rec_diff), welch=welch_t(seed_wer_a, seed_wer_b),
        level=level)
