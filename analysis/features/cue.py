"""The planted cue (positive control): the cue-word error rate against context, beside WER on all and other words.

A synthetic corpus made with ``synth --cue`` plants homophones whose spelling only a word far back decides
(docs/ARCHITECTURE.md, "Planted cue"); evaluation counts, per recording, the planted words (``cue_words``) and those
substituted or deleted (``cue_errors``) in ``eval/<DATASET>.csv`` (:data:`asr_core.contract.metrics.CUE_COLUMNS`).
A model that uses long context should get them right more often as its context grows; one whose long context is
broken cannot.

Here, per family, series, dataset and condition (greedy decoding) and per context length:

* the cue-word error rate pooled over recordings (all cue errors / all cue words, percent) for each seed, and its
  mean, sd, min and max over seeds; the same for WER on all words and WER on the other words — per recording
  ``errors - cue_errors`` over ``ref_words - cue_words``: exact, as both counts come from one alignment of the same
  normalised words, and insertions (which belong to no reference word) count as errors on the other words;
* recording-level paired tests of each context against the series' shortest context and against the report's
  baseline context (the WER section's, nearest within 1%): the paired sign-flip permutation test of
  :func:`analysis.significance.stats.sign_flip_test`, for the cue words on the per-recording cue-word error rates (seed-averaged
  errors over cue words; recordings without cue words left out), for WER and the other words on the seed-averaged
  per-recording error counts, as the WER section tests WER. Each measure's p-values are Holm-corrected across every
  distinct comparison of the section (a comparison that is both "against the shortest" and "against the baseline"
  counts once).

The rates come from the per-recording tables alone, so a run whose table is unusable (see the problems table) is
not in them; the ``cue/<DATASET>`` metrics are the same pooled rate per run.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.significance import stats
from analysis.ledger.collect import Sweep, greedy_rows
from analysis.display.plots import MAX_PANELS, Figure, context_axis, panels, save, series_labels
from analysis.significance.werr import context_spans, family_rows, find_baseline, format_seconds, stable_seed
from asr_core.contract.metrics import CLEAN

MEASURES = ("cue", "wer", "noncue")  # cue words; all words; the other (not planted) words
MEASURE_NAMES = {"cue": "cue-word error rate", "wer": "WER", "noncue": "WER on the other words"}
REFERENCES = ("shortest", "baseline")
RATE_COLUMNS = ["family", "series", "series_id", "dataset", "condition", "snr_db", "config", "config_id",
                "context_s", "n_seeds", "seeds", "n_recordings", "n_cue_recordings", "cue_words", "cue_rate",
                "cue_rate_sd", "cue_rate_min", "cue_rate_max", "wer", "wer_sd", "wer_min", "wer_max", "noncue_wer",
                "noncue_wer_sd", "noncue_wer_min", "noncue_wer_max"]
TEST_COLUMNS = [f"{ref}_{c}" for ref in REFERENCES
                for c in ("config", "context_s", "p_cue", "p_holm_cue", "p_wer", "p_holm_wer", "p_noncue",
                          "p_holm_noncue", "note")]
TABLE_COLUMNS = RATE_COLUMNS + TEST_COLUMNS

# (config_id, dataset, condition) -> seed -> recording -> (errors, ref_words, cue_errors, cue_words)
CueIndex = dict[tuple[str, str, str], dict[int, dict[str, tuple[float, float, float, float]]]]


def cue_rows(sweep: Sweep) -> pd.DataFrame:
    """The greedy per-recording rows that count planted words (``cue_words`` not empty), with ``noncue_errors`` and
    ``noncue_words``; empty when the sweep has no planted cue."""
    rec = greedy_rows(sweep.recordings)
    if rec.empty or "cue_words" not in rec.columns:
        return rec.iloc[0:0]
    rec = rec[rec["cue_words"].notna() & rec["cue_errors"].notna()]
    return rec.assign(noncue_errors=rec["errors"] - rec["cue_errors"], noncue_words=rec["ref_words"] - rec["cue_words"])


def has_cues(sweep: Sweep) -> bool:
    """Whether some finished run counted planted words on some dataset (what the ``cue/`` metrics are logged for)."""
    rows = cue_rows(sweep)
    return bool(len(rows)) and float(rows["cue_words"].sum()) > 0


def _pct(errors: pd.Series, words: pd.Series) -> pd.Series:
    return 100.0 * errors / words.where(words > 0)


def rate_table(sweep: Sweep) -> pd.DataFrame:
    """Per family, configuration, dataset and condition (datasets with planted words only): the pooled cue-word
    error rate, WER and WER on the other words, each as mean / sd / min / max over seeds of the per-seed pooled rate
    (percent; :data:`RATE_COLUMNS`)."""
    rows = cue_rows(sweep)
    if rows.empty:
        return pd.DataFrame(columns=RATE_COLUMNS)
    keys = ["config", "config_id", "series", "series_id", "families", "context_s", "dataset", "condition", "snr_db"]
    counts = ["errors", "ref_words", "cue_errors", "cue_words", "noncue_errors", "noncue_words"]
    per_seed = rows.groupby(keys + ["seed"], dropna=False, sort=False)[counts].sum().reset_index()
    per_seed["cue_rate"] = _pct(per_seed["cue_errors"], per_seed["cue_words"])
    per_seed["wer"] = _pct(per_seed["errors"], per_seed["ref_words"])
    per_seed["noncue_wer"] = _pct(per_seed["noncue_errors"], per_seed["noncue_words"])
    g = per_seed.groupby(keys, dropna=False, sort=False)

    out = g["cue_rate"].agg(cue_rate="mean", cue_rate_sd=stats.seed_sd, cue_rate_min="min",
                            cue_rate_max="max").reset_index()
    for col, name in (("wer", "wer"), ("noncue_wer", "noncue_wer")):
        agg = g[col].agg(mean="mean", sd=stats.seed_sd, min="min", max="max").reset_index(drop=True)
        out[name], out[f"{name}_sd"], out[f"{name}_min"], out[f"{name}_max"] = (agg[c] for c in ("mean", "sd", "min",
                                                                                                 "max"))
    out["n_seeds"] = g["seed"].count().values
    out["seeds"] = g["seed"].agg(lambda s: ",".join(str(int(v)) for v in sorted(s))).values
    out["cue_words"] = g["cue_words"].mean().values  # the same planted words for every seed
    per_rec = rows.groupby(keys + ["recording"], dropna=False, sort=False)["cue_words"].max().reset_index()
    rg = per_rec.groupby(keys, dropna=False, sort=False)["cue_words"]
    out["n_recordings"] = rg.count().values
    out["n_cue_recordings"] = rg.agg(lambda s: int((s > 0).sum())).values
    out = family_rows(out, sweep.families)
    return out[RATE_COLUMNS].sort_values(["family", "series", "dataset", "snr_db", "context_s"],
                                         na_position="first").reset_index(drop=True)


def cue_index(sweep: Sweep) -> CueIndex:
    """:data:`CueIndex` of the greedy rows with planted words, built in one pass."""
    rows = cue_rows(sweep)
    out: CueIndex = {}
    cols = [rows[c].to_numpy() for c in ("config_id", "dataset", "condition", "seed", "recording", "errors",
                                          "ref_words", "cue_errors", "cue_words")]
    for cid, ds, cond, seed, name, err, words, cerr, cwords in zip(*cols):
        out.setdefault((cid, ds, cond), {}).setdefault(int(seed), {})[str(name)] = (
            float(err), float(words), float(cerr), float(cwords))
    return out


def _measure(table: dict[int, dict[str, tuple[float, float, float, float]]], measure: str) -> stats.SeedTable:
    """One measure's ``seed -> recording -> (errors, words)`` out of a :data:`CueIndex` entry."""
    def pick(v: tuple[float, float, float, float]) -> tuple[float, float]:
        err, words, cerr, cwords = v
        return {"cue": (cerr, cwords), "wer": (err, words), "noncue": (err - cerr, words - cwords)}[measure]

    return {seed: {rec: pick(v) for rec, v in recs.items()} for seed, recs in table.items()}


