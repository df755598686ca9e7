"""How far back a trained model's decoded output reaches: silence audio some seconds before a stretch of speech and
measure how much the moving-window posteriors of that stretch change.

``python -m asr_core reach CKPT [CKPT ...] [--data NAME=FORMAT:PATH ...] [--distances 1,2,5,10,20,40,60] [--targets 8]
[--span 1] [--out DIR]``

This checks the whole decoding path that ``evaluate`` uses (features normalised over the recording, windows of the
trained context at the configured stride, probabilities averaged over the windows covering a frame): a defect that
cut the context short (windows shorter than trained, a wrong stride, lost averaging) shows as no change where the
trained context should reach. What it measures, for each test stretch (``span`` seconds of speech, ``targets`` of
them per recording, evenly spaced) and each distance ``d``:

* the features of the ``span`` seconds ending ``d`` seconds before the stretch starts are set to zero (the
  recording's mean after normalisation: the silence ``evaluate`` gives untranscribed regions);
* the stretch's posteriors (moving windows, as evaluated) are compared with those of the untouched recording: the
  total-variation distance per output frame (half the L1 distance of the two distributions, 0 to 1), averaged over
  the stretch; and whether any frame changed at all (any probability by more than :data:`CHANGED`).

A model with a context of ``C`` seconds can only be moved by audio less than ``C`` seconds away: beyond that the
change is exactly zero, and whether it is non-zero inside ``C`` says whether the trained model uses that much of it.

On a corpus with a planted cue (``synth --cue``, :mod:`asr_core.data.synth.cues`) it also silences, for each planted
word, its disambiguating word (the nearest word before it that gives the topic away) and, as a control, an equally
long stretch as far after the cue word: if the decoded cue word changes when its disambiguating word is silenced,
the context that decides it reaches the model; whether the model then spells it by the topic is what the cue-word
error rate measures.

Writes ``reach.csv`` (distance profile, one row per stretch and distance), ``cue_reach.csv`` (one row per planted
word) and ``reach.png`` to ``--out`` (default: ``reach/`` beside the checkpoint); given several checkpoints (a
sweep's models at each context), each gets a folder in ``--out`` and ``OUT/reach.png`` draws them all. Nothing is
logged to MLflow.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from asr_core.contract.folder.checkpoint_file import file_refusal
from asr_core.contract.specs import parse_dataset_spec
from asr_core.data.corpora import CorpusError, Recording, load_corpus
from asr_core.probes.checkpoints import out_for, refusal

# torch, pandas and the model's modules are imported where they are used: a refusal of the command line or of a
# checkpoint's file needs none of them
if TYPE_CHECKING:
    import pandas as pd
    import torch

    from asr_core.decoding.decode import Model

DISTANCES_S = (1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 60.0)
CHANGED = 1e-6  # a probability that moved by more than this counts as a change (float32 noise is ~1e-7)
REACH_DIR = "reach"


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Per frame, half the L1 distance of two distributions (0: the same, 1: disjoint). p, q: (T, V) -> (T,)."""
    return 0.5 * (p - q).abs().sum(dim=-1)


@dataclass(frozen=True)
class Decoding:
    """What the measurements need to decode like ``evaluate``: the model, its window in input frames, the stride
    (a fraction of the window), the subsampling factor and the feature frame rate."""

    model: Model
    window: int
    stride: float = 0.125
    subsampling: int = 8
    frames_per_second: float = 100.0
    batch_windows: int = 8

    def out_frames(self, start_s: float, end_s: float, features: torch.Tensor) -> tuple[int, int]:
        """The output frames of [start_s, end_s) seconds (at least one), within the recording."""
        per_out = self.subsampling / self.frames_per_second
        t_out = math.ceil(features.shape[0] / self.subsampling)
        a = min(max(0, int(start_s / per_out)), t_out - 1)
        return a, min(t_out, max(a + 1, int(math.ceil(end_s / per_out))))

    def stretch(self, features: torch.Tensor, frames: tuple[int, int]) -> torch.Tensor:
        from asr_core.decoding.decode import posteriors_at

        return posteriors_at(self.model, features, self.window, frames, stride=self.stride,
                             subsampling=self.subsampling, batch_windows=self.batch_windows)

    def change(self, features: torch.Tensor, base: torch.Tensor, frames: tuple[int, int], start_s: float,
               end_s: float) -> tuple[float, bool]:
        """(mean total variation over ``frames``, whether any probability moved by more than :data:`CHANGED`) when
        [start_s, end_s) is silenced, against ``base`` (the stretch's posteriors untouched)."""
        from asr_core.data.features import zero_regions

        moved = self.stretch(zero_regions(features, [(start_s, end_s)], self.frames_per_second), frames)
        return float(total_variation(base, moved).mean()), bool((base - moved).abs().max() > CHANGED)


