"""Tail words (paper 002): the tail-word error rate against context, beside WER, tested against the baseline.

An evaluation given a tail set (``evaluate --tail FILE.json``, ``eval.tail``; :mod:`asr_core.scoring.tail`)
counts, per recording, the reference's tail words (``tail_words``) and the errors on them (``tail_errors``: tail
words substituted or deleted, and inserted words that are tail words) in ``eval/<DATASET>.csv``
(:data:`asr_core.contract.metrics.TAIL_COLUMNS`). Tail words are the rarest word types of a text, those whose counts
together make up at most a set share of its words (5% in the paper, "Tail-1" in its tables).

Here, per family, series, dataset and condition (greedy decoding) and per context length:

* the tail-word error rate ("tail-WER") pooled over recordings (all tail errors / all tail words, percent) for each
  seed, and its mean, sd, min and max over seeds; the same for WER on all words, and the share of the reference
  words that are tail words;
* a recording-level paired test of each context against the series' model at the report's baseline context (the
  WER section's, :func:`analysis.significance.werr.find_baseline`: nearest within 1%): the paired sign-flip permutation test of
  :func:`analysis.significance.stats.sign_flip_test` on per-recording tail-WERs (tail errors averaged over seeds, over the
  recording's tail words; recordings without tail words left out), as :mod:`analysis.features.cue` tests the cue-word error
  rate. The p-values are Holm-corrected across every distinct comparison of the part (a comparison that belongs to
  several families counts once).

The rates come from the per-recording tables alone, so a run whose table is unusable (see the problems table) is
not in them; the ``tail/<DATASET>`` metrics are the same pooled rate per run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from analysis.significance import stats
from analysis.ledger.collect import Sweep, greedy_rows
from analysis.ledger.tables import counts_by_seed
from analysis.display.render import Section
from analysis.significance.werr import context_spans, family_rows, find_baseline, format_seconds, holm_once, stable_seed
from asr_core.contract.metrics import CLEAN, TAIL_TAG

TITLE = "Tail words (paper 002)"
KEYS = ["config", "config_id", "series", "series_id", "families", "context_s", "dataset", "condition", "snr_db"]
RATE_COLUMNS = ["family", "series", "series_id", "dataset", "condition", "snr_db", "config", "config_id",
                "context_s", "n_seeds", "seeds", "n_recordings", "n_tail_recordings", "tail_words", "ref_words",
                "tail_share", "tail_wer", "tail_wer_sd", "tail_wer_min", "tail_wer_max", "wer", "wer_sd", "wer_min",
                "wer_max"]
TEST_COLUMNS = ["family", "series", "series_id", "dataset", "condition", "snr_db", "baseline_config",
                "baseline_context_s", "config", "config_id", "context_s", "n_recordings", "tail_wer_baseline",
                "tail_wer", "delta_tail_wer", "wer_baseline", "wer", "p", "p_holm", "note"]

# (config_id, dataset, condition) -> seed -> recording -> (tail_errors, tail_words)
TailIndex = dict[tuple[str, str, str], dict[int, Mapping[str, tuple[float, float]]]]


def tail_rows(sweep: Sweep) -> pd.DataFrame:
    """The greedy per-recording rows that carry tail counts (``tail_words`` and ``tail_errors`` not empty); empty
    when no evaluation of the sweep was given a tail set."""
    rec = greedy_rows(sweep.recordings)
    if rec.empty or "tail_words" not in rec.columns:
        return rec.iloc[0:0]
    return rec[rec["tail_words"].notna() & rec["tail_errors"].notna()]


def has_tail(sweep: Sweep) -> bool:
    """Whether some finished run's per-recording tables have tail counts (what the ``tail/`` metrics come with)."""
    return bool(len(tail_rows(sweep)))


def _pct(errors: pd.Series, words: pd.Series) -> pd.Series:
    return 100.0 * errors / words.where(words > 0)


