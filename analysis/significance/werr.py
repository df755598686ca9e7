"""WER, WERR against the baseline context and the significance of every comparison with it, from a :class:`Sweep`.

WERR is the paper's figure: ``100 * (WER_base - WER) / WER_base`` with both WERs the mean over seeds of the corpus
WER, where the base is the same series (the same configuration apart from the context length) at the baseline
context, 10.24 s unless told otherwise; the nearest context within 1% counts as the baseline. The spread shown for
WERR is that of each seed's WER against the baseline mean. Noise robustness is the same WERR computed within each
SNR condition (the noisy 10 s model is the base for the noisy longer-context models at that SNR).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pandas as pd

from analysis.significance import stats
from analysis.ledger.collect import Sweep, greedy_rows
from analysis.ledger.tables import counts_by_seed
from analysis.significance.pool import Task, compare_all
from analysis.ledger.defaults import DEFAULT_BASELINE_CONTEXT_S  # (re-exported: analysis.significance.werr.DEFAULT_BASELINE_CONTEXT_S)
from asr_core.contract.metrics import CLEAN, GREEDY
from asr_core.contract.trial import FINISHED

CONTEXT_REL_TOL = 0.01  # contexts within 1% are the same length (10 s vs 10.24 s is not; 10.24 vs 10.3 is)


class SelectionError(ValueError):
    """A configuration named on the command line matches none or several; the message lists the candidates."""


def same_context(a: float, b: float, rel_tol: float = CONTEXT_REL_TOL) -> bool:
    return abs(a - b) <= rel_tol * max(abs(a), abs(b))


def find_baseline(contexts: Iterable[float], baseline_context: float) -> float | None:
    """The context among ``contexts`` nearest to ``baseline_context`` if it is within 1%, else None."""
    cs = [c for c in contexts if not math.isnan(c)]
    if not cs:
        return None
    best = min(cs, key=lambda c: abs(c - baseline_context))
    return best if same_context(best, baseline_context) else None


def in_family(frame: pd.DataFrame, family: str) -> pd.DataFrame:
    """Rows of ``frame`` (which has a comma-joined ``families`` column) that belong to sub-grid ``family``."""
    return frame[frame["families"].map(lambda s: family in s.split(",")).astype(bool)]  # bool: also when empty


# ---- WER and WERR tables -------------------------------------------------------------------------------------

def wer_table(sweep: Sweep, decoder: str = GREEDY) -> pd.DataFrame:
    """Per configuration, dataset and condition: mean, sd, min and max over seeds of the corpus WER (percent) of
    ``decoder``'s results (the trials' own greedy decoding unless told)."""
    keys = ["config", "config_id", "series", "series_id", "families", "context_s", "layers", "d_model", "heads",
            "posenc", "rotary_theta", "dataset", "condition", "snr_db"]
    wer = greedy_rows(sweep.wer, decoder)
    if wer.empty:
        return pd.DataFrame(columns=keys + ["n_seeds", "seeds", "wer_mean", "wer_sd", "wer_min", "wer_max"])
    g = wer.groupby(keys, dropna=False, sort=False)
    out = g["wer"].agg(wer_mean="mean", wer_sd=stats.seed_sd,
                       wer_min="min", wer_max="max").reset_index()
    out["n_seeds"] = g["seed"].count().values
    out["seeds"] = g["seed"].agg(lambda s: ",".join(str(int(v)) for v in sorted(s))).values
    return out.sort_values(["series", "dataset", "snr_db", "context_s"], na_position="first").reset_index(drop=True)


def werr_from_means(means: pd.DataFrame, baseline_context: float, by: list[str]) -> pd.DataFrame:
    """Add ``baseline_context_s``, ``baseline_wer`` and ``werr`` to a table of mean WERs.

    ``means`` has the columns ``by`` (what a baseline is looked up within, e.g. series, dataset and condition),
    ``context_s`` and ``wer_mean``. Groups without a context within 1% of ``baseline_context`` are dropped.
    """
    parts = []
    for _, grp in means.groupby(by, dropna=False, sort=False):
        base_ctx = find_baseline(grp["context_s"].tolist(), baseline_context)
        if base_ctx is None:
            continue
        base_row = grp.loc[grp["context_s"] == base_ctx].iloc[0]
        base_wer = float(base_row["wer_mean"])
        extra = {"baseline_config": base_row["config"]} if "config" in grp else {}
        parts.append(grp.assign(baseline_context_s=base_ctx, baseline_wer=base_wer, **extra,
                                werr=[stats.werr(base_wer, w) for w in grp["wer_mean"]]))
    if not parts:
        return means.iloc[0:0].assign(baseline_context_s=[], baseline_wer=[], werr=[])
    return pd.concat(parts, ignore_index=True)


def varying_params(sweep: Sweep, family: str) -> set[str]:
    """Params (minus seed and context) that differ between the series of ``family`` (finished runs)."""
    trials = in_family(sweep.trials[sweep.trials["run_id"].isin(sweep.wer["run_id"])], family)
    reps = trials.drop_duplicates("series_id")["run_id"].tolist()
    if len(reps) < 2:
        return set()
    params = sweep.params.reindex(reps).fillna("")
    return {c for c in params.columns if c not in ("train.seed", "data.context_s") and params[c].nunique() > 1}


def family_rows(table: pd.DataFrame, families: Iterable[str]) -> pd.DataFrame:
    """``table`` repeated once per family each row belongs to, with a ``family`` column."""
    parts = [in_family(table, f).assign(family=f) for f in families]
    parts = [p for p in parts if len(p)]
    if not parts:
        return table.iloc[0:0].assign(family=[])
    out = pd.concat(parts, ignore_index=True)
    return out[["family"] + [c for c in out.columns if c != "family"]]


def werr_table(sweep: Sweep, baseline_context: float = DEFAULT_BASELINE_CONTEXT_S) -> pd.DataFrame:
    """Per family, series, configuration, dataset and condition: WER over seeds and WERR against the baseline.

    ``werr_sd``/``werr_min``/``werr_max`` are the spread of the per-seed WERRs (each seed's WER against the
    baseline's mean WER).
    """
    wt = family_rows(wer_table(sweep), sweep.families)
    by = ["family", "series_id", "dataset", "condition"]
    out = werr_from_means(wt, baseline_context, by)
    if out.empty:
        return out
    per_seed = greedy_rows(sweep.wer)[["config_id", "dataset", "condition", "wer"]]
    merged = out[by + ["config_id", "baseline_wer"]].merge(per_seed, on=["config_id", "dataset", "condition"])
    merged["werr_seed"] = 100.0 * (merged["baseline_wer"] - merged["wer"]) / merged["baseline_wer"]
    spread = merged.groupby(by + ["config_id"], dropna=False)["werr_seed"].agg(
        werr_sd=stats.seed_sd, werr_min="min", werr_max="max").reset_index()
    out = out.merge(spread, on=by + ["config_id"], how="left")
    return out.sort_values(["family", "series", "dataset", "snr_db", "context_s"],
                           na_position="first").reset_index(drop=True)


def baseline_notes(sweep: Sweep, baseline_context: float = DEFAULT_BASELINE_CONTEXT_S) -> list[str]:
    """One sentence per family and series that has no model at the baseline context (so no WERR)."""
    notes = []
    done = sweep.trials[sweep.trials["run_id"].isin(sweep.wer["run_id"])]
    for fam in sweep.families:
        members = in_family(done, fam)
        for series, grp in members.groupby("series", sort=True):
            if find_baseline(grp["context_s"].tolist(), baseline_context) is None:
                have = ", ".join(format_seconds(c) for c in sorted(grp["context_s"].unique()))
                notes.append(f"family {fam}, series {series}: no finished model at the baseline context "
                             f"{format_seconds(baseline_context)} (contexts: {have}); no WERR for it")
    return notes


def snr_table(werr: pd.DataFrame) -> pd.DataFrame:
    """The noise-robustness rows of :func:`werr_table` (datasets with SNR conditions, clean included)."""
    noisy = werr[werr["condition"] != CLEAN][["family", "series_id", "dataset"]].drop_duplicates()
    out = werr.merge(noisy, on=["family", "series_id", "dataset"])
    cols = ["family", "series", "dataset", "condition", "snr_db", "context_s", "config", "n_seeds", "wer_mean",
            "baseline_wer", "werr", "werr_min", "werr_max"]
    return out[cols].sort_values(["family", "series", "dataset", "context_s", "snr_db"],
                                 na_position="first").reset_index(drop=True)


# ---- pairing and significance --------------------------------------------------------------------------------

SeedTables = dict[tuple[str, str, str], dict[int, Mapping[str, tuple[float, float]]]]


def recording_index(sweep: Sweep, decoder: str = GREEDY) -> SeedTables:
    """``(config_id, dataset, condition) -> seed -> recording -> (errors, ref_words)`` of ``decoder``'s results
    (greedy unless told), built in one pass (filtering the tidy frame once per comparison would dominate the
    report's run time on a paper-sized sweep)."""
    rec = greedy_rows(sweep.recordings, decoder)
    return counts_by_seed(rec, ["config_id", "dataset", "condition"])  # type: ignore[return-value]


def expected_seeds(sweep: Sweep) -> dict[str, list[int]]:
    """``config_id -> seeds`` of all its trial runs, finished or not."""
    t = sweep.trials.dropna(subset=["seed"])
    return {cid: sorted(int(s) for s in grp["seed"]) for cid, grp in t.groupby("config_id")}


def config_names(sweep: Sweep) -> dict[str, str]:
    return dict(zip(sweep.trials["config_id"], sweep.trials["config"]))


def paired_configs(sweep: Sweep, config_a: str, config_b: str, dataset: str, condition: str = CLEAN, *,
                   index: SeedTables | None = None) -> stats.PairedCounts:
    """Configuration A's and B's (``config_id``) per-recording counts on one dataset and condition, paired.

    ``index``: :func:`recording_index` of the sweep, when many comparisons are made. Raises
    :class:`stats.PairingError` naming what is missing when they cannot be paired recording by recording.
    """
    names = config_names(sweep)
    name_a, name_b = names.get(config_a, config_a), names.get(config_b, config_b)
    where = f" on {dataset}/{condition}"
    index = recording_index(sweep) if index is None else index
    a = index.get((config_a, dataset, condition), {})
    b = index.get((config_b, dataset, condition), {})
    for name, table in ((name_a, a), (name_b, b)):
        if not table:
            raise stats.PairingError(f"configuration {name} has no per-recording results{where} "
                                     f"(see the problems table)")
    return stats.pair_counts(a, b, name_a=name_a + where, name_b=name_b + where)


def compare_configs(sweep: Sweep, config_a: str, config_b: str, dataset: str, condition: str = CLEAN, *,
                    bootstrap_resamples: int = stats.BOOTSTRAP_RESAMPLES, level: float = 0.95,
                    index: SeedTables | None = None) -> stats.Comparison:
    """Every test of configuration B (``config_id``) against A on one dataset and condition (see
    :func:`paired_configs` for ``index`` and the :class:`stats.PairingError` it raises)."""
    pc = paired_configs(sweep, config_a, config_b, dataset, condition, index=index)
    return stats.compare(pc, level=level, bootstrap_resamples=bootstrap_resamples,
                         seed=stable_seed(config_a, config_b, dataset, condition))


def stable_seed(*parts: str) -> int:
    """A seed fixed by what is compared, so a comparison's Monte Carlo results do not depend on report order."""
    return int(hashlib.sha1("|".join(parts).encode()).hexdigest()[:8], 16)


SIGNIFICANCE_COLUMNS = [
    "family", "series", "dataset", "condition", "snr_db", "baseline_config", "config", "baseline_context_s",
    "context_s", "n_recordings", "seeds_baseline", "seeds", "wer_baseline", "wer", "delta_wer", "delta_lo",
    "delta_hi", "werr", "werr_lo", "werr_hi", "prob_improvement", "p_permutation", "permutation", "p_holm",
    "significant", "verdict", "p_wilcoxon", "p_sign", "n_better", "n_worse", "n_tied", "welch_t", "welch_df", "p_welch", "note"]


def significance_table(sweep: Sweep, baseline_context: float = DEFAULT_BASELINE_CONTEXT_S, *, alpha: float = 0.05,
                       bootstrap_resamples: int = stats.BOOTSTRAP_RESAMPLES, level: float = 0.95,
                       progress: bool = False) -> pd.DataFrame:
    """Every configuration against its series' baseline, per family, dataset and condition.

    The permutation p-values of the comparisons sharing a family, series, dataset and condition (the context
    lengths compared with one baseline) are Holm-corrected together; ``significant`` is ``p_holm < alpha``.
    """
    wt = wer_table(sweep)
    index = recording_index(sweep)
    seeds_of = expected_seeds(sweep)
    groups = []
    for fam in sweep.families:
        members = in_family(wt, fam)
        for key, grp in members.groupby(["series_id", "dataset", "condition"], sort=True):
            groups.append((fam, key, grp))
    plan: list[tuple[str, str, str, pd.Series, list[pd.Series]]] = []
    todo: dict[tuple[str, str, str, str], Task | str] = {}  # one comparison per pair, made once
    for fam, (series_id, ds, cond), grp in groups:
        base_ctx = find_baseline(grp["context_s"].tolist(), baseline_context)
        if base_ctx is None:
            continue
        base = grp[grp["context_s"] == base_ctx].iloc[0]
        others = [other for _, other in grp[grp["context_s"] != base_ctx].sort_values("context_s").iterrows()]
        plan.append((fam, ds, cond, base, others))
        for other in others:
            ck = (base["config_id"], other["config_id"], ds, cond)
            if ck not in todo:
                try:
                    todo[ck] = (paired_configs(sweep, *ck, index=index),
                                {"level": level, "bootstrap_resamples": bootstrap_resamples,
                                 "seed": stable_seed(*ck)})
                except stats.PairingError as e:
                    todo[ck] = str(e)
    made = [k for k, v in todo.items() if not isinstance(v, str)]
    results = dict(zip(made, compare_all([todo[k] for k in made], progress=progress)))  # type: ignore[misc]
    rows: list[dict] = []
    for fam, ds, cond, base, others in plan:
        start = len(rows)
        for other in others:
            ck = (base["config_id"], other["config_id"], ds, cond)
            rows.append(_row(fam, base, other, results.get(ck, todo[ck]), seeds_of))  # type: ignore[arg-type]
        ps = [r["p_permutation"] for r in rows[start:]]
        for r, adj in zip(rows[start:], stats.holm(ps)):
            r["p_holm"] = float(adj)
            r["significant"] = bool(adj < alpha) if np.isfinite(adj) else None
            r["verdict"] = verdict(r, alpha)
    out = pd.DataFrame(rows, columns=SIGNIFICANCE_COLUMNS)
    return out.sort_values(["family", "series", "dataset", "snr_db", "context_s"],
                           na_position="first").reset_index(drop=True)


def verdict(row: dict, alpha: float) -> str:
    """Plain words for one comparison: the Holm-corrected permutation test decides; the bootstrap interval (which
    also resamples seeds) says whether the difference survives seed-to-seed variation."""
    p = row.get("p_holm", math.nan)
    if not np.isfinite(p):
        return "not tested"
    if p >= alpha:
        return "not significant"
    lo, hi = row["delta_lo"], row["delta_hi"]
    direction = "better" if row["delta_wer"] < 0 else "worse"
    if np.isfinite(lo) and np.isfinite(hi) and (lo > 0 or hi < 0):
        return f"significantly {direction}"
    return (f"significantly {direction} on these recordings, but the interval that also resamples seeds "
            "includes 0 (may be seed variation)")


def _row(family: str, base: pd.Series, other: pd.Series, res: stats.Comparison | str,
         seeds_of: dict[str, list[int]]) -> dict:
    row = {"family": family, "series": other["series"], "dataset": other["dataset"],
           "condition": other["condition"], "snr_db": other["snr_db"], "baseline_config": base["config"],
           "config": other["config"], "baseline_context_s": base["context_s"], "context_s": other["context_s"]}
    if isinstance(res, str):
        return {**row, "p_permutation": math.nan, "note": "not tested: " + res}
    notes = []
    for name, cid, used in ((base["config"], base["config_id"], res.seeds_a),
                            (other["config"], other["config_id"], res.seeds_b)):
        missing = sorted(set(seeds_of.get(cid, [])) - set(used))
        if missing:
            notes.append(f"{name}: seeds {missing} have no results here and are left out")
    return {**row, "n_recordings": res.n_recordings, "seeds_baseline": ",".join(map(str, res.seeds_a)),
            "seeds": ",".join(map(str, res.seeds_b)), "wer_baseline": res.wer_a, "wer": res.wer_b,
            "delta_wer": res.delta, "delta_lo": res.delta_ci[0], "delta_hi": res.delta_ci[1], "werr": res.werr,
            "werr_lo": res.werr_ci[0], "werr_hi": res.werr_ci[1], "prob_improvement": res.prob_improvement,
            "p_permutation": res.permutation.pvalue,
            "permutation": "exact" if res.permutation.exact else f"{res.permutation.resamples} random sign flips",
            "p_wilcoxon": res.wilcoxon.pvalue, "p_sign": res.sign.pvalue, "n_better": res.sign.n_negative,
            "n_worse": res.sign.n_positive, "n_tied": res.sign.n_ties, "welch_t": res.welch.t,
            "welch_df": res.welch.df, "p_welch": res.welch.pvalue, "note": "; ".join(notes)}


# ---- naming configurations and contexts ----------------------------------------------------------------------

@dataclass(frozen=True)
class ContextSpan:
    """One group of a per-context table (family, series, dataset, condition) read for a verdict: ``head`` (how its
    line starts), ``span`` ("10 s → 82 s"), the rows of its ``short``est and ``long``est context; ``single`` holds
    the whole line when the group has one context length (nothing to compare)."""

    family: str
    series_id: str
    dataset: str
    condition: str
    head: str
    span: str
    short: pd.Series
    long: pd.Series
    single: str = ""


def context_spans(table: pd.DataFrame) -> Iterator[ContextSpan]:
    """Per family, series, dataset and condition of ``table`` (rows with ``context_s`` and ``series``), sorted:
    the shortest and longest context of each, as the verdicts of the planted-cue and recall parts read them."""
    for (fam, sid, ds, cond), grp in table.groupby(["family", "series_id", "dataset", "condition"], sort=True):
        grp = grp.sort_values("context_s")
        head = f"Family {fam}, {grp['series'].iloc[0]}, {ds}" + ("" if cond == CLEAN else f" ({cond})")
        short, long = grp.iloc[0], grp.iloc[-1]
        single = (f"{head}: one context length ({format_seconds(short['context_s'])}); nothing to compare."
                  if len(grp) < 2 else "")
        yield ContextSpan(str(fam), str(sid), str(ds), str(cond), head,
                          f"{format_seconds(short['context_s'])} → {format_seconds(long['context_s'])}", short, long,
                          single)


def holm_once(table: pd.DataFrame, columns: Sequence[str]) -> pd.Series:
    """Holm-adjusted ``p`` of each row of ``table``, a comparison (the same values in ``columns``) counted once
    whichever families it belongs to."""
    key = table[list(columns)].astype(str).agg("|".join, axis=1)
    first = ~key.duplicated()
    adjusted = dict(zip(key[first], stats.holm(table.loc[first, "p"].to_numpy(dtype=float))))
    return key.map(adjusted).astype(float)


def format_seconds(seconds: float) -> str:
    """5.12 -> '5.12 s', 10.24 -> '10.24 s', 81.92 -> '81.92 s', 10 -> '10 s', 655.36 -> '10.9 min', 3600 -> '1 h';
    what the axes, tables and sentences print. Under ten minutes every length is written alike, to the hundredth
    (trailing zeros dropped): the grids' context lengths (multiples of 1.28 s) print exactly, so 5.12 s never stands
    beside a rounded '10 s'."""
    if math.isnan(seconds):
        return "?"
    if seconds < 600:
        return f"{seconds:.2f}".rstrip("0").rstrip(".") + " s"
    if seconds < 3600:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


_DURATION_RE = re.compile(r"^\s*(?P<num>[0-9]*\.?[0-9]+)\s*(?P<unit>s|sec|min|m|h)?\s*$")


def parse_duration(text: str) -> float | None:
    """'20.48' / '20.48s' / '5.5min' / '1h' -> seconds; None if ``text`` is not a duration."""
    m = _DURATION_RE.match(text)
    if not m:
        return None
    scale = {"min": 60.0, "m": 60.0, "h": 3600.0}.get(m.group("unit") or "s", 1.0)
    return float(m.group("num")) * scale


def resolve_config(sweep: Sweep, spec: str, *, family: str | None = None, series_id: str | None = None) -> str:
    """The ``config_id`` that ``spec`` names: a configuration name (trial label without ``-s<seed>``), a trial
    label, a ``config_id`` (or a prefix of at least 4 characters) or a context length such as ``20.48``, ``20s``,
    ``5.5min`` (within 1%, or equal rounded to whole seconds; unique within ``family`` if given, else within the
    sweep; where several match, the one in series ``series_id`` if given)."""
    trials = sweep.trials if family is None else in_family(sweep.trials, family)
    if trials.empty:
        raise SelectionError(f"family {family!r} has no trials; families: {', '.join(sweep.families)}")
    configs = trials.drop_duplicates("config_id")
    for column in ("config", "label"):
        hit = trials.loc[trials[column] == spec, "config_id"].unique()
        if len(hit) == 1:
            return str(hit[0])
    if len(spec) >= 4:
        hit = configs.loc[configs["config_id"].str.startswith(spec), "config_id"].unique()
        if len(hit) == 1:
            return str(hit[0])
    seconds = parse_duration(spec)
    if seconds is not None:
        # within 1%, or equal when rounded to whole seconds as trial labels write them (20s names 20.48 s)
        hit = configs[[same_context(c, seconds) or round(c) == seconds for c in configs["context_s"]]]
        if len(hit) > 1 and series_id is not None and (hit["series_id"] == series_id).sum() == 1:
            hit = hit[hit["series_id"] == series_id]
        if len(hit) == 1:
            return str(hit["config_id"].iloc[0])
        if len(hit) > 1:
            raise SelectionError(f"{spec!r} matches {len(hit)} configurations: {', '.join(sorted(hit['config']))}; "
                                 "name one of them, or restrict with --family")
    listing = ", ".join(f"{n} ({format_seconds(c)})" for n, c in
                        sorted(zip(configs["config"], configs["context_s"]), key=lambda t: (t[1], t[0])))
    raise SelectionError(f"{spec!r} names no configuration" + (f" in family {family!r}" if family else "")
                         + f"; configurations: {listing}")


def evaluation_notes(sweep: Sweep) -> list[str]:
    """Which evaluation the greedy tables read (every WER, WERR, significance and SNR table, and the figures): the
    setting of evaluation ``greedy`` on the finished runs, and the conditions evaluation jobs added after training.
    Nothing for runs that recorded no evaluation (made before evaluations were recorded)."""
    ev = sweep.evaluations
    greedy = ev[ev["evaluation"] == GREEDY] if len(ev) else ev
    if greedy.empty:
        return []
    settings = []
    for text in sorted(set(greedy["setting"])):
        d = json.loads(text)
        settings.append(", ".join(f"{k} {d[k]}" for k in ("stride", "precision", "noise") if k in d))
    runs = greedy["run_id"].nunique()
    line = (f"Every WER, WERR, significance and noise table and figure reads evaluation {GREEDY} "
            f"({'; '.join(settings)}) of {runs} runs")
    added = greedy[greedy["job"] != "own"]
    if added.empty:
        return [line + ", each measured at the end of its training."]
    what = ", ".join(f"{d} {c}" for (d, c), _ in added.groupby(["dataset", "condition"], sort=True))
    return [line + f"; evaluation jobs measured {what} on {added['run_id'].nunique()} of them after training "
                   "(the model's run holds both, its tables merged)."]


def kernel_notes(sweep: Sweep) -> list[str]:
    """Which CPU kernel levels trained the finished runs (tag ``trial.kernels``), and a warning where they differ:
    the same seed trains other weights under another level (floating-point order), so runs of one configuration
    trained on different CPUs differ by more than their seeds. Nothing when no run recorded its level."""
    t = sweep.trials
    if t.empty or "kernels" not in t:
        return []
    done = t[(t["status"] == FINISHED) & (t["kernels"].fillna("") != "")]
    if done.empty:
        return []
    counts = done["kernels"].value_counts().sort_index()
    said = ", ".join(f"{level} ({n} run{'s' if n != 1 else ''})" for level, n in counts.items())
    unknown = int((t["status"] == FINISHED).sum()) - len(done)
    tail = f"; {unknown} finished runs recorded none" if unknown else ""
    if len(counts) == 1 and "," not in counts.index[0]:
        return [f"Every run whose level is recorded trained with the CPU kernels {said}{tail}: on another "
                "instruction set the same seeds train other weights, so expect these figures to hold within the "
                "seed spread, not to the digit."]
    return [f"The runs trained with different CPU kernel levels: {said}{tail}. The same seed trains other weights "
            "under another level (floating-point order), so seeds of one configuration that trained on different "
            "CPUs differ by more than their seeds do; compare such runs with care."]


def cut_notes(sweep: Sweep) -> list[str]:
    """What the training cuts dropped, per context and ``data.cut`` (the mean over finished runs of the metric
    ``data/words_lost_pct``): a shorter context cuts more often, so its models are taught to blank more of the speech
    they hear; nothing when no run logged it (runs made before it was logged)."""
    t = sweep.trials
    if t.empty or "words_lost_pct" not in t:
        return []
    done = t[(t["status"] == FINISHED) & t["words_lost_pct"].notna()]
    if done.empty:
        return []
    parts = []
    for (cut, context), g in done.groupby(["cut", "context_s"], sort=True):
        parts.append(f"{format_seconds(context)} {cut} cuts {g['words_lost_pct'].mean():.2f}%")
    return ["Words dropped by the training cuts (lying wholly in no window; `data.cut`): " + ", ".join(parts) + "."]


def comparison_row(res: stats.Comparison | str, note: str = "") -> dict[str, Any]:
    """A test table's columns of one comparison (WERs, ΔWER and WERR with intervals, the permutation p, seeds and
    ``note``), or ``p_permutation`` NaN and ``"not tested: <why>"`` where ``res`` says why it could not be made."""
    if isinstance(res, str):
        return {"p_permutation": math.nan, "note": "not tested: " + res}
    return {"n_recordings": res.n_recordings, "seeds_reference": ",".join(map(str, res.seeds_a)),
            "seeds": ",".join(map(str, res.seeds_b)), "wer_reference": res.wer_a, "wer": res.wer_b,
            "delta_wer": res.delta, "delta_lo": res.delta_ci[0], "delta_hi": res.delta_ci[1], "werr": res.werr,
            "werr_lo": res.werr_ci[0], "werr_hi": res.werr_ci[1], "p_permutation": res.permutation.pvalue,
            "note": note}
