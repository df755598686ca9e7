"""Context or fragmentation: does a long-context model gain from long-range context, or from being cut less?

A model trained and decoded at a long window meets fewer window edges than a short one: fewer words dropped at the
training cuts and fewer edges in decoding. The sweep's controls separate the two (docs/ARCHITECTURE.md, "analysis"):

* **dense** models: attention over the whole window (``model.attention_span_s`` null), fixed cuts, at a short and
  a long context (:class:`Group`: the short one is the pause-cut models', e.g. 5.12 s in the demo and 10.24 s at the
  paper's scale; the long ones the banded models', e.g. 81.92 s); the gain to explain is the WER between them;
* **banded** models: a long window with attention banded to a few seconds a layer, so each output frame sees only
  its receptive field (seconds each side: the run's tag ``model.receptive_field_s``, which training computes
  with :func:`asr_core.model.receptive.receptive_field`) while the window stays long: few edges, no long-range context;
* **pause cuts**: the short context with ``data.cut = pauses`` (cuts moved to word starts, no word dropped);
* **window decoding**: the dense long model decoded at shorter windows (decoder ``window-<W>s``): the decoding
  edges of a short model, none of its training.

Models are matched on every other field: a group is the configurations whose params differ only in context, cut
and attention span (sub-grid names are not read). :func:`summary_table` gives per group, dataset and condition
the WER and its substitutions, deletions and insertions (:mod:`analysis.features.errors`) of every control and both dense
models; :func:`test_table` tests each control against the dense models recording by recording
(:func:`analysis.significance.stats.compare`: per recording the errors averaged over seeds, a sign-flip permutation test, and a
bootstrap over recordings and seeds; one model decoded two ways draws its seeds once), Holm-corrected over the
section; :func:`decide` is the verdict, by rules fixed in this module before any control was trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from analysis.features import errors
from analysis.significance import stats
from analysis.ledger.collect import Sweep
# the verdict's rules: their constants and kinds are re-exported here for the section's readers
from analysis.features.fragmentation_rules import (CONTEXT_BANDED_MIN, CONTEXT_PAUSES_MAX, CONTEXT_USED,  # noqa: F401
                                          FRAGMENTATION, FRAGMENTATION_BANDED_MAX, FRAGMENTATION_PAUSES_MIN, MIXED,
                                          NO_GAIN, OTHER_FAMILY, UNDECIDED, VERDICT_FAMILY, Evidence, Verdict,
                                          decide)
from analysis.ledger.naming import CONTEXT_PARAM, SEED_PARAM, digest, number
from analysis.display.render import Section, fragmentation_display
from analysis.significance.werr import SeedTables, comparison_row, recording_index, same_context, stable_seed, verdict
from asr_core.contract.metrics import CLEAN, GREEDY, window_seconds

TITLE = "Context or fragmentation"
CUT_PARAM, SPAN_PARAM = "data.cut", "model.attention_span_s"
DENSE, BANDED, PAUSES, WINDOW = "dense", "banded", "pauses", "window"



# ---- the models --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Model:
    """One configuration of a group: ``role`` :data:`DENSE`, :data:`BANDED` or :data:`PAUSES` (None: other);
    ``span_s`` the attention band a layer and ``field_s`` the receptive field each side (NaN: the whole window)."""

    group: str
    role: str | None
    config_id: str
    config: str
    series: str
    context_s: float
    cut: str
    span_s: float
    field_s: float


def _role(cut: str, span: float) -> str | None:
    if math.isfinite(span):
        return BANDED if cut == "fixed" else None
    return {"fixed": DENSE, "pauses": PAUSES}.get(cut)


def models(sweep: Sweep) -> list[Model]:
    """Every configuration with results, its role and its group (the digest of its params other than seed, context,
    cut and attention span, and those that differ between the seeds of a configuration: configurations that differ
    in nothing else)."""
    runs = sweep.trials[sweep.trials["run_id"].isin(sweep.wer["run_id"])]
    every = sweep.params.reindex(runs["run_id"]).astype(object).where(lambda p: p.notna(), "").astype(str)
    per_seed = every.groupby(runs["config_id"].to_numpy()).nunique().gt(1).any()
    skip = {SEED_PARAM, CONTEXT_PARAM, CUT_PARAM, SPAN_PARAM, *per_seed[per_seed].index}
    done = runs.drop_duplicates("config_id")
    out = []
    for (_, t), (_, p) in zip(done.iterrows(), every.loc[done["run_id"]].iterrows()):
        p = p.to_dict()
        group = digest({k: v for k, v in p.items() if k not in skip})
        span = number(str(p.get(SPAN_PARAM, "")))
        field = float(t.get("receptive_field_s", math.nan))  # the run's tag model.receptive_field_s
        cut = str(p.get(CUT_PARAM) or t.get("cut") or "fixed")
        out.append(Model(group, _role(cut, span), t["config_id"], t["config"], t["series"], float(t["context_s"]),
                         cut, span, field))
    return out


def window_decoders(sweep: Sweep) -> list[str]:
    """The ``window-<W>s`` decoders some finished run has results of, by window length."""
    names = set(sweep.wer["decoder"]) if "decoder" in sweep.wer.columns else set()
    return sorted((d for d in names if window_seconds(d) is not None), key=lambda d: window_seconds(d) or 0.0)


def has_controls(sweep: Sweep) -> bool:
    """Whether the sweep has a banded or a pause-cut model, or a window decoder, with results."""
    return bool(window_decoders(sweep)) or any(m.role in (BANDED, PAUSES) for m in models(sweep))


def label(m: Model, decoder: str = GREEDY) -> str:
    """How the section names a model (decoded by ``decoder``)."""
    w = window_seconds(decoder)
    if w is not None:
        return f"dense {m.context_s:g} s at {w:g} s windows"
    if m.role == BANDED:
        return f"banded {m.context_s:g} s (field ±{m.field_s:.2f} s)" if math.isfinite(m.field_s) else \
            f"banded {m.context_s:g} s ({m.span_s:g} s a layer)"
    return {DENSE: "dense", PAUSES: "pause cuts"}.get(m.role or "", m.config) + f" {m.context_s:g} s"


# ---- tables --------------------------------------------------------------------------------------------------

SUMMARY_COLUMNS = ["group", "dataset", "condition", "snr_db", "role", "model", "config", "config_id", "decoder",
                   "context_s", "cut", "attention_span_s", "field_s", "field_total_s", "window_s", "n_seeds", "seeds",
                   "n_recordings", "wer_mean", "wer_sd", "sub_mean", "sub_sd", "del_mean", "del_sd", "ins_mean",
                   "ins_sd"]
TEST_COLUMNS = ["group", "dataset", "condition", "test", "reference", "model", "reference_config",
                "reference_decoder", "config", "decoder", "shared_seeds", "n_recordings", "seeds_reference", "seeds",
                "wer_reference", "wer", "delta_wer", "delta_lo", "delta_hi", "werr", "werr_lo", "werr_hi",
                "p_permutation", "family", "p_holm", "significant", "seed_robust", "holds", "verdict", "note"]


@dataclass(frozen=True)
class Group:
    """The models of one group that the section reads: its dense models, the short context (the pause-cut models',
    else the shortest dense one) and its dense model, each long context (the banded models' and those of the dense
    models decoded at shorter windows, else the longest dense one) with its dense model (None where missing), the
    banded and pause-cut models, and the window decodings ``(dense model, decoder)`` shorter than the model's."""

    key: str
    name: str
    dense: list[Model]
    short_s: float
    longs: list[float]
    banded: list[Model]
    pauses: list[Model]
    windows: list[tuple[Model, str]]

    def at(self, context_s: float) -> Model | None:
        """The dense model at ``context_s`` (within 1%), None if the group has none."""
        return next((m for m in self.dense if same_context(m.context_s, context_s)), None)

    @property
    def short(self) -> Model | None:
        return self.at(self.short_s)

    def rows(self) -> list[tuple[str, Model, str]]:
        """``(role, model, decoder)`` in the order the tables show them."""
        dense = [self.short, *map(self.at, self.longs), *(m for m, _ in self.windows)]
        out = [(DENSE, m, GREEDY) for m in dense if m is not None]
        out += [(BANDED, m, GREEDY) for m in self.banded] + [(PAUSES, m, GREEDY) for m in self.pauses]
        return list(dict.fromkeys(out + [(WINDOW, m, d) for m, d in self.windows]))


