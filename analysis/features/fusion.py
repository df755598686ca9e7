"""Decoding method (paper 001): the WER and its context-length gain under each way of joining overlapping windows.

The trial's own greedy decoding joins its windows by averaging their posteriors at the evaluation's stride
(``average``; 0.125 of a window, 87.5% overlap); an evaluation may also decode the same model with each method of
:data:`asr_core.contract.metrics.FUSION_METHODS`, logged as the decoder ``fusion-<METHOD>`` (``wer_fusion-chiu/...``,
``eval/<DATASET>.fusion-chiu.csv``; :attr:`analysis.ledger.collect.Sweep.fusion_decoders`). Here, per family, series,
dataset and condition, over the configurations that some fusion method decoded:

* :func:`fusion_table`: each method's WER per context length, mean / sd / min / max over seeds of the corpus WER
  (:func:`analysis.significance.werr.wer_table` of the method's decoder; ``average`` is greedy);
* :func:`context_tests` (rows ``test = "context"``): under each method, the longest context against the series'
  model at the baseline context (the WER section's, nearest within 1%), or against the shortest context where the
  series has none or the baseline is its longest; WERR and the recording-level paired sign-flip permutation test
  of :func:`analysis.significance.werr.compare_configs`, Holm-corrected over the methods of the group;
* :func:`method_tests` (rows ``test = "method"``): at each context, each fusion method against averaging, and Chiu
  against block-wise where both exist, on the seeds both decoded (:func:`analysis.significance.stats.compare` with shared
  seeds: one trained model decoded two ways), Holm-corrected over the contexts of the group;
* :func:`confound_lines`: per group, whether the context-length WERR's sign or Holm significance differs between
  methods (the decoding method is then a confound of the context-length gain) or not.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from analysis.significance import stats
from analysis.ledger.collect import Sweep
from analysis.display.render import Section, fmt_num, fmt_p
from analysis.significance.werr import (compare_configs, comparison_row, family_rows, find_baseline, format_seconds,
                           recording_index, stable_seed, verdict, wer_table)
from asr_core.contract.metrics import AVERAGING, CLEAN, FUSION_METHODS, fusion_decoder, fusion_method

TITLE = "Decoding method: window fusion (paper 001)"
METHODS = (AVERAGING, *FUSION_METHODS)
LABELS = {AVERAGING: "average", "select": "select", "blockwise": "block-wise", "blockwise-frames": "block-wise frames",
          "chiu": "Chiu 50%", "chiu-seconds": "Chiu 50% seconds", "lcs": "LCS 50%", "rover": "ROVER ×8"}
# method pairs tested at each context besides each fusion method against averaging: (reference, method)
EXTRA_PAIRS = (("blockwise", "chiu"),)
GROUP = ["family", "series_id", "dataset", "condition"]
WER_COLUMNS = ["family", "series", "series_id", "dataset", "condition", "snr_db", "config", "config_id",
               "context_s", "method", "decoder", "n_seeds", "seeds", "wer_mean", "wer_sd", "wer_min", "wer_max"]
# one row per test: ``test`` "context" (``method`` at ``context_s`` against itself at ``reference_context_s``;
# ``reference`` "baseline" or "shortest") or "method" (``method`` against ``reference_method`` at one context);
# ``wer_reference``/``wer`` from the seed-averaged counts the test pairs, ``delta_wer`` = wer - wer_reference
TEST_COLUMNS = ["test", "family", "series", "series_id", "dataset", "condition", "snr_db", "reference_method",
                "method", "reference", "reference_config", "reference_context_s", "config", "context_s",
                "n_recordings", "seeds_reference", "seeds", "wer_reference", "wer", "delta_wer", "delta_lo",
                "delta_hi", "werr", "werr_lo", "werr_hi", "p_permutation", "p_holm", "significant", "verdict", "note"]


def methods_present(sweep: Sweep) -> list[str]:
    """``average`` and the fusion methods some finished run has results of, in :data:`METHODS` order."""
    have = {fusion_method(d) for d in sweep.fusion_decoders}
    return [m for m in METHODS if m == AVERAGING or m in have]


def has_fusion(sweep: Sweep) -> bool:
    """Whether some finished run has results of a window fusion decoder (``fusion-<METHOD>``)."""
    return bool(sweep.fusion_decoders)


def fusion_table(sweep: Sweep) -> pd.DataFrame:
    """Per family, configuration, dataset, condition and method (:data:`WER_COLUMNS`): the WER over seeds, percent,
    for the configurations, datasets and conditions that some fusion method decoded. Empty without fusion results."""
    parts = [wer_table(sweep, fusion_decoder(m)).assign(method=m, decoder=fusion_decoder(m))
             for m in methods_present(sweep)]
    fused = pd.concat([p for p in parts[1:] if len(p)] or [parts[0].iloc[0:0]], ignore_index=True)
    if fused.empty:
        return pd.DataFrame(columns=WER_COLUMNS)
    decoded = set(zip(fused["config_id"], fused["dataset"], fused["condition"]))
    average = parts[0][[k in decoded for k in zip(parts[0]["config_id"], parts[0]["dataset"], parts[0]["condition"])]]
    out = family_rows(pd.concat([average, fused], ignore_index=True), sweep.families)
    out["order"] = out["method"].map(METHODS.index)
    out = out.sort_values(["family", "series", "dataset", "snr_db", "context_s", "order"], na_position="first")
    return out[WER_COLUMNS].reset_index(drop=True)


# ---- tests ---------------------------------------------------------------------------------------------------

def _holm(rows: list[dict[str, Any]], alpha: float) -> None:
    for r, adj in zip(rows, stats.holm([r.get("p_permutation", math.nan) for r in rows])):
        r["p_holm"] = float(adj)
        r["significant"] = bool(adj < alpha) if np.isfinite(adj) else None
        r["verdict"] = verdict({"delta_lo": math.nan, "delta_hi": math.nan, **r}, alpha)


def _span(contexts: list[float], baseline_context: float) -> tuple[float, float, str]:
    """(reference context, longest context, "baseline" or "shortest")."""
    ref = find_baseline(contexts, baseline_context)
    if ref is None or ref == contexts[-1]:
        return contexts[0], contexts[-1], "shortest"
    return ref, contexts[-1], "baseline"


def context_tests(sweep: Sweep, table: pd.DataFrame, baseline_context: float, *, alpha: float = 0.05,
                  level: float = 0.95, bootstrap_resamples: int = stats.BOOTSTRAP_RESAMPLES) -> pd.DataFrame:
    """Under each method, the longest context against the reference context (:data:`TEST_COLUMNS`, ``test =
    "context"``), Holm-corrected over the methods of each family, series, dataset and condition. ``table``:
    :func:`fusion_table`."""
    index = {m: recording_index(sweep, fusion_decoder(m)) for m in METHODS if m in set(table["method"])}
    cache: dict[tuple, stats.Comparison | str] = {}
    rows: list[dict[str, Any]] = []
    for (fam, sid, ds, cond), grp in table.groupby(GROUP, sort=True):
        contexts = sorted(grp["context_s"].unique())
        if len(contexts) < 2:
            continue
        ref_ctx, long_ctx, kind = _span(contexts, baseline_context)
        group: list[dict[str, Any]] = []
        for m in [m for m in METHODS if m in set(grp["method"])]:
            mine = grp[grp["method"] == m]
            ref, long = mine[mine["context_s"] == ref_ctx], mine[mine["context_s"] == long_ctx]
            row = {"test": "context", "family": fam, "series": grp["series"].iloc[0], "series_id": sid,
                   "dataset": ds, "condition": cond, "snr_db": grp["snr_db"].iloc[0], "reference_method": m,
                   "method": m, "reference": kind, "reference_context_s": ref_ctx, "context_s": long_ctx}
            if ref.empty or long.empty:
                missing = " and ".join(format_seconds(c) for c, f in ((ref_ctx, ref), (long_ctx, long)) if f.empty)
                group.append({**row, **comparison_row(f"{LABELS[m]} has no results at {missing} in this series")})
                continue
            a, b = ref["config_id"].iloc[0], long["config_id"].iloc[0]
            row.update(reference_config=ref["config"].iloc[0], config=long["config"].iloc[0])
            key = (m, a, b, ds, cond)
            if key not in cache:
                try:
                    cache[key] = compare_configs(sweep, a, b, ds, cond, bootstrap_resamples=bootstrap_resamples,
                                                 level=level, index=index[m])
                except stats.PairingError as e:
                    cache[key] = str(e)
            group.append({**row, **comparison_row(cache[key])})
        _holm(group, alpha)
        rows += group
    return pd.DataFrame(rows, columns=TEST_COLUMNS)


def _decoded_twice(a: stats.SeedTable, b: stats.SeedTable, names: tuple[str, str], *, level: float,
                   bootstrap_resamples: int, seed: int) -> tuple[stats.Comparison | str, str]:
    """One model decoded two ways, compared on the seeds both decoded: (the comparison or why it cannot be made, a
    note on the seeds left out)."""
    shared = sorted(set(a) & set(b))
    if not shared:
        return (f"no seed has per-recording tables of both {names[0]} and {names[1]} (see the problems table)", "")
    dropped = sorted(set(a) ^ set(b))
    note = f"seeds {dropped} decoded by one method only are left out" if dropped else ""
    try:
        pc = stats.pair_counts({s: a[s] for s in shared}, {s: b[s] for s in shared}, name_a=names[0], name_b=names[1])
    except stats.PairingError as e:
        return str(e), note
    return stats.compare(pc, level=level, bootstrap_resamples=bootstrap_resamples, shared_seeds=True, seed=seed), note


def method_tests(sweep: Sweep, table: pd.DataFrame, *, alpha: float = 0.05, level: float = 0.95,
                 bootstrap_resamples: int = stats.BOOTSTRAP_RESAMPLES) -> pd.DataFrame:
    """At each context, each fusion method against averaging and the :data:`EXTRA_PAIRS` (:data:`TEST_COLUMNS`,
    ``test = "method"``) on the seeds both decoded, Holm-corrected over the contexts of each family, series,
    dataset, condition and pair. ``table``: :func:`fusion_table`."""
    present = [m for m in METHODS if m in set(table["method"])]
    index = {m: recording_index(sweep, fusion_decoder(m)) for m in present}
    pairs = [(AVERAGING, m) for m in present if m != AVERAGING]
    pairs += [p for p in EXTRA_PAIRS if set(p) <= set(present)]
    rows: list[dict[str, Any]] = []
    cache: dict[tuple, tuple[stats.Comparison | str, str]] = {}
    for (fam, sid, ds, cond), grp in table.groupby(GROUP, sort=True):
        for ref_m, m in pairs:
            configs = grp[grp["method"] == m].merge(grp[grp["method"] == ref_m][["config_id"]], on="config_id")
            group: list[dict[str, Any]] = []
            for _, c in configs.sort_values("context_s").iterrows():
                cid = c["config_id"]
                row = {"test": "method", "family": fam, "series": c["series"], "series_id": sid, "dataset": ds,
                       "condition": cond, "snr_db": c["snr_db"], "reference_method": ref_m, "method": m,
                       "reference": ref_m, "reference_config": c["config"], "reference_context_s": c["context_s"],
                       "config": c["config"], "context_s": c["context_s"]}
                key = (cid, ref_m, m, ds, cond)
                if key not in cache:
                    where = f"{c['config']} on {ds}/{cond}"
                    cache[key] = _decoded_twice(index[ref_m].get((cid, ds, cond), {}),
                                                index[m].get((cid, ds, cond), {}),
                                                (f"{where} by {LABELS[ref_m]}", f"{where} by {LABELS[m]}"),
                                                level=level, bootstrap_resamples=bootstrap_resamples,
                                                seed=stable_seed(*key))
                res, note = cache[key]
                group.append({**row, **comparison_row(res, note)})
            _holm(group, alpha)
            rows += group
    return pd.DataFrame(rows, columns=TEST_COLUMNS)


# ---- words ---------------------------------------------------------------------------------------------------

def _head(t: pd.DataFrame) -> str:
    cond = t["condition"].iloc[0]
    return (f"Family {t['family'].iloc[0]}, {t['series'].iloc[0]}, {t['dataset'].iloc[0]}"
            + ("" if cond == CLEAN else f" ({cond})"))


def _outcome(r: pd.Series) -> tuple[str, str]:
    sign = "WERR > 0" if r["werr"] > 0 else "WERR < 0" if r["werr"] < 0 else "WERR = 0"
    return sign, "significant" if r["significant"] else "not significant"


def confound_lines(tests: pd.DataFrame, alpha: float) -> list[str]:
    """Per family, series, dataset and condition: each method's context-length WERR with its Holm p, and whether the
    decoding method is a confound of the context-length gain (the WERR's sign or Holm significance differs between
    the methods tested) or the result holds under every method measured."""
    lines = []
    ctx = tests[tests["test"] == "context"]
    for _, t in ctx.groupby(GROUP, sort=True):
        span = f"{format_seconds(t['reference_context_s'].iloc[0])} → {format_seconds(t['context_s'].iloc[0])}"
        head = f"{_head(t)}, {span}"
        tested = t[t["p_holm"].notna()]
        untested = t[t["p_holm"].isna()]
        figures = "; ".join(f"{LABELS[r['method']]} WERR {fmt_num(r['werr'], 1, True)}% (WER "
                            f"{fmt_num(r['wer_reference'])}% → {fmt_num(r['wer'])}%, Holm p = {fmt_p(r['p_holm'])})"
                            for _, r in tested.iterrows())
        rest = (" Not tested: " + "; ".join(f"{LABELS[r['method']]} ({r['note'].removeprefix('not tested: ')})"
                                            for _, r in untested.iterrows()) + ".") if len(untested) else ""
        if len(tested) < 2:
            lines.append(f"{head}: fewer than two methods tested, nothing to compare across methods"
                         + (f" ({figures})" if figures else "") + "." + rest)
            continue
        outcomes: dict[tuple[str, str], list[str]] = {}
        for _, r in tested.iterrows():
            outcomes.setdefault(_outcome(r), []).append(LABELS[r["method"]])
        names = ", ".join(LABELS[m] for m in tested["method"])
        if len(outcomes) > 1:
            which = "; ".join(f"{', '.join(ms)}: {sign}, {sig}" for (sign, sig), ms in outcomes.items())
            lines.append(f"{head}: **the decoding method is a confound of the context-length gain**: the WERR's sign "
                         f"or its Holm significance (α = {alpha:g}) differs between methods ({which}). {figures}."
                         + rest)
            continue
        sign, sig = next(iter(outcomes))
        what = ("the context-length gain holds under every method measured" if (sign, sig) == ("WERR > 0",
                "significant") else f"the context-length result ({sign}, {sig}) is the same under every method "
                "measured")
        lines.append(f"{head}: **{what}** ({names}). {figures}." + rest)
    return lines


def pair_lines(tests: pd.DataFrame, alpha: float) -> list[str]:
    """Per group and :data:`EXTRA_PAIRS` pair (Chiu against block-wise): the two WERs at each context and whether the
    method is significantly better, worse or neither (Holm over contexts, ``alpha``)."""
    lines = []
    extra = pd.Series([p in EXTRA_PAIRS for p in zip(tests["reference_method"], tests["method"])], index=tests.index,
                      dtype=bool)
    mt = tests[(tests["test"] == "method") & extra]
    for (_, _, _, _, ref_m, m), t in mt.groupby(GROUP + ["reference_method", "method"], sort=True):
        items = []
        for _, r in t.sort_values("context_s").iterrows():
            v = r["verdict"] if r["verdict"] != "not significant" else "no significant difference"
            items.append(f"at {format_seconds(r['context_s'])} {fmt_num(r['wer_reference'])}% → "
                         f"{fmt_num(r['wer'])}% ({v}, Holm p = {fmt_p(r['p_holm'])})")
        lines.append(f"{_head(t)}: {LABELS[m]} against {LABELS[ref_m]}: " + "; ".join(items) + ".")
    return lines


def display(table: pd.DataFrame, tests: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Per family, dataset and condition: rows = context (and series where several), a column per method, each fusion
    method's cell ``WER (ΔWER against averaging, sig./n.s./untested)``; then the context-length tests and the method
    tests."""
    mark = {True: "sig.", False: "n.s."}
    vs_avg = {(r["family"], r["series_id"], r["dataset"], r["condition"], r["context_s"], r["method"]): r
              for _, r in tests[(tests["test"] == "method") & (tests["reference_method"] == AVERAGING)].iterrows()}
    out = []
    for (fam, ds, cond), grp in table.groupby(["family", "dataset", "condition"], sort=True):
        several = grp["series_id"].nunique() > 1
        rows = []
        for (series, sid, ctx), cell in grp.groupby(["series", "series_id", "context_s"], sort=True):
            row = {"series": series} if several else {}
            row["context"] = format_seconds(ctx)
            for m in [m for m in METHODS if m in set(grp["method"])]:
                w = cell[cell["method"] == m]
                text = "–" if w.empty else f"{w['wer_mean'].iloc[0]:.2f}"
                t = vs_avg.get((fam, sid, ds, cond, ctx, m))
                if t is not None and not w.empty:
                    text += f" ({fmt_num(t['delta_wer'], 2, True)}, {mark.get(t['significant'], 'untested')})"
                row[LABELS[m]] = text
            rows.append(row)
        out.append((f"WER (%) by method, family {fam}, {ds}" + ("" if cond == CLEAN else f", {cond}")
                    + ": mean over seeds (ΔWER against averaging on the seeds both decoded)", pd.DataFrame(rows)))
    if not tests.empty:
        out.append(("Every test (all in fusion_tests.csv)", pd.DataFrame({
            "test": tests["test"], "family": tests["family"], "series": tests["series"],
            "dataset": tests["dataset"], "condition": tests["condition"],
            "compared": [f"{LABELS[m]}: {format_seconds(b)} vs {format_seconds(a)}" if k == "context" else
                         f"{format_seconds(b)}: {LABELS[m]} vs {LABELS[rm]}" for k, m, rm, a, b in zip(
                             tests["test"], tests["method"], tests["reference_method"],
                             tests["reference_context_s"], tests["context_s"])],
            "WER ref": tests["wer_reference"].map(fmt_num), "WER": tests["wer"].map(fmt_num),
            "WERR %": [fmt_num(x, 1, True) for x in tests["werr"]],
            "ΔWER": [fmt_num(x, 2, True) for x in tests["delta_wer"]],
            "p perm": tests["p_permutation"].map(fmt_p), "p Holm": tests["p_holm"].map(fmt_p),
            "verdict": tests["verdict"], "note": tests["note"]})))
    return out


