"""The forced choice of the recall and copy plants in the report (:mod:`analysis.features.recall`): per slot, which of its
candidates the window's posteriors favour (:mod:`asr_core.evaluation.scorers.slot_window`; the slot table's ``choice_correct``,
``posterior_correct``, ``onset_correct`` and ``n_choices``), a measure of recall that does not need the model to spell
a whole word of several pieces.

Per family, configuration, dataset, condition and group (:func:`choice_rates`, columns :data:`CHOICE_RATE_COLUMNS`
added to :func:`analysis.features.recall.rate_table`): forced-choice, posterior-choice and onset-match accuracy (percent) as
mean and sd over seeds of the per-seed pooled accuracy; chance (100/candidates); the forced choice's hits and slots
pooled over seeds and its one-sided exact binomial p-value against chance (``choice_p``); and each model's attention
span and receptive field (each side, seconds; NaN: dense), as :func:`analysis.features.fragmentation.models` finds them.

The positive-control criteria of the copy plant (:func:`copy_verdicts`), fixed before any result, on the forced
choice of the single-window scoring of clean audio:

* N1: near band, forced choice ≥ 50% for the dense 10.24 s model and for the dense 81.92 s model;
* F1: far band, the dense 81.92 s model ≥ 30% and ≥ 20 points above the dense 10.24 s model of its series (with the
  recording-level far-band test's Holm p-value on the forced choice, :func:`analysis.features.recall.far_tests`, reported);
* F2: far band, the dense 10.24 s model within 5 points of chance;
* F3: far band, an 81.92 s model with banded attention whose receptive field (each side) is shorter than 20 s within
  5 points of chance, while the dense 81.92 s model meets F1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from analysis.significance.werr import format_seconds

MEASURES = {"choice_correct": "choice", "posterior_correct": "posterior", "onset_correct": "onset"}
MEASURE_NAMES = {"correct": "exact match", "choice": "forced choice", "posterior": "posterior choice",
                 "onset": "onset match"}
CHOICE_RATE_COLUMNS = ["chance", "choice", "choice_sd", "choice_hits", "choice_slots", "choice_p", "posterior",
                       "posterior_sd", "onset", "onset_sd", "attention_span_s", "field_s"]
CHOICE_TEXT = (
    "**Forced choice.** Each slot is also decoded from the one window of the model's context that ends 1 s after it, "
    "and scored by forced choice among the plant's candidates (the recall plant's 8 code words; the copy plant's 16 "
    "identity tokens, python -m asr_core synth --copy: a letter said by name, one tokenizer piece, drawn afresh for "
    "every episode): the candidate whose substitution into the window's reference has the highest CTC likelihood "
    "(forced choice); with one-piece candidates also the one with the most posterior over the masked frames "
    "(posterior choice); onset match: the aligned hypothesis word starts as the candidate does. Binomial p: one-sided, "
    "against chance, slots pooled over seeds. The copy plant's criteria, fixed before its models were trained: N1 "
    "near band ≥ 50% at 10.24 and 81.92 s; F1 far band ≥ 30% at 81.92 s and ≥ 20 points above 10.24 s; F2 far band "
    "at 10.24 s within 5 points of chance; F3 a banded 81.92 s model whose receptive field is under the far band's "
    "20 s within 5 points of chance on the far band while the dense one meets F1. N2 and N3 (the keys swapped and "
    "silenced) are read from python -m asr_core recall --key swap,silence (its summary.csv).")
DEFAULT_CHOICES = 8  # the recall plant's code words: the candidates of a table without ``n_choices``

# the copy plant's criteria (module docstring); percent, percentage points and seconds
SHORT_S, LONG_S = 10.24, 81.92
NEAR_MIN, FAR_MIN, FAR_GAIN, NEAR_CHANCE, FIELD_MAX_S = 50.0, 30.0, 20.0, 5.0, 20.0
_EPS = 1e-9


def with_measures(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (per slot) with the forced-choice columns numeric (NaN where empty, or absent in an older table);
    ``n_choices`` :data:`DEFAULT_CHOICES` where a forced choice lacks it."""
    out = rows.copy()
    for c in (*MEASURES, "n_choices"):
        out[c] = pd.to_numeric(out[c], errors="coerce") if c in out.columns else math.nan
    out.loc[out["choice_correct"].notna() & out["n_choices"].isna(), "n_choices"] = DEFAULT_CHOICES
    return out


def _sd(x: pd.Series) -> float:
    return float(x.std(ddof=1)) if x.notna().sum() > 1 else math.nan


def _binom(hits: float, n: float, chance: float) -> float:
    if not (n > 0 and math.isfinite(chance) and 0 < chance < 100):
        return math.nan
    return float(binomtest(int(hits), int(n), chance / 100.0, alternative="greater").pvalue)