def _distinct(contexts: list[float]) -> list[float]:
    out: list[float] = []
    for c in sorted(contexts):
        out += [] if out and same_context(out[-1], c) else [c]
    return out


def groups(sweep: Sweep) -> list[Group]:
    """The groups that hold a control (a banded or pause-cut model, or a window decoder of a dense model)."""
    by_group: dict[str, list[Model]] = {}
    for m in models(sweep):
        by_group.setdefault(m.group, []).append(m)
    have = set(zip(sweep.wer["config_id"], sweep.wer["decoder"])) if "decoder" in sweep.wer.columns else set()
    out = []
    for key, ms in sorted(by_group.items()):
        dense = sorted((m for m in ms if m.role == DENSE), key=lambda m: m.context_s)
        windows = [(m, d) for m in dense for d in window_decoders(sweep) if (m.config_id, d) in have
                   and (window_seconds(d) or 0) < m.context_s and not same_context(window_seconds(d) or 0, m.context_s)]
        banded = sorted((m for m in ms if m.role == BANDED), key=lambda m: (m.context_s, m.field_s))
        pauses = sorted((m for m in ms if m.role == PAUSES), key=lambda m: m.context_s)
        if not (banded or pauses or windows):
            continue
        with_dense = [p.context_s for p in pauses if any(same_context(p.context_s, m.context_s) for m in dense)]
        short_s = min(with_dense or [m.context_s for m in dense] or [m.context_s for m in pauses] or [math.nan])
        longs = _distinct([m.context_s for m in banded] + [m.context_s for m, _ in windows]) or \
            [c for c in [dense[-1].context_s] if dense]
        longs = [c for c in longs if not same_context(c, short_s)]
        name = next((m.series for m in dense), ms[0].series)
        out.append(Group(key, name, dense, short_s, longs, banded, pauses, windows))
    return out


