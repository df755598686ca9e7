"""The report's optional sections as plug-ins: each a module's section that a sweep gets only with the data for it
(beam decoders, window fusion, the fragmentation controls, LM perplexity, head similarity, the planted cue, the
recall control, tail words), registered in :data:`SECTIONS`.

A plug-in (:class:`SectionPlugin`) names itself, says whether a sweep has its data (``present``) and builds its
section and CSV tables from the report's :class:`Context`. :func:`analysis.document.report.build_report` loops over
:data:`SECTIONS` in order: each present plug-in's section goes before "Runs left out" (or right after the WER section,
``after_wer``), its tables into the report's CSVs; a plug-in with ``joins`` adds its part to the section of that
title when that section was built just before it (the recall control's part of the planted cue's positive-control
section). A new section is one function that builds it and one line here; ``build_report`` stays as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.features import cue
from analysis.features import decoders as dec
from analysis.features import fragmentation as fr
from analysis.features import fusion as fu
from analysis.features import heads as hd
from analysis.features import recall as rc
from analysis.features import tail as tl
from analysis.ledger.collect import Sweep
from analysis.display.plots import choose_main_family, draw_heads_figures, draw_ppl_figure
from analysis.display.render import Section, fmt_num, fmt_p
from analysis.significance.werr import format_seconds


@dataclass(frozen=True)
class Context:
    """What a section is built from: the sweep, the report's folder (for figures), the WER table, the report's
    settings, and ``no_figures``: why no figure is drawn ("" to draw them: the sweep has models that learned)."""

    sweep: Sweep
    out: Path
    wer: pd.DataFrame
    baseline_context: float
    alpha: float
    level: float
    resamples: int
    heads_representation: str
    main_family: str | None
    no_figures: str = ""


@dataclass(frozen=True)
class Part:
    """A built section and its CSV tables ({file stem: table})."""

    section: Section
    tables: dict[str, pd.DataFrame]


@dataclass(frozen=True)
class SectionPlugin:
    """One optional section: ``name``; ``present(sweep)``: whether the sweep has its data; ``build(context)``: the
    section and tables; ``joins``: the title of a section this one's part joins when that one was built just before
    it; ``after_wer``: placed right after the WER section instead of before "Runs left out"."""

    name: str
    present: Callable[[Sweep], bool]
    build: Callable[[Context], Part]
    joins: str | None = None
    after_wer: bool = False


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
    tables = [("Decoders (settings from each run's tag eval.decoder.<name>)", dec.settings_display(settings))]
    tables += [(f"WER (%) by decoder: {title}", pv) for title, pv in dec.table6_pivots(table, settings, wer)]
    tables.append(("Every comparison with greedy decoding", dec.decoder_display(table)))
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
    tables = hd.heads_display(table, representation)
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


# ---- the registry -------------------------------------------------------------------------------------------

def _decoders(c: Context) -> Part:
    return Part(*_decoder_section(c.sweep, c.wer, c.alpha, c.level, c.resamples))


def _fusion(c: Context) -> Part:
    return Part(*fu.section(c.sweep, c.baseline_context, c.alpha, level=c.level, bootstrap_resamples=c.resamples))


def _fragmentation(c: Context) -> Part:
    return Part(*fr.section(c.sweep, c.alpha, level=c.level, bootstrap_resamples=c.resamples))


def _ppl(c: Context) -> Part:
    return Part(_ppl_section(c.sweep, c.out), {"lm_ppl": c.sweep.lm_ppl})


def _heads(c: Context) -> Part:
    return Part(*_heads_section(c.sweep, c.out, c.heads_representation, choose_main_family(c.sweep, c.main_family),
                                c.alpha, c.no_figures))


def _cue(c: Context) -> Part:
    section, table = _cue_section(c.sweep, c.out, c.baseline_context, c.alpha, c.no_figures)
    return Part(section, {"cue": table})


def _recall(c: Context) -> Part:
    return Part(*_recall_part(c.sweep, c.alpha))


def _tail(c: Context) -> Part:
    return Part(*tl.section(c.sweep, c.baseline_context, c.alpha))


# in the report's order
SECTIONS: list[SectionPlugin] = [
    SectionPlugin("decoders", lambda s: bool(s.beam_decoders), _decoders),
    SectionPlugin("fusion", fu.has_fusion, _fusion),
    SectionPlugin("fragmentation", fr.has_controls, _fragmentation),
    SectionPlugin("lm_ppl", lambda s: not s.lm_ppl.empty, _ppl),
    SectionPlugin("heads", lambda s: not s.heads.empty, _heads),
    SectionPlugin("cue", cue.has_cues, _cue),
    SectionPlugin("recall", rc.has_slots, _recall, joins=CUE_TITLE),
    SectionPlugin("tail", tl.has_tail, _tail, after_wer=True),
]


@dataclass(frozen=True)
class Built:
    """The optional sections of one report: those before "Runs left out" (``extra``), those right after the WER
    section (``after_wer``), and every table ({file stem: table}, in the order built)."""

    extra: list[Section]
    after_wer: list[Section]
    tables: dict[str, pd.DataFrame]


def build_sections(context: Context, plugins: list[SectionPlugin] | None = None) -> Built:
    """Every present plug-in of ``plugins`` (default :data:`SECTIONS`) built, in order."""
    extra: list[Section] = []
    after: list[Section] = []
    tables: dict[str, pd.DataFrame] = {}
    for plugin in SECTIONS if plugins is None else plugins:
        if not plugin.present(context.sweep):
            continue
        part = plugin.build(context)
        tables.update(part.tables)
        where = after if plugin.after_wer else extra
        if plugin.joins is not None and where and where[-1].title == plugin.joins:
            where[-1] = _join(where[-1], part.section)
        else:
            where.append(part.section)
    return Built(extra, after, tables)
