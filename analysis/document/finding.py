"""Does the paper's qualitative finding hold in a sweep? Three checks on one context-length family.

Paper 000's finding, as the demo study tries to reproduce it in miniature:

1. WER falls as the training/evaluation context grows from the shortest context, on every test set;
2. the gain is largest on the shifted-domain set (a dataset whose name contains ``shift``);
3. the gain is larger with music at the lowest SNR than on clean audio.

Claims 2 and 3 hold only for a positive gain: a smaller loss is not a larger gain.

"Gain" is the WERR of the longest context against the shortest, ``100 * (WER_short - WER_long) / WER_short``, with
WERs the mean over seeds. Each longest-against-shortest comparison is also tested (recordings as the unit, the
permutation test of :mod:`analysis.significance.stats`), Holm-corrected over the comparisons the checks use. Claims 2 and 3
compare two gains with each other; that difference is reported, not tested.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from analysis.significance import stats
from analysis.ledger.collect import Sweep
from analysis.significance.werr import compare_configs, in_family, recording_index, wer_table
from asr_core.contract.metrics import CLEAN


UNTRAINED_WER = 99.0  # clean WER at or above which a model counts as not yet trained (blank or garbage output)


@dataclass(frozen=True)
class Check:
    """One claim of the finding: ``holds`` is None when the sweep cannot say (``detail`` tells why)."""

    claim: str
    holds: bool | None
    detail: str

    @property
    def verdict(self) -> str:
        return {True: "holds", False: "does not hold", None: "cannot be checked"}[self.holds]

    def line(self) -> str:
        """The claim's bullet: its verdict, the claim, then why, joined by a dash rather than a full stop (the detail
        opens in lower case or with a test set's name) and ending with one full stop."""
        return f"**{self.verdict.capitalize()}**: {self.claim} — {self.detail.rstrip('. ')}."


@dataclass(frozen=True)
class Gain:
    """The longest context against the shortest on one dataset and condition."""

    dataset: str
    condition: str
    wer_short: float
    wer_long: float
    werr: float  # percent, positive: the longer context is better
    p: float  # permutation p-value (NaN when untested)
    p_holm: float = math.nan

    def describe(self, alpha: float) -> str:
        sig = ("not tested" if not np.isfinite(self.p_holm) else
               f"Holm-adjusted p = {self.p_holm:.3g}, " + ("significant" if self.p_holm < alpha else
                                                            "not significant"))
        where = self.dataset + ("" if self.condition == CLEAN else f" ({self.condition})")
        return f"{where}: {self.wer_short:.1f}% → {self.wer_long:.1f}%, WERR {self.werr:+.1f}% ({sig})"


def _shifted(dataset: str) -> bool:
    return "shift" in dataset.lower()


def _lowest_snr(wt: pd.DataFrame, dataset: str) -> str | None:
    noisy = wt[(wt["dataset"] == dataset) & wt["snr_db"].notna()]
    if noisy.empty:
        return None
    return str(noisy.sort_values("snr_db").iloc[0]["condition"])


