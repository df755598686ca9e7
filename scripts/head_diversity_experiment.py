"""Paper 003's head-diversity loss on the demo model, on this CPU (a benchmark script, not a CI test):

    .venv/bin/python scripts/head_diversity_experiment.py --out hd-out [--corpus DIR] [--context 20.48]
        [--weights 0,1] [--repr Y] [--seeds 1,2] [--steps N] [--threads 1] [--demo-sweep DIR [--demo-heads DIR]]

The demo model (``grids/demo.yaml``'s base: the tiny preset with the grid's model, data and train settings, read from
the grid file) is trained at one context with each weight lambda of ``train.head_diversity_weight`` (0 is the
baseline) and each seed, each step a command a user would run, recorded in MLflow (``OUT/mlflow.db``):

1. without ``--corpus``, synthesises the demo's corpus into ``OUT/corpus`` (``asr_core synth`` with
   ``scripts/demo.sh``'s settings; its train and in-domain test splits, which do not depend on the other splits);
2. trains (``asr_core train``), evaluates on the clean in-domain test set (``asr_core evaluate --clean-only``) and
   measures head similarity on it (``asr_core heads``), one model at a time;
3. prints, and writes as ``OUT/results-R.csv`` and ``OUT/results-R.md`` (R: the targeted representation), the
   clean WER and 003's summed similarity (eq. 6 summed over layers) of A, Q, K, V and Y per model and their means
   per lambda; for the targeted representation, whether its similarity fell by at least half and WER is at most
   one point worse (means over the seeds both weights have); and the seconds per training step with and without
   the loss, from the trainer's own step log (its outbox: one timestamped record per step).
   ``OUT/similarity-R.png`` shows each representation per seed and lambda.

With ``--demo-sweep`` it also tabulates head similarity against context on a finished demo sweep's trials
(``OUT/sweep.csv``, and in ``results-R.md``): the ``heads`` results beside each trial's checkpoint, or in
``--demo-heads/<trial key>/``. Each step is skipped when its output exists (rerun after an interruption; other
weights or representations add models to the same ``OUT``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
REPRESENTATIONS = ("A", "Q", "K", "V", "Y")  # asr_core.model.heads.REPRESENTATIONS (not imported: torch is slow to load)
FALL = 0.5  # the bar: the targeted similarity at most half the baseline's ...
WER_TOLERANCE = 1.0  # ... with WER at most this many points worse (means over seeds)
TEST = "test"  # the dataset name of the in-domain test set in every run
# threads per command (--threads). On a CPU shared with other jobs one thread is the fast choice: measured here, a
# full-context step took 0.49 s with one thread and 2.5 s with two while another job held a core (threads waiting at
# OpenMP barriers for a thread that is not running)
THREADS = 1


# ---- pure parts: verdict, tables, step times -----------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """One lambda > 0 against lambda = 0 on the targeted representation, means over ``seeds`` (the seeds both have)."""

    weight: float
    representation: str
    seeds: tuple[int, ...]
    base_similarity: float
    similarity: float
    base_wer: float
    wer: float

    @property
    def fall(self) -> float:
        """The fraction of the baseline's similarity removed (0.5: halved; negative: it rose)."""
        return 1.0 - self.similarity / self.base_similarity if self.base_similarity > 0 else float("nan")

    @property
    def halved(self) -> bool:
        return self.similarity <= (1.0 - FALL) * self.base_similarity

    @property
    def wer_change(self) -> float:
        """WER points gained (positive: worse)."""
        return self.wer - self.base_wer

    @property
    def wer_ok(self) -> bool:
        return self.wer_change <= WER_TOLERANCE

    @property
    def holds(self) -> bool:
        return self.halved and self.wer_ok

    def sentence(self) -> str:
        """What holds and what does not, in words."""
        sim = (f"{self.representation} similarity {self.base_similarity:.4f} -> {self.similarity:.4f} "
               f"({100 * self.fall:.0f}% lower; at least {100 * FALL:.0f}% asked)")
        wer = (f"WER {self.base_wer:.2f}% -> {self.wer:.2f}% ({self.wer_change:+.2f} points; at most "
               f"+{WER_TOLERANCE:g} asked)")
        failed = [part for part, ok in (("the similarity did not fall by half", self.halved),
                                        (f"WER is more than {WER_TOLERANCE:g} point worse", self.wer_ok)) if not ok]
        head = "HOLDS" if self.holds else "DOES NOT HOLD: " + " and ".join(failed)
        seeds = ",".join(str(s) for s in self.seeds)
        return f"lambda {self.weight:g} on {self.representation} (seeds {seeds}): {head}. {sim}; {wer}."


