"""The recall control (positive control): slot accuracy of the recall plant against context length.

A synthetic corpus made with ``synth --recall`` says a code word clearly and later asks for it again with its audio
masked (:mod:`asr_core.data.synth.recall`); evaluation scores each slot (:mod:`asr_core.evaluation.scorers.slots`) into
``eval/<DATASET>.slots.csv`` (:data:`asr_core.contract.metrics.SLOT_COLUMNS`), read into
:attr:`analysis.ledger.collect.Sweep.slots`. A model that uses its context recalls a masked code word when the clear
mention lies inside it: the near band (1-4 s back in the recall plant) is inside every window, the far band
(20-60 s) only inside long ones.

Two scorings (the table's ``scoring``): the moving-window decoding that evaluation makes, reported under its condition
(``clean``), and one window per slot ending 1 s after it (:mod:`asr_core.evaluation.scorers.slot_window`), reported as the
condition ``clean, one window per slot`` (:func:`scored_condition`): where the far band is recalled in one window
but not under averaging, the decoder dilutes distant evidence.

Here, per family, series, dataset and condition (greedy decoding) and per context length, for each group of
:data:`GROUPS` (masked slots with a key sentence by band and by distance bin, :data:`BINS`; then the controls:
unmasked slots, the acoustic ceiling, and masked slots of recordings without a key sentence, the guess rate 1/K):
the accuracy pooled over slots (percent) for each seed, and its mean, sd, min and max over seeds (:func:`rate_table`).

Tests (:func:`far_tests`): each context against the series' shortest, on far-band accuracy, recording by recording:
per recording the far slots recalled wrong averaged over seeds, as a rate over the recording's far slots; the paired
sign-flip permutation test of :func:`analysis.significance.stats.sign_flip_test` on the differences (recordings without far slots
left out), its p-values Holm-corrected across every comparison of the section. :func:`verdicts`: per series, dataset
and condition, whether the longest context recalls far slots significantly better than the shortest; where there are
near slots only (recordings under 45 s), whether near-band recall is above chance at all (:func:`near_verdict`).

Where the single-window rows carry the forced choice among each slot's candidates, the rates also hold forced-choice,
posterior-choice and onset-match accuracy with chance and a binomial test against it, and the tables show them
beside exact match (:mod:`analysis.features.recall_choice`, which also holds the copy plant's criteria,
:func:`~analysis.features.recall_choice.copy_verdicts`); :func:`far_tests` makes the far-band tests on the forced choice too
(``measure="choice_correct"``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.features import recall_choice as ch
from analysis.significance import stats
from analysis.ledger.collect import Sweep, greedy_rows
from analysis.significance.werr import ContextSpan, context_spans, family_rows, format_seconds, holm_once, stable_seed
from asr_core.contract.metrics import AVERAGE, CLEAN, WINDOW

# distance bins of masked slots: (label, upper edge in seconds, exclusive); the recall plant's bands are 1-4 s and
# 20-60 s, the copy plant's 1-3 s and 20-60 s (the bands' names give the distances of the slots at hand: band_names)
BINS = (("1-4 s", 5.0), ("5-10 s", 10.0), ("10-20 s", 20.0), ("20-40 s", 40.0), ("40-60 s", math.inf))
CONTROLS = ("unmasked", "no-key")
GROUPS = ("near", "far", *(label for label, _ in BINS), *CONTROLS)
GROUP_NAMES = {"near": "near band (1-4 s)", "far": "far band (20-60 s)", "unmasked": "ceiling (unmasked)",
               "no-key": "guess rate (no key)", **{label: f"distance {label}" for label, _ in BINS}}
SCORING_NAMES = {WINDOW: "one window per slot"}
CHANCE = 100.0 / 8  # percent: one of the plant's K = 8 code words guessed
KEYS = ["config", "config_id", "series", "series_id", "families", "context_s", "dataset", "condition"]
RATE_COLUMNS = ["family", "series", "series_id", "dataset", "condition", "config", "config_id", "context_s", "group",
                "n_seeds", "seeds", "n_recordings", "n_slots", "accuracy", "accuracy_sd", "accuracy_min",
                "accuracy_max", *ch.CHOICE_RATE_COLUMNS, "distance_min_s", "distance_max_s"]
TEST_COLUMNS = ["family", "series", "series_id", "dataset", "condition", "shortest_config", "shortest_context_s",
                "config", "context_s", "n_recordings", "far_shortest", "far", "p", "p_holm", "note"]


def distance_bin(distance_s: float) -> str:
    """The label of :data:`BINS` a distance falls in (each bin up to its upper edge, exclusive): 4.0 -> ``"1-4 s"``,
    20.0 -> ``"20-40 s"``; "" for NaN."""
    if not math.isfinite(distance_s):
        return "" if math.isnan(distance_s) else BINS[-1][0]
    return next(label for label, hi in BINS if distance_s < hi)


def band_names(rates: pd.DataFrame) -> dict[str, str]:
    """:data:`GROUP_NAMES` with each band named by the distances of its slots in ``rates`` (columns
    ``distance_min_s``, ``distance_max_s``), so a plant's own band is what the report says: ``"near band (1.2-2.9
    s)"``; the plant's nominal band where ``rates`` holds none of its slots."""
    names = dict(GROUP_NAMES)
    for band in ("near", "far"):
        part = rates[rates["group"] == band] if "distance_min_s" in rates else rates.iloc[0:0]
        lo, hi = part["distance_min_s"].min(), part["distance_max_s"].max()
        if len(part) and np.isfinite(lo) and np.isfinite(hi):
            a, b = f"{round(float(lo), 1):g}", f"{round(float(hi), 1):g}"
            names[band] = f"{band} band ({a} s)" if a == b else f"{band} band ({a}-{b} s)"
    return names