def summary_table(sweep: Sweep, found: list[Group] | None = None) -> pd.DataFrame:
    """Per group, dataset, condition and model (:data:`SUMMARY_COLUMNS`): WER, S, D and I in percent, mean and sd
    over seeds, with the model's context, cut, attention span, receptive field and decoding window."""
    found = groups(sweep) if found is None else found
    rates = errors.error_table(sweep).drop_duplicates(["config_id", "decoder", "dataset", "condition"])
    rows = []
    for g in found:
        for role, m, dec in g.rows():
            part = rates[(rates["config_id"] == m.config_id) & (rates["decoder"] == dec)]
            for _, r in part.iterrows():
                rows.append({**r.to_dict(), "group": g.name, "role": role, "model": label(m, dec),
                             "field_s": m.field_s, "field_total_s": 2 * m.field_s, "cut": m.cut,
                             "window_s": window_seconds(dec) or m.context_s})
    out = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    return out.sort_values(["group", "dataset", "snr_db"], kind="stable", na_position="first").reset_index(drop=True)


def _compare(a: Mapping, b: Mapping, names: tuple[str, str], shared: bool, seed: int, level: float,
             resamples: int) -> tuple[stats.Comparison | str, str]:
    """B against A recording by recording: (the comparison or why it cannot be made, a note on seeds left out)."""
    for name, t in zip(names, (a, b)):
        if not t:
            return f"{name} has no per-recording results (see the problems table)", ""
    note = ""
    if shared:  # one trained model decoded two ways: the seeds both decoded, drawn once for both
        common = sorted(set(a) & set(b))
        if not common:
            return f"no seed has per-recording tables of both {names[0]} and {names[1]}", ""
        dropped = sorted(set(a) ^ set(b))
        note = f"seeds {dropped} decoded one way only are left out" if dropped else ""
        a, b = {s: a[s] for s in common}, {s: b[s] for s in common}
    try:
        pc = stats.pair_counts(a, b, name_a=names[0], name_b=names[1])
    except stats.PairingError as e:
        return str(e), note
    return stats.compare(pc, level=level, bootstrap_resamples=resamples, shared_seeds=shared, seed=seed), note


