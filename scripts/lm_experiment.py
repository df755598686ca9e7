"""The LM decoding experiment of paper 004 in miniature, on this CPU (a benchmark script, not a CI test):

    .venv/bin/python scripts/lm_experiment.py [--demo-sweep demo-out/demo/runs/demo] [--out lm-out]

It takes two acoustic models of a finished demo sweep (``./scripts/demo.sh``: the shortest and the longest context,
seed 1), and then, each step a command a user would run:

1. synthesises long in-domain dev and test recordings (1.5-3 minutes, the demo's voices and conditions);
2. generates LM text in the corpus's language (``lm text``), disjoint from the test transcripts (its 8-gram
   overlap is printed), and trains the tiny LM on it with the acoustic models' tokenizer (``lm train``);
3. measures the LM's perplexity at LM contexts 16 to 1024 tokens on the test transcripts (``lm ppl``);
4. tunes alpha and beta on the dev split for each acoustic model (``lm tune``);
5. decodes the test split greedily and by beam search with the LM (``evaluate --decoder beam``, one set of
   posteriors), and tests the difference with the recording-level sign-flip permutation test the analysis uses.

Prints a table and writes ``OUT/results.json`` and ``OUT/results.md``. Each step is skipped when its output exists
(rerun after an interruption).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def run(args: list[str], what: str) -> str:
    t0 = time.perf_counter()
    print(f"== {what}: {' '.join(args)}", flush=True)
    p = subprocess.run([PY, "-m", *args], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{what} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    print(f"   done in {time.perf_counter() - t0:.0f} s", flush=True)
    return p.stdout


def acoustic_models(sweep: Path, seed: int) -> dict[float, Path]:
    """{context_s: checkpoint} of the sweep's dense models with ``train.seed == seed``: trained on fixed cuts with full
    attention (a sweep that also holds banded or pause-cut models, as the demo's after ``--fragmentation``, has
    several models at one context)."""
    out = {}
    for cfg_path in sorted((sweep / "trials").glob("*/config.json")):
        cfg = json.loads(cfg_path.read_text())
        ck = cfg_path.parent / "checkpoint.pt"
        dense = cfg["model"].get("attention_span_s") is None and cfg["data"].get("cut", "fixed") == "fixed"
        if cfg["train"]["seed"] == seed and ck.exists() and dense:
            out[float(cfg["data"]["context_s"])] = ck
    return out


def errors_of(csv: Path) -> pd.DataFrame:
    t = pd.read_csv(csv, dtype={"recording": str})
    t = t[t.condition == "clean"].set_index("recording")
    t["errors"] = t.substitutions + t.deletions + t.insertions
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo-sweep", type=Path, default=ROOT / "demo-out" / "demo" / "runs" / "demo")
    ap.add_argument("--out", type=Path, default=ROOT / "lm-out")
    ap.add_argument("--seed", type=int, default=1, help="the acoustic models' training seed")
    ap.add_argument("--lm-docs", type=int, default=800)
    ap.add_argument("--lm-steps", type=int, default=1500)
    ap.add_argument("--alpha", default="0.2,0.4,0.6,0.8")
    ap.add_argument("--beta", default="0,1,2")
    ap.add_argument("--beam-width", type=int, default=16)
    ap.add_argument("--tune-recordings", type=int, default=6)
    a = ap.parse_args(argv)
    out = a.out.resolve()
    models = acoustic_models(a.demo_sweep, a.seed)
    if len(models) < 2:
        sys.exit(f"{a.demo_sweep}: no finished demo sweep with two contexts at seed {a.seed} (run ./scripts/demo.sh)")
    contexts = [min(models), max(models)]
    corpus = out / "corpus"
    if not (corpus / "synth.json").exists():
        run(["asr_core", "synth", str(corpus), "--hours", "0.01", "--seed", "7", "--voices", "3", "--shift", "near",
             "--splits", "dev,test", "--eval-hours", "0.3", "--min-minutes", "1.5", "--eval-max-minutes", "3",
             "--jobs", "2"], "long dev and test recordings")
    lm_dir = out / "lm"
    if not (lm_dir / "train.jsonl").exists():
        overlap = run(["asr_core", "lm", "text", str(lm_dir / "train.jsonl"), "--docs", str(a.lm_docs), "--seed",
                       "101", "--min-words", "300", "--max-words", "1200", "--against", f"podcast:{corpus}/test"],
                      "LM text")
        (lm_dir / "overlap.txt").write_text(overlap)
        run(["asr_core", "lm", "text", str(lm_dir / "dev.jsonl"), "--docs", "40", "--seed", "102"], "LM dev text")
    lm = lm_dir / "model" / "checkpoint.pt"
    if not (lm_dir / "model" / "DONE").exists():
        run(["asr_core", "lm", "train", "--text", f"text:{lm_dir / 'train.jsonl'}", "--dev-text",
             f"text:{lm_dir / 'dev.jsonl'}", "--tokenizer", str(models[contexts[0]]), "--out", str(lm_dir / "model"),
             "--preset", "tiny", "--set", f"max_steps={a.lm_steps}"], "LM training")
        (lm_dir / "model" / "DONE").write_text("trained\n")
    ppl_csv = lm.parent / "ppl" / "ppl.csv"
    if not ppl_csv.exists():
        run(["asr_core", "lm", "ppl", str(lm), "--data", f"test=podcast:{corpus}/test", "--data",
             f"lmdev=text:{lm_dir / 'dev.jsonl'}", "--lm-contexts", "16,64,256,1024"], "perplexity against LM context")
    ppl = pd.read_csv(ppl_csv)

    from analysis.significance.stats import sign_flip_test

    rows = []
    for ctx in contexts:
        name = f"am{ctx:g}s"
        tune = out / f"tune-{name}.json"
        if not tune.exists():
            run(["asr_core", "lm", "tune", str(models[ctx]), "--lm", str(lm), "--data", f"dev=podcast:{corpus}/dev",
                 "--lm-weights", a.alpha, "--token-bonuses", a.beta, "--beam-width", str(a.beam_width), "--max-recordings",
                 str(a.tune_recordings), "--out", str(tune)], f"alpha and beta for the {ctx:g} s model")
        best = json.loads(tune.read_text())["best"]
        ev = out / f"eval-{name}"
        if not (ev / "test.lm.csv").exists():
            run(["asr_core", "evaluate", str(models[ctx]), "--data", f"test=podcast:{corpus}/test", "--clean-only",
                 "--out", str(ev), "--no-log", "--decoder", "beam", "--lm", str(lm),
                 "--lm-weight", f"{best['alpha']:g}", "--token-bonus", f"{best['beta']:g}", "--beam-width", str(a.beam_width),
                 "--decoder-name", "lm"], f"test decoding of the {ctx:g} s model")
        g, b = errors_of(ev / "test.csv"), errors_of(ev / "test.lm.csv")
        g, b = g.loc[sorted(g.index)], b.loc[sorted(g.index)]
        wg = 100 * g.errors.sum() / g.ref_words.sum()
        wb = 100 * b.errors.sum() / b.ref_words.sum()
        test = sign_flip_test((g.errors - b.errors).to_numpy(dtype=float))
        rows.append({"context_s": ctx, "alpha": best["alpha"], "beta": best["beta"], "greedy_wer": wg,
                     "beam_lm_wer": wb, "relative_reduction_pct": 100 * (wg - wb) / wg if wg else float("nan"),
                     "recordings": len(g), "p_value": test.pvalue, "dev_greedy_wer":
                     json.loads(tune.read_text())["greedy_wer"], "dev_beam_wer": best["wer"]})
    table = pd.DataFrame(rows)
    lines = ["| acoustic context | alpha | beta | greedy WER | beam+LM WER | relative reduction | p (sign-flip) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['context_s']:g} s | {r['alpha']:g} | {r['beta']:g} | {r['greedy_wer']:.2f}% | "
                     f"{r['beam_lm_wer']:.2f}% | {r['relative_reduction_pct']:.1f}% | {r['p_value']:.4f} |")
    lines += ["", "| LM data | " + " | ".join(f"ctx {c}" for c in sorted(ppl.context.unique())) + " |",
              "| --- |" + " --- |" * ppl.context.nunique()]
    for ds, part in ppl.groupby("dataset"):
        lines.append(f"| {ds} | " + " | ".join(f"{v:.3f}" for v in part.sort_values("context").ppl) + " |")
    md = "\n".join(lines)
    print(md)
    (out / "results.md").write_text(md + "\n")
    (out / "results.json").write_text(json.dumps({"decoding": rows, "ppl": ppl.to_dict("records"),
                                                  "overlap": (lm_dir / "overlap.txt").read_text().strip()},
                                                 indent=1) + "\n")
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