def scored_condition(condition: str, scoring: str) -> str:
    """The condition a slot row is reported under: its own for the moving-window scoring, with the scoring named
    otherwise (``"clean"``, ``"window"`` -> ``"clean, one window per slot"``), so every table, test and verdict of the
    section is made once per scoring."""
    return condition if scoring in ("", AVERAGE) else f"{condition}, {SCORING_NAMES.get(scoring, scoring)}"


def slot_rows(sweep: Sweep) -> pd.DataFrame:
    """The greedy per-slot rows of ``sweep`` (empty without the plant), the single-window rows under their own
    condition (:func:`scored_condition`)."""
    rows = ch.with_measures(greedy_rows(sweep.slots))
    if rows.empty or "scoring" not in rows.columns:
        return rows
    return rows.assign(condition=[scored_condition(c, s) for c, s in zip(rows["condition"], rows["scoring"])])


def has_slots(sweep: Sweep) -> bool:
    """Whether some finished run scored recall slots on some dataset."""
    return len(slot_rows(sweep)) > 0


def grouped(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (per-slot) once per group each slot counts in (column ``group``): a masked slot in its band and its
    distance bin, an unmasked or no-key slot in its control."""
    masked = rows[rows["kind"] == "masked"]
    bins = masked["distance_s"].astype(float).map(distance_bin)
    parts = [masked.assign(group=masked["band"]), masked.assign(group=bins)[bins != ""]]
    parts += [rows[rows["kind"] == k].assign(group=k) for k in CONTROLS]
    return pd.concat(parts, ignore_index=True)


def _sd(x: pd.Series) -> float:
    return float(x.std(ddof=1)) if x.notna().sum() > 1 else math.nan


def rate_table(sweep: Sweep) -> pd.DataFrame:
    """Per family, configuration, dataset, condition and group: slot accuracy (percent) as mean / sd / min / max
    over seeds of the per-seed pooled accuracy, then the forced choice's columns
    (:data:`~analysis.features.recall_choice.CHOICE_RATE_COLUMNS`, NaN without it) (:data:`RATE_COLUMNS`), in the order of
    :data:`GROUPS`."""
    rows = slot_rows(sweep)
    if rows.empty:
        return pd.DataFrame(columns=RATE_COLUMNS)
    g_rows = grouped(rows)
    keys = KEYS + ["group"]
    g_rows["distance_s"] = g_rows["distance_s"].astype(float)
    per_seed = g_rows.groupby(keys + ["seed"], dropna=False, sort=False).agg(
        ok=("correct", "sum"), n=("correct", "size"), n_recordings=("recording", "nunique"),
        distance_min_s=("distance_s", "min"), distance_max_s=("distance_s", "max")).reset_index()
    per_seed["accuracy"] = 100.0 * per_seed["ok"] / per_seed["n"]
    g = per_seed.groupby(keys, dropna=False, sort=False)
    out = g["accuracy"].agg(accuracy="mean", accuracy_sd=_sd, accuracy_min="min", accuracy_max="max").reset_index()
    out["n_seeds"] = g["seed"].count().values
    out["seeds"] = g["seed"].agg(lambda s: ",".join(str(int(v)) for v in sorted(s))).values
    out["n_slots"] = g["n"].mean().values  # the same slots for every seed
    out["n_recordings"] = g["n_recordings"].max().values
    out["distance_min_s"], out["distance_max_s"] = g["distance_min_s"].min().values, g["distance_max_s"].max().values
    choice = ch.choice_rates(g_rows, keys)
    for c in choice.columns.difference(keys):
        out[c] = choice[c].values
    fields = ch.model_fields(sweep) if len(out) else {}
    out["attention_span_s"] = [fields.get(c, (math.nan, math.nan))[0] for c in out["config_id"]]
    out["field_s"] = [fields.get(c, (math.nan, math.nan))[1] for c in out["config_id"]]
    out = family_rows(out, sweep.families)
    out["order"] = out["group"].map({k: i for i, k in enumerate(GROUPS)})
    return out.sort_values(["family", "series", "dataset", "condition", "context_s", "order"]
                           ).reset_index(drop=True)[RATE_COLUMNS]


def far_table(rows: pd.DataFrame, measure: str = "correct") -> dict[tuple[str, str, str], stats.SeedTable]:
    """Per (config_id, dataset, condition): seed -> recording -> (far slots wrong, far slots), masked far slots only
    (recordings without any are not in it); wrong by ``measure`` (``correct``: exact match; ``choice_correct``: the
    forced choice, slots without it left out)."""
    far = rows[(rows["kind"] == "masked") & (rows["band"] == "far") & rows[measure].notna()]
    out: dict[tuple[str, str, str], dict[int, dict[str, tuple[float, float]]]] = {}
    counts = far.groupby(["config_id", "dataset", "condition", "seed", "recording"], sort=False)[measure].agg(
        ["sum", "size"]).reset_index()
    for cid, ds, cond, seed, rec, ok, n in counts.itertuples(index=False):
        out.setdefault((cid, ds, cond), {}).setdefault(int(seed), {})[str(rec)] = (float(n - ok), float(n))
    return out  # type: ignore[return-value]


def far_pvalue(a: stats.SeedTable, b: stats.SeedTable, *, names: tuple[str, str] = ("A", "B"), seed: int = 0
               ) -> tuple[float, int]:
    """The permutation p-value of B's far-slot accuracy against A's, recording by recording (the module docstring),
    and the recordings paired; :class:`stats.PairingError` when they cannot be paired."""
    pc = stats.pair_counts(a, b, name_a=names[0], name_b=names[1])
    has = pc.ref_words > 0
    diffs = (pc.mean_errors_b[has] - pc.mean_errors_a[has]) / pc.ref_words[has]
    return stats.sign_flip_test(diffs, seed=seed).pvalue, int(has.sum())


def far_tests(sweep: Sweep, rates: pd.DataFrame | None = None, measure: str = "correct") -> pd.DataFrame:
    """Each context against the series' shortest on far-band accuracy (:data:`TEST_COLUMNS`), Holm-corrected across
    every comparison made; rows that cannot be tested carry a note. ``measure``: ``correct`` (exact match) or
    ``choice_correct`` (the forced choice: its accuracy in ``far_shortest`` and ``far``)."""
    rates = rate_table(sweep) if rates is None else rates
    column = {"correct": "accuracy", "choice_correct": "choice"}[measure]
    far = rates[(rates["group"] == "far") & rates[column].notna()]
    if far.empty:
        return pd.DataFrame(columns=TEST_COLUMNS)
    far = far.assign(accuracy=far[column])
    index = far_table(slot_rows(sweep), measure)
    out = []
    for (fam, sid, ds, cond), grp in far.groupby(["family", "series_id", "dataset", "condition"], sort=True):
        grp = grp.sort_values("context_s")
        short = grp.iloc[0]
        for _, row in grp.iloc[1:].iterrows():
            r = {"family": fam, "series": row["series"], "series_id": sid, "dataset": ds, "condition": cond,
                 "shortest_config": short["config"], "shortest_context_s": short["context_s"],
                 "config": row["config"], "context_s": row["context_s"], "n_recordings": 0,
                 "far_shortest": short["accuracy"], "far": row["accuracy"], "p": math.nan, "p_holm": math.nan,
                 "note": ""}
            try:
                a = index.get((short["config_id"], ds, cond), {})
                b = index.get((row["config_id"], ds, cond), {})
                r["p"], r["n_recordings"] = far_pvalue(
                    a, b, names=(f"{short['config']} on {ds}/{cond}", f"{row['config']} on {ds}/{cond}"),
                    seed=stable_seed(short["config_id"], row["config_id"], ds, cond, "recall"))
            except stats.PairingError as e:
                r["note"] = f"not tested: {e}"
            out.append(r)
    table = pd.DataFrame(out, columns=TEST_COLUMNS)
    if len(table):  # one context a series: nothing to compare
        table["p_holm"] = holm_once(table, ["series_id", "dataset", "condition", "config", "shortest_config"])
    return table


def _p(p: float) -> str:
    return "–" if not np.isfinite(p) else f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def _acc(rates: pd.DataFrame, config_id: str, ds: str, cond: str, group: str) -> float:
    hit = rates[(rates["config_id"] == config_id) & (rates["dataset"] == ds) & (rates["condition"] == cond)
                & (rates["group"] == group)]
    return float(hit["accuracy"].iloc[0]) if len(hit) else math.nan


def verdicts(rates: pd.DataFrame, tests: pd.DataFrame, alpha: float) -> list[str]:
    """Per family, series, dataset and condition: one line saying whether the longest context recalls far slots
    significantly better than the shortest (Holm p < ``alpha``), with the far, near, ceiling and guess-rate
    accuracies of both."""
    lines = []
    for g in context_spans(rates[rates["group"] == "far"]):
        if g.single:
            lines.append(g.single)
            continue
        fam, sid, ds, cond, head, span, short, long = (g.family, g.series_id, g.dataset, g.condition, g.head, g.span,
                                                       g.short, g.long)
        names = band_names(rates[(rates["dataset"] == ds) & (rates["condition"] == cond)])
        t = tests[(tests["family"] == fam) & (tests["series_id"] == sid) & (tests["dataset"] == ds)
                  & (tests["condition"] == cond) & (tests["config"] == long["config"])]
        if t.empty or not np.isfinite(t["p_holm"].iloc[0]):
            note = t["note"].iloc[0] if len(t) else ""
            lines.append(f"{head}, {span}: **not tested** — {note or 'no paired recordings'}.")
            continue
        p = float(t["p_holm"].iloc[0])
        better = long["accuracy"] > short["accuracy"] and p < alpha
        worse = long["accuracy"] < short["accuracy"] and p < alpha
        verdict = ("**yes: the longer context recalls far slots significantly better**" if better else
                   "**no: the longer context recalls far slots significantly worse**" if worse else
                   "**no: no significant difference in far-slot recall from longer context**")

        def other(group: str) -> str:
            a = _acc(rates, short["config_id"], ds, cond, group)
            b = _acc(rates, long["config_id"], ds, cond, group)
            return f"{names[group]} {_pct(a)} → {_pct(b)}"

        lines.append(f"{head}, {span}: {verdict}: far-band accuracy {short['accuracy']:.1f}% → "
                     f"{long['accuracy']:.1f}% (Holm p = {_p(p)}, {int(t['n_recordings'].iloc[0])} recordings, "
                     f"α = {alpha:g}); " + "; ".join(other(g) for g in ("near", "unmasked", "no-key")) + ".")
    far_groups = {(g.family, g.series_id, g.dataset, g.condition)
                  for g in context_spans(rates[rates["group"] == "far"])}
    return lines + [near_verdict(rates, g) for g in context_spans(rates[rates["group"] == "near"])
                    if (g.family, g.series_id, g.dataset, g.condition) not in far_groups]


def near_verdict(rates: pd.DataFrame, g: ContextSpan) -> str:
    """The line of a group with near slots but no far ones (``g``: its near-band rows): whether near-band recall,
    inside every window, is above chance (:data:`CHANCE`) at every context, at none (the control is not learned), or
    at some; with the ceiling and guess-rate accuracies."""
    near = rates[(rates["group"] == "near") & (rates["family"].astype(str) == g.family)
                 & (rates["series_id"].astype(str) == g.series_id) & (rates["dataset"].astype(str) == g.dataset)
                 & (rates["condition"].astype(str) == g.condition)].sort_values("context_s")
    above = near["accuracy"] > CHANCE
    verdict = ("**the control is not learned: near-band recall is at or below chance at every context**"
               if not above.any() else "**near-band recall is above chance at every context**" if above.all() else
               "**near-band recall is above chance at some contexts only**")
    span = format_seconds(g.short["context_s"]) if g.single else g.span
    names = band_names(rates[(rates["dataset"] == g.dataset) & (rates["condition"] == g.condition)])
    accs = " → ".join(_pct(a) for a in near["accuracy"])

    def control(group: str) -> str:
        return f"{names[group]} " + " → ".join(_pct(_acc(rates, cid, g.dataset, g.condition, group))
                                                     for cid in near["config_id"])

    return (f"{g.head}, {span}: no far-band slots (recordings under 45 s hold near slots only), so far-slot recall "
            f"is not compared; {names['near']} {accs} (chance {CHANCE:.1f}%): {verdict}; "
            + "; ".join(control(k) for k in CONTROLS) + ".")


def _pct(x: float) -> str:
    return "–" if not np.isfinite(x) else f"{x:.1f}%"


def display(rates: pd.DataFrame, tests: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Per family, dataset and condition: slot accuracy (%) per group (rows: bands, distance bins, the ceiling and
    the guess rate) and context length (columns, per series), mean ± sd over seeds with the slots counted; then the
    far-band tests."""
    def pm(m: float, s: float) -> str:
        return "–" if not np.isfinite(m) else f"{m:.1f} ± {s:.1f}" if np.isfinite(s) else f"{m:.1f}"

    out = []
    for (fam, ds, cond), grp in rates.groupby(["family", "dataset", "condition"], sort=True):
        if ch.has_choice(grp):
            out.append((f"Family {fam}, {ds}" + ("" if cond == CLEAN else f", {cond}") + ": recall slot accuracy (%) "
                        "by exact match, forced choice among the candidates (p: one-sided binomial test against "
                        "chance, slots pooled over seeds), posterior choice and onset match, mean ± sd over seeds "
                        "(n: slots)", ch.choice_table(grp, band_names(grp), GROUPS)))
            continue
        several = grp["series_id"].nunique() > 1
        names = band_names(grp)
        cols: dict[str, list[str]] = {"": [names[g] for g in GROUPS if g in set(grp["group"])]}
        present = cols[""]
        for (series, ctx), part in grp.groupby(["series", "context_s"], sort=True):
            name = f"{format_seconds(ctx)}" + (f" ({series})" if several else "")
            by = {names[g]: r for g, r in zip(part["group"], part.itertuples(index=False))}
            cols[name] = [pm(by[n].accuracy, by[n].accuracy_sd) + f" (n={by[n].n_slots:.0f}, {by[n].n_seeds} seeds)"
                          if n in by else "–" for n in present]
        out.append((f"Family {fam}, {ds}" + ("" if cond == CLEAN else f", {cond}") + ": recall slot accuracy (%), "
                    "mean ± sd over seeds (n: slots)", pd.DataFrame(cols)))
    if not tests.empty:
        out.append(("Recall control: far-band accuracy against the series' shortest context (paired sign-flip "
                    "permutation test over recordings, Holm-corrected)", pd.DataFrame({
                        "family": tests["family"], "series": tests["series"], "dataset": tests["dataset"],
                        "condition": tests["condition"],
                        "contexts": [f"{format_seconds(a)} → {format_seconds(b)}"
                                     for a, b in zip(tests["shortest_context_s"], tests["context_s"])],
                        "far accuracy %": [f"{_pct(a)} → {_pct(b)}" for a, b in zip(tests["far_shortest"],
                                                                                    tests["far"])],
                        "recordings": tests["n_recordings"], "p": tests["p"].map(_p),
                        "p Holm": tests["p_holm"].map(_p), "note": tests["note"]})))
    return out


def choice_part(sweep: Sweep, rates: pd.DataFrame, alpha: float
                ) -> tuple[list[tuple[str, pd.DataFrame]], list[str], dict[str, pd.DataFrame]]:
    """What the report adds for the forced choice: the far-band tests on it (a display table), the copy plant's
    verdict lines (:func:`analysis.features.recall_choice.copy_verdicts`) and the csv ``recall_choice_tests``; nothing
    without forced-choice rows."""
    if not ch.has_choice(rates):
        return [], [], {}
    tests = far_tests(sweep, rates, measure="choice_correct")
    shown = display(rates.iloc[0:0], tests)
    titled = [(t.replace("far-band accuracy", "far-band forced-choice accuracy"), d) for t, d in shown]
    return titled, ch.copy_verdicts(rates, tests, None, alpha), {"recall_choice_tests": tests}
