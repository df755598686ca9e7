"""``python -m analysis report``: one folder a reader can publish, built from a sweep in MLflow.

``OUT/index.html`` (self-contained: figures embedded as base64 PNG, inline CSS), ``OUT/report.md`` (figures linked
beside it), the PNGs, and CSVs: ``wer.csv``, ``werr.csv``, ``significance.csv``, ``snr.csv``, ``problems.csv``,
``trials.csv``, ``external.csv`` (other systems scored by ``python -m asr_core score``, also a table beside the
models' WER), ``errors.csv`` (substitutions, deletions and insertions of every decoder, :mod:`analysis.errors`;
its section "Error types", after the WER and tail-word sections, shows greedy decoding on clean audio). Every
comparison with a baseline is stated in one plain sentence (the two WERs and whether the difference is significant
after Holm's correction), its numbers (intervals, p-values) in the table beside the sentences, and
every run that was left out is listed with the reason. A configuration whose every seed is at
:data:`~analysis.collect.NOTHING_LEARNED_WER`% WER or more on every clean test set has not learned to transcribe: it
stays in the WER table and the CSVs, but no comparison, WERR table or figure is drawn from it (a sweep of such models
gets no figures at all, only the sentence saying why).

Sections that only a sweep with the data gets (a sweep without it gets the report it always got):

* beam decoders (``wer_<D>/...``): each against greedy decoding, Table 6's layout (:mod:`analysis.decoders`),
  ``decoders.csv`` and ``decoder_settings.csv``;
* window fusion (decoders ``fusion-<METHOD>``, paper 001): a "Decoding method" section after the decoders', WER
  per method and context, the context-length gain under each method and methods against averaging
  (:mod:`analysis.fusion`), ``fusion.csv`` and ``fusion_tests.csv``;
* the context-or-fragmentation controls (a banded or pause-cut model, or a decoder ``window-<W>s``): a "Context or
  fragmentation" section, each control against the dense models and a verdict by fixed rules
  (:mod:`analysis.fragmentation`), ``fragmentation.csv`` and ``fragmentation_tests.csv``;
* LM perplexity (``lm_ppl/...`` on LM runs): perplexity against LM context, ``lm_ppl.csv`` and a figure;
* head similarity (``heads/...``): against context per heads count and model size, beside WER, and whether it
  tracks WER (:mod:`analysis.heads`), ``heads.csv``, ``heads_tracking.csv`` and a figure per family;
* the planted cue (``cue_words``/``cue_errors`` in the per-recording tables): the cue-word error rate against context
  beside WER on all and on the other words, with paired tests against the shortest and the baseline context
  (:mod:`analysis.cue`), ``cue.csv`` and a figure per family;
* the recall plant (per-slot tables ``eval/<DATASET>.slots.csv``): a "Recall control" part of the positive-control
  section, slot accuracy by band, distance and context with the ceiling and guess-rate controls, far-band tests
  between context lengths and a verdict (:mod:`analysis.recall`), ``recall.csv`` and ``recall_tests.csv``;
* tail words (``tail_words``/``tail_errors`` in the per-recording tables of an evaluation given ``eval.tail``): a
  "Tail words (paper 002)" section after the WER section, tail-WER beside WER with paired tests against the baseline
  context and a verdict per group (:mod:`analysis.tail`), ``tail.csv`` and ``tail_tests.csv``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from analysis import cue
from analysis import decoders as dec
from analysis import errors as er
from analysis import fragmentation as fr
from analysis import fusion as fu
from analysis import heads as hd
from analysis import recall as rc
from analysis import stats
from analysis import tail as tl
from analysis.collect import NOTHING_LEARNED_WER, Sweep
from analysis.finding import Check, Gain, finding_checks, summary_sentence
from analysis.plots import Figure, Skipped, choose_main_family, draw_figures, draw_heads_figures, draw_ppl_figure
from analysis.render import (Section, decoder_display, external_pivot, fmt_num, fmt_p, heads_display, render_html,
                             render_markdown, settings_display, significance_display, snr_pivots, wer_pivot,
                             werr_pivot)
from analysis.werr import (DEFAULT_BASELINE_CONTEXT_S, baseline_notes, evaluation_notes, format_seconds,
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
    extra: list[Section] = []
    if sweep.beam_decoders:
        section, tables = _decoder_section(sweep, wer, alpha, level, bootstrap_resamples)
        extra.append(section)
        csvs.update(tables)
    if fu.has_fusion(sweep):
        section, tables = fu.section(sweep, baseline_context, alpha, level=level,
                                     bootstrap_resamples=bootstrap_resamples)
        extra.append(section)
        csvs.update(tables)
    if fr.has_controls(sweep):
        section, tables = fr.section(sweep, alpha, level=level, bootstrap_resamples=bootstrap_resamples)
        extra.append(section)
        csvs.update(tables)
    if not sweep.lm_ppl.empty:
        section = _ppl_section(sweep, out)
        extra.append(section)
        csvs["lm_ppl"] = sweep.lm_ppl
    if not sweep.heads.empty:
        section, tables = _heads_section(sweep, out, heads_representation, choose_main_family(sweep, main_family),
                                         alpha, unlearned_note(unlearned, n_configs, names=False)
                                         if nothing_learned else "")
        extra.append(section)
        csvs.update(tables)
    if cue.has_cues(sweep):
        section, table = _cue_section(sweep, out, baseline_context, alpha,
                                      unlearned_note(unlearned, n_configs, names=False) if nothing_learned else "")
        extra.append(section)
        csvs["cue"] = table
    if rc.has_slots(sweep):
        part, tables = _recall_part(sweep, alpha)
        if extra and extra[-1].title == CUE_TITLE:  # one positive-control section
            extra[-1] = _join(extra[-1], part)
        else:
            extra.append(part)
        csvs.update(tables)
    tail_section = None
    if tl.has_tail(sweep):
        tail_section, tables = tl.section(sweep, baseline_context, alpha)
        csvs.update(tables)
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
    sections[at:at] = ([tail_section] if tail_section is not None else []) + [error_section]
    figures = figures + [f for s in extra for f in s.figures]
    md_path, html_path = out / "report.md", out / "index.html"
    md_path.write_text(render_markdown(sweep, sections), encoding="utf-8")
    html_path.write_text(render_html(sweep, sections), encoding="utf-8")
    log.info("report written to %s in %.1f s", out, time.perf_counter() - t0)
    return Report(out, html_path, md_path, paths, figures, skipped, sig)


# ---- sections a sweep has only with the data: decoders, LM perplexity, head similarity -----------------------

def _decoder_section(sweep: Sweep, wer: pd.DataFrame, alpha: float, level: float, resamples: int
                     ) -> tuple[Section, dict[str, pd.DataFrame]]:
    settings = dec.decoder_settings(sweep)
    table = dec.decoder_table(sweep, alpha=alpha, level=level, bootstrap_resamples=resamples)
    compared = table[table["wer_greedy"].notna()]
    tested = table[table["p_permutation"].notna()]
    n_sig = int((tested["significant"] == True).sum())  # noqa: E712 (None means untested)
    better = int(((tested["significant"] == True) & (tested["werr"] > 0)).sum())  # noqa: E712
    paras = [
        f"Each configuration decoded by beam search is compared with its own greedy decoding, on the same "
        f"recordings and seeds. Cells: WER (%) (WERR against greedy, %; sig. / n.s.: the paired sign-flip "
        f"permutation test over recordings, per recording the errors averaged over the seeds both decoders have, "
        f"Holm-corrected across all the tested comparisons of this section at α = {alpha:g}; untested: no "
        f"per-recording tables). The greedy column is the configuration's WER over all its seeds, as in the WER "
        f"table. Intervals are {100 * level:g}% paired bootstrap percentiles over {resamples} resamples of "
        f"recordings and seeds (a seed drawn for both decoders: they decode one trained model).",
        f"{len(compared)} comparisons with greedy decoding, {len(tested)} tested: {n_sig} significant after Holm "
        f"correction ({better} of them better than greedy), {len(tested) - n_sig} not."]
    for _, s in settings.iterrows():
        if s["differs"]:
            paras.append(f"**Decoder {s['decoder']} ran with other settings on some runs** ({s['differs']} differ "
                         f"between their tags eval.decoder.{s['decoder']}); its column mixes them.")
    tables = [("Decoders (settings from each run's tag eval.decoder.<name>)", settings_display(settings))]
    tables += [(f"WER (%) by decoder: {title}", pv) for title, pv in dec.table6_pivots(table, settings, wer)]
    tables.append(("Every comparison with greedy decoding", decoder_display(table)))
    gains = dec.context_gains(table)
    bullets = [("Short against long acoustic context with the LM", gains)] if gains else []
    section = Section("Beam search and LM decoding against greedy (paper 004 Table 6)", paras, tables, [], bullets)
    return section, {"decoders": table, "decoder_settings": settings}


def _ppl_section(sweep: Sweep, out: Path) -> Section:
    fig = draw_ppl_figure(sweep.lm_ppl, out)
    paras = ["Per-token perplexity of each LM (python -m asr_core lm ppl: metrics lm_ppl/<dataset>/ctx<N> of its "
             "run), found among the sweep's runs, the LM runs its decoders name and the experiments given with "
             "--lm-experiment. Columns: LM context in tokens."]
    sentences = dec.ppl_sentences(sweep)
    return Section("LM perplexity against LM context (paper 004 Table 5)", paras,
                    [("", dec.ppl_table(sweep))], [fig] if fig else [], [("", sentences)] if sentences else [])


def _heads_section(sweep: Sweep, out: Path, representation: str, main_family: str | None, alpha: float,
                   no_figures: str = "") -> tuple[Section, dict[str, pd.DataFrame]]:
    """``no_figures``: why no figure is drawn ("" to draw them)."""
    families = hd.head_families(sweep, main_family)
    table = hd.heads_table(sweep, families)
    tracking = hd.tracking_table(table, representation, alpha=alpha)
    figs, skipped = draw_heads_figures(sweep, table, out, representation) if not no_figures else ([], [])
    paras = [
        f"How alike the attention heads are (paper 003), measured by each trial after evaluation "
        f"(heads/<dataset>/<R>/sum: eq. 6 summed over layers, 0 for orthogonal heads, (N − 1)/N per layer for "
        f"identical ones), against context length in families {', '.join(families) or '–'} (those whose series "
        f"differ in heads or model size, else the main family). {representation} is drawn and correlated with WER; "
        f"every representation is in the tables and heads.csv.",
        hd.tracking_summary(tracking, representation, alpha)]
    tables = heads_display(table, representation)
    if not tracking.empty:
        tables.append((f"Does summed {representation} similarity track WER across context?", pd.DataFrame({
            "family": tracking["family"], "configuration": tracking["series"], "dataset": tracking["dataset"],
            "contexts": tracking["n_contexts"], "Spearman ρ": [fmt_num(x, 2, True) for x in tracking["rho"]],
            "p perm": tracking["p_permutation"].map(fmt_p), "p Holm": tracking["p_holm"].map(fmt_p),
            "WER degrades at long context": tracking["degrades"].map({True: "yes", False: "no"})})))
    bullets = [("", list(tracking["sentence"]))] if not tracking.empty else []
    if skipped:
        bullets.append(("", [f"{s.title} — not drawn: {s.reason}." for s in skipped]))
    if no_figures:
        bullets.append(("", [f"Figures not drawn: {no_figures}."]))
    section = Section("Head similarity (paper 003) against context length", paras, tables, figs, bullets)
    return section, {"heads": table, "heads_tracking": tracking}


def _cue_section(sweep: Sweep, out: Path, baseline_context: float, alpha: float, no_figures: str = ""
                 ) -> tuple[Section, pd.DataFrame]:
    """``no_figures``: why no figure is drawn ("" to draw them)."""
    table = cue.cue_table(sweep, baseline_context)
    paras = [
        "The synthetic corpus plants homophones whose spelling only a word far back decides (20–60 s by default; "
        "docs/ARCHITECTURE.md, \"Planted cue\"): a model that uses long context must get them right more often as its "
        "context grows, so this is the sweep's positive control; WER on the words that are not planted is the "
        "matching null. Cue-word error rate: planted words substituted or deleted over all planted words, pooled "
        "over recordings, greedy decoding, mean ± sd over seeds. WER on the other words: per recording the errors "
        "less the cue errors over the words less the cue words (insertions count there).",
        f"Tests: the paired sign-flip permutation test over recordings (the WER section's), of each context against "
        f"the series' shortest and against {format_seconds(baseline_context)}: on per-recording cue-word error "
        f"rates (errors averaged over seeds; recordings without cue words left out) and, for WER and the other "
        f"words, on per-recording error counts. Each measure's p-values are Holm-corrected across every comparison "
        f"of this section; significant: adjusted p < {alpha:g}."]
    figs = cue.draw_cue_figures(sweep, table, out) if not no_figures else []
    bullets = [("Shortest against longest context", cue.verdicts(table, alpha))]
    if no_figures:
        bullets.append(("", [f"Figure not drawn: {no_figures}."]))
    section = Section(CUE_TITLE, paras, cue.display(table, baseline_context), figs, bullets)
    return section, table


CUE_TITLE = "Planted cue (positive control)"
RECALL_TITLE = "Recall control (positive control)"


def _recall_part(sweep: Sweep, alpha: float) -> tuple[Section, dict[str, pd.DataFrame]]:
    """The recall control: its own section, or the part :func:`_join` adds to the planted cue's."""
    rates = rc.rate_table(sweep)
    tests = rc.far_tests(sweep, rates)
    paras = [
        "**Recall control.** The synthetic corpus says a code word clearly (\"the code word is X\") and later asks "
        "for it again with its audio masked by noise (\"remember the code word X\"; python -m asr_core synth "
        "--recall): the masked word can only be recalled from the context, 1-4 s back (near band, inside every "
        "window) or 20-60 s back (far band). Accuracy: slots whose aligned hypothesis word is the code word, pooled "
        "over slots, greedy decoding with the moving windows of the evaluation, mean ± sd over seeds; masked slots "
        "with a key sentence by band and distance, the ceiling (unmasked slots) and the guess rate (masked slots "
        "of recordings without a key sentence; chance is 1/8).",
        f"Tests: each context against the series' shortest on far-band accuracy, the paired sign-flip permutation "
        f"test over recordings (per recording the far slots missed, averaged over seeds, over its far slots), "
        f"Holm-corrected across every comparison of this part; significant: adjusted p < {alpha:g}."]
    shown, lines, choice_csvs = rc.choice_part(sweep, rates, alpha)
    bullets = [("Recall control: shortest against longest context", rc.verdicts(rates, tests, alpha))]
    if lines:  # the forced choice among the slot's candidates (one window per slot), and the copy plant's criteria
        paras.append(rc.ch.CHOICE_TEXT)
        bullets.append(("Copy control: criteria N1, F1-F3 (forced choice, one window per slot, clean)", lines))
    return Section(RECALL_TITLE, paras, rc.display(rates, tests) + shown, [], bullets), {
        "recall": rates, "recall_tests": tests, **choice_csvs}


def _join(section: Section, part: Section) -> Section:
    """``section`` with ``part``'s paragraphs, tables, figures and bullets after its own."""
    return Section(section.title, section.paragraphs + part.paragraphs, section.tables + part.tables,
                   section.figures + part.figures, section.bullets + part.bullets)


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