def paired_pvalues(index: CueIndex, config_a: str, config_b: str, dataset: str, condition: str, *,
                   names: tuple[str, str] = ("A", "B")) -> dict[str, float]:
    """Permutation p-values of B against A for each of :data:`MEASURES` (see the module docstring); raises
    :class:`stats.PairingError` naming what is missing when the two cannot be paired recording by recording."""
    where = f" on {dataset}/{condition}"
    a, b = index.get((config_a, dataset, condition), {}), index.get((config_b, dataset, condition), {})
    for name, table in zip(names, (a, b)):
        if not table:
            raise stats.PairingError(f"configuration {name} has no per-recording cue counts{where}")
    seed = stable_seed(config_a, config_b, dataset, condition, "cue")
    out = {}
    for m in MEASURES:
        pc = stats.pair_counts(_measure(a, m), _measure(b, m), name_a=names[0] + where, name_b=names[1] + where)
        if m == "cue":  # per-recording rates; a recording without planted words has none
            has = pc.ref_words > 0
            diffs = (pc.mean_errors_b[has] - pc.mean_errors_a[has]) / pc.ref_words[has]
        else:
            diffs = pc.mean_errors_b - pc.mean_errors_a
        out[m] = stats.sign_flip_test(diffs, seed=seed).pvalue
    return out