Step = tuple[str, Model | None, float, str, Model, str]


def _plan(g: Group) -> list[Step]:
    """``(test, reference, its context, reference decoder, model, decoder)`` of one group; the reference None where
    the group has no dense model at that context."""
    short = (g.short, g.short_s)
    plan: list[Step] = [("gain", *short, GREEDY, g.at(c), GREEDY) for c in g.longs if g.at(c) is not None]
    for m in g.banded:
        plan += [(BANDED, *short, GREEDY, m, GREEDY), (BANDED, g.at(m.context_s), m.context_s, GREEDY, m, GREEDY)]
    for m in g.pauses:
        plan += [(PAUSES, *ref, GREEDY, m, GREEDY) for ref in [short, *((g.at(c), c) for c in g.longs)]]
    for m, dec in g.windows:
        plan += [(WINDOW, m, m.context_s, GREEDY, m, dec)]
        plan += [(WINDOW, *short, GREEDY, m, dec)] if g.short is not m else []
    return plan


def test_table(sweep: Sweep, found: list[Group] | None = None, *, alpha: float = 0.05, level: float = 0.95,
               bootstrap_resamples: int = stats.BOOTSTRAP_RESAMPLES) -> pd.DataFrame:
    """Clean audio, per group and dataset (:data:`TEST_COLUMNS`): the dense long model against the dense short one
    (``gain``), each banded and pause-cut model against both dense models, and each window decoding against the
    same model at its own window (shared seeds) and against the dense short model; Holm over every row."""
    found = groups(sweep) if found is None else found
    index: dict[str, SeedTables] = {}
    rows: list[dict[str, Any]] = []
    for g in found:
        for test, ref, ref_ctx, ref_dec, m, dec in _plan(g):
            for dec_ in (ref_dec, dec):
                if dec_ not in index:
                    index[dec_] = recording_index(sweep, dec_)
            datasets = sorted({ds for (cid, ds, cond) in index[dec] if cid == m.config_id and cond == CLEAN})
            for ds in datasets:
                row = {"group": g.name, "dataset": ds, "condition": CLEAN, "test": test, "model": label(m, dec),
                       "reference": label(ref, ref_dec) if ref else f"dense {ref_ctx:g} s",
                       "config": m.config, "decoder": dec, "reference_decoder": ref_dec,
                       "shared_seeds": ref is m, "family": VERDICT_FAMILY if test == "gain" or (
                           test == PAUSES and ref is g.short) else OTHER_FAMILY}
                if ref is None:
                    rows.append({**row, "p_permutation": math.nan,
                                 "note": f"not tested: no dense model at {ref_ctx:g} s in this group"})
                    continue
                row["reference_config"] = ref.config
                res, note = _compare(index[ref_dec].get((ref.config_id, ds, CLEAN), {}),
                                     index[dec].get((m.config_id, ds, CLEAN), {}), (row["reference"], row["model"]),
                                     ref is m, stable_seed(ref.config_id, ref_dec, m.config_id, dec, ds), level,
                                     bootstrap_resamples)
                rows.append({**row, **comparison_row(res, note)})
    for family in (VERDICT_FAMILY, OTHER_FAMILY):  # Holm within each family
        members = [r for r in rows if r["family"] == family]
        for r, adj in zip(members, stats.holm([r.get("p_permutation", math.nan) for r in members])):
            r["p_holm"] = float(adj)
    for r in rows:
        adj = r["p_holm"]
        r["significant"] = bool(adj < alpha) if np.isfinite(adj) else None
        lo, hi = r.get("delta_lo", math.nan), r.get("delta_hi", math.nan)
        r["seed_robust"] = bool(lo > 0 or hi < 0) if np.isfinite(lo) and np.isfinite(hi) else None
        r["holds"] = None if r["significant"] is None else bool(r["significant"] and r["seed_robust"])
        r["verdict"] = verdict({"delta_lo": math.nan, "delta_hi": math.nan, **r}, alpha)
    return pd.DataFrame(rows, columns=TEST_COLUMNS)


