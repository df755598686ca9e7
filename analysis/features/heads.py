"""Head similarity (paper 003) against context length, beside WER: does it track the degradation at long context?

Paper 000 §4.3 finds more heads help at short context and hurt at long context; paper 003 measures how alike a
layer's heads are. The trials log, per dataset and representation R (A, Q, K, V, Y), ``heads/<dataset>/<R>/sum``:
003's eq. 6 (the "diversity loss": 0 for orthogonal heads, (N - 1)/N for identical ones, so *higher means heads
more alike*) summed over layers, and ``.../similarity``, the mean cosine of two different heads
(:mod:`asr_core.probes.heads`). Here, per configuration (one series of a family, one line per heads count or model
size) and context length, the means over seeds of those beside the greedy clean WER on the same dataset.

Whether similarity *tracks* WER across contexts is the rank correlation (Spearman's ρ) between the summed
similarity of the chosen representation and WER over a configuration's context lengths, with its permutation
p-value (:func:`analysis.significance.stats.rank_correlation`) Holm-corrected across configurations. With fewer than
:data:`MIN_CONTEXTS` context lengths no correlation is computed; with 4 the test cannot reach 0.05 whatever ρ is,
and the sentence says so rather than reading a trend into it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.significance import stats
from analysis.ledger.collect import Sweep
from analysis.ledger.naming import HEAD_KEYS, SIZE_KEYS  # (re-exported: analysis.features.heads.HEAD_KEYS)
from analysis.display.render import fmt_num
from analysis.significance.werr import format_seconds, in_family, stable_seed, varying_params, wer_table
from asr_core.contract.metrics import CLEAN

REPRESENTATIONS = ("A", "Q", "K", "V", "Y")
MIN_CONTEXTS = 4  # with 3, Spearman's rho takes 4 values and no test means anything

TABLE_COLUMNS = ["family", "series", "series_id", "config", "config_id", "context_s", "dataset", "representation",
                 "n_seeds", "sum_mean", "sum_min", "sum_max", "similarity_mean", "wer_mean", "wer_min", "wer_max"]
TRACKING_COLUMNS = ["family", "series", "series_id", "dataset", "representation", "n_contexts", "rho", "p_permutation",
                    "exact", "p_holm", "best_context_s", "longest_context_s", "wer_best", "wer_longest", "sum_best",
                    "sum_longest", "degrades", "sentence"]


def head_families(sweep: Sweep, main_family: str | None = None) -> list[str]:
    """The families to show: those whose series differ in the number of heads or in model size (paper 000 §4.3 and
    the sizes study); when none does, ``main_family`` (one line against context). Only families with head
    metrics."""
    measured = set(sweep.heads["run_id"])
    fams = [f for f in sweep.families
            if set(in_family(sweep.trials, f)["run_id"]) & measured]
    chosen = [f for f in fams if varying_params(sweep, f) & set(HEAD_KEYS + SIZE_KEYS)]
    if chosen:
        return chosen
    return [main_family] if main_family in fams else fams[:1]


def heads_table(sweep: Sweep, families: list[str]) -> pd.DataFrame:
    """Per family, configuration, context, dataset and representation: the summed similarity (eq. 6 summed over
    layers) as mean / min / max over seeds, the mean cosine of two heads, and the greedy clean WER of the
    configuration on that dataset (mean / min / max over seeds; NaN where the dataset has no WER)."""
    h = sweep.heads
    if h.empty or not families:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    keys = ["config_id", "dataset", "representation"]
    sums = h[h["statistic"] == "sum"].groupby(keys)["value"].agg(sum_mean="mean", sum_min="min", sum_max="max",
                                                                   n_seeds="count")
    sim = h[h["statistic"] == "similarity"].groupby(keys)["value"].mean().rename("similarity_mean")
    per = sums.join(sim, how="left").reset_index()
    info = sweep.trials.drop_duplicates("config_id")[["config_id", "config", "series", "series_id", "families",
                                                      "context_s"]]
    per = per.merge(info, on="config_id")
    wt = wer_table(sweep)
    wt = wt[wt["condition"] == CLEAN][["config_id", "dataset", "wer_mean", "wer_min", "wer_max"]]
    per = per.merge(wt, on=["config_id", "dataset"], how="left")
    parts = [in_family(per, f).assign(family=f) for f in families]
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    out = pd.concat(parts, ignore_index=True)[TABLE_COLUMNS]
    return out.sort_values(["family", "dataset", "representation", "series", "context_s"]).reset_index(drop=True)


def tracking_table(table: pd.DataFrame, representation: str, *, alpha: float = 0.05) -> pd.DataFrame:
    """Per family, configuration (series) and dataset, for ``representation``: Spearman's ρ across contexts between
    summed similarity and WER with its permutation p (Holm-corrected across the rows), the context with the lowest
    WER and the longest one, and a sentence in plain words (:data:`TRACKING_COLUMNS`)."""
    part = table[(table["representation"] == representation) & table["wer_mean"].notna()]
    rows = []
    for (fam, sid, ds), grp in part.groupby(["family", "series_id", "dataset"], sort=True):
        grp = grp.sort_values("context_s")
        n = len(grp)
        best, longest = grp.loc[grp["wer_mean"].idxmin()], grp.iloc[-1]
        if n >= MIN_CONTEXTS:
            rc = stats.rank_correlation(grp["sum_mean"], grp["wer_mean"], seed=stable_seed(fam, sid, ds))
        else:
            rc = stats.RankCorrelation(math.nan, math.nan, n, True)
        rows.append({"family": fam, "series": grp["series"].iloc[0], "series_id": sid, "dataset": ds,
                     "representation": representation, "n_contexts": n, "rho": rc.rho, "p_permutation": rc.pvalue,
                     "exact": rc.exact if np.isfinite(rc.rho) else None, "best_context_s": best["context_s"],
                     "longest_context_s": longest["context_s"], "wer_best": best["wer_mean"],
                     "wer_longest": longest["wer_mean"], "sum_best": best["sum_mean"],
                     "sum_longest": longest["sum_mean"],
                     "degrades": bool(longest["wer_mean"] > best["wer_mean"])})
    out = pd.DataFrame(rows, columns=[c for c in TRACKING_COLUMNS if c not in ("p_holm", "sentence")])
    out = out.sort_values(["family", "dataset", "series"]).reset_index(drop=True)
    out["p_holm"] = stats.holm(out["p_permutation"].to_numpy(dtype=float))
    out["sentence"] = [tracking_sentence(r, alpha) for r in out.to_dict("records")]
    return out[TRACKING_COLUMNS]


def _strength(rho: float) -> str:
    a = abs(rho)
    return "strong" if a >= 0.7 else "moderate" if a >= 0.4 else "weak"


def tracking_sentence(row: dict, alpha: float) -> str:
    """One configuration in words: the correlation (or why there is none) and what happens at long context."""
    r = row["representation"]
    head = f"{row['series']} on {row['dataset']} ({row['n_contexts']} context lengths)"
    if row["n_contexts"] < MIN_CONTEXTS:
        corr = (f"too few context lengths for a rank correlation (needs {MIN_CONTEXTS}); no claim about whether "
                f"summed {r} similarity tracks WER")
    elif not np.isfinite(row["rho"]):
        corr = f"summed {r} similarity or WER does not vary across contexts; no correlation to speak of"
    else:
        sign = "rises with WER" if row["rho"] > 0 else "falls as WER rises"
        p, ph = row["p_permutation"], row["p_holm"]
        test = f"permutation p = {p:.3g}, Holm-adjusted {ph:.3g}"
        if ph < alpha:
            verdict = ("similarity tracks WER here" if row["rho"] > 0 else
                       "similarity moves against WER here")
            corr = f"summed {r} similarity {sign}: Spearman ρ = {row['rho']:+.2f} ({_strength(row['rho'])}; {test}); " \
                   f"{verdict}"
        else:
            few = (f"; {row['n_contexts']} context lengths are too few for the test to reach α = {alpha:g}"
                   if math.factorial(row["n_contexts"]) * alpha <= 2 else "")
            corr = (f"summed {r} similarity {sign}: Spearman ρ = {row['rho']:+.2f} ({_strength(row['rho'])}; "
                    f"{test}), not significant: no evidence that it tracks WER{few}")
    if row["degrades"]:
        change = row["sum_longest"] - row["sum_best"]
        moved = ("about the same: within 1%" if abs(change) <= 0.01 * abs(row["sum_best"]) else
                 "rises with it" if change > 0 else "falls")
        tail = (f"WER degrades at long context, {row['wer_best']:.2f}% at {format_seconds(row['best_context_s'])} → "
                f"{row['wer_longest']:.2f}% at {format_seconds(row['longest_context_s'])}, while summed {r} similarity "
                f"goes {row['sum_best']:.3f} → {row['sum_longest']:.3f} ({moved})")
    else:
        tail = f"WER does not degrade at long context here (lowest at the longest, " \
               f"{format_seconds(row['longest_context_s'])})"
    return f"{head}: {corr}. {tail}."


def tracking_summary(tracking: pd.DataFrame, representation: str, alpha: float) -> str:
    """One sentence over the configurations."""
    tested = tracking[tracking["rho"].notna()]
    if tracking.empty:
        return f"No configuration has both {representation} head similarity and a clean WER on the same dataset."
    if tested.empty:
        return (f"No configuration was measured at {MIN_CONTEXTS} or more context lengths, so this sweep says nothing "
                f"about whether head similarity ({representation}) tracks WER across context.")
    pos = int(((tested["p_holm"] < alpha) & (tested["rho"] > 0)).sum())
    neg = int(((tested["p_holm"] < alpha) & (tested["rho"] < 0)).sum())
    same = int((tested["rho"] > 0).sum())
    return (f"Summed {representation} similarity against WER across context lengths, {len(tested)} configurations "
            f"with enough lengths: it rises with WER in {same} (significantly, after Holm correction, in {pos}) and "
            f"moves against it significantly in {neg}; the rest show no evidence either way.")


def heads_display(table: pd.DataFrame, representation: str) -> list[tuple[str, pd.DataFrame]]:
    """Per family and dataset: WER and summed head similarity of every representation against context."""
    out = []
    for (fam, ds), grp in table.groupby(["family", "dataset"], sort=True):
        sums = grp.pivot_table(index=["series", "context_s", "config"], columns="representation", values="sum_mean",
                               aggfunc="first")
        sums = sums[[r for r in REPRESENTATIONS if r in sums.columns]].map(lambda x: fmt_num(x, 3))
        sums.columns = [f"Σ {r}" for r in sums.columns]
        chosen = grp[grp["representation"] == representation].set_index(["series", "context_s", "config"])
        sums[f"mean cos {representation}"] = chosen["similarity_mean"].map(lambda x: fmt_num(x, 3))
        sums.insert(0, f"WER {ds} %", chosen["wer_mean"].map(fmt_num))
        sums.insert(1, "seeds", chosen["n_seeds"])
        view = sums.reset_index().sort_values(["series", "context_s"])
        view["context_s"] = view["context_s"].map(format_seconds)
        out.append((f"Family {fam}, {ds}: greedy clean WER and summed head similarity (003 eq. 6 over layers; "
                    f"higher = heads more alike), means over seeds", view.rename(columns={"context_s": "context"})))
    return out