def cue_table(sweep: Sweep, baseline_context: float) -> pd.DataFrame:
    """:func:`rate_table` with, per row, the tests against the series' shortest context and against its baseline
    context (:data:`TEST_COLUMNS`: the reference's config and context, each measure's p and Holm-adjusted p, and a
    note where a test could not be made; empty for the reference row itself). This is ``cue.csv``."""
    rates = rate_table(sweep)
    out = rates.assign(**{c: (math.nan if "_p" in c or c.endswith("context_s") else "") for c in TEST_COLUMNS})
    if rates.empty:
        return out[TABLE_COLUMNS]
    index = cue_index(sweep)
    names = dict(zip(rates["config_id"], rates["config"]))
    pvalues: dict[tuple[str, str, str, str], dict[str, float] | str] = {}
    links: list[tuple[int, str, tuple[str, str, str, str]]] = []  # (row, reference, comparison key)
    for _, grp in out.groupby(["family", "series_id", "dataset", "condition"], sort=False):
        grp = grp.sort_values("context_s")
        base_ctx = find_baseline(grp["context_s"].tolist(), baseline_context)
        refs = {"shortest": grp.iloc[0],
                "baseline": grp[grp["context_s"] == base_ctx].iloc[0] if base_ctx is not None else None}
        for i, row in grp.iterrows():
            for ref, r in refs.items():
                if r is None:
                    out.at[i, f"{ref}_note"] = (f"no model at the baseline context {format_seconds(baseline_context)}"
                                                f" in this series")
                    continue
                if r["config_id"] == row["config_id"]:
                    continue
                out.at[i, f"{ref}_config"], out.at[i, f"{ref}_context_s"] = r["config"], r["context_s"]
                # one key per pair: the two-sided tests do not depend on which side is the reference
                a, b = sorted((r["config_id"], row["config_id"]))
                key = (a, b, row["dataset"], row["condition"])
                if key not in pvalues:
                    try:
                        pvalues[key] = paired_pvalues(index, *key, names=(names[a], names[b]))
                    except stats.PairingError as e:
                        pvalues[key] = "not tested: " + str(e)
                links.append((i, ref, key))
    tested = [k for k, v in pvalues.items() if isinstance(v, dict)]
    holm = {m: dict(zip(tested, stats.holm([pvalues[k][m] for k in tested]))) for m in MEASURES}  # type: ignore[index]
    for i, ref, key in links:
        res = pvalues[key]
        if isinstance(res, str):
            out.at[i, f"{ref}_note"] = res
            continue
        for m in MEASURES:
            out.at[i, f"{ref}_p_{m}"] = res[m]
            out.at[i, f"{ref}_p_holm_{m}"] = float(holm[m][key])
    return out[TABLE_COLUMNS]


# ---- words ---------------------------------------------------------------------------------------------------

def _p(p: float) -> str:
    return "–" if not np.isfinite(p) else f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def _change(name: str, a: float, b: float, p_holm: float, alpha: float, digits: int = 1) -> str:
    moved = "fell" if b < a else "rose" if b > a else "did not change"
    sig = ("significant" if p_holm < alpha else "not significant") if np.isfinite(p_holm) else "not tested"
    return f"{name} {a:.{digits}f}% → {b:.{digits}f}% ({moved}; Holm p = {_p(p_holm)}, {sig})"


def verdicts(table: pd.DataFrame, alpha: float) -> list[str]:
    """Per family, series, dataset and condition: did the longest context lower the cue-word error rate
    significantly against the shortest (Holm p < ``alpha``), and did WER on all words and on the other words
    fall."""
    lines = []
    for g in context_spans(table):
        if g.single:
            lines.append(g.single)
            continue
        head, span, short, long = g.head, g.span, g.short, g.long
        if not np.isfinite(long["shortest_p_holm_cue"]):
            lines.append(f"{head}, {span}: **not tested** — {long['shortest_note'] or 'no paired recordings'}.")
            continue
        lowered = long["cue_rate"] < short["cue_rate"] and long["shortest_p_holm_cue"] < alpha
        raised = long["cue_rate"] > short["cue_rate"] and long["shortest_p_holm_cue"] < alpha
        verdict = ("**longer context lowered the cue-word error rate significantly**" if lowered else
                   "**longer context raised the cue-word error rate significantly**" if raised else
                   "**no significant change in the cue-word error rate from longer context**")
        lines.append(
            f"{head}, {span}: {verdict} ({int(long['n_cue_recordings'])} recordings with cue words, α = {alpha:g}). "
            + "; ".join(_change(n, short[c], long[c], long[f"shortest_p_holm_{m}"], alpha) for n, c, m in (
                ("Cue-word error rate", "cue_rate", "cue"), ("WER", "wer", "wer"),
                ("WER on the other words", "noncue_wer", "noncue")))
            + ".")
    return lines