def choice_rates(g_rows: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Per ``keys`` of ``g_rows`` (per slot and group, :func:`with_measures`): the columns of
    :data:`CHOICE_RATE_COLUMNS` but the model's span and field, in the order ``groupby(keys, sort=False)`` gives."""
    keys = list(keys)
    rows = g_rows.assign(chance_=100.0 / g_rows["n_choices"])
    parts = {}
    for col, name in MEASURES.items():
        parts[f"{name}_ok"] = (col, "sum")
        parts[f"{name}_n"] = (col, "count")
    per_seed = rows.groupby(keys + ["seed"], dropna=False, sort=False).agg(chance=("chance_", "mean"), **parts
                                                                           ).reset_index()
    for name in MEASURES.values():
        per_seed[name] = np.where(per_seed[f"{name}_n"] > 0,
                                  100.0 * per_seed[f"{name}_ok"] / per_seed[f"{name}_n"].clip(lower=1), math.nan)
    g = per_seed.groupby(keys, dropna=False, sort=False)
    out = g[list(MEASURES.values())].mean().reset_index()
    for name in MEASURES.values():
        out[f"{name}_sd"] = g[name].agg(_sd).values
    out["chance"] = g["chance"].mean().values
    out["choice_hits"] = g["choice_ok"].sum().values
    out["choice_slots"] = g["choice_n"].sum().values
    out["choice_p"] = [_binom(h, n, c) for h, n, c in zip(out["choice_hits"], out["choice_slots"], out["chance"])]
    out.loc[out["choice_slots"] == 0, ["choice_hits", "choice_slots"]] = math.nan
    return out


def model_fields(sweep) -> dict[str, tuple[float, float]]:
    """Per configuration id: (attention span, receptive field each side), seconds, NaN where attention is dense
    (:func:`analysis.features.fragmentation.models`)."""
    from analysis.features.fragmentation import models

    return {m.config_id: (m.span_s, m.field_s) for m in models(sweep)}


def has_choice(rates: pd.DataFrame) -> bool:
    return "choice" in rates.columns and bool(rates["choice"].notna().any())


# ---- display ------------------------------------------------------------------------------------------------------

def _pm(m: float, s: float) -> str:
    return "–" if not np.isfinite(m) else f"{m:.1f} ± {s:.1f}" if np.isfinite(s) else f"{m:.1f}"


def _p(p: float) -> str:
    return "–" if not np.isfinite(p) else f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def choice_table(grp: pd.DataFrame, names: dict[str, str], order: Sequence[str]) -> pd.DataFrame:
    """One family's, dataset's and condition's rates (``grp``) as a table: per group (``names``: how each is
    called, in ``order``) the exact match, forced choice (with its binomial p against chance, pooled over seeds),
    posterior choice where made and onset match, mean ± sd over seeds, with chance; columns per context (and
    series, where several)."""
    several = grp["series_id"].nunique() > 1
    measures = ["correct", "choice", *(m for m in ("posterior", "onset") if grp[m].notna().any())]
    present = [g for g in order if g in set(grp["group"])]
    cols: dict[str, list[str]] = {"": [], "measure": [], "chance %": []}
    for g in present:
        for m in measures:
            cols[""].append(names.get(g, g))
            cols["measure"].append(MEASURE_NAMES[m])
            ch = grp.loc[grp["group"] == g, "chance"]
            cols["chance %"].append(f"{ch.mean():.1f}" if m in ("choice", "posterior") and ch.notna().any() else "")
    for (series, ctx), part in grp.groupby(["series", "context_s"], sort=True):
        name = format_seconds(ctx) + (f" ({series})" if several else "")
        by = {g: r for g, r in zip(part["group"], part.itertuples(index=False))}
        cells = []
        for g in present:
            r = by.get(g)
            for m in measures:
                if r is None:
                    cells.append("–")
                elif m == "correct":
                    cells.append(_pm(r.accuracy, r.accuracy_sd) + f" (n={r.n_slots:.0f}, {r.n_seeds} seeds)")
                else:
                    cell = _pm(getattr(r, m), getattr(r, f"{m}_sd"))
                    cells.append(cell + (f" (p={_p(r.choice_p)})" if m == "choice" and np.isfinite(r.choice_p)
                                         else ""))
        cols[name] = cells
    return pd.DataFrame(cols)


# ---- the copy plant's criteria --------------------------------------------------------------------------------------

def _near(x: float, target: float) -> bool:
    return math.isfinite(x) and abs(x - target) < 1e-6


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def copy_verdicts(rates: pd.DataFrame, tests: pd.DataFrame, chance: float | None = None, alpha: float = 0.05,
                  condition: str = "clean, one window per slot") -> list[str]:
    """The lines N1, F1, F2, F3 (module docstring) per dataset and series of dense models (across sub-grids), each "met" or
    "not met" with its figures. ``rates``: :func:`analysis.features.recall.rate_table` (with :data:`CHOICE_RATE_COLUMNS`);
    ``tests``: :func:`analysis.features.recall.far_tests` on the forced choice (``measure="choice_correct"``), for F1's
    p-value; ``chance`` (percent): the rates' own where None; ``condition``: the single-window scoring of clean
    audio."""
    if not has_choice(rates):
        return []
    r = rates[(rates["condition"] == condition) & rates["choice"].notna()]
    lines: list[str] = []
    # across sub-grids: the dense and banded models of a control grid sit in sub-grids of their own (grids/demo-copy)
    for ds, grp in r.groupby("dataset", sort=True):
        ch = float(chance) if chance is not None else float(grp["chance"].mean())

        def acc(cfg: pd.Series | None, group: str) -> tuple[float, float]:
            if cfg is None:
                return math.nan, math.nan
            hit = grp[(grp["config_id"] == cfg["config_id"]) & (grp["group"] == group)]
            return (float(hit["choice"].iloc[0]), float(hit["choice_p"].iloc[0])) if len(hit) else (math.nan, math.nan)

        def fig(cfg: pd.Series | None, group: str) -> str:
            a, p = acc(cfg, group)
            if cfg is None or not math.isfinite(a):
                return "no results"
            return f"{a:.1f}% (binomial p = {_p(p)})"

        configs = grp.drop_duplicates("config_id")
        dense = configs[configs["attention_span_s"].isna()]
        banded = configs[configs["attention_span_s"].notna() & (configs["field_s"] < FIELD_MAX_S)
                         & configs["context_s"].map(lambda c: _near(c, LONG_S))]
        series = sorted(set(dense["series_id"])) or [""]
        for sid in series:
            mine = dense[dense["series_id"] == sid]
            short = next((row for _, row in mine.iterrows() if _near(row["context_s"], SHORT_S)), None)
            long = next((row for _, row in mine.iterrows() if _near(row["context_s"], LONG_S)), None)
            head = f"{ds}" + (f", {mine['series'].iloc[0]}" if len(mine) and len(series) > 1 else "") + \
                f" (forced choice, {condition}; chance {ch:.1f}%)"
            n_s, n_l = acc(short, "near")[0], acc(long, "near")[0]
            n1 = all(math.isfinite(x) and x >= NEAR_MIN - _EPS for x in (n_s, n_l))
            lines.append(f"{head}: N1 (near band ≥ {NEAR_MIN:g}% at {SHORT_S:g} s and at {LONG_S:g} s): "
                         f"{_verdict(n1)} — {SHORT_S:g} s {fig(short, 'near')}, {LONG_S:g} s {fig(long, 'near')}.")
            f_s, f_l = acc(short, "far")[0], acc(long, "far")[0]
            f1 = math.isfinite(f_s) and math.isfinite(f_l) and f_l >= FAR_MIN - _EPS and f_l - f_s >= FAR_GAIN - _EPS
            p = math.nan
            if short is not None and long is not None and len(tests):
                t = tests[(tests["dataset"] == ds) & (tests["condition"] == condition)
                          & (tests["config"] == long["config"]) & (tests["shortest_config"] == short["config"])]
                p = float(t["p_holm"].iloc[0]) if len(t) else math.nan
            sig = "" if not math.isfinite(p) else (" significant" if p < alpha else " not significant")
            gain = f"{f_l - f_s:+.1f} points" if math.isfinite(f_l - f_s) else "no difference measured"
            lines.append(f"{head}: F1 (far band: {LONG_S:g} s ≥ {FAR_MIN:g}% and ≥ {FAR_GAIN:g} points above "
                         f"{SHORT_S:g} s): {_verdict(f1)} — {LONG_S:g} s {fig(long, 'far')}, {SHORT_S:g} s "
                         f"{fig(short, 'far')} ({gain}; recording-level Holm p = {_p(p)}, α = {alpha:g}{sig}).")
            f2 = math.isfinite(f_s) and abs(f_s - ch) <= NEAR_CHANCE + _EPS
            lines.append(f"{head}: F2 (far band: {SHORT_S:g} s within {NEAR_CHANCE:g} points of chance): "
                         f"{_verdict(f2)} — {SHORT_S:g} s {fig(short, 'far')}"
                         + (f" ({f_s - ch:+.1f} points from chance)." if math.isfinite(f_s) else "."))
            if banded.empty:
                lines.append(f"{head}: F3 (far band: a banded {LONG_S:g} s model with a receptive field under "
                             f"{FIELD_MAX_S:g} s within {NEAR_CHANCE:g} points of chance, the dense {LONG_S:g} s "
                             f"model meeting F1): {_verdict(False)} — no banded {LONG_S:g} s model with a receptive "
                             f"field under {FIELD_MAX_S:g} s has far-band results.")
            for _, b in banded.iterrows():
                f_b = acc(b, "far")[0]
                f3 = f1 and math.isfinite(f_b) and abs(f_b - ch) <= NEAR_CHANCE + _EPS
                lines.append(f"{head}: F3 (far band: banded {LONG_S:g} s, {b['config']}, receptive field "
                             f"±{b['field_s']:.2f} s, within {NEAR_CHANCE:g} points of chance while the dense "
                             f"{LONG_S:g} s model meets F1): {_verdict(f3)} — banded {fig(b, 'far')}"
                             + (f" ({f_b - ch:+.1f} points from chance)" if math.isfinite(f_b) else "")
                             + f"; F1 {'met' if f1 else 'not met'}.")
    return lines
