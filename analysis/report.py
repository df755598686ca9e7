"""``python -m analysis report``: one folder a reader can publish, built from a sweep in MLflow.

``OUT/index.html`` (self-contained: figures embedded as base64 PNG, inline CSS), ``OUT/report.md`` (figures linked
beside it), the PNGs, and CSVs: ``wer.csv``, ``werr.csv``, ``significance.csv``, ``snr.csv``, ``problems.csv``,
``trials.csv``, ``external.csv`` (other systems scored by ``python -m asr_core score``, also a table beside the
models' WER). Every comparison with a baseline is stated in words — significant or not after Holm's correction,
with its p-values and intervals — and every run that was left out is listed with the reason.

Sections that only a sweep with the data gets (a sweep without it gets the report it always got):

* beam decoders (``wer_<D>/...``): each against greedy decoding, Table 6's layout (:mod:`analysis.decoders`),
  ``decoders.csv`` and ``decoder_settings.csv``;
* LM perplexity (``lm_ppl/...`` on LM runs): perplexity against LM context, ``lm_ppl.csv`` and a figure;
* head similarity (``heads/...``): against context per heads count and model size, beside WER, and whether it
  tracks WER (:mod:`analysis.heads`), ``heads.csv``, ``heads_tracking.csv`` and a figure per family;
* the planted cue (``cue_words``/``cue_errors`` in the per-recording tables): the cue-word error rate against context
  beside WER on all and on the other words, with paired tests against the shortest and the baseline context
  (:mod:`analysis.cue`), ``cue.csv`` and a figure per family.
"""

from __future__ import annotations

import base64
import html
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import pandas as pd

from . import cue
from . import decoders as dec
from . import heads as hd
from . import stats
from .collect import CLEAN, Sweep
from .finding import Check, Gain, finding_checks, summary_sentence
from .plots import Figure, Skipped, choose_main_family, draw_figures, draw_heads_figures, draw_ppl_figure
from .werr import (DEFAULT_BASELINE_CONTEXT_S, baseline_notes, evaluation_notes, format_seconds, significance_table,
                   snr_table, wer_table, werr_table)

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


# ---- formatting ----------------------------------------------------------------------------------------------

def fmt_p(p: float) -> str:
    if p is None or not math.isfinite(p):
        return "–"
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def fmt_num(x: float, digits: int = 2, sign: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def sentence(row: pd.Series, level: float, alpha: float) -> str:
    """One comparison with its baseline in plain words."""
    head = (f"{row['config']} ({format_seconds(row['context_s'])}) vs {row['baseline_config']} "
            f"({format_seconds(row['baseline_context_s'])}) on {row['dataset']}"
            + ("" if row["condition"] == CLEAN else f" with music at {row['snr_db']:g} dB"))
    if not math.isfinite(row["p_permutation"]):
        return f"{head}: **not tested** — {row['note']}"
    lv = f"{100 * level:g}% CI"
    text = (f"{head}: WER {fmt_num(row['wer_baseline'])}% → {fmt_num(row['wer'])}%, WERR "
            f"{fmt_num(row['werr'], 1, True)}% [{lv} {fmt_num(row['werr_lo'], 1, True)}, "
            f"{fmt_num(row['werr_hi'], 1, True)}], ΔWER {fmt_num(row['delta_wer'], 2, True)} points "
            f"[{fmt_num(row['delta_lo'], 2, True)}, {fmt_num(row['delta_hi'], 2, True)}]; permutation p = "
            f"{fmt_p(row['p_permutation'])} ({row['permutation']}, {int(row['n_recordings'])} recordings), "
            f"Holm-adjusted p = {fmt_p(row['p_holm'])}; Wilcoxon p = {fmt_p(row['p_wilcoxon'])}; sign test "
            f"p = {fmt_p(row['p_sign'])} (better on {int(row['n_better'])}, worse on {int(row['n_worse'])} "
            f"recordings); Welch p = {fmt_p(row['p_welch'])} (seeds). ")
    v = row["verdict"]
    if v == "not significant":
        text += f"**Not significant** at α = {alpha:g} after Holm correction: no evidence of a difference."
    elif v.startswith("significantly") and "(may be seed variation)" not in v:
        text += f"**{v.capitalize()}** at α = {alpha:g} after Holm correction."
    else:
        text += f"**{v.capitalize()}**."
    if row.get("note"):
        text += f" Note: {row['note']}."
    return text


def md_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "_(none)_\n"
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(v).replace("|", "\\|") for v in r.values) + " |")
    return "\n".join(lines) + "\n"