def rate_table(sweep: Sweep) -> pd.DataFrame:
    """Per family, configuration, dataset and condition: the pooled tail-WER and WER, each as mean / sd / min / max
    over seeds of the per-seed pooled rate (percent), and the share of reference words that are tail words
    (percent; :data:`RATE_COLUMNS`). Empty when the sweep has no tail counts."""
    rows = tail_rows(sweep)
    if rows.empty:
        return pd.DataFrame(columns=RATE_COLUMNS)
    counts = ["errors", "ref_words", "tail_errors", "tail_words"]
    per_seed = rows.groupby(KEYS + ["seed"], dropna=False, sort=False)[counts].sum().reset_index()
    per_seed["tail_wer"] = _pct(per_seed["tail_errors"], per_seed["tail_words"])
    per_seed["wer"] = _pct(per_seed["errors"], per_seed["ref_words"])
    g = per_seed.groupby(KEYS, dropna=False, sort=False)
    out = g["tail_wer"].agg(tail_wer="mean", tail_wer_sd=stats.seed_sd, tail_wer_min="min",
                            tail_wer_max="max").reset_index()
    agg = g["wer"].agg(mean="mean", sd=stats.seed_sd, min="min", max="max").reset_index(drop=True)
    out["wer"], out["wer_sd"], out["wer_min"], out["wer_max"] = (agg[c] for c in ("mean", "sd", "min", "max"))
    out["n_seeds"] = g["seed"].count().values
    out["seeds"] = g["seed"].agg(lambda s: ",".join(str(int(v)) for v in sorted(s))).values
    out["tail_words"] = g["tail_words"].mean().values  # the same references for every seed
    out["ref_words"] = g["ref_words"].mean().values
    out["tail_share"] = _pct(out["tail_words"], out["ref_words"])
    per_rec = rows.groupby(KEYS + ["recording"], dropna=False, sort=False)["tail_words"].max().reset_index()
    rg = per_rec.groupby(KEYS, dropna=False, sort=False)["tail_words"]
    out["n_recordings"] = rg.count().values
    out["n_tail_recordings"] = rg.agg(lambda s: int((s > 0).sum())).values
    out = family_rows(out, sweep.families)
    return out[RATE_COLUMNS].sort_values(["family", "series", "dataset", "snr_db", "context_s"],
                                         na_position="first").reset_index(drop=True)


def tail_index(sweep: Sweep) -> TailIndex:
    """:data:`TailIndex` of the greedy rows with tail counts, built in one pass."""
    return counts_by_seed(tail_rows(sweep), ["config_id", "dataset", "condition"], errors="tail_errors",
                          words="tail_words")


def tail_pvalue(a: stats.SeedTable, b: stats.SeedTable, *, names: tuple[str, str] = ("A", "B"), seed: int = 0
                ) -> tuple[float, int]:
    """(two-sided permutation p of B against A on per-recording tail-WERs, recordings with tail words compared);
    raises :class:`stats.PairingError` saying what is missing when the two cannot be paired recording by
    recording, or when no recording has tail words."""
    pc = stats.pair_counts(a, b, name_a=names[0], name_b=names[1])
    has = pc.ref_words > 0
    if not has.any():
        raise stats.PairingError(f"no recording of {names[0]} has tail words (is the tail set of eval.tail made from "
                                 "a text that shares words with these references?)")
    diffs = (pc.mean_errors_b[has] - pc.mean_errors_a[has]) / pc.ref_words[has]
    return stats.sign_flip_test(diffs, seed=seed).pvalue, int(has.sum())