def verdicts(results: pd.DataFrame, target: str) -> list[Verdict]:
    """One :class:`Verdict` per weight > 0 in ``results`` (columns ``weight``, ``seed``, ``wer`` and one per
    representation), each against weight 0 on the seeds both have."""
    if target not in REPRESENTATIONS:
        raise ValueError(f"unknown representation {target!r}; valid: {', '.join(REPRESENTATIONS)}")
    base = results[results.weight == 0].set_index("seed")
    if base.empty:
        raise ValueError("no lambda = 0 rows to compare with: include weight 0 in --weights")
    out = []
    for weight, part in results[results.weight > 0].groupby("weight", sort=True):
        part = part.set_index("seed")
        seeds = sorted(set(part.index) & set(base.index))
        if not seeds:
            raise ValueError(f"lambda {weight:g} shares no seed with lambda 0 (seeds {sorted(part.index)} against "
                             f"{sorted(base.index)})")
        out.append(Verdict(float(weight), target, tuple(int(s) for s in seeds),
                           float(base.loc[seeds, target].mean()), float(part.loc[seeds, target].mean()),
                           float(base.loc[seeds, "wer"].mean()), float(part.loc[seeds, "wer"].mean())))
    return out


def with_means(results: pd.DataFrame) -> pd.DataFrame:
    """``results`` sorted by (weight, seed) with a mean row per weight after its seeds (``seed`` = "mean")."""
    cols = ["wer", *REPRESENTATIONS, *(c for c in ("s_per_step",) if c in results)]
    rows: list[dict[str, Any]] = []
    for weight, part in results.sort_values(["weight", "seed"]).groupby("weight", sort=True):
        rows += part.to_dict("records")
        rows.append({"weight": weight, "seed": "mean", **{c: part[c].mean() for c in cols}})
    return pd.DataFrame(rows)


def markdown_table(results: pd.DataFrame, target: str) -> str:
    """The results with a mean row per lambda, the targeted representation's column marked (*)."""
    table = with_means(results)
    head = [f"{r}*" if r == target else r for r in REPRESENTATIONS]
    timed = "s_per_step" in table
    lines = ["| lambda | seed | clean WER | " + " | ".join(head) + (" | s/step |" if timed else " |"),
             "| --- | --- | --- |" + " --- |" * (len(head) + timed)]
    for r in table.to_dict("records"):
        bold = "**" if r["seed"] == "mean" else ""
        cells = [f"{r['weight']:g}", f"{bold}{r['seed']}{bold}", f"{r['wer']:.2f}%",
                 *(f"{r[c]:.4f}" for c in REPRESENTATIONS)]
        if timed:
            cells.append("" if pd.isna(r["s_per_step"]) else f"{r['s_per_step']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def step_seconds(records: Iterable[dict[str, Any]], context_s: float) -> tuple[float, int]:
    """(median seconds per optimiser step, steps counted) over the steps trained at the full context.

    ``records``: the trainer's outbox records; a ``metrics`` record with ``train/seq_len_s`` is one step, ``time`` in
    ms when it was logged. A step's time is the gap to the previous step's record; only steps whose previous step is
    also logged count (a resumed run's first step includes the start-up). ``(nan, 0)`` when there is none."""
    times: dict[int, tuple[float, float]] = {}
    for rec in records:
        m = rec.get("metrics", {})
        if rec.get("kind") == "metrics" and "train/seq_len_s" in m:
            times.setdefault(int(rec["step"]), (rec["time"] / 1000.0, float(m["train/seq_len_s"])))
    gaps = [t - times[s - 1][0] for s, (t, seq) in times.items()
            if s - 1 in times and seq >= context_s - 1e-6 and times[s - 1][1] >= context_s - 1e-6]
    return (float(np.median(gaps)), len(gaps)) if gaps else (float("nan"), 0)


def clean_wer(csv: Path, dataset: str = TEST) -> float:
    """Corpus WER in percent of the clean rows of an ``evaluate`` table."""
    t = pd.read_csv(csv, dtype={"recording": str})
    t = t[(t.condition == "clean") & (t.dataset == dataset)]
    if t.empty:
        raise ValueError(f"{csv}: no clean rows of dataset {dataset!r}")
    return 100.0 * float((t.substitutions + t.deletions + t.insertions).sum()) / float(t.ref_words.sum())


def summed_similarity(npz: Path) -> dict[str, float]:
    """003's figure per representation (eq. 6 summed over layers) from a ``heads`` result file."""
    with np.load(npz) as z:
        return {r: float(z[f"diversity_{r}"].sum()) for r in REPRESENTATIONS}


# ---- running the commands --------------------------------------------------------------------------------------
def run(args: list[str], what: str, log: Path) -> float:
    """``python -m ARGS`` from the repository root, its output into ``log``; exits with the log's tail when it fails.
    Returns its wall seconds."""
    t0 = time.perf_counter()
    print(f"== {what}: {' '.join(args)}", flush=True)
    with open(log, "w") as sink:
        p = subprocess.run([PY, "-m", *args], cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                           env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(THREADS)})
    if p.returncode != 0:
        sys.exit(f"{what} failed ({p.returncode}); the end of {log}:\n{log.read_text()[-3000:]}")
    took = time.perf_counter() - t0
    print(f"   done in {took:.0f} s", flush=True)
    return took


