"""How the report is written: numbers and tables as text, the tables' display layouts, and the sections as
Markdown (``report.md``) and as one self-contained HTML page (``index.html``, figures embedded as base64 PNG, inline
CSS). What the report says is decided in :mod:`analysis.document.report`; this module only lays it out.
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass
from typing import Iterable

import pandas as pd

from analysis.ledger.collect import Sweep
from analysis.display.plots import Figure
from analysis.significance.werr import format_seconds
from asr_core.contract.metrics import CLEAN


@dataclass
class Section:
    """One section of the report: its paragraphs, then its tables (titled or not), figures and bullet lists."""

    title: str
    paragraphs: list[str]
    tables: list[tuple[str, pd.DataFrame]]
    figures: list[Figure]
    bullets: list[tuple[str, list[str]]]  # (sub-heading or "", items)


# ---- numbers and tables as text ------------------------------------------------------------------------------

def fmt_p(p: float) -> str:
    """A p-value: two significant digits below 0.001, else three decimals; "–" where untested."""
    if p is None or not math.isfinite(p):
        return "–"
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def fmt_num(x: float, digits: int = 2, sign: bool = False) -> str:
    """``x`` with ``digits`` decimals (and its sign with ``sign``); "–" where not finite."""
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def md_table(df: pd.DataFrame) -> str:
    """A Markdown table of ``df`` (``|`` in cells escaped)."""
    if df.empty:
        return "_(none)_\n"
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(v).replace("|", "\\|") for v in r.values) + " |")
    return "\n".join(lines) + "\n"


def html_table(df: pd.DataFrame) -> str:
    """An HTML table of ``df``, its cells escaped."""
    if df.empty:
        return "<p><em>(none)</em></p>"
    return df.to_html(index=False, escape=True, border=0, classes="t", na_rep="–")


# ---- display layouts of the tables ---------------------------------------------------------------------------

def wer_pivot(wer: pd.DataFrame) -> pd.DataFrame:
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


def external_pivot(external: pd.DataFrame) -> pd.DataFrame:
    """Systems × dataset/condition, WER in percent."""
    cell = external.assign(col=[ds if c == CLEAN else f"{ds} {c}"
                                for ds, c in zip(external["dataset"], external["condition"])])
    order = list(dict.fromkeys(cell.sort_values(["dataset", "snr_db"], na_position="first")["col"]))
    out = cell.pivot_table(index="system", columns="col", values="wer", aggfunc="first")
    return out[order].round(2).reset_index()


def werr_pivot(werr: pd.DataFrame, family: str) -> pd.DataFrame:
    """Series and context × dataset of one family (clean): WERR % [min, max over seeds]."""
    part = werr[(werr["family"] == family) & (werr["condition"] == CLEAN)]
    if part.empty:
        return pd.DataFrame()
    part = part.assign(val=[f"{w:+.1f} [{lo:+.1f}, {hi:+.1f}]" for w, lo, hi in
                            zip(part["werr"], part["werr_min"], part["werr_max"])])
    out = part.pivot_table(index=["series", "context_s"], columns="dataset", values="val", aggfunc="first")
    out = out.reset_index().sort_values(["series", "context_s"])
    out["context_s"] = out["context_s"].map(format_seconds)
    return out.rename(columns={"context_s": "context"})


def snr_pivots(snr: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Per family, series and dataset: context × SNR, WERR in percent."""
    out = []
    for (fam, series, ds), grp in snr.groupby(["family", "series", "dataset"], sort=True):
        g = grp.assign(col=["clean" if c == CLEAN else f"{s:g} dB" for c, s in zip(grp["condition"], grp["snr_db"])])
        order = ["clean"] + [f"{s:g} dB" for s in sorted(grp["snr_db"].dropna().unique(), reverse=True)]
        pv = g.pivot_table(index="context_s", columns="col", values="werr", aggfunc="first")
        pv = pv[[c for c in order if c in pv.columns]].round(2).reset_index()
        pv["context_s"] = pv["context_s"].map(format_seconds)
        out.append((f"{fam} / {series} / {ds}", pv.rename(columns={"context_s": "context"})))
    return out