def html_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "<p><em>(none)</em></p>"
    return df.to_html(index=False, escape=True, border=0, classes="t", na_rep="–")


def _wer_pivot(wer: pd.DataFrame) -> pd.DataFrame:
    """Configurations × dataset/condition, 'mean ± sd (n)'."""
    if wer.empty:
        return pd.DataFrame()
    cell = wer.assign(
        col=[ds if c == CLEAN else f"{ds} {c}" for ds, c in zip(wer["dataset"], wer["condition"])],
        val=[f"{m:.2f} ± {s:.2f} ({n})" if math.isfinite(s) else f"{m:.2f} ({n})"
             for m, s, n in zip(wer["wer_mean"], wer["wer_sd"], wer["n_seeds"])])
    order = list(dict.fromkeys(cell.sort_values(["dataset", "snr_db"], na_position="first")["col"]))
    out = cell.pivot_table(index=["series", "context_s", "config"], columns="col", values="val", aggfunc="first")
    out = out[order].reset_index().sort_values(["series", "context_s"])
    out["context_s"] = out["context_s"].map(format_seconds)
    return out.rename(columns={"context_s": "context"})


def _external_pivot(external: pd.DataFrame) -> pd.DataFrame:
    """Systems × dataset/condition, WER in percent."""
    cell = external.assign(col=[ds if c == CLEAN else f"{ds} {c}"
                                for ds, c in zip(external["dataset"], external["condition"])])
    order = list(dict.fromkeys(cell.sort_values(["dataset", "snr_db"], na_position="first")["col"]))
    out = cell.pivot_table(index="system", columns="col", values="wer", aggfunc="first")
    return out[order].round(2).reset_index()


def _werr_pivot(werr: pd.DataFrame, family: str) -> pd.DataFrame:
    part = werr[(werr["family"] == family) & (werr["condition"] == CLEAN)]
    if part.empty:
        return pd.DataFrame()
    part = part.assign(val=[f"{w:+.1f} [{lo:+.1f}, {hi:+.1f}]" for w, lo, hi in
                            zip(part["werr"], part["werr_min"], part["werr_max"])])
    out = part.pivot_table(index=["series", "context_s"], columns="dataset", values="val", aggfunc="first")
    out = out.reset_index().sort_values(["series", "context_s"])
    out["context_s"] = out["context_s"].map(format_seconds)
    return out.rename(columns={"context_s": "context"})