# ---- the two measurements --------------------------------------------------------------------------------------------
def distance_profile(dec: Decoding, features: torch.Tensor, duration_s: float, *, recording: str,
                     distances_s: Sequence[float] = DISTANCES_S, targets: int = 8, span_s: float = 1.0
                     ) -> list[dict]:
    """Rows ``recording, target_s, distance_s, tv, changed`` for ``targets`` stretches of ``span_s`` seconds evenly
    spaced over the recording (the first starting ``span_s`` in, the last ending a second before its end) and every
    distance whose silenced stretch lies wholly inside the recording."""
    last = duration_s - 1.0 - span_s
    if last < span_s or targets < 1:
        return []
    starts = [span_s + (last - span_s) * (k + 0.5) / targets for k in range(targets)]
    rows = []
    for t in starts:
        frames = dec.out_frames(t, t + span_s, features)
        base = dec.stretch(features, frames)
        for d in distances_s:
            lo, hi = t - d - span_s, t - d
            if lo < 0:
                continue
            tv, changed = dec.change(features, base, frames, lo, hi)
            rows.append({"recording": recording, "target_s": round(t, 3), "distance_s": d, "tv": tv,
                         "changed": changed})
    return rows


def cue_profile(dec: Decoding, features: torch.Tensor, duration_s: float, rec: Recording, marks: Sequence[int],
                topic: str) -> list[dict]:
    """Rows per planted word of ``rec`` (``marks``: indices into ``rec.words``) with a disambiguating word before
    it: ``word``, ``before_s`` (its gap to that word), ``tv_decider``/``changed_decider`` (that word silenced) and
    ``tv_control``/``changed_control`` (as long a stretch as far after the cue word silenced; NaN/None where that
    runs past the recording's end)."""
    from asr_core.data.synth.cues import cue_sites

    rows = []
    for i, site in zip(marks, cue_sites(rec.words, marks, topic)):
        if site.prev is None:
            continue
        frames = dec.out_frames(site.start, site.end, features)
        base = dec.stretch(features, frames)
        tv_d, ch_d = dec.change(features, base, frames, *site.prev)
        gap, length = site.start - site.prev[1], site.prev[1] - site.prev[0]
        c0 = site.end + gap
        tv_c, ch_c = (dec.change(features, base, frames, c0, c0 + length) if c0 + length <= duration_s
                      else (math.nan, None))
        rows.append({"recording": rec.id, "word": rec.words[i].text, "before_s": site.before_s,
                     "tv_decider": tv_d, "changed_decider": ch_d, "tv_control": tv_c, "changed_control": ch_c})
    return rows


def summarise_distances(rows: pd.DataFrame) -> pd.DataFrame:
    """Per distance: stretches measured, mean total variation, share changed (%)."""
    import pandas as pd

    if rows.empty:
        return pd.DataFrame(columns=["distance_s", "stretches", "mean_tv", "changed_pct"])
    g = rows.groupby("distance_s")
    return pd.DataFrame({"stretches": g.size(), "mean_tv": g["tv"].mean(),
                         "changed_pct": 100.0 * g["changed"].mean()}).reset_index()


CUE_BINS_S = (0.0, 5.0, 10.0, 20.0, 40.0, 80.0, math.inf)


