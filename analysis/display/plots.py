"""The paper's figures 1–5 (paper 000 §4) drawn from a sweep's tables, with the spread over seeds shown.

1. WERR against the baseline context vs context length, one line per dataset (the main family);
2. WERR vs SNR, one line per context length (the main family, each dataset evaluated with music);
3. WER vs context, one line per positional encoding (each family whose series differ in encoding);
4. WERR vs context, one line per model size (each family whose series differ in layers or width);
5. WER vs context, one line per head count (each family whose series differ in heads only).

Lines are means over seeds; the shaded band is the min–max over seeds (for WERR: each seed's WER against the
baseline's mean WER). A figure the sweep has no data for is skipped, with the reason, never drawn empty.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on cluster nodes or in CI
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FixedLocator, NullLocator  # noqa: E402

from analysis.ledger.collect import Sweep, greedy_rows  # noqa: E402
from analysis.ledger.naming import HEAD_KEYS, SIZE_KEYS, describe_params  # noqa: E402
from analysis.significance.werr import format_seconds, in_family, varying_params  # noqa: E402
from asr_core.contract.metrics import CLEAN  # noqa: E402

MAX_PANELS = 4  # datasets per figure; more would be unreadable at report width
FIGURE_DPI = 180  # one panel is 5.2 in: ~940 px, sharp at the report's full width (900 px and more)
POSENC_KEYS = ("model.posenc", "model.rotary_theta")


@dataclass(frozen=True)
class Figure:
    key: str  # file stem, e.g. "fig1_werr_vs_context_context"
    title: str
    caption: str
    path: Path


@dataclass(frozen=True)
class Skipped:
    key: str
    title: str
    reason: str


def choose_main_family(sweep: Sweep, requested: str | None = None) -> str | None:
    """``requested`` if given; else ``context`` if the sweep has it; else the family with one series and the most
    context lengths (the paper's Fig. 1 and 2 are the main model alone)."""
    fams = sweep.families
    if requested is not None:
        if requested not in fams:
            raise ValueError(f"--main-family {requested!r} is not a family of this sweep; families: "
                             + ", ".join(fams))
        return requested
    if not fams:
        return None
    if "context" in fams:
        return "context"
    done = greedy_rows(sweep.wer).drop_duplicates("config_id")

    def rank(f: str) -> tuple[int, int, str]:
        m = in_family(done, f)
        return (m["series_id"].nunique(), -m["context_s"].nunique(), f)

    return min(fams, key=rank)


def _largest_series(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty:
        return frame
    counts = frame.groupby("series_id")["context_s"].nunique()
    return frame[frame["series_id"] == counts.sort_values(ascending=False, kind="stable").index[0]]


def series_labels(sweep: Sweep, series_ids: list[str], always: tuple[str, ...] = ()) -> dict[str, str]:
    """Legend names: the params in which these series differ (e.g. ``sinusoidal`` / ``rotary θ=1.5M``), plus the
    params ``always`` (e.g. the whole architecture for the model-size figure)."""
    trials = sweep.trials.drop_duplicates("series_id").set_index("series_id")
    reps = {sid: trials.loc[sid, "run_id"] for sid in series_ids if sid in trials.index}
    params = sweep.params.reindex(list(reps.values())).fillna("")
    cols = [c for c in params.columns if c not in ("train.seed", "data.context_s")
            and (params[c].nunique() > 1 or c in always)]
    out = {}
    for sid, rid in reps.items():
        out[sid] = describe_params({c: str(params.loc[rid, c]) for c in cols}) or trials.loc[sid, "series"]
    return out


def context_axis(ax: plt.Axes, contexts: list[float]) -> None:
    """Log-scale context axis, ticked at the lengths the sweep trained, labelled in seconds/minutes/hours."""
    ax.set_xscale("log")
    ticks = sorted(set(round(c, 6) for c in contexts))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([format_seconds(t) for t in ticks], rotation=45 if len(ticks) > 5 else 0,
                       ha="right" if len(ticks) > 5 else "center")
    ax.set_xlabel("context length (trained and evaluated)")
    ax.grid(True, which="major", alpha=0.3)


def _line(ax: plt.Axes, x: pd.Series, mean: pd.Series, lo: pd.Series, hi: pd.Series, label: str) -> None:
    order = x.argsort().values
    xs, ms, ls, hs = (s.to_numpy()[order] for s in (x, mean, lo, hi))
    (line,) = ax.plot(xs, ms, marker="o", label=label)
    ax.fill_between(xs, ls, hs, color=line.get_color(), alpha=0.2, linewidth=0)


def panels(n: int, title: str) -> tuple[plt.Figure, list[plt.Axes]]:
    """A figure of ``n`` side-by-side panels (at most :data:`MAX_PANELS`) under ``title``, wrapped to fit."""
    n = max(1, min(n, MAX_PANELS))
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.2), squeeze=False)
    fig.suptitle("\n".join(textwrap.wrap(title, width=48 * n)), fontsize=11)
    return fig, list(axes[0])