def section(sweep: Sweep, baseline_context: float, alpha: float, *, level: float = 0.95,
            bootstrap_resamples: int = stats.BOOTSTRAP_RESAMPLES) -> tuple[Section, dict[str, pd.DataFrame]]:
    """The report's "Decoding method" section and its CSVs ``fusion`` (:func:`fusion_table`) and ``fusion_tests``
    (:func:`context_tests` then :func:`method_tests`)."""
    table = fusion_table(sweep)
    kw = {"alpha": alpha, "level": level, "bootstrap_resamples": bootstrap_resamples}
    parts = [context_tests(sweep, table, baseline_context, **kw), method_tests(sweep, table, **kw)]
    tests = pd.concat([t for t in parts if len(t)] or [pd.DataFrame(columns=TEST_COLUMNS)], ignore_index=True)
    methods = [m for m in METHODS if m in set(table["method"])]
    paras = [
        f"How overlapping windows are joined: average (the greedy decoding of every other section: posteriors "
        f"averaged over the windows at the evaluation's stride, 87.5% overlap at 0.125), select (each frame from the "
        f"window whose centre is nearest), block-wise (windows side by side), Chiu 50% (Chiu et al.'s overlapping "
        f"inference), LCS 50% (consecutive windows joined at their longest common run of words), ROVER ×8 (SCTK's "
        f"rover over 8 phase-shifted block-wise decodings). Measured here: {', '.join(LABELS[m] for m in methods)}, "
        f"on the configurations some fusion method decoded; WER is the mean over seeds of the corpus WER.",
        f"Context-length gain under each method: the longest context against the series' model at "
        f"{format_seconds(baseline_context)} (the WER section's baseline; the shortest context where the series has "
        f"none), the paired sign-flip permutation test over recordings (errors averaged over seeds), Holm-corrected "
        f"over the methods of each series, dataset and condition. Where the WERR's sign or significance differs "
        f"between methods, the decoding method is a confound of the gain. Methods against each other: at each "
        f"context, each fusion method against averaging (and Chiu against block-wise) on the seeds both decoded, "
        f"Holm-corrected over the contexts; significant: adjusted p < {alpha:g}. All WERs in fusion.csv, all tests "
        f"in fusion_tests.csv."]
    bullets = [("Context-length gain under each method", confound_lines(tests, alpha))]
    pairs = pair_lines(tests, alpha)
    if pairs:
        bullets.append(("Chiu against block-wise", pairs))
    return Section(TITLE, paras, display(table, tests), [], bullets), {"fusion": table, "fusion_tests": tests}