# ---- the verdict from the tables -------------------------------------------------------------------------------

def evidence(g: Group, long_s: float, summary: pd.DataFrame, tests: pd.DataFrame, dataset: str) -> Evidence:
    """What :func:`decide` reads for one group, long context and dataset, clean audio."""
    s = summary[(summary["group"] == g.name) & (summary["dataset"] == dataset) & (summary["condition"] == CLEAN)]
    t = tests[(tests["group"] == g.name) & (tests["dataset"] == dataset)]
    long = g.at(long_s)

    def wer(m: Model | None, dec: str = GREEDY) -> float | None:
        hit = s[(s["config_id"] == m.config_id) & (s["decoder"] == dec)] if m is not None else s.iloc[0:0]
        return float(hit["wer_mean"].iloc[0]) if len(hit) and math.isfinite(hit["wer_mean"].iloc[0]) else None

    def holds(test: str, m: Model | None, ref: Model | None) -> bool | None:
        hit = t[(t["test"] == test) & (t["model"] == label(m)) & (t["reference"] == label(ref))] if m and ref else t[:0]
        return None if hit.empty or pd.isna(hit["holds"].iloc[0]) else bool(hit["holds"].iloc[0])

    here = [m for m in g.banded if same_context(m.context_s, long_s) and wer(m) is not None]
    banded = min(here, key=lambda m: abs(2 * m.field_s - g.short_s) if math.isfinite(m.field_s) else math.inf,
                 default=None)
    pauses = next((m for m in g.pauses if same_context(m.context_s, g.short_s)), None)
    edges = next((d for m, d in g.windows if m is long and same_context(window_seconds(d) or 0, g.short_s)), None)
    return Evidence(wer(g.short), wer(long), holds("gain", long, g.short), wer(banded),
                    2 * banded.field_s if banded is not None and math.isfinite(banded.field_s) else None,
                    wer(pauses), holds(PAUSES, pauses, g.short), wer(long, edges) if edges else None, g.short_s, long_s)


def verdicts(found: list[Group], summary: pd.DataFrame, tests: pd.DataFrame) -> list[tuple[str, Verdict]]:
    """Per group, dataset and long context: (what the verdict is about, the verdict)."""
    out = []
    for g in found:
        for ds in sorted(set(summary.loc[summary["group"] == g.name, "dataset"])):
            for long_s in g.longs or [math.nan]:
                head = ds + (f" ({g.name})" if len(found) > 1 else "")
                head += f", {g.short_s:g} → {long_s:g} s" if len(g.longs) > 1 else ""
                out.append((head, decide(evidence(g, long_s, summary, tests, ds))))
    return out