def summarise_cues(rows: pd.DataFrame) -> pd.DataFrame:
    """Per band of the gap to the disambiguating word: planted words, mean total variation and share changed (%)
    with it silenced and with the control silenced."""
    import pandas as pd

    cols = ["gap_s", "cue_words", "tv_decider", "changed_decider_pct", "tv_control", "changed_control_pct"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    out = []
    for lo, hi in zip(CUE_BINS_S, CUE_BINS_S[1:]):
        part = rows[(rows["before_s"] >= lo) & (rows["before_s"] < hi)]
        if part.empty:
            continue
        ctrl = part[part["changed_control"].notna()]
        out.append({"gap_s": f"{lo:g}-{hi:g}", "cue_words": len(part), "tv_decider": part["tv_decider"].mean(),
                    "changed_decider_pct": 100.0 * part["changed_decider"].mean(),
                    "tv_control": ctrl["tv_control"].mean() if len(ctrl) else math.nan,
                    "changed_control_pct": 100.0 * ctrl["changed_control"].astype(bool).mean() if len(ctrl)
                    else math.nan})
    return pd.DataFrame(out, columns=cols)


# ---- the command -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reach:
    """One checkpoint's measurements: the distance rows and the cue rows (both with a ``dataset`` column), the
    trained context, the seed and where the tables went."""

    checkpoint: Path
    context_s: float
    seed: int
    distances: pd.DataFrame
    cues: pd.DataFrame
    out: Path

    @property
    def label(self) -> str:
        return f"{self.context_s:g} s, seed {self.seed}"


def measure(checkpoint: str | Path, datasets: Sequence[str], *, distances_s: Sequence[float] = DISTANCES_S,
            targets: int = 8, span_s: float = 1.0, stride: float | None = None, batch_windows: int = 8,
            out_dir: str | Path | None = None) -> Reach:
    """Both measurements of ``checkpoint`` (on the CPU, fp32) on each ``NAME=FORMAT:PATH`` dataset; writes
    ``reach.csv``, ``cue_reach.csv`` (a cued dataset) and ``reach.png`` to ``out_dir`` (default ``reach/`` beside
    the checkpoint)."""
    from asr_core.data.audio import load_audio
    from asr_core.data.synth.cues import meta_file, planted, read_meta
    from asr_core.data.features import FeatureExtractor

    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} not found")
    if targets < 1 or span_s <= 0 or batch_windows < 1 or not distances_s or min(distances_s) < 0:
        raise ValueError(f"targets ({targets}) and batch_windows ({batch_windows}) must be at least 1, span "
                         f"({span_s:g} s) positive and distances ({list(distances_s)}) given and not negative")
    parsed = [parse_dataset_spec(d) for d in datasets]
    corpora = {name: load_corpus(spec) for name, spec in parsed}  # bad data fails before any decoding
    import pandas as pd

    from asr_core.decoding.decode import prepare_features, window_frames
    from asr_core.training.checkpoint import load_for_eval

    model, cfg, _ = load_for_eval(checkpoint, "cpu")
    model.eval()
    fps = cfg.data.features.frames_per_second
    sub = cfg.model.subsampling_factor
    dec = Decoding(model, window_frames(cfg.data.context_s, fps, sub), stride if stride is not None else
                   cfg.eval.stride, sub, fps, batch_windows)
    extractor = FeatureExtractor(cfg.data.features)
    print(f"[reach] {checkpoint}: context {cfg.data.context_s:g} s, stride {dec.stride:g}; {targets} stretches of "
          f"{span_s:g} s per recording, silencing {span_s:g} s at {', '.join(f'{d:g}' for d in distances_s)} s "
          "before each", file=sys.stderr, flush=True)
    dist_rows: list[dict] = []
    cue_rows: list[dict] = []
    for name, recordings in corpora.items():
        marks = planted(recordings) or {}
        for n, rec in enumerate(recordings, 1):
            feats = prepare_features(extractor, load_audio(rec.audio), rec.ignore, fps)
            duration = feats.shape[0] / fps
            dist_rows += [{"dataset": name, **r} for r in distance_profile(
                dec, feats, duration, recording=rec.id, distances_s=distances_s, targets=targets, span_s=span_s)]
            if marks.get(rec.id):
                topic = read_meta(meta_file(rec))["topic"]  # type: ignore[arg-type]
                cue_rows += [{"dataset": name, **r} for r in cue_profile(dec, feats, duration, rec,
                                                                          marks[rec.id], topic)]
            print(f"[reach] {name} {n}/{len(recordings)} {rec.id}", file=sys.stderr, flush=True)
    out = Path(out_dir) if out_dir is not None else checkpoint.parent / REACH_DIR
    out.mkdir(parents=True, exist_ok=True)
    dist = pd.DataFrame(dist_rows, columns=["dataset", "recording", "target_s", "distance_s", "tv", "changed"])
    cues = pd.DataFrame(cue_rows, columns=["dataset", "recording", "word", "before_s", "tv_decider",
                                           "changed_decider", "tv_control", "changed_control"])
    dist.to_csv(out / "reach.csv", index=False)
    if not cues.empty:
        cues.to_csv(out / "cue_reach.csv", index=False)
    result = Reach(checkpoint, cfg.data.context_s, cfg.train.seed, dist, cues, out)
    plot([result], out / "reach.png")
    return result