def _snr_pivots(snr: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    out = []
    for (fam, series, ds), grp in snr.groupby(["family", "series", "dataset"], sort=True):
        g = grp.assign(col=["clean" if c == CLEAN else f"{s:g} dB" for c, s in zip(grp["condition"], grp["snr_db"])])
        order = ["clean"] + [f"{s:g} dB" for s in sorted(grp["snr_db"].dropna().unique(), reverse=True)]
        pv = g.pivot_table(index="context_s", columns="col", values="werr", aggfunc="first")
        pv = pv[[c for c in order if c in pv.columns]].round(2).reset_index()
        pv["context_s"] = pv["context_s"].map(format_seconds)
        out.append((f"{fam} / {series} / {ds}", pv.rename(columns={"context_s": "context"})))
    return out


def _sig_display(sig: pd.DataFrame) -> pd.DataFrame:
    if sig.empty:
        return sig
    return pd.DataFrame({
        "family": sig["family"], "series": sig["series"], "dataset": sig["dataset"], "condition": sig["condition"],
        "context": sig["context_s"].map(format_seconds), "vs": sig["baseline_context_s"].map(format_seconds),
        "WERR %": [fmt_num(x, 1, True) for x in sig["werr"]],
        "WERR CI": [f"[{fmt_num(a, 1, True)}, {fmt_num(b, 1, True)}]" for a, b in zip(sig["werr_lo"], sig["werr_hi"])],
        "ΔWER": [fmt_num(x, 2, True) for x in sig["delta_wer"]],
        "ΔWER CI": [f"[{fmt_num(a, 2, True)}, {fmt_num(b, 2, True)}]" for a, b in zip(sig["delta_lo"], sig["delta_hi"])],
        "p perm": sig["p_permutation"].map(fmt_p), "p Holm": sig["p_holm"].map(fmt_p),
        "p Wilcoxon": sig["p_wilcoxon"].map(fmt_p), "p sign": sig["p_sign"].map(fmt_p),
        "p Welch": sig["p_welch"].map(fmt_p), "verdict": sig["verdict"]})


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
    figures, skipped = draw_figures(sweep, werr, wer, out, baseline_context=baseline_context,
                                    main_family=main_family)
    notes = baseline_notes(sweep, baseline_context) + evaluation_notes(sweep)
    checks, gains = finding_checks(sweep, alpha=alpha, wer=wer)

    csvs = {"wer": wer, "werr": werr, "significance": sig, "snr": snr, "problems": sweep.problems,
            "trials": sweep.trials, "finding": _finding_frame(checks, gains), "external": sweep.external}
    extra: list[_Section] = []
    if sweep.beam_decoders:
        section, tables = _decoder_section(sweep, wer, alpha, level, bootstrap_resamples)
        extra.append(section)
        csvs.update(tables)
    if not sweep.lm_ppl.empty:
        section = _ppl_section(sweep, out)
        extra.append(section)
        csvs["lm_ppl"] = sweep.lm_ppl
    if not sweep.heads.empty:
        section, tables = _heads_section(sweep, out, heads_representation, choose_main_family(sweep, main_family),
                                         alpha)
        extra.append(section)
        csvs.update(tables)
    if cue.has_cues(sweep):
        section, table = _cue_section(sweep, out, baseline_context, alpha)
        extra.append(section)
        csvs["cue"] = table
    paths = {}
    for name, df in csvs.items():
        paths[name] = out / f"{name}.csv"
        df.to_csv(paths[name], index=False)

    sections = _sections(sweep, wer, werr, snr, sig, figures, skipped, notes, baseline_context, alpha, level,
                         bootstrap_resamples)
    sections.insert(1, _finding_section(checks))
    at = next(i for i, s in enumerate(sections) if s.title == RUNS_LEFT_OUT)
    sections[at:at] = extra
    figures = figures + [f for s in extra for f in s.figures]
    md_path, html_path = out / "report.md", out / "index.html"
    md_path.write_text(_markdown(sweep, sections), encoding="utf-8")
    html_path.write_text(_html(sweep, sections), encoding="utf-8")
    log.info("report written to %s in %.1f s", out, time.perf_counter() - t0)
    return Report(out, html_path, md_path, paths, figures, skipped, sig)


# ---- sections a sweep has only with the data: decoders, LM perplexity, head similarity ------------------------

def _decoder_display(table: pd.DataFrame) -> pd.DataFrame:
    """Every decoder comparison with its p-values and intervals."""
    return pd.DataFrame({
        "dataset": table["dataset"], "condition": table["condition"], "config": table["config"],
        "decoder": table["label"], "seeds": table["seeds"], "WER greedy": table["wer_greedy"].map(fmt_num),
        "WER": table["wer"].map(fmt_num), "WERR %": [fmt_num(x, 1, True) for x in table["werr"]],
        "WERR CI": [f"[{fmt_num(a, 1, True)}, {fmt_num(b, 1, True)}]" for a, b in zip(table["werr_lo"],
                                                                                       table["werr_hi"])],
        "ΔWER": [fmt_num(x, 2, True) for x in table["delta_wer"]],
        "p perm": table["p_permutation"].map(fmt_p), "p Holm": table["p_holm"].map(fmt_p),
        "verdict": table["verdict"], "note": table["note"]})


def _settings_display(settings: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "decoder": settings["decoder"], "column": settings["label"],
        "LM": [n or (Path(lm).parent.name + "/" + Path(lm).name if lm and lm != dec.NO_LM else lm or "?")
               for n, lm in zip(settings["lm_name"], settings["lm"])],
        "LM context": [f"{int(c)}" if math.isfinite(c) else "–" for c in settings["lm_context"]],
        "alpha": settings["alpha"], "beta": settings["beta"], "beam width": settings["beam_width"],
        "prompt": [Path(p).name if p else "–" for p in settings["prompt"]], "runs": settings["runs"]})