def power_lines(tests: pd.DataFrame, alpha: float) -> list[str]:
    """Where even the verdict's family cannot reach ``alpha``: with R recordings an exact sign-flip test's p is at
    least 2^(1 − R) (Monte Carlo: 1 / (resamples + 1)), and Holm multiplies the smallest by the family's size k."""
    out = []
    fam = tests[(tests["family"] == VERDICT_FAMILY) & tests["p_permutation"].notna()]
    for (group, ds), t in fam.groupby(["group", "dataset"], sort=True):
        r = int(t["n_recordings"].min())
        floor = 2.0 ** (1 - r) if r <= stats.EXACT_PERMUTATION_MAX_N else 1 / (stats.PERMUTATION_RESAMPLES + 1)
        if len(t) * floor >= alpha:
            out.append(f"{ds} ({group}): with {r} recordings no test can reach p < {alpha:g} after Holm over the "
                       f"verdict's {len(t)} tests (the smallest possible is {len(t) * floor:.3g}); the verdict "
                       f"cannot find a gain: give the test set more recordings")
    return out


# ---- the section -------------------------------------------------------------------------------------------------

def section(sweep: Sweep, alpha: float, *, level: float = 0.95, bootstrap_resamples: int = stats.BOOTSTRAP_RESAMPLES
            ) -> tuple[Section, dict[str, pd.DataFrame]]:
    """The report's "Context or fragmentation" section and its CSVs ``fragmentation`` (:func:`summary_table`) and
    ``fragmentation_tests`` (:func:`test_table`); only for a sweep with a control (:func:`has_controls`)."""
    found = groups(sweep)
    summary = summary_table(sweep, found)
    tests = test_table(sweep, found, alpha=alpha, level=level, bootstrap_resamples=bootstrap_resamples)
    spans = "; ".join(f"{g.short_s:g} s against {', '.join(f'{c:g} s' for c in g.longs) or '–'}" for g in found)
    paras = [
        f"Is the long-context model better because it uses long-range context, or because it is cut less? Dense "
        f"models attend over their whole window, cut at fixed points, at a short and a long context (here {spans}). "
        f"A banded model keeps a long window but bands attention to a few seconds a layer, so each output sees only "
        f"its receptive field (± each side; in brackets the total): few edges, no long-range context. Pause cuts "
        f"train at the short context with each cut moved to a word start, so no word is dropped. Window decoding "
        f"runs a dense long model at shorter windows: the decoding edges of a short model without its training. "
        f"Models are matched on every field but context, cut and attention span; S, D, I as in \"{errors.TITLE}\".",
        f"Tests (clean audio): each control against the dense models, recording by recording: per recording the "
        f"errors averaged over seeds, the paired sign-flip permutation test, and a bootstrap interval of ΔWER over "
        f"recordings and seeds (a model decoded two ways draws its seeds once); Holm-corrected within two families: "
        f"the tests the verdict reads (the gain, pause cuts against dense short) and the others (descriptive). "
        f"A test holds when its Holm p < {alpha:g} and its interval excludes 0.",
        f"The verdict's rules, fixed before any control was trained: G = WER(dense short) − WER(dense long). No "
        f"gain to explain if G ≤ 0 or its test does not hold. Banding's share (WER(banded) − WER(dense long)) / G, "
        f"for the banded model at the long context whose total field is nearest the short context; pause cuts' "
        f"share (WER(dense short) − WER(pause cuts)) / G. Context used: banding's share ≥ "
        f"{CONTEXT_BANDED_MIN:.2f}, |pause cuts' share| ≤ {CONTEXT_PAUSES_MAX:.2f} and the test of pause cuts "
        f"against dense short does not hold. Fragmentation: banding's share ≤ {FRAGMENTATION_BANDED_MAX:.2f} and "
        f"pause cuts' share ≥ {FRAGMENTATION_PAUSES_MIN:.2f}. Otherwise mixed, with each control's share; the "
        f"share that decoding the dense long model at the short window loses is stated, not ruled on. All rows in "
        f"fragmentation.csv (every condition), all tests in fragmentation_tests.csv."]
    lines = [f"{head}: {v.sentence}" for head, v in verdicts(found, summary, tests)]
    bullets = [("Verdict", (lines or ["No group holds a control with results."]) + power_lines(tests, alpha))]
    return Section(TITLE, paras, fragmentation_display(summary, tests), [], bullets), {"fragmentation": summary,
                                                                          "fragmentation_tests": tests}
