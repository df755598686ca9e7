"""``python -m analysis report``: one folder a reader can publish, built from a sweep in MLflow.

``OUT/index.html`` (self-contained: figures embedded as base64 PNG, inline CSS), ``OUT/report.md`` (figures linked
beside it), the PNGs, and CSVs: ``wer.csv``, ``werr.csv``, ``significance.csv``, ``snr.csv``, ``problems.csv``,
``trials.csv``, ``external.csv`` (other systems scored by ``python -m asr_core score``, also a table beside the
models' WER), ``errors.csv`` (substitutions, deletions and insertions of every decoder, :mod:`analysis.features.errors`;
its section "Error types", after the WER and tail-word sections, shows greedy decoding on clean audio). Every
comparison with a baseline is stated in one plain sentence (the two WERs and whether the difference is significant
after Holm's correction), its numbers (intervals, p-values) in the table beside the sentences, and
every run that was left out is listed with the reason. A configuration whose every seed is at
:data:`~analysis.ledger.collect.NOTHING_LEARNED_WER`% WER or more on every clean test set has not learned to transcribe: it
stays in the WER table and the CSVs, but no comparison, WERR table or figure is drawn from it (a sweep of such models
gets no figures at all, only the sentence saying why).

Sections that only a sweep with the data gets (a sweep without it gets the report it always got):

* beam decoders (``wer_<D>/...``): each against greedy decoding, Table 6's layout (:mod:`analysis.features.decoders`),
  ``decoders.csv`` and ``decoder_settings.csv``;
* window fusion (decoders ``fusion-<METHOD>``, paper 001): a "Decoding method" section after the decoders', WER
  per method and context, the context-length gain under each method and methods against averaging
  (:mod:`analysis.features.fusion`), ``fusion.csv`` and ``fusion_tests.csv``;
* the context-or-fragmentation controls (a banded or pause-cut model, or a decoder ``window-<W>s``): a "Context or
  fragmentation" section, each control against the dense models and a verdict by fixed rules
  (:mod:`analysis.features.fragmentation`), ``fragmentation.csv`` and ``fragmentation_tests.csv``;
* LM perplexity (``lm_ppl/...`` on LM runs): perplexity against LM context, ``lm_ppl.csv`` and a figure;
* head similarity (``heads/...``): against context per heads count and model size, beside WER, and whether it
  tracks WER (:mod:`analysis.features.heads`), ``heads.csv``, ``heads_tracking.csv`` and a figure per family;
* the planted cue (``cue_words``/``cue_errors`` in the per-recording tables): the cue-word error rate against context
  beside WER on all and on the other words, with paired tests against the shortest and the baseline context
  (:mod:`analysis.features.cue`), ``cue.csv`` and a figure per family;
* the recall plant (per-slot tables ``eval/<DATASET>.slots.csv``): a "Recall control" part of the positive-control
  section, slot accuracy by band, distance and context with the ceiling and guess-rate controls, far-band tests
  between context lengths and a verdict (:mod:`analysis.features.recall`), ``recall.csv`` and ``recall_tests.csv``;
* tail words (``tail_words``/``tail_errors`` in the per-recording tables of an evaluation given ``eval.tail``): a
  "Tail words (paper 002)" section after the WER section, tail-WER beside WER with paired tests against the baseline
  context and a verdict per group (:mod:`analysis.features.tail`), ``tail.csv`` and ``tail_tests.csv``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from analysis.features import errors as er
from analysis.features import heads as hd
from analysis.significance import stats
from analysis.ledger.collect import NOTHING_LEARNED_WER, Sweep
from analysis.document.finding import Check, Gain, finding_checks, summary_sentence
from analysis.display.plots import Figure, Skipped, draw_figures
from analysis.display.render import (Section, external_pivot, fmt_num, render_html, render_markdown,
                             significance_display, snr_pivots, wer_pivot, werr_pivot)
from analysis.document.sections import Context, build_sections
from analysis.significance.werr import (DEFAULT_BASELINE_CONTEXT_S, baseline_notes, evaluation_notes, format_seconds,
                           cut_notes, kernel_notes, significance_table, snr_table, wer_table, werr_table)
from asr_core.contract.metrics import CLEAN

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Report:
    out_dir: Path
    html: Path
    markdown: Path
    csvs: dict[str, Path]
    figures: list[Figure]
    skipped: list[Skipped]
    significance: pd.DataFrame


# ---- what the report says ------------------------------------------------------------------------------------

def sentence(row: pd.Series) -> str:
    """One comparison with its baseline in one plain sentence: which contexts, on what, the verdict and the two
    WERs. Every other number (WERR, intervals, p-values) is in the findings table."""
    head = (f"{format_seconds(row['context_s'])} against {format_seconds(row['baseline_context_s'])} on "
            f"{row['dataset']}" + ("" if row["condition"] == CLEAN else f" with music at {row['snr_db']:g} dB"))
    if not math.isfinite(row["p_permutation"]):
        why = str(row["note"] or "no per-recording results").removeprefix("not tested: ")
        return f"{head}: **not tested** ({why})."
    v = row["verdict"]
    verdict = "no significant difference" if v == "not significant" else v
    if "(may be seed variation)" in v:  # the table's verdict says why; the sentence stays short
        verdict = v.split(",")[0] + " (may be seed variation)"
    return f"{head}: **{verdict}**, WER {fmt_num(row['wer_baseline'])}% → {fmt_num(row['wer'])}%."


def noisy_sentence(rows: pd.DataFrame) -> str:
    """The comparisons with added music of one series in one sentence (each is a row of the findings table)."""
    tested = rows[rows["p_permutation"].notna()]
    verdicts = tested["verdict"].fillna("")
    better = int((verdicts == "significantly better").sum())
    worse = int((verdicts == "significantly worse").sum())
    snrs = ", ".join(f"{x:g}" for x in sorted(rows["snr_db"].dropna().unique(), reverse=True))
    return (f"With music added ({snrs} dB): of {len(tested)} tested comparisons {better} significantly better and "
            f"{worse} significantly worse (each a row of the table below).")


def unlearned_configs(wer: pd.DataFrame) -> set[str]:
    """The configurations (names) whose every seed is at :data:`NOTHING_LEARNED_WER`% WER or more on every clean
    test set: they have not learned to transcribe, and nothing is read from them."""
    clean = wer[wer["condition"] == CLEAN] if not wer.empty else wer
    if clean.empty:
        return set()
    best = clean.groupby("config")["wer_min"].min()
    return set(best[best >= NOTHING_LEARNED_WER].index)


def learned(frame: pd.DataFrame, unlearned: set[str]) -> pd.DataFrame:
    """``frame`` without the rows of (or against a baseline of) the ``unlearned`` configurations."""
    if frame.empty or not unlearned:
        return frame
    keep = ~frame["config"].isin(unlearned)
    if "baseline_config" in frame.columns:
        keep &= ~frame["baseline_config"].isin(unlearned)
    return frame[keep]


def unlearned_note(unlearned: set[str], total: int, *, names: bool = True) -> str:
    """Why comparisons and figures leave configurations out ("" when none is); ``names``: name them (a few)."""
    if not unlearned:
        return ""
    every = len(unlearned) == total
    which = "every configuration" if every else f"{len(unlearned)} of {total} configurations"
    if names and not every:
        which += f" ({', '.join(sorted(unlearned)[:6])}{', …' if len(unlearned) > 6 else ''})"
    return (f"{which} at {NOTHING_LEARNED_WER:g}% WER or more on clean audio: not learned to transcribe, so left "
            f"out of the comparisons and figures (see \"{RUNS_LEFT_OUT}\")")


def _headline(sig: pd.DataFrame) -> pd.DataFrame:
    """Per family, series and dataset (clean): which context lengths are significantly better, worse or neither,
    and the largest WERR."""
    clean = sig[sig["condition"] == CLEAN] if not sig.empty else sig
    rows = []
    for (fam, series, ds), grp in clean.groupby(["family", "series", "dataset"], sort=True):
        def lengths(mask: pd.Series) -> str:
            return ", ".join(format_seconds(c) for c in grp.loc[mask, "context_s"]) or "–"

        verdict = grp["verdict"].fillna("")
        best = grp.loc[grp["werr"].idxmax()] if grp["werr"].notna().any() else None
        rows.append({
            "family": fam, "series": series, "dataset": ds, "baseline": format_seconds(grp["baseline_context_s"].iloc[0]),
            "significantly better": lengths(verdict == "significantly better"),
            "significantly worse": lengths(verdict == "significantly worse"),
            "not significant or not robust to seeds": lengths(~verdict.isin(["significantly better",
                                                                            "significantly worse"])),
            "largest WERR": "–" if best is None else f"{best['werr']:+.1f}% at {format_seconds(best['context_s'])}"})
    return pd.DataFrame(rows)


def _methods(alpha: float, level: float, resamples: int, baseline_context: float) -> str:
    return (
        f"WER is the corpus WER (all errors / all reference words, Whisper's normaliser) in percent; each "
        f"configuration's WER is the mean over its seeds. WERR = 100 × (WER_base − WER) / WER_base against the "
        f"same series (the same configuration apart from context length) at {format_seconds(baseline_context)} "
        f"({baseline_context:g} s). Significance treats the recording as the unit: per recording the error counts "
        f"are averaged over seeds, and a paired sign-flip permutation test over recordings tests ΔWER (exact "
        f"enumeration up to {stats.EXACT_PERMUTATION_MAX_N} differing recordings, else "
        f"{stats.PERMUTATION_RESAMPLES} random sign flips with p = (k + 1)/(N + 1)). Its p-values are "
        f"Holm-corrected across the context lengths compared with one baseline (per family, series, dataset and "
        f"condition); a comparison is significant when the adjusted p < {alpha:g}. Wilcoxon's signed-rank and the "
        f"sign test on per-recording WER are checks that weight recordings equally; Welch's t on seed-level WERs is "
        f"the authors' secondary figure. The {100 * level:g}% intervals are paired bootstrap percentiles "
        f"(Bisani & Ney) over {resamples} resamples of recordings and, within each configuration, of seeds; when "
        f"the permutation test is significant but this interval includes 0, the difference may be seed-to-seed "
        f"variation and the verdict says so.")


# ---- the report ----------------------------------------------------------------------------------------------

def build_report(sweep: Sweep, out_dir: Path | str, *, baseline_context: float = DEFAULT_BASELINE_CONTEXT_S,
                 alpha: float = 0.05, level: float = 0.95, bootstrap_resamples: int = stats.BOOTSTRAP_RESAMPLES,
                 main_family: str | None = None, progress: bool = False,
                 heads_representation: str = "A") -> Report:
    """Write the report of ``sweep`` into ``out_dir`` (created; files in it are overwritten).

    ``heads_representation``: the representation (A, Q, K, V or Y) whose summed head similarity is drawn against
    context and correlated with WER (every one is in the table)."""
    if heads_representation not in hd.REPRESENTATIONS:
        raise ValueError(f"heads representation {heads_representation!r} is not one of "
                         f"{', '.join(hd.REPRESENTATIONS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    wer = wer_table(sweep)
    werr = werr_table(sweep, baseline_context)
    snr = snr_table(werr) if not werr.empty else pd.DataFrame()
    sig = significance_table(sweep, baseline_context, alpha=alpha, level=level,
                             bootstrap_resamples=bootstrap_resamples, progress=progress)
    log.info("tables in %.1f s (%d comparisons)", time.perf_counter() - t0, len(sig))
    unlearned = unlearned_configs(wer)
    n_configs = wer["config"].nunique() if not wer.empty else 0
    left_out = unlearned_note(unlearned, n_configs)
    nothing_learned = bool(unlearned) and learned(wer, unlearned).empty
    figures, skipped = draw_figures(sweep, learned(werr, unlearned), learned(wer, unlearned), out,
                                    baseline_context=baseline_context, main_family=main_family)
    if unlearned:  # the reason that matters first: a figure of runs left out would be drawn flat
        brief = unlearned_note(unlearned, n_configs, names=False)
        skipped = [replace(s, reason=brief if nothing_learned else f"{s.reason}; {brief}") for s in skipped]
    notes = (baseline_notes(sweep, baseline_context) + evaluation_notes(sweep) + cut_notes(sweep)
             + kernel_notes(sweep))
    checks, gains = finding_checks(sweep, alpha=alpha, wer=wer)

    csvs = {"wer": wer, "werr": werr, "significance": sig, "snr": snr, "problems": sweep.problems,
            "trials": sweep.trials, "finding": _finding_frame(checks, gains), "external": sweep.external}
    error_section, csvs["errors"] = er.section(sweep)
    built = build_sections(Context(sweep, out, wer, baseline_context, alpha, level, bootstrap_resamples,
                                   heads_representation, main_family,
                                   unlearned_note(unlearned, n_configs, names=False) if nothing_learned else ""))
    extra = built.extra
    csvs.update(built.tables)
    paths = {}
    for name, df in csvs.items():
        paths[name] = out / f"{name}.csv"
        df.to_csv(paths[name], index=False)

    werr_read = learned(werr, unlearned)
    sections = _sections(sweep, wer, werr_read, snr_table(werr_read) if not werr_read.empty else pd.DataFrame(),
                         learned(sig, unlearned), figures, skipped, notes, baseline_context, alpha, level,
                         bootstrap_resamples, left_out)
    sections.insert(1, _finding_section(checks))
    at = next(i for i, s in enumerate(sections) if s.title == RUNS_LEFT_OUT)
    sections[at:at] = extra
    at = next(i for i, s in enumerate(sections) if s.title == "WER and WERR") + 1  # right after the WER section
    sections[at:at] = built.after_wer + [error_section]
    figures = figures + [f for s in extra for f in s.figures]
    md_path, html_path = out / "report.md", out / "index.html"
    md_path.write_text(render_markdown(sweep, sections), encoding="utf-8")
    html_path.write_text(render_html(sweep, sections), encoding="utf-8")
    log.info("report written to %s in %.1f s", out, time.perf_counter() - t0)
    return Report(out, html_path, md_path, paths, figures, skipped, sig)


def _finding_frame(checks: list[Check], gains: list[Gain]) -> pd.DataFrame:
    rows = [{"kind": "claim", "claim": c.claim, "verdict": c.verdict, "detail": c.detail} for c in checks]
    rows += [{"kind": "gain", "dataset": g.dataset, "condition": g.condition, "wer_short": g.wer_short,
              "wer_long": g.wer_long, "werr": g.werr, "p_permutation": g.p, "p_holm": g.p_holm} for g in gains]
    return pd.DataFrame(rows)


def _finding_section(checks: list[Check]) -> Section:
    return Section("The paper's finding in this sweep", [summary_sentence(checks)], [], [],
                    [("", [c.line() for c in checks])])


RUNS_LEFT_OUT = "Runs left out"


def _sections(sweep: Sweep, wer: pd.DataFrame, werr: pd.DataFrame, snr: pd.DataFrame, sig: pd.DataFrame,
              figures: list[Figure], skipped: list[Skipped], notes: list[str], baseline_context: float,
              alpha: float, level: float, resamples: int, left_out: str = "") -> list[Section]:
    """The report's own sections; ``werr``, ``snr`` and ``sig`` without the configurations that learned nothing
    (``left_out`` says which, "" when none)."""
    status = sweep.trials["status"].value_counts().to_dict()
    n_cfg = sweep.trials["config_id"].nunique()
    overview = [
        f"{len(sweep.trials)} trial runs ({', '.join(f'{v} {k}' for k, v in sorted(status.items()))}) of {n_cfg} "
        f"configurations in families {', '.join(sweep.families) or '–'}; datasets "
        f"{', '.join(sweep.datasets) or '–'}; baseline context {format_seconds(baseline_context)}.",
    ]
    if not sweep.problems.empty:
        overview.append(f"**{len(sweep.problems)} runs or results were left out or look wrong**; they are listed "
                        f"under \"Runs left out\" and in problems.csv.")
    secs = [Section("Overview", overview, [], [], [])]

    findings: list[str] = []
    if not sig.empty:
        tested = sig[sig["p_permutation"].notna()]
        n_sig = int((tested["significant"] == True).sum())  # noqa: E712 (None means untested)
        findings.append(f"{len(sig)} comparisons with a baseline, {len(tested)} tested: {n_sig} significant at "
                        f"α = {alpha:g} after Holm correction, {len(tested) - n_sig} not. Each is one sentence "
                        f"below and one row of the table after them.")
    if left_out:
        findings.append(f"**Left out**: {left_out}.")
    headline = _headline(sig)
    bullets = []
    ordered = sig.sort_values(["family", "series", "dataset", "snr_db", "context_s"], na_position="first")
    for (fam, series), grp in ordered.groupby(["family", "series"], sort=False):
        clean = grp[grp["condition"] == CLEAN]
        noisy = grp[grp["condition"] != CLEAN]
        items = [sentence(r) for _, r in clean.iterrows()] + ([noisy_sentence(noisy)] if not noisy.empty else [])
        bullets.append((f"Family {fam}, series {series}", items))
    if not bullets and not left_out:
        findings.append("No comparison with a baseline could be made: no family has finished models at the "
                        "baseline context and at another context length.")
    if not figures and skipped and len({s.reason for s in skipped}) == 1:  # one reason for all: said once
        secs.append(Section("Figures", [f"No figure is drawn: {skipped[0].reason}."], [], [], []))
    elif figures or skipped:
        secs.append(Section("Figures", [], [], figures,
                             [("", [f"{s.title} — not drawn: {s.reason}." for s in skipped])] if skipped else []))
    tables = [("Summary per family and dataset (clean audio; Holm-corrected permutation tests)", headline)] \
        if not headline.empty else []
    if not sig.empty:
        tables.append((f"Every comparison: WERR and ΔWER with {100 * level:g}% intervals, p-values (all in "
                       f"significance.csv)", significance_display(sig)))
    secs.append(Section("Findings: each context length against the baseline", findings, [], [], bullets))
    if tables:  # after the sentences, so that each sentence comes before its numbers
        secs.append(Section("Findings in numbers", [], tables, [], []))
    tables = [("WER (%) per configuration: mean ± sd over seeds (number of seeds)", wer_pivot(wer))]
    if not sweep.external.empty:
        tables.append(("WER (%) of other systems on the same test sets (python -m asr_core score: the same "
                       "references and normaliser)", external_pivot(sweep.external)))
    for fam in sweep.families:
        pv = werr_pivot(werr, fam)
        if not pv.empty:
            tables.append((f"WERR (%) from {format_seconds(baseline_context)}, family {fam}, clean: mean "
                           f"[min, max over seeds]", pv))
    secs.append(Section("WER and WERR", [], tables, [], [("", notes)] if notes else []))
    if not snr.empty:
        secs.append(Section("Noise robustness: WERR (%) from the baseline at each SNR", [], snr_pivots(snr), [],
                             []))
    secs.append(Section(RUNS_LEFT_OUT, [] if not sweep.problems.empty else ["None: every trial run finished "
                                                                              "with all its metrics and tables."],
                         [("", sweep.problems[["label", "status", "problem"]])] if not sweep.problems.empty else [],
                         [], []))
    secs.append(Section("Methods", [_methods(alpha, level, resamples, baseline_context)], [], [], []))
    return secs