def _decoder_section(sweep: Sweep, wer: pd.DataFrame, alpha: float, level: float, resamples: int
                     ) -> tuple["_Section", dict[str, pd.DataFrame]]:
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
    tables = [("Decoders (settings from each run's tag eval.decoder.<name>)", _settings_display(settings))]
    tables += [(f"WER (%) by decoder: {title}", pv) for title, pv in dec.table6_pivots(table, settings, wer)]
    tables.append(("Every comparison with greedy decoding", _decoder_display(table)))
    gains = dec.context_gains(table)
    bullets = [("Short against long acoustic context with the LM", gains)] if gains else []
    section = _Section("Beam search and LM decoding against greedy (paper 004 Table 6)", paras, tables, [], bullets)
    return section, {"decoders": table, "decoder_settings": settings}


def _ppl_section(sweep: Sweep, out: Path) -> "_Section":
    fig = draw_ppl_figure(sweep.lm_ppl, out)
    paras = ["Per-token perplexity of each LM (python -m asr_core lm ppl: metrics lm_ppl/<dataset>/ctx<N> of its "
             "run), found among the sweep's runs, the LM runs its decoders name and the experiments given with "
             "--lm-experiment. Columns: LM context in tokens."]
    sentences = dec.ppl_sentences(sweep)
    return _Section("LM perplexity against LM context (paper 004 Table 5)", paras,
                    [("", dec.ppl_table(sweep))], [fig] if fig else [], [("", sentences)] if sentences else [])


def _heads_display(table: pd.DataFrame, representation: str) -> list[tuple[str, pd.DataFrame]]:
    out = []
    for (fam, ds), grp in table.groupby(["family", "dataset"], sort=True):
        sums = grp.pivot_table(index=["series", "context_s", "config"], columns="representation", values="sum_mean",
                               aggfunc="first")
        sums = sums[[r for r in hd.REPRESENTATIONS if r in sums.columns]].map(lambda x: fmt_num(x, 3))
        sums.columns = [f"Σ {r}" for r in sums.columns]
        chosen = grp[grp["representation"] == representation].set_index(["series", "context_s", "config"])
        sums[f"mean cos {representation}"] = chosen["similarity_mean"].map(lambda x: fmt_num(x, 3))
        sums.insert(0, f"WER {ds} %", chosen["wer_mean"].map(fmt_num))
        sums.insert(1, "seeds", chosen["n_seeds"])
        view = sums.reset_index().sort_values(["series", "context_s"])
        view["context_s"] = view["context_s"].map(format_seconds)
        out.append((f"Family {fam}, {ds}: greedy clean WER and summed head similarity (003 eq. 6 over layers; "
                    f"higher = heads more alike), means over seeds", view.rename(columns={"context_s": "context"})))
    return out