def tail_tests(sweep: Sweep, rates: pd.DataFrame, baseline_context: float) -> pd.DataFrame:
    """Each context against the series' model at the baseline context on tail-WER (:data:`TEST_COLUMNS`),
    Holm-corrected across every distinct comparison; rows that cannot be tested carry a note (``tail_tests.csv``)."""
    if rates.empty:
        return pd.DataFrame(columns=TEST_COLUMNS)
    index = tail_index(sweep)
    out = []
    for (fam, sid, ds, cond), grp in rates.groupby(["family", "series_id", "dataset", "condition"], sort=True):
        grp = grp.sort_values("context_s")
        base_ctx = find_baseline(grp["context_s"].tolist(), baseline_context)
        base = grp[grp["context_s"] == base_ctx].iloc[0] if base_ctx is not None else None
        for _, row in grp.iterrows():
            if base is not None and row["config_id"] == base["config_id"]:
                continue
            r = {"family": fam, "series": row["series"], "series_id": sid, "dataset": ds, "condition": cond,
                 "snr_db": row["snr_db"], "baseline_config": "", "baseline_context_s": math.nan,
                 "config": row["config"], "config_id": row["config_id"], "context_s": row["context_s"],
                 "n_recordings": 0, "tail_wer_baseline": math.nan, "tail_wer": row["tail_wer"],
                 "delta_tail_wer": math.nan, "wer_baseline": math.nan, "wer": row["wer"], "p": math.nan,
                 "p_holm": math.nan, "note": ""}
            if base is None:
                r["note"] = f"not tested: no model at the baseline context {format_seconds(baseline_context)} in " \
                            "this series"
                out.append(r)
                continue
            r.update(baseline_config=base["config"], baseline_context_s=base["context_s"],
                     tail_wer_baseline=base["tail_wer"], delta_tail_wer=row["tail_wer"] - base["tail_wer"],
                     wer_baseline=base["wer"])
            where = f" on {ds}/{cond}"
            try:
                r["p"], r["n_recordings"] = tail_pvalue(
                    index.get((base["config_id"], ds, cond), {}), index.get((row["config_id"], ds, cond), {}),
                    names=(base["config"] + where, row["config"] + where),
                    seed=stable_seed(base["config_id"], row["config_id"], ds, cond, "tail"))
            except stats.PairingError as e:
                r["note"] = f"not tested: {e}"
            out.append(r)
    table = pd.DataFrame(out, columns=TEST_COLUMNS)
    if table.empty:
        return table
    table["p_holm"] = holm_once(table, ["series_id", "dataset", "condition", "config_id", "baseline_config"])
    return table


# ---- words ---------------------------------------------------------------------------------------------------

def _p(p: float) -> str:
    return "–" if not np.isfinite(p) else f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def _rate(x: float) -> str:
    return f"{x:.1f}%" if np.isfinite(x) else "–"


def _significant(t: pd.Series, alpha: float) -> str:
    return "not tested" if not np.isfinite(t["p_holm"]) else "significant" if t["p_holm"] < alpha else \
        "not significant"


def verdicts(rates: pd.DataFrame, tests: pd.DataFrame, alpha: float, baseline_context: float) -> list[str]:
    """Per family, series, dataset and condition: one line saying whether the context farthest above the baseline
    (else the one farthest below it) has a significantly lower or higher tail-WER than the baseline (Holm p <
    ``alpha``), with both tail-WERs and WERs, and the other contexts' tail-WERs with their Holm p."""
    lines = []
    for g in context_spans(rates):
        if g.single:
            lines.append(g.single)
            continue
        t = tests[(tests["family"] == g.family) & (tests["series_id"] == g.series_id) & (tests["dataset"] == g.dataset)
                  & (tests["condition"] == g.condition)].sort_values("context_s")
        if t.empty or not t["baseline_config"].astype(bool).any():
            lines.append(f"{g.head}, {g.span}: **not tested** — no model at the baseline context "
                         f"{format_seconds(baseline_context)} in this series.")
            continue
        base_ctx = float(t["baseline_context_s"].iloc[0])
        longer = t[t["context_s"] > base_ctx]
        main = longer.iloc[-1] if len(longer) else t.iloc[0]
        direction = "longer" if len(longer) else "shorter"
        span = f"{format_seconds(base_ctx)} → {format_seconds(main['context_s'])}"
        if not np.isfinite(main["p_holm"]):
            lines.append(f"{g.head}, {span}: **not tested** — {main['note'] or 'no paired recordings'}.")
            continue
        sig = main["p_holm"] < alpha
        moved = "fell" if main["delta_tail_wer"] < 0 else "rose" if main["delta_tail_wer"] > 0 else "did not change"
        verdict = (f"**{direction} context lowered the tail-word error rate significantly**" if sig and moved == "fell"
                   else f"**{direction} context raised the tail-word error rate significantly**" if sig and
                   moved == "rose" else f"**no significant change in the tail-word error rate from {direction} "
                                        "context**")
        line = (f"{g.head}, {span}: {verdict} ({int(main['n_recordings'])} recordings with tail words, α = "
                f"{alpha:g}). Tail-WER {_rate(main['tail_wer_baseline'])} → {_rate(main['tail_wer'])} ({moved}; "
                f"Holm p = {_p(main['p_holm'])}, {_significant(main, alpha)}); WER {_rate(main['wer_baseline'])} → "
                f"{_rate(main['wer'])}.")
        others = t[t["config_id"] != main["config_id"]]
        if len(others):
            line += f" Other contexts against {format_seconds(base_ctx)}: " + "; ".join(
                f"{format_seconds(o['context_s'])} {_rate(o['tail_wer'])} (Holm p = {_p(o['p_holm'])}, "
                f"{_significant(o, alpha)})" for _, o in others.iterrows()) + "."
        lines.append(line)
    return lines