def display(table: pd.DataFrame, baseline_context: float) -> list[tuple[str, pd.DataFrame]]:
    """Per family, dataset and condition: the rates (mean ± sd over seeds) and the Holm-adjusted p-values against
    the shortest and the baseline context (cue · WER · other words)."""
    def pm(m: float, s: float) -> str:
        return "–" if not np.isfinite(m) else f"{m:.1f} ± {s:.1f}" if np.isfinite(s) else f"{m:.1f}"

    def ps(row: pd.Series, ref: str) -> str:
        if not np.isfinite(row[f"{ref}_p_holm_cue"]):
            return "–"
        return " · ".join(_p(row[f"{ref}_p_holm_{m}"]) for m in MEASURES)

    out = []
    for (fam, ds, cond), grp in table.groupby(["family", "dataset", "condition"], sort=True):
        grp = grp.sort_values(["series", "context_s"])
        view = pd.DataFrame({
            "series": grp["series"], "context": grp["context_s"].map(format_seconds), "seeds": grp["n_seeds"],
            "cue words": grp["cue_words"].map(lambda x: f"{x:.0f}"),
            "cue-word error %": [pm(m, s) for m, s in zip(grp["cue_rate"], grp["cue_rate_sd"])],
            "WER %": [pm(m, s) for m, s in zip(grp["wer"], grp["wer_sd"])],
            "WER other words %": [pm(m, s) for m, s in zip(grp["noncue_wer"], grp["noncue_wer_sd"])],
            "p Holm vs shortest (cue · WER · other)": [ps(r, "shortest") for _, r in grp.iterrows()],
            f"p Holm vs {format_seconds(baseline_context)} (cue · WER · other)":
                [ps(r, "baseline") for _, r in grp.iterrows()]})
        out.append((f"Family {fam}, {ds}" + ("" if cond == CLEAN else f", {cond}") + ": planted cue words, mean ± "
                    "sd over seeds", view))
    return out


# ---- figure --------------------------------------------------------------------------------------------------

def _band(ax, x: pd.Series, mean: pd.Series, lo: pd.Series, hi: pd.Series, label: str, style: str,
          color: str | None = None) -> str:
    order = x.argsort().values
    xs, ms, ls, hs = (s.to_numpy(dtype=float)[order] for s in (x, mean, lo, hi))
    (line,) = ax.plot(xs, ms, style, marker="o", label=label, color=color)
    ax.fill_between(xs, ls, hs, color=line.get_color(), alpha=0.15, linewidth=0)
    return line.get_color()


def draw_cue_figures(sweep: Sweep, table: pd.DataFrame, out_dir: Path) -> list[Figure]:
    """Per family: the cue-word error rate (solid) and WER (dashed; dotted: WER on the other words) against context
    on clean audio, one panel per dataset (at most :data:`MAX_PANELS`), one colour per series, shaded min–max over
    seeds. Families with fewer than two context lengths get none."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = []
    clean = table[table["condition"] == CLEAN]
    for fam, grp in clean.groupby("family", sort=True):
        if grp["context_s"].nunique() < 2:
            continue
        datasets = sorted(grp["dataset"].unique())[:MAX_PANELS]
        labels = series_labels(sweep, sorted(grp["series_id"].unique()))
        several = len(labels) > 1
        title = f"Planted cue: cue-word error rate and WER vs context, family {fam}"
        fig, axes = panels(len(datasets), title)
        for ax, ds in zip(axes, datasets):
            part = grp[grp["dataset"] == ds]
            for sid, g in part.groupby("series_id", sort=True):
                tail = f" ({labels[sid]})" if several else ""
                c = _band(ax, g["context_s"], g["cue_rate"], g["cue_rate_min"], g["cue_rate_max"],
                          f"cue words{tail}", "-")
                _band(ax, g["context_s"], g["wer"], g["wer_min"], g["wer_max"], f"WER{tail}", "--", c)
                ax.plot(g["context_s"].sort_values(), g.sort_values("context_s")["noncue_wer"], ":", color=c,
                        label=f"WER, other words{tail}")
            context_axis(ax, part["context_s"].tolist())
            ax.set_ylabel("error rate (%), greedy, clean")
            ax.set_title(ds)
            ax.legend(fontsize="small")
        key = f"cue_vs_context_{fam}"
        figs.append(Figure(key, title, f"Family {fam}: the planted words' error rate (substituted or deleted, pooled "
                                       "over recordings) and WER, mean over seeds; dotted: WER on the words that are "
                                       "not planted. Shaded: min–max over seeds.", save(fig, out_dir, key)))
    return figs