def _heads_section(sweep: Sweep, out: Path, representation: str, main_family: str | None, alpha: float
                   ) -> tuple["_Section", dict[str, pd.DataFrame]]:
    families = hd.head_families(sweep, main_family)
    table = hd.heads_table(sweep, families)
    tracking = hd.tracking_table(table, representation, alpha=alpha)
    figs, skipped = draw_heads_figures(sweep, table, out, representation)
    paras = [
        f"How alike the attention heads are (paper 003), measured by each trial after evaluation "
        f"(heads/<dataset>/<R>/sum: eq. 6 summed over layers, 0 for orthogonal heads, (N − 1)/N per layer for "
        f"identical ones), against context length in families {', '.join(families) or '–'} (those whose series "
        f"differ in heads or model size, else the main family). {representation} is drawn and correlated with WER; "
        f"every representation is in the tables and heads.csv.",
        hd.tracking_summary(tracking, representation, alpha)]
    tables = _heads_display(table, representation)
    if not tracking.empty:
        tables.append((f"Does summed {representation} similarity track WER across context?", pd.DataFrame({
            "family": tracking["family"], "configuration": tracking["series"], "dataset": tracking["dataset"],
            "contexts": tracking["n_contexts"], "Spearman ρ": [fmt_num(x, 2, True) for x in tracking["rho"]],
            "p perm": tracking["p_permutation"].map(fmt_p), "p Holm": tracking["p_holm"].map(fmt_p),
            "WER degrades at long context": tracking["degrades"].map({True: "yes", False: "no"})})))
    bullets = [("", list(tracking["sentence"]))] if not tracking.empty else []
    if skipped:
        bullets.append(("", [f"{s.title} — not drawn: {s.reason}." for s in skipped]))
    section = _Section("Head similarity (paper 003) against context length", paras, tables, figs, bullets)
    return section, {"heads": table, "heads_tracking": tracking}


def _cue_section(sweep: Sweep, out: Path, baseline_context: float, alpha: float
                 ) -> tuple["_Section", pd.DataFrame]:
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
    figs = cue.draw_cue_figures(sweep, table, out)
    section = _Section("Planted cue (positive control)", paras, cue.display(table, baseline_context), figs,
                       [("Shortest against longest context", cue.verdicts(table, alpha))])
    return section, table


def _finding_frame(checks: list[Check], gains: list[Gain]) -> pd.DataFrame:
    rows = [{"kind": "claim", "claim": c.claim, "verdict": c.verdict, "detail": c.detail} for c in checks]
    rows += [{"kind": "gain", "dataset": g.dataset, "condition": g.condition, "wer_short": g.wer_short,
              "wer_long": g.wer_long, "werr": g.werr, "p_permutation": g.p, "p_holm": g.p_holm} for g in gains]
    return pd.DataFrame(rows)


def _finding_section(checks: list[Check]) -> "_Section":
    return _Section("The paper's finding in this sweep", [summary_sentence(checks)], [], [],
                    [("", [f"**{c.verdict.capitalize()}**: {c.claim}. {c.detail}." for c in checks])])


RUNS_LEFT_OUT = "Runs left out"


@dataclass
class _Section:
    title: str
    paragraphs: list[str]
    tables: list[tuple[str, pd.DataFrame]]
    figures: list[Figure]
    bullets: list[tuple[str, list[str]]]  # (sub-heading or "", items)


