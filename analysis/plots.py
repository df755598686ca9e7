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

from .collect import CLEAN, Sweep, describe_params  # noqa: E402
from .werr import format_seconds, in_family  # noqa: E402

MAX_PANELS = 4  # datasets per figure; more would be unreadable at report width
POSENC_KEYS = ("model.posenc", "model.rotary_theta")
SIZE_KEYS = ("model.layers", "model.d_model")
HEAD_KEYS = ("model.heads",)


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
    done = sweep.wer.drop_duplicates("config_id")

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


def _varying(sweep: Sweep, family: str) -> set[str]:
    """Params (minus seed and context) that differ between the series of ``family``."""
    trials = in_family(sweep.trials[sweep.trials["run_id"].isin(sweep.wer["run_id"])], family)
    reps = trials.drop_duplicates("series_id")["run_id"].tolist()
    if len(reps) < 2:
        return set()
    params = sweep.params.reindex(reps).fillna("")
    return {c for c in params.columns if c not in ("train.seed", "data.context_s") and params[c].nunique() > 1}


def _context_axis(ax: plt.Axes, contexts: list[float]) -> None:
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


def _panels(n: int, title: str) -> tuple[plt.Figure, list[plt.Axes]]:
    n = max(1, min(n, MAX_PANELS))
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.2), squeeze=False)
    fig.suptitle("\n".join(textwrap.wrap(title, width=48 * n)), fontsize=11)
    return fig, list(axes[0])


def _save(fig: plt.Figure, out_dir: Path, key: str) -> Path:
    path = out_dir / f"{key}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
        fig, (ax,) = _panels(1, f"{title1} ({main})")
        for ds, grp in rows.groupby("dataset"):
            _line(ax, grp["context_s"], grp["werr"], grp["werr_min"], grp["werr_max"], ds)
        _context_axis(ax, rows["context_s"].tolist())
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_ylabel(f"WERR vs {base_txt} (%)")
        ax.legend()
        key = f"fig1_werr_vs_context_{main}"
        figs.append(Figure(key, title1, f"Family {main}, series {rows['series'].iloc[0]}. {spread}",
                           _save(fig, out_dir, key)))

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
        fig, axes = _panels(len(datasets), title2)
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
                                        f"SNR. {spread}" + _cut(datasets), _save(fig, out_dir, key)))

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
                if (v := _varying(sweep, f)) & set(keys) and not v & set(fixed)]
        drawn = False
        for fam in fams:
            table = werr if what == "werr" else wer
            rows = in_family(table, fam) if what == "wer" else table[table["family"] == fam]
            rows = rows[rows["condition"] == CLEAN]
            if rows.empty or rows["context_s"].nunique() < 2:
                continue
            labels = series_labels(sweep, sorted(rows["series_id"].unique()), legend)
            datasets = sorted(rows["dataset"].unique())
            fig, axes = _panels(len(datasets), f"{title} ({fam})")
            for ax, ds in zip(axes, datasets):
                for sid, grp in rows[rows["dataset"] == ds].groupby("series_id"):
                    if what == "wer":
                        _line(ax, grp["context_s"], grp["wer_mean"], grp["wer_min"], grp["wer_max"], labels[sid])
                    else:
                        _line(ax, grp["context_s"], grp["werr"], grp["werr_min"], grp["werr_max"], labels[sid])
                _context_axis(ax, rows["context_s"].tolist())
                ax.set_title(ds)
                ax.set_ylabel("WER (%)" if what == "wer" else f"WERR vs {base_txt} (%)")
                if what == "werr":
                    ax.axhline(0, color="grey", lw=0.8)
                ax.legend(fontsize="small")
            key = f"{tag}_{what}_vs_context_{fam}"
            figs.append(Figure(key, title, f"Family {fam}. {spread}" + _cut(datasets), _save(fig, out_dir, key)))
            drawn = True
        if not drawn:
            skipped.append(Skipped(tag, title, why if not fams else
                                   f"families {fams} vary it but have fewer than two context lengths"))
    return figs, skipped


def _cut(datasets: list[str]) -> str:
    if len(datasets) <= MAX_PANELS:
        return ""
    return f" Only the first {MAX_PANELS} datasets are drawn ({', '.join(datasets[MAX_PANELS:])} omitted)."

