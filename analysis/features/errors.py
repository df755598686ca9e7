"""Error types: substitutions, deletions and insertions per decoder, configuration, dataset and condition.

The per-recording tables (``eval/<DATASET>[.<DECODER>].csv``, :data:`asr_core.contract.metrics.TABLE_COLUMNS`) count
each recording's substitutions (S), deletions (D), insertions (I) and reference words (N). Here, for every decoder a
finished run has tables of (``greedy``, beam decoders, ``fusion-<METHOD>``, ``window-<W>s``):

* per seed, the corpus-level rates over that seed's recordings: ``100 × ΣS / ΣN`` and the same for D and I, and the
  WER ``100 × Σ(S + D + I) / ΣN``, so S + D + I = WER for every seed;
* per family, configuration, dataset and condition, the mean and sd of each rate over the seeds (:func:`error_table`);
  the means add up to the mean WER as the per-seed rates do.

A shorter context that cuts more words at training-window edges teaches its model to leave them out, which shows as
deletions; :func:`change_lines` says, per series and dataset, how the clean WER's change from the shortest to the
longest context splits into the three kinds.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.significance import stats
from analysis.ledger.collect import Sweep
from analysis.display.render import Section, fmt_num, mean_sd
from analysis.significance.werr import family_rows, format_seconds
from asr_core.contract.metrics import CLEAN, GREEDY

TITLE = "Error types"
SPAN_PARAM = "model.attention_span_s"
KINDS = (("sub", "substitutions"), ("del", "deletions"), ("ins", "insertions"))
KEYS = ["config", "config_id", "series", "series_id", "families", "context_s", "decoder", "dataset", "condition",
        "snr_db"]
SEED_COLUMNS = [*KEYS, "seed", "n_recordings", "ref_words", "wer", "sub", "del", "ins"]
RATE_COLUMNS = ["family", "series", "series_id", "config", "config_id", "context_s", "cut", "attention_span_s",
                "decoder", "dataset", "condition", "snr_db", "n_seeds", "seeds", "n_recordings", "wer_mean", "wer_sd",
                "sub_mean", "sub_sd", "del_mean", "del_sd", "ins_mean", "ins_sd"]


def seed_rates(sweep: Sweep) -> pd.DataFrame:
    """Per configuration, decoder, dataset, condition and seed (:data:`SEED_COLUMNS`): the corpus-level WER and S, D
    and I rates in percent of the reference words of that seed's recordings. Empty without per-recording tables."""
    rec = sweep.recordings
    if rec.empty:
        return pd.DataFrame(columns=SEED_COLUMNS)
    if "decoder" not in rec.columns:  # a frame built before decoders were collected is all greedy
        rec = rec.assign(decoder=GREEDY)
    counts = ["ref_words", "substitutions", "deletions", "insertions"]
    g = rec.groupby([*KEYS, "seed"], dropna=False, sort=False)
    out = g[counts].sum().reset_index()
    out["n_recordings"] = g["recording"].count().to_numpy()
    words = out["ref_words"].astype(float).where(out["ref_words"] > 0)
    for short, column in KINDS:
        out[short] = 100.0 * out[column].astype(float) / words
    out["wer"] = 100.0 * (out["substitutions"] + out["deletions"] + out["insertions"]).astype(float) / words
    return out[SEED_COLUMNS]


def _span_by_config(sweep: Sweep) -> dict[str, float]:
    """``config_id -> model.attention_span_s`` (NaN: not banded, or a run without the param)."""
    if SPAN_PARAM not in sweep.params.columns:
        return {}
    span = pd.to_numeric(sweep.params[SPAN_PARAM], errors="coerce")
    trials = sweep.trials.drop_duplicates("config_id")
    return {cid: float(span.get(rid, math.nan)) for cid, rid in zip(trials["config_id"], trials["run_id"])}


def error_table(sweep: Sweep) -> pd.DataFrame:
    """Per family, configuration (with its context, training cut and attention span), decoder, dataset and condition
    (:data:`RATE_COLUMNS`): WER and the substitution, deletion and insertion rates in percent of the reference words,
    corpus-level per seed, then mean and sd over the seeds. Empty without per-recording tables."""
    per_seed = seed_rates(sweep)
    if per_seed.empty:
        return pd.DataFrame(columns=RATE_COLUMNS)
    g = per_seed.groupby(KEYS, dropna=False, sort=False)
    out = g["wer"].agg(wer_mean="mean", wer_sd=stats.seed_sd).reset_index()
    for short, _ in KINDS:
        agg = g[short].agg(["mean", stats.seed_sd])
        out[f"{short}_mean"], out[f"{short}_sd"] = agg["mean"].to_numpy(), agg["seed_sd"].to_numpy()
    out["n_seeds"] = g["seed"].count().to_numpy()
    out["seeds"] = g["seed"].agg(lambda s: ",".join(str(int(v)) for v in sorted(s))).to_numpy()
    out["n_recordings"] = g["n_recordings"].min().to_numpy()
    cut = dict(zip(sweep.trials["config_id"], sweep.trials["cut"])) if "cut" in sweep.trials else {}
    out["cut"] = out["config_id"].map(lambda c: cut.get(c, "fixed"))
    span = _span_by_config(sweep)
    out["attention_span_s"] = out["config_id"].map(lambda c: span.get(c, math.nan)).astype(float)
    out = family_rows(out, sweep.families)
    out["greedy_first"] = out["decoder"] != GREEDY
    out = out.sort_values(["family", "series", "greedy_first", "decoder", "dataset", "snr_db", "context_s"],
                          na_position="first")
    return out[RATE_COLUMNS].reset_index(drop=True)