def _sections(sweep: Sweep, wer: pd.DataFrame, werr: pd.DataFrame, snr: pd.DataFrame, sig: pd.DataFrame,
              figures: list[Figure], skipped: list[Skipped], notes: list[str], baseline_context: float,
              alpha: float, level: float, resamples: int) -> list[_Section]:
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
    secs = [_Section("Overview", overview, [], [], [])]

    findings: list[str] = []
    if not sig.empty:
        tested = sig[sig["p_permutation"].notna()]
        n_sig = int((tested["significant"] == True).sum())  # noqa: E712 (None means untested)
        findings.append(f"{len(sig)} comparisons with a baseline, {len(tested)} tested: {n_sig} significant at "
                        f"α = {alpha:g} after Holm correction, {len(tested) - n_sig} not.")
    headline = _headline(sig)
    bullets = []
    ordered = sig.sort_values(["family", "series", "dataset", "snr_db", "context_s"], na_position="first")
    for (fam, series), grp in ordered.groupby(["family", "series"], sort=False):
        bullets.append((f"Family {fam}, series {series}", [sentence(r, level, alpha) for _, r in grp.iterrows()]))
    if not bullets:
        findings.append("No comparison with a baseline could be made: no family has finished models at the "
                        "baseline context and at another context length.")
    secs.append(_Section("Figures", [], [], figures,
                         [("", [f"{s.title} — not drawn: {s.reason}." for s in skipped])] if skipped else []))
    summary = [("Summary per family and dataset (clean audio; Holm-corrected permutation tests)", headline)] \
        if not headline.empty else []
    secs.append(_Section("Findings: each context length against the baseline", findings, summary, [], bullets))
    tables = [("WER (%) per configuration: mean ± sd over seeds (number of seeds)", _wer_pivot(wer))]
    if not sweep.external.empty:
        tables.append(("WER (%) of other systems on the same test sets (python -m asr_core score: the same "
                       "references and normaliser)", _external_pivot(sweep.external)))
    for fam in sweep.families:
        pv = _werr_pivot(werr, fam)
        if not pv.empty:
            tables.append((f"WERR (%) from {format_seconds(baseline_context)}, family {fam}, clean: mean "
                           f"[min, max over seeds]", pv))
    secs.append(_Section("WER and WERR", [], tables, [], [("", notes)] if notes else []))
    if not snr.empty:
        secs.append(_Section("Noise robustness: WERR (%) from the baseline at each SNR", [], _snr_pivots(snr), [],
                             []))
    secs.append(_Section("Significance table", [], [("", _sig_display(sig))], [], []))
    secs.append(_Section(RUNS_LEFT_OUT, [] if not sweep.problems.empty else ["None: every trial run finished "
                                                                              "with all its metrics and tables."],
                         [("", sweep.problems[["label", "status", "problem"]])] if not sweep.problems.empty else [],
                         [], []))
    secs.append(_Section("Methods", [_methods(alpha, level, resamples, baseline_context)], [], [], []))
    return secs


def _markdown(sweep: Sweep, sections: Iterable[_Section]) -> str:
    parts = [f"# Sweep `{sweep.experiment}`: WER against context length\n"]
    for s in sections:
        parts.append(f"\n## {s.title}\n")
        parts.extend(p + "\n" for p in s.paragraphs)
        for title, df in s.tables:
            if title:
                parts.append(f"\n**{title}**\n")
            parts.append("\n" + md_table(df))
        for f in s.figures:
            parts.append(f"\n![{f.title}]({f.path.name})\n\n*{f.title}.* {f.caption}\n")
        for sub, items in s.bullets:
            if sub:
                parts.append(f"\n### {sub}\n")
            parts.append("\n" + "\n".join(f"- {b}" for b in items) + "\n")
    return "".join(parts)


_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table.t{border-collapse:collapse;font-size:0.85em;margin:0.5em 0 1.5em}
table.t th,table.t td{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left}
figure{margin:1em 0}img{max-width:100%}li{margin:0.3em 0}code{background:#f4f4f4}"""


def _inline_md(text: str) -> str:
    """The little Markdown the sentences use (**bold**, `code`) as HTML, everything else escaped."""
    out = html.escape(text)
    while "**" in out:
        out = out.replace("**", "<strong>", 1).replace("**", "</strong>", 1)
    while "`" in out:
        out = out.replace("`", "<code>", 1).replace("`", "</code>", 1)
    return out


def _html(sweep: Sweep, sections: Iterable[_Section]) -> str:
    body = [f"<h1>Sweep <code>{html.escape(sweep.experiment)}</code>: WER against context length</h1>"]
    for s in sections:
        body.append(f"<h2>{html.escape(s.title)}</h2>")
        body.extend(f"<p>{_inline_md(p)}</p>" for p in s.paragraphs)
        for title, df in s.tables:
            if title:
                body.append(f"<h3>{html.escape(title)}</h3>")
            body.append(html_table(df))
        for f in s.figures:
            data = base64.b64encode(f.path.read_bytes()).decode("ascii")
            body.append(f'<figure><img alt="{html.escape(f.title)}" src="data:image/png;base64,{data}">'
                        f"<figcaption><strong>{html.escape(f.title)}.</strong> {html.escape(f.caption)}"
                        f"</figcaption></figure>")
        for sub, items in s.bullets:
            if sub:
                body.append(f"<h3>{html.escape(sub)}</h3>")
            body.append("<ul>" + "".join(f"<li>{_inline_md(b)}</li>" for b in items) + "</ul>")
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(sweep.experiment)}</title>"
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n")