def demo_base(grid: Path) -> dict[str, Any]:
    """The base config of the demo grid (preset and overrides), as a config file's content."""
    from asr_core.config.yaml_input import load_yaml_file  # the project's one YAML reader (bounded)

    raw = load_yaml_file(grid)
    if not isinstance(raw, dict) or not isinstance(raw.get("base"), dict):
        raise SystemExit(f"{grid}: no 'base' mapping of config sections")
    return raw["base"]


def model_name(context_s: float, steps: int, weight: float, representation: str, seed: int) -> str:
    loss = "base" if weight == 0 else f"{representation}{weight:g}"
    return f"ctx{context_s:g}-{steps}steps-{loss}-s{seed}"


def outbox_records(train_dir: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted((train_dir / "outbox").glob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def model_overrides(corpus: Path, context_s: float, seed: int, steps: int) -> list[str]:
    """The ``--set`` values every model of the experiment has on top of the grid's base."""
    return [f"data.train=podcast:{corpus / 'train'}", f"data.context_s={context_s:g}", f"train.seed={seed}",
            f"train.max_steps={steps}", f"eval.datasets=[{TEST}=podcast:{corpus / 'test'}]"]


def one_model(out: Path, config: Path, corpus: Path, context_s: float, steps: int, weight: float,
              representation: str, seed: int) -> dict[str, Any]:
    """Train, evaluate and measure one model (each step skipped when done); its row of the results."""
    name = model_name(context_s, steps, weight, representation, seed)
    d = out / "models" / name
    d.mkdir(parents=True, exist_ok=True)
    test = f"{TEST}=podcast:{corpus / 'test'}"
    sets = model_overrides(corpus, context_s, seed, steps)
    if weight > 0:
        sets += [f"train.head_diversity_weight={weight:g}", f"train.head_diversity_repr={representation}"]
    ckpt = d / "checkpoint.pt"
    timing = d / "timing.json"
    if not timing.exists():
        wall = run(["asr_core", "train", str(config), *(a for s in sets for a in ("--set", s)), "--out", str(d),
                    "--tracking-uri", f"sqlite:///{out / 'mlflow.db'}", "--experiment", "head-diversity"],
                   f"training {name}", d / "train.log")
        timing.write_text(json.dumps({"wall_s": wall, "steps": steps}) + "\n")
    if not (d / "eval" / f"{TEST}.csv").exists():
        run(["asr_core", "evaluate", str(ckpt), "--data", test, "--clean-only", "--out", str(d / "eval")],
            f"clean WER of {name}", d / "evaluate.log")
    if not (d / "heads" / f"{TEST}.npz").exists():
        run(["asr_core", "heads", str(ckpt), "--data", test, "--out", str(d / "heads")],
            f"head similarity of {name}", d / "heads.log")
    per_step, counted = step_seconds(outbox_records(d), context_s)
    wall = json.loads(timing.read_text())["wall_s"]
    return {"weight": weight, "seed": seed, "wer": clean_wer(d / "eval" / f"{TEST}.csv"),
            **summed_similarity(d / "heads" / f"{TEST}.npz"), "s_per_step": per_step, "steps_timed": counted,
            "train_wall_s": wall, "model": name}


def paired_step_cost(config: Path, overrides: list[str], weight: float, representation: str,
                     repeats: int = 8) -> tuple[float, float]:
    """(seconds without, seconds with the loss): the median forward and backward pass of one full-context step of
    the configured model (B windows of random features and targets, as many tokens a second as the corpus), the two
    alternated in one process so that both see the same load on a shared machine. The optimiser's step, the same
    either way, is left out."""
    import torch

    from asr_core.data.batching import MicroBatch
    from asr_core.data.chunking import group_size
    from asr_core.config import Config
    from asr_core.model.acoustic import build_model
    from asr_core.training.step import HeadDiversity, step_gradients

    cfg = Config.from_yaml(config, overrides)
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.data.features.n_mels, cfg.data.features.frames_per_second).train()
    b = group_size(cfg.data.context_s, cfg.data)
    t = round(cfg.data.context_s * cfg.data.features.frames_per_second)
    tokens = int(6 * cfg.data.context_s)  # ~6 pieces a second (grids/demo.yaml's vocab_size note)
    mb = MicroBatch(torch.randn(b, t, cfg.data.features.n_mels), torch.full((b,), t),
                    torch.randint(0, cfg.model.vocab_size - 1, (b, tokens)).tolist())
    loss = HeadDiversity(weight, representation, cfg.train.head_diversity_rows, cfg.train.seed)
    took: dict[bool, list[float]] = {False: [], True: []}
    for i in range(2 * repeats + 2):
        with_loss = i % 2 == 1
        t0 = time.perf_counter()
        step_gradients(model, [mb], torch.device("cpu"), False, 1000 + i, cfg.train.loss_norm, float(t * b),
                       loss if with_loss else None)
        if i >= 2:  # the first pair warms up
            took[with_loss].append(time.perf_counter() - t0)
    return float(np.median(took[False])), float(np.median(took[True]))


def corpus_dir(out: Path, given: Path | None) -> Path:
    """The corpus to use: ``given`` (checked), else ``OUT/corpus``, synthesised when it is not complete."""
    if given is not None:
        missing = [s for s in ("train", "test") if not (given / s).is_dir()]
        if missing:
            sys.exit(f"--corpus {given}: no {' or '.join(missing)}/ folder; give a corpus made by asr_core synth")
        return given.resolve()
    corpus = out / "corpus"
    done = corpus / "synth.json"
    if not (done.exists() and json.loads(done.read_text()).get("complete")):
        run(["asr_core", "synth", str(corpus), "--hours", "1.0", "--eval-hours", "0.15", "--eval-max-minutes", "0.75",
             "--voices", "3", "--shift", "near", "--splits", "train,test", "--seed", "0"], "the demo corpus",
            out / "synth.log")
    return corpus


def plot(results: pd.DataFrame, target: str, path: Path) -> None:
    """Summed similarity per representation: one panel each, bars per seed, one colour per lambda."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    weights = sorted(results.weight.unique())
    seeds = sorted(results.seed.unique())
    fig, axes = plt.subplots(1, len(REPRESENTATIONS), figsize=(3.0 * len(REPRESENTATIONS), 3.2))
    width = 0.8 / len(weights)
    for ax, r in zip(axes, REPRESENTATIONS):
        for i, w in enumerate(weights):
            part = results[results.weight == w].set_index("seed")
            ax.bar([k + i * width for k in range(len(seeds))], [part[r].get(s, math.nan) for s in seeds], width,
                   label=f"lambda {w:g}")
        ax.set_xticks([k + width * (len(weights) - 1) / 2 for k in range(len(seeds))], [f"seed {s}" for s in seeds])
        ax.set_title(f"{r}{' (targeted)' if r == target else ''}", fontsize=10)
    axes[0].set_ylabel("summed similarity (003 eq. 6 over layers)")
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- the demo sweep against context ----------------------------------------------------------------------------
def sweep_rows(sweep: Path, heads: Path | None) -> pd.DataFrame:
    """Context, seed, clean in-domain WER and summed similarity per trial of a demo sweep (NaN where missing)."""
    rows = []
    for cfg_path in sorted((sweep / "trials").glob("*/config.json")):
        cfg = json.loads(cfg_path.read_text())
        key = cfg_path.parent.name
        npz = (heads / key if heads else cfg_path.parent / "heads") / f"{TEST}.npz"
        csv = cfg_path.parent / "eval" / f"{TEST}.csv"
        rows.append({"context_s": float(cfg["data"]["context_s"]), "seed": int(cfg["train"]["seed"]), "trial": key,
                     "wer": clean_wer(csv) if csv.exists() else math.nan,
                     **(summed_similarity(npz) if npz.exists() else dict.fromkeys(REPRESENTATIONS, math.nan))})
    return pd.DataFrame(rows).sort_values(["context_s", "seed"]).reset_index(drop=True)


def sweep_markdown(rows: pd.DataFrame) -> str:
    lines = ["| context | seed | clean WER | " + " | ".join(REPRESENTATIONS) + " |",
             "| --- | --- | --- |" + " --- |" * len(REPRESENTATIONS)]
    for ctx, part in rows.groupby("context_s", sort=True):
        for r in [*part.to_dict("records"), {"seed": "mean", **part[["wer", *REPRESENTATIONS]].mean().to_dict()}]:
            bold = "**" if r["seed"] == "mean" else ""
            lines.append(f"| {ctx:g} s | {bold}{r['seed']}{bold} | {r['wer']:.2f}% | "
                         + " | ".join(f"{r[c]:.4f}" for c in REPRESENTATIONS) + " |")
    return "\n".join(lines)


# ---- the command -------------------------------------------------------------------------------------------------
def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    global THREADS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--corpus", type=Path, default=None, help="a demo corpus with train/ and test/ (default: "
                    "synthesised into OUT/corpus)")
    ap.add_argument("--grid", type=Path, default=ROOT / "grids" / "demo.yaml", help="the grid whose base is trained")
    ap.add_argument("--context", type=float, default=20.48, help="data.context_s of every model")
    ap.add_argument("--weights", default="0,1", help="train.head_diversity_weight values (0 = the baseline)")
    ap.add_argument("--repr", default="Y", choices=REPRESENTATIONS, help="train.head_diversity_repr")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--steps", type=int, default=None, help="train.max_steps (default: the grid's)")
    ap.add_argument("--threads", type=int, default=THREADS, help="CPU threads per command (OMP_NUM_THREADS)")
    ap.add_argument("--demo-sweep", type=Path, default=None, help="a finished demo sweep (runs/demo) to tabulate")
    ap.add_argument("--demo-heads", type=Path, default=None, help="its heads results as HEADS/<trial key>/test.npz "
                    "(default: heads/ in each trial folder)")
    a = ap.parse_args(argv)
    THREADS = max(1, a.threads)
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    weights, seeds = floats(a.weights), [int(s) for s in floats(a.seeds)]
    if any(w < 0 for w in weights) or not seeds:
        sys.exit(f"--weights must be non-negative ({a.weights}) and --seeds not empty ({a.seeds})")
    base = demo_base(a.grid)
    steps = a.steps or int(base.get("train", {}).get("max_steps", 0))
    if steps <= 0:
        sys.exit(f"{a.grid}: no train.max_steps in base; give --steps")
    config = out / "demo-base.yaml"
    config.write_text(f"# the base of {a.grid}\n" + yaml.safe_dump(base, sort_keys=False))
    corpus = corpus_dir(out, a.corpus)

    rows = [one_model(out, config, corpus, a.context, steps, w, a.repr, s) for w in weights for s in seeds]
    results = pd.DataFrame(rows)
    stem = out / f"results-{a.repr}"
    results.to_csv(stem.with_suffix(".csv"), index=False)
    md = [f"Context {a.context:g} s, {steps} steps, loss on {a.repr} (* targeted); similarity: 003 eq. 6 summed "
          f"over layers on the clean in-domain test set; s/step: median seconds per step at full context.", "",
          markdown_table(results, a.repr), ""]
    if 0 in weights and any(w > 0 for w in weights):
        md += [f"- {v.sentence()}" for v in verdicts(results, a.repr)]
        base_s = results[results.weight == 0].s_per_step.mean()
        for w, part in results[results.weight > 0].groupby("weight"):
            cost = part.s_per_step.mean()
            md.append(f"- seconds per step in training (lambda {w:g}, {a.repr}; the trainer's step log, median at "
                      f"full context, mean over seeds; other work shares this CPU): {cost:.3f} with the loss, "
                      f"{base_s:.3f} without ({100 * (cost / base_s - 1):+.0f}%)")
            paired = out / f"cost-{a.repr}{w:g}.json"
            if not paired.exists():
                print(f"== the loss's cost per step, paired (lambda {w:g} on {a.repr})", flush=True)
                without, with_ = paired_step_cost(config, model_overrides(corpus, a.context, seeds[0], steps), w,
                                                  a.repr)
                paired.write_text(json.dumps({"without_s": without, "with_s": with_}) + "\n")
            c = json.loads(paired.read_text())
            md.append(f"- forward and backward of one full-context step, alternated in one process (median of 8): "
                      f"{c['with_s']:.3f} s with the loss on {a.repr}, {c['without_s']:.3f} s without "
                      f"({100 * (c['with_s'] / c['without_s'] - 1):+.0f}%)")
    plot(results, a.repr, stem.with_name(f"similarity-{a.repr}.png"))
    if a.demo_sweep is not None:
        sweep = sweep_rows(a.demo_sweep, a.demo_heads)
        sweep.to_csv(out / "sweep.csv", index=False)
        md += ["", f"Demo sweep {a.demo_sweep}: summed similarity against context (clean in-domain test set)", "",
               sweep_markdown(sweep)]
    text = "\n".join(md)
    stem.with_suffix(".md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