# ---- words ---------------------------------------------------------------------------------------------------

def display(table: pd.DataFrame, decoder: str = GREEDY) -> pd.DataFrame:
    """One row per configuration and dataset (clean audio, ``decoder``, each configuration once whatever families
    it is in): WER, S, D and I in percent of the reference words, mean ± sd over seeds."""
    part = table[(table["decoder"] == decoder) & (table["condition"] == CLEAN)]
    part = part.drop_duplicates(["config_id", "dataset"]).sort_values(["series", "context_s", "dataset"])
    several = part["series"].nunique() > 1
    rows = []
    for _, r in part.iterrows():
        row = {"series": r["series"]} if several else {}
        row.update({"context": format_seconds(r["context_s"]), "configuration": r["config"], "dataset": r["dataset"],
                    "WER": mean_sd(r["wer_mean"], r["wer_sd"]), "S": mean_sd(r["sub_mean"], r["sub_sd"]),
                    "D": mean_sd(r["del_mean"], r["del_sd"]), "I": mean_sd(r["ins_mean"], r["ins_sd"]),
                    "seeds": int(r["n_seeds"])})
        rows.append(row)
    return pd.DataFrame(rows)


def change_lines(table: pd.DataFrame, decoder: str = GREEDY) -> list[str]:
    """Per series and dataset (clean audio, ``decoder``): the WER's change from the shortest to the longest context
    and how much of it each error type makes, in points, and the type that changed most."""
    part = table[(table["decoder"] == decoder) & (table["condition"] == CLEAN)].drop_duplicates(
        ["config_id", "dataset"])
    lines = []
    for (series, ds), grp in part.groupby(["series", "dataset"], sort=True):
        grp = grp.sort_values("context_s")
        if grp["context_s"].nunique() < 2:
            continue
        a, b = grp.iloc[0], grp.iloc[-1]
        deltas = {name: b[f"{short}_mean"] - a[f"{short}_mean"] for short, name in KINDS}
        delta = b["wer_mean"] - a["wer_mean"]
        head = (f"{series + ', ' if series else ''}{ds}, {format_seconds(a['context_s'])} → "
                f"{format_seconds(b['context_s'])}: WER {fmt_num(a['wer_mean'])}% → {fmt_num(b['wer_mean'])}% "
                f"({fmt_num(delta, 2, True)} points): ")
        parts = ", ".join(f"{name} {fmt_num(d, 2, True)}" for name, d in deltas.items())
        finite = {k: v for k, v in deltas.items() if math.isfinite(v)}
        most = ""
        if finite and math.isfinite(delta) and delta != 0:
            kind = max(finite, key=lambda k: abs(finite[k]))
            share = 100.0 * finite[kind] / delta
            # a share over 100% (the kinds moving in opposite directions, a small net change) reads as nonsense
            most = (f"; {kind} change most ({share:.0f}% of the change)" if 0 < share <= 100 else
                    f"; {kind} change most, and the kinds move in opposite directions")
        elif any(v != 0 for v in finite.values()):
            kind = max(finite, key=lambda k: abs(finite[k]))
            most = f"; {kind} change most, and the kinds move in opposite directions"
        lines.append(head + parts + most + ".")
    return lines


def section(sweep: Sweep) -> tuple[Section, pd.DataFrame]:
    """The report's "Error types" section (greedy decoding, clean audio) and its CSV ``errors``
    (:func:`error_table`: every decoder and condition)."""
    table = error_table(sweep)
    if table.empty:
        return Section(TITLE, ["No per-recording tables were read, so the errors cannot be split into types "
                               "(see \"Runs left out\")."], [], [], []), table
    paras = ["Substitutions (S), deletions (D) and insertions (I) in percent of the reference words: per seed over "
             "all its recordings (corpus level, as the WER), then mean ± sd over the seeds, so S + D + I = WER. "
             "Shown for greedy decoding on clean audio; errors.csv holds the same for every decoder and condition. "
             "Words cut at training-window edges teach a model to leave words out, which shows as deletions."]
    tables = [("Error types (%) per configuration, greedy, clean: mean ± sd over seeds", display(table))]
    lines = change_lines(table)
    bullets = [("From the shortest to the longest context (points of WER)", lines)] if lines else []
    return Section(TITLE, paras, tables, [], bullets), table


def check_sums(table: pd.DataFrame, tol: float = 1e-9) -> bool:
    """Whether every row's mean S + D + I equals its mean WER (up to ``tol`` points)."""
    total = table["sub_mean"] + table["del_mean"] + table["ins_mean"]
    return bool(np.all(np.isclose(total, table["wer_mean"], atol=tol, rtol=0.0) | table["wer_mean"].isna()))