def finding_checks(sweep: Sweep, family: str = "context", *, alpha: float = 0.05,
                   wer: pd.DataFrame | None = None) -> tuple[list[Check], list[Gain]]:
    """The three checks for ``family`` (its first series with two or more context lengths), and the gains behind
    them. Nothing here raises on a partial sweep: a check that lacks data says so."""
    wt = wer_table(sweep) if wer is None else wer
    if wt.empty or family not in sweep.families:
        return [Check("WER falls as context grows", None, f"no finished runs in a family {family!r}")], []
    members = in_family(wt, family)
    series = [s for s, g in members.groupby("series_id", sort=True) if g["context_s"].nunique() >= 2]
    if not series:
        return [Check("WER falls as context grows", None,
                      f"family {family!r} has no series with two or more context lengths")], []
    grp = members[members["series_id"] == series[0]]
    short_ctx, long_ctx = float(grp["context_s"].min()), float(grp["context_s"].max())
    cfg_of = {float(c): g["config_id"].iloc[0] for c, g in grp.groupby("context_s")}
    index = recording_index(sweep)

    def gain(dataset: str, condition: str) -> Gain | None:
        rows = grp[(grp["dataset"] == dataset) & (grp["condition"] == condition)].set_index("context_s")
        if short_ctx not in rows.index or long_ctx not in rows.index:
            return None
        ws, wl = float(rows.loc[short_ctx, "wer_mean"]), float(rows.loc[long_ctx, "wer_mean"])
        try:
            p = compare_configs(sweep, cfg_of[short_ctx], cfg_of[long_ctx], dataset, condition,
                                index=index).permutation.pvalue
        except stats.PairingError:
            p = math.nan
        werr = 100.0 * (ws - wl) / ws if ws > 0 else math.nan
        return Gain(dataset, condition, ws, wl, werr, p)

    datasets = sorted(grp["dataset"].unique())
    clean = [g for g in (gain(d, CLEAN) for d in datasets) if g is not None]
    lowest = {d: _lowest_snr(grp, d) for d in datasets}
    noisy = [g for g in (gain(d, c) for d, c in lowest.items() if c) if g is not None]
    gains = [replace(g, p_holm=float(adj)) for g, adj in zip(clean + noisy, stats.holm([g.p for g in clean + noisy]))]
    clean, noisy = gains[:len(clean)], gains[len(clean):]
    span = f"{short_ctx:g} s → {long_ctx:g} s"
    if clean and all(min(g.wer_short, g.wer_long) >= UNTRAINED_WER for g in clean):
        return [Check("WER falls as context grows", None,
                      f"every model is at {UNTRAINED_WER:g}% WER or more on clean audio: none has learned enough "
                      f"to tell (too few training steps?)")], gains
    checks: list[Check] = []

    # 1. WER falls with context on every test set (clean audio)
    trend = []
    for d in datasets:
        seq = grp[(grp["dataset"] == d) & (grp["condition"] == CLEAN)].sort_values("context_s")
        trend.append(f"{d}: " + ", ".join(f"{c:g} s {w:.1f}%" for c, w in zip(seq["context_s"], seq["wer_mean"])))
    if clean:
        holds = all(g.werr > 0 for g in clean)
        checks.append(Check(f"WER falls as context grows ({span}, clean audio, every test set)", holds,
                            "; ".join(g.describe(alpha) for g in clean) + ". WER by context: " + "; ".join(trend)))
    else:
        checks.append(Check(f"WER falls as context grows ({span})", None, "no clean results at both contexts"))

    # 2. the gain is largest on the shifted-domain set
    shifted = [g for g in clean if _shifted(g.dataset)]
    inside = [g for g in clean if not _shifted(g.dataset)]
    if shifted and inside:
        best_in = max(inside, key=lambda g: g.werr)
        holds = all(s.werr > max(best_in.werr, 0.0) for s in shifted)  # a smaller loss is not a gain
        checks.append(Check("the gain is largest on the shifted-domain set", holds,
                            ", ".join(f"WERR {s.werr:+.1f}% on {s.dataset}" for s in shifted)
                            + f" against {best_in.werr:+.1f}% on {best_in.dataset} (a difference of gains, "
                              "not tested)"))
    else:
        checks.append(Check("the gain is largest on the shifted-domain set", None,
                            "needs a dataset whose name contains 'shift' and another one"))

    # 3. the gain is larger at the lowest SNR than on clean audio
    pairs = [(c, n) for c in clean for n in noisy if n.dataset == c.dataset]
    if pairs:
        holds = all(n.werr > max(c.werr, 0.0) for c, n in pairs)
        checks.append(Check("the gain is larger at the lowest SNR than on clean audio", holds,
                            "; ".join(f"{c.dataset}: WERR {n.werr:+.1f}% with music at {n.condition} against "
                                      f"{c.werr:+.1f}% clean" for c, n in pairs) + " (differences of gains, not "
                                                                                   "tested)"))
    else:
        checks.append(Check("the gain is larger at the lowest SNR than on clean audio", None,
                            "no music conditions at both contexts"))
    return checks, gains


def summary_sentence(checks: list[Check]) -> str:
    """One line for the top of a report."""
    decided = [c for c in checks if c.holds is not None]
    if not decided:
        return "The paper's finding cannot be checked in this sweep: " + checks[0].detail.rstrip(". ") + "."
    held = sum(bool(c.holds) for c in decided)
    if held == len(checks):
        return f"The paper's qualitative finding holds here: all {len(checks)} of its claims (below)."
    if held == 0:
        return f"The paper's qualitative finding is not reproduced here: none of its {len(decided)} checkable " \
               f"claims holds (below)."
    return f"The paper's qualitative finding is only partly reproduced here: {held} of {len(checks)} claims hold " \
           f"(below)."