def significance_display(sig: pd.DataFrame) -> pd.DataFrame:
    """The significance table as the report shows it: contexts in words, numbers rounded."""
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


def mean_sd(mean: float, sd: float) -> str:
    """'mean ± sd' with two decimals; the mean alone where sd is not finite (one seed)."""
    return f"{fmt_num(mean)} ± {fmt_num(sd)}" if math.isfinite(sd) else fmt_num(mean)


def fragmentation_display(summary: pd.DataFrame, tests: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The "Context or fragmentation" section's tables (:mod:`analysis.features.fragmentation`): per group and dataset (clean)
    the models' WER and error types, then every test."""
    out = []
    clean = summary[summary["condition"] == CLEAN]
    for (grp, ds), part in clean.groupby(["group", "dataset"], sort=True):
        out.append((f"{ds}" + (f" ({grp})" if clean["group"].nunique() > 1 else "") + ": WER and error types (%), "
                    "clean, mean ± sd over seeds", pd.DataFrame({
                        "model": part["model"], "context": part["context_s"].map(lambda c: f"{c:g} s"),
                        "receptive field": [f"±{f:.2f} s ({2 * f:.2f} s)" if math.isfinite(f) else "whole window"
                                            for f in part["field_s"]],
                        "training cut": part["cut"], "decoding window": part["window_s"].map(lambda w: f"{w:g} s"),
                        "WER": [mean_sd(m, s) for m, s in zip(part["wer_mean"], part["wer_sd"])],
                        "S": [mean_sd(m, s) for m, s in zip(part["sub_mean"], part["sub_sd"])],
                        "D": [mean_sd(m, s) for m, s in zip(part["del_mean"], part["del_sd"])],
                        "I": [mean_sd(m, s) for m, s in zip(part["ins_mean"], part["ins_sd"])],
                        "seeds": part["n_seeds"]})))
    if not tests.empty:
        out.append(("Every test (all in fragmentation_tests.csv)", pd.DataFrame({
            "dataset": tests["dataset"], "compared": tests["model"] + " vs " + tests["reference"],
            "seeds": ["shared" if s else "own" for s in tests["shared_seeds"]],
            "WER ref": tests["wer_reference"].map(fmt_num), "WER": tests["wer"].map(fmt_num),
            "WERR %": [fmt_num(x, 1, True) for x in tests["werr"]],
            "ΔWER [CI]": [f"{fmt_num(d, 2, True)} [{fmt_num(a, 2, True)}, {fmt_num(b, 2, True)}]"
                          for d, a, b in zip(tests["delta_wer"], tests["delta_lo"], tests["delta_hi"])],
            "p perm": tests["p_permutation"].map(fmt_p), "Holm family": tests["family"],
            "p Holm": tests["p_holm"].map(fmt_p), "verdict": tests["verdict"], "note": tests["note"].fillna("")})))
    return out


# ---- Markdown and HTML ---------------------------------------------------------------------------------------

def render_markdown(sweep: Sweep, sections: Iterable[Section]) -> str:
    """The report as Markdown (``report.md``), figures linked beside it."""
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
figure{margin:1.5em 0}img{max-width:100%}li{margin:0.3em 0}code{background:#f4f4f4}
figure img{display:block;min-width:min(100%,900px);height:auto}figcaption{font-size:0.9em;color:#444}"""


def _inline_md(text: str) -> str:
    """The little Markdown the sentences use (**bold**, `code`) as HTML, everything else escaped."""
    out = html.escape(text)
    while "**" in out:
        out = out.replace("**", "<strong>", 1).replace("**", "</strong>", 1)
    while "`" in out:
        out = out.replace("`", "<code>", 1).replace("`", "</code>", 1)
    return out


def render_html(sweep: Sweep, sections: Iterable[Section]) -> str:
    """The report as one self-contained HTML page (``index.html``), figures embedded."""
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