def display(rates: pd.DataFrame, tests: pd.DataFrame, baseline_context: float) -> list[tuple[str, pd.DataFrame]]:
    """Per family, dataset and condition: tail words, tail-WER and WER (mean ± sd over seeds) and the p-values
    against the baseline context."""
    def pm(m: float, s: float) -> str:
        return "–" if not np.isfinite(m) else f"{m:.1f} ± {s:.1f}" if np.isfinite(s) else f"{m:.1f}"

    found = {(r["family"], r["series_id"], r["dataset"], r["condition"], r["config_id"]): r
             for _, r in tests.iterrows()}

    def p_of(row: pd.Series, col: str) -> str:
        t = found.get((row["family"], row["series_id"], row["dataset"], row["condition"], row["config_id"]))
        return "–" if t is None else _p(t[col])

    base = format_seconds(baseline_context)
    out = []
    for (fam, ds, cond), grp in rates.groupby(["family", "dataset", "condition"], sort=True):
        grp = grp.sort_values(["series", "context_s"])
        view = pd.DataFrame({
            "series": grp["series"], "context": grp["context_s"].map(format_seconds), "seeds": grp["n_seeds"],
            "tail words": [f"{w:.0f} ({s:.1f}%)" if np.isfinite(s) else f"{w:.0f}"
                           for w, s in zip(grp["tail_words"], grp["tail_share"])],
            "tail-WER %": [pm(m, s) for m, s in zip(grp["tail_wer"], grp["tail_wer_sd"])],
            "WER %": [pm(m, s) for m, s in zip(grp["wer"], grp["wer_sd"])],
            f"p vs {base} (tail-WER)": [p_of(r, "p") for _, r in grp.iterrows()],
            f"p Holm vs {base} (tail-WER)": [p_of(r, "p_holm") for _, r in grp.iterrows()]})
        out.append((f"Family {fam}, {ds}" + ("" if cond == CLEAN else f", {cond}") + ": tail words, mean ± sd over "
                    "seeds", view))
    return out


def section(sweep: Sweep, baseline_context: float, alpha: float) -> tuple[Section, dict[str, pd.DataFrame]]:
    """The report's "Tail words (paper 002)" section and its CSVs ``tail`` and ``tail_tests``."""
    rates = rate_table(sweep)
    tests = tail_tests(sweep, rates, baseline_context)
    paras = [
        f"Tail words are the rarest word types of a text, those whose counts together make up at most a set share "
        f"of its words (5% in the paper); the set here is the tail set named by {TAIL_TAG}, and each run's tag "
        f"{TAIL_TAG} records its source, its number of word types and the share of each test set's reference words "
        f"that are tail words. Tail-WER: errors on tail words (reference tail words substituted or deleted, "
        f"inserted tail words) over the reference's tail words, pooled over recordings, greedy decoding, mean ± sd "
        f"over seeds, beside WER on all words.",
        f"Tests: each context against the series' model at {format_seconds(baseline_context)} (the WER section's "
        f"baseline), the paired sign-flip permutation test over recordings on per-recording tail-WERs (tail errors "
        f"averaged over seeds; recordings without tail words left out), Holm-corrected across every comparison of "
        f"this section; significant: adjusted p < {alpha:g}. All rates in tail.csv, all tests in tail_tests.csv."]
    bullets = [(f"Against the baseline context ({format_seconds(baseline_context)})",
                verdicts(rates, tests, alpha, baseline_context))]
    return Section(TITLE, paras, display(rates, tests, baseline_context), [], bullets), {"tail": rates,
                                                                                        "tail_tests": tests}