def plot(results: Sequence[Reach], path: Path) -> Path:
    """Mean total variation against distance (log-log), one line per checkpoint, its trained context marked by a
    dotted line of its colour; distances where nothing changed at all are drawn on the bottom edge as open
    markers ("exactly 0")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    floor = 1e-7
    contexts = sorted({r.context_s for r in results})
    seen: dict[float, int] = {}
    for r in results:
        colour = f"C{contexts.index(r.context_s) % 10}"
        style = ("-", "--", "-.", ":")[seen.get(r.context_s, 0) % 4]  # the seeds of one context: one colour
        seen[r.context_s] = seen.get(r.context_s, 0) + 1
        s = summarise_distances(r.distances)
        if not s.empty:
            ax.plot(s["distance_s"], s["mean_tv"].clip(lower=floor), "o", ls=style, color=colour, label=r.label)
            zero = s[s["mean_tv"] == 0]
            ax.plot(zero["distance_s"], [floor] * len(zero), "o", mfc="white", color=colour)
        ax.axvline(r.context_s, color=colour, ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor / 2)
    ax.set_xlabel("seconds between the silenced second and the decoded second")
    ax.set_ylabel("change of the posteriors (mean total variation)")
    ax.set_title("How far back the decoded output reaches")
    ax.text(0.99, 0.97, "open markers: exactly 0; dotted lines: the contexts", transform=ax.transAxes,
            ha="right", va="top", fontsize=8, color="grey")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _floats(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds separated by commas, e.g. 1,2,5,10,20,40,60")
    if not out or any(x < 0 or not math.isfinite(x) for x in out):
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds (0 or more) separated by commas, e.g. 1,5,20")
    return out


def _print(r: Reach, span_s: float) -> None:
    print(f"{r.checkpoint}: context {r.context_s:g} s, seed {r.seed}: change of a {span_s:g} s stretch's posteriors "
          f"when {span_s:g} s of audio that many seconds before it is silenced")
    print(f"{'distance':>9s} {'stretches':>9s} {'mean TV':>10s} {'changed':>8s}")
    for row in summarise_distances(r.distances).itertuples():
        print(f"{row.distance_s:8g}s {row.stretches:9d} {row.mean_tv:10.2e} {row.changed_pct:7.1f}%")
    if not r.cues.empty:
        print("planted cue words: their disambiguating word silenced, or as long a stretch as far after them")
        print(f"{'gap':>8s} {'words':>6s} {'TV word':>10s} {'changed':>8s} {'TV after':>10s} {'changed':>8s}")
        for row in summarise_cues(r.cues).itertuples():
            print(f"{row.gap_s:>7s}s {row.cue_words:6d} {row.tv_decider:10.2e} {row.changed_decider_pct:7.1f}% "
                  f"{row.tv_control:10.2e} {row.changed_control_pct:7.1f}%")


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m asr_core reach", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", type=Path, nargs="+", metavar="CKPT",
                    help="one or more checkpoints (e.g. a sweep's models at each context)")
    ap.add_argument("--data", action="append", default=None, metavar="NAME=FORMAT:PATH",
                    help="a dataset (repeatable); default: the first of each checkpoint's eval.datasets")
    ap.add_argument("--distances", type=_floats, default=list(DISTANCES_S), metavar="S,S,...",
                    help="seconds before each stretch where a second is silenced (default 1,2,5,10,20,40,60)")
    ap.add_argument("--targets", type=int, default=8, help="stretches per recording (default 8)")
    ap.add_argument("--span", type=float, default=1.0, help="seconds per stretch and per silenced stretch (default 1)")
    ap.add_argument("--stride", type=float, default=None, help="window stride (default: the checkpoint's eval.stride)")
    ap.add_argument("--batch-windows", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None, help=f"folder for the tables and figures (default: {REACH_DIR}/ "
                    "next to the checkpoint; needed for several checkpoints: each gets a folder in it, and the "
                    "figure of all of them is OUT/reach.png)")
    a = ap.parse_args(argv)
    refused = refusal("reach", a.checkpoints, a.out, "each gets a folder in it, and one figure shows them all")
    refused = refused or next((f"reach: {r}" for r in map(file_refusal, a.checkpoints) if r), None)
    if refused:  # all of them before torch is imported, and before any is measured
        print(refused, file=sys.stderr)
        return 2
    results: list[Reach] = []
    try:
        for k, ckpt in enumerate(a.checkpoints, 1):
            data = a.data
            if not data:
                from asr_core.config import Config
                from asr_core.training.checkpoint import acoustic_header

                ck = acoustic_header(ckpt)
                data = list(Config.from_stored(ck["config"], source=str(ckpt)).eval.datasets[:1])
                del ck
            out = out_for(a.out, a.checkpoints, k)
            results.append(measure(ckpt, data, distances_s=a.distances, targets=a.targets, span_s=a.span,
                                   stride=a.stride, batch_windows=a.batch_windows, out_dir=out))
            _print(results[-1], a.span)
    except (CorpusError, ValueError, FileNotFoundError, KeyError) as e:
        print(f"reach: {e}", file=sys.stderr)
        return 2
    if len(results) > 1:
        a.out.mkdir(parents=True, exist_ok=True)
        print(f"figure of all: {plot(sorted(results, key=lambda r: (r.context_s, r.seed)), a.out / 'reach.png')}")
    for r in results:
        print(f"tables and figure: {r.out}")
    return 0