def save(fig: plt.Figure, out_dir: Path, key: str) -> Path:
    """Write ``fig`` to ``OUT/<key>.png`` and close it."""
    path = out_dir / f"{key}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=FIGURE_DPI)
    plt.close(fig)
    return path


def draw_figures(sweep: Sweep, werr: pd.DataFrame, wer: pd.DataFrame, out_dir: Path, *,
                 baseline_context: float, main_family: str | None = None) -> tuple[list[Figure], list[Skipped]]:
    """Draw every figure the sweep has data for into ``out_dir``; returns the figures and the skipped ones."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figs: list[Figure] = []
    skipped: list[Skipped] = []
    base_txt = format_seconds(baseline_context)
    main = choose_main_family(sweep, main_family)
    spread = "Shaded: min–max over seeds."

    # Figure 1: WERR vs context per dataset
    title1 = f"Fig. 1: WERR from the {base_txt} model vs context, per dataset"
    rows = werr[(werr["family"] == main) & (werr["condition"] == CLEAN)] if main else werr.iloc[0:0]
    rows = _largest_series(rows)
    if rows.empty or rows["context_s"].nunique() < 2:
        skipped.append(Skipped("fig1", title1, "no family has WERR at two or more context lengths on clean data"))
    else:
        fig, (ax,) = panels(1, f"{title1} ({main})")
        for ds, grp in rows.groupby("dataset"):
            _line(ax, grp["context_s"], grp["werr"], grp["werr_min"], grp["werr_max"], ds)
        context_axis(ax, rows["context_s"].tolist())
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_ylabel(f"WERR vs {base_txt} (%)")
        ax.legend()
        key = f"fig1_werr_vs_context_{main}"
        figs.append(Figure(key, title1, f"Family {main}, series {rows['series'].iloc[0]}. {spread}",
                           save(fig, out_dir, key)))

    # Figure 2: WERR vs SNR per context
    title2 = f"Fig. 2: WERR from the {base_txt} model vs SNR of added music, per context"
    rows = werr[(werr["family"] == main) & (werr["condition"] != CLEAN)] if main else werr.iloc[0:0]
    rows = _largest_series(rows)
    rows = rows[rows["context_s"] != rows["baseline_context_s"]]
    if rows.empty:
        skipped.append(Skipped("fig2", title2, "no dataset was evaluated with added noise (no wer/<DATASET>/snr<DB> "
                                               "metrics) in a family with a baseline"))
    else:
        datasets = sorted(rows["dataset"].unique())
        fig, axes = panels(len(datasets), title2)
        for ax, ds in zip(axes, datasets):
            for ctx, grp in rows[rows["dataset"] == ds].groupby("context_s"):
                _line(ax, grp["snr_db"], grp["werr"], grp["werr_min"], grp["werr_max"], format_seconds(ctx))
            ax.set_title(ds)
            ax.set_xlabel("SNR (dB)")
            ax.set_ylabel(f"WERR vs {base_txt} (%)")
            ax.axhline(0, color="grey", lw=0.8)
            ax.grid(True, alpha=0.3)
            ax.legend(title="context", fontsize="small")
        key = f"fig2_werr_vs_snr_{main}"
        figs.append(Figure(key, title2, f"Family {main}; the baseline at each SNR is the {base_txt} model at that "
                                        f"SNR. {spread}" + _cut(datasets), save(fig, out_dir, key)))

    # Figures 3-5: one line per series of a family that varies the encoding, the size or the heads
    specs = [  # (tag, title, y, params whose variation calls for it, params that must not vary, legend params)
        ("fig3", "Fig. 3: WER vs context, per positional encoding", "wer", POSENC_KEYS, (), POSENC_KEYS,
         "no family whose series differ in positional encoding (model.posenc / model.rotary_theta)"),
        ("fig4", f"Fig. 4: WERR from the {base_txt} model vs context, per model size", "werr", SIZE_KEYS, (),
         SIZE_KEYS + HEAD_KEYS, "no family whose series differ in model size (model.layers / model.d_model)"),
        ("fig5", "Fig. 5: WER vs context, per number of attention heads", "wer", HEAD_KEYS, SIZE_KEYS, HEAD_KEYS,
         "no family whose series differ in model.heads at a fixed depth and width"),
    ]
    for tag, title, what, keys, fixed, legend, why in specs:
        fams = [f for f in sweep.families
                if (v := varying_params(sweep, f)) & set(keys) and not v & set(fixed)]
        drawn = False
        for fam in fams:
            table = werr if what == "werr" else wer
            rows = in_family(table, fam) if what == "wer" else table[table["family"] == fam]
            rows = rows[rows["condition"] == CLEAN]
            if rows.empty or rows["context_s"].nunique() < 2:
                continue
            labels = series_labels(sweep, sorted(rows["series_id"].unique()), legend)
            datasets = sorted(rows["dataset"].unique())
            fig, axes = panels(len(datasets), f"{title} ({fam})")
            for ax, ds in zip(axes, datasets):
                for sid, grp in rows[rows["dataset"] == ds].groupby("series_id"):
                    if what == "wer":
                        _line(ax, grp["context_s"], grp["wer_mean"], grp["wer_min"], grp["wer_max"], labels[sid])
                    else:
                        _line(ax, grp["context_s"], grp["werr"], grp["werr_min"], grp["werr_max"], labels[sid])
                context_axis(ax, rows["context_s"].tolist())
                ax.set_title(ds)
                ax.set_ylabel("WER (%)" if what == "wer" else f"WERR vs {base_txt} (%)")
                if what == "werr":
                    ax.axhline(0, color="grey", lw=0.8)
                ax.legend(fontsize="small")
            key = f"{tag}_{what}_vs_context_{fam}"
            figs.append(Figure(key, title, f"Family {fam}. {spread}" + _cut(datasets), save(fig, out_dir, key)))
            drawn = True
        if not drawn:
            skipped.append(Skipped(tag, title, why if not fams else
                                   f"families {fams} vary it but have fewer than two context lengths"))
    return figs, skipped


def _cut(datasets: list[str]) -> str:
    if len(datasets) <= MAX_PANELS:
        return ""
    return f" Only the first {MAX_PANELS} datasets are drawn ({', '.join(datasets[MAX_PANELS:])} omitted)."


# ---- beyond the paper's figures: head similarity (paper 003), LM perplexity (paper 004 Table 5) ----------------

def draw_heads_figures(sweep: Sweep, table: pd.DataFrame, out_dir: Path, representation: str
                       ) -> tuple[list[Figure], list[Skipped]]:
    """Per family and dataset of :func:`analysis.features.heads.heads_table`: summed ``representation`` similarity against
    context (left) and the greedy clean WER (right), one line per configuration (series), shaded min–max over
    seeds."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figs: list[Figure] = []
    skipped: list[Skipped] = []
    title = f"Head similarity ({representation}) and WER vs context"
    part = table[table["representation"] == representation]
    for (fam, ds), grp in part.groupby(["family", "dataset"], sort=True):
        if grp["context_s"].nunique() < 2:
            skipped.append(Skipped(f"heads_{fam}_{ds}", f"{title} ({fam}, {ds})",
                                   "head metrics at fewer than two context lengths"))
            continue
        labels = series_labels(sweep, sorted(grp["series_id"].unique()), HEAD_KEYS + SIZE_KEYS)
        fig, (left, right) = panels(2, f"{title}, family {fam}, {ds}")
        for sid, g in grp.groupby("series_id"):
            _line(left, g["context_s"], g["sum_mean"], g["sum_min"], g["sum_max"], labels[sid])
            w = g[g["wer_mean"].notna()]
            if len(w):
                _line(right, w["context_s"], w["wer_mean"], w["wer_min"], w["wer_max"], labels[sid])
        for ax in (left, right):
            context_axis(ax, grp["context_s"].tolist())
            ax.legend(fontsize="small")
        left.set_ylabel(f"summed {representation} similarity (003 eq. 6 over layers)")
        left.set_title("head similarity (higher: heads more alike)")
        right.set_ylabel("WER (%), greedy, clean")
        right.set_title(f"WER on {ds}")
        key = f"heads_{representation}_vs_context_{fam}_{ds}"
        figs.append(Figure(key, f"{title} ({fam})", f"Family {fam}, dataset {ds}: 003's eq. 6 summed over layers "
                                                    f"for {representation}, mean over seeds. Shaded: min–max over "
                                                    f"seeds.", save(fig, out_dir, key)))
    return figs, skipped


def draw_ppl_figure(ppl: pd.DataFrame, out_dir: Path) -> Figure | None:
    """Per-token perplexity against LM context, one line per LM and dataset (``Sweep.lm_ppl``); None with fewer
    than two contexts."""
    if ppl.empty or ppl["lm_context"].nunique() < 2:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    title = "LM perplexity vs LM context"
    fig, (ax,) = panels(1, title)
    several = ppl["lm_run"].nunique() > 1
    for (name, run, ds), g in ppl.groupby(["lm_name", "lm_run", "dataset"], sort=True):
        g = g.sort_values("lm_context")
        label = f"{name} ({run[:8]}), {ds}" if several else f"{name}, {ds}"
        ax.plot(g["lm_context"], g["ppl"], marker="o", label=label)
    ticks = sorted(ppl["lm_context"].unique())
    if ticks[0] > 0:  # a context of 0 tokens (no history) has no place on a log axis
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(int(t)) for t in ticks])
    ax.set_xlabel("LM context (tokens)")
    ax.set_ylabel("perplexity per token")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    key = "lm_ppl_vs_context"
    return Figure(key, title, "Per-token perplexity (python -m asr_core lm ppl) of each LM at each context it was "
                              "measured at.", save(fig, out_dir, key))
