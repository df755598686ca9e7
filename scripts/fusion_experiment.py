"""Window fusion on the demo's models (paper 001): does the study's context-length gain depend on how the moving
windows are joined? In miniature on this CPU (a benchmark script, not a CI test):

    .venv/bin/python scripts/fusion_experiment.py [--sweep-root demo-out/demo/runs] [--sweep demo] [--out fusion-out]

It needs a finished demo (``./scripts/demo.sh``: four contexts, two seeds, two test sets). Each step is a command a
user would run:

1. ``python -m orchestrate evaluate demo --spec grids/decode-fusion.yaml``: every trained model decoded once more on
   both test sets (clean), its windows joined each way of :data:`asr_core.contract.metrics.FUSION_METHODS`, into its
   own MLflow run (``wer_fusion-<METHOD>/...``) beside its own averaging (``wer/...``);
2. ``python -m analysis report demo --out OUT/report``: the report, whose "Decoding method" section writes
   ``fusion.csv`` (WER per method and context) and ``fusion_tests.csv`` (the tests);
3. the criteria, fixed before running (clean audio, each test set, seeds averaged as the report does):

   * S1: averaging (stride 0.125, 87.5% overlap) has the lowest mean WER of the methods at every context (a
     violation is a finding);
   * S2: Chiu at 50% is no worse than block-wise at each context: its WER lower, or the difference not significant
     (recording-level sign-flip permutation test, Holm over the contexts);
   * S3: ROVER over the 8 phases comes within 1 WER point of averaging, or is worse (WER_rover >= WER_average - 1);
   * S4: the 81.92 s vs 10.24 s WERR under averaging, block-wise and ROVER, each with its recording-level test
     (Holm over the methods); if its sign or its Holm significance differs between them, the decoding method is a
     confound of the context-length gain;
   * S5 (the learned stitcher) is not measured: the stitcher is not built.

Prints the tables and writes ``OUT/results.json`` and ``OUT/results.md``. A step whose output exists is not run
again (the evaluation itself decodes only what the models lack).
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
LONG, SHORT = 81.92, 10.24  # S4's contexts
S4_METHODS = ("average", "blockwise", "rover")


def run(args: list[str], what: str) -> None:
    t0 = time.perf_counter()
    print(f"== {what}: {' '.join(args)}", flush=True)
    p = subprocess.run([PY, "-m", *args], cwd=ROOT)
    if p.returncode != 0:
        sys.exit(f"{what} failed ({p.returncode})")
    print(f"   done in {time.perf_counter() - t0:.0f} s", flush=True)


def near(a: float, b: float) -> bool:
    return abs(a - b) <= 0.01 * b


def criteria(table: pd.DataFrame, tests: pd.DataFrame) -> dict[str, dict]:
    """S1-S4 from the report's fusion tables (clean rows only), of one family: ``context`` where the report has it (a
    sweep extended by ``demo.sh --fragmentation`` has the same dense models in a second family, ``dense``)."""
    table = table[table["condition"] == "clean"]
    tests = tests[tests["condition"] == "clean"]
    if "family" in table and table["family"].nunique() > 1:
        family = "context" if "context" in set(table["family"]) else sorted(table["family"])[0]
        table, tests = table[table["family"] == family], tests[tests["family"] == family]
    out: dict[str, dict] = {}
    s1 = []
    for (ds, ctx), g in table.groupby(["dataset", "context_s"]):
        by = g.set_index("method")["wer_mean"]
        best = by.idxmin()
        s1.append({"dataset": ds, "context_s": ctx, "average": by.get("average"), "best": best,
                   "best_wer": by.min(), "met": bool(by["average"] <= by.min())})
    out["S1"] = {"met": all(r["met"] for r in s1), "rows": s1}
    s2 = []
    pairs = tests[(tests["test"] == "method") & (tests["reference_method"] == "blockwise")
                  & (tests["method"] == "chiu")]
    for _, r in pairs.iterrows():
        worse = r["delta_wer"] > 0 and bool(r["significant"])
        s2.append({"dataset": r["dataset"], "context_s": r["context_s"], "blockwise": r["wer_reference"],
                   "chiu": r["wer"], "delta": r["delta_wer"], "p_holm": r["p_holm"], "met": not worse})
    out["S2"] = {"met": bool(s2) and all(r["met"] for r in s2), "rows": s2}
    s3 = []
    for (ds, ctx), g in table.groupby(["dataset", "context_s"]):
        by = g.set_index("method")["wer_mean"]
        if "rover" in by and "average" in by:
            s3.append({"dataset": ds, "context_s": ctx, "average": by["average"], "rover": by["rover"],
                       "met": bool(by["rover"] >= by["average"] - 1.0)})
    out["S3"] = {"met": bool(s3) and all(r["met"] for r in s3), "rows": s3}
    s4 = []
    ctx = tests[(tests["test"] == "context") & tests["method"].isin(S4_METHODS)]
    for ds, g in ctx.groupby("dataset"):
        g = g[g["context_s"].map(lambda c: near(c, LONG)) & g["reference_context_s"].map(lambda c: near(c, SHORT))]
        rows = [{"dataset": ds, "method": r["method"], "werr": r["werr"], "p": r["p_permutation"],
                 "p_holm": r["p_holm"], "significant": bool(r["significant"])} for _, r in g.iterrows()]
        signs = {r["werr"] > 0 for r in rows}
        sig = {r["significant"] for r in rows}
        s4.append({"dataset": ds, "rows": rows, "confound": len(signs) > 1 or len(sig) > 1})
    out["S4"] = {"confound": any(d["confound"] for d in s4), "by_dataset": s4}
    return out


def markdown(res: dict[str, dict]) -> str:
    lines = ["| criterion | test set | context (s) | figures | met |", "|---|---|---|---|---|"]
    for r in res["S1"]["rows"]:
        lines.append(f"| S1 averaging lowest | {r['dataset']} | {r['context_s']:g} | average {r['average']:.2f}, "
                     f"best {r['best']} {r['best_wer']:.2f} | {'yes' if r['met'] else 'no'} |")
    for r in res["S2"]["rows"]:
        lines.append(f"| S2 Chiu no worse than block-wise | {r['dataset']} | {r['context_s']:g} | block-wise "
                     f"{r['blockwise']:.2f}, Chiu {r['chiu']:.2f} (Δ {r['delta']:+.2f}, p_Holm {r['p_holm']:.3g}) | "
                     f"{'yes' if r['met'] else 'no'} |")
    for r in res["S3"]["rows"]:
        lines.append(f"| S3 ROVER ≥ averaging − 1 | {r['dataset']} | {r['context_s']:g} | average "
                     f"{r['average']:.2f}, ROVER {r['rover']:.2f} | {'yes' if r['met'] else 'no'} |")
    lines += ["", "| S4: WERR 81.92 s vs 10.24 s | method | WERR | p | p_Holm | significant |", "|---|---|---|---|---|---|"]
    for d in res["S4"]["by_dataset"]:
        for r in d["rows"]:
            lines.append(f"| {d['dataset']} | {r['method']} | {r['werr']:+.3f} | {r['p']:.3g} | {r['p_holm']:.3g} | "
                         f"{'yes' if r['significant'] else 'no'} |")
        lines.append(f"| {d['dataset']} | decoding method a confound? | {'**yes**' if d['confound'] else 'no'} | | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep-root", type=Path, default=ROOT / "demo-out" / "demo" / "runs")
    ap.add_argument("--sweep", default="demo")
    ap.add_argument("--out", type=Path, default=ROOT / "fusion-out")
    ap.add_argument("--spec", default="grids/decode-fusion.yaml",
                    help="the fusion decode file (another one: e.g. its datasets named)")
    ap.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                    help="only these trials, as orchestrate evaluate --where (e.g. subgrid=context: the demo's dense "
                         "models at four contexts, not the banded and pause-cut ones --fragmentation adds)")
    a = ap.parse_args(argv)
    root = a.sweep_root.resolve()
    if not (root / a.sweep / "trials.json").exists():
        sys.exit(f"no sweep {a.sweep!r} under {root}: run ./scripts/demo.sh first, or give --sweep-root/--sweep")
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    where = [x for w in a.where for x in ("--where", w)]
    run(["orchestrate", "evaluate", a.sweep, "--spec", a.spec, "--sweep-root", str(root), *where],
        "1/3 window fusion evaluation of every model")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    report = a.out / "report"
    run(["analysis", "report", a.sweep, "--tracking-uri", uri, "--out", str(report), "--no-log"], "2/3 report")
    table, tests = pd.read_csv(report / "fusion.csv"), pd.read_csv(report / "fusion_tests.csv")
    res = criteria(table, tests)
    res["seconds"] = time.perf_counter() - t0
    (a.out / "results.json").write_text(json.dumps(res, indent=1, default=float))
    wer = table[table["condition"] == "clean"].pivot_table(index=["dataset", "context_s"], columns="method",
                                                            values="wer_mean")
    text = ("## WER (%) per method, clean, mean over seeds\n\n```\n" + wer.round(2).to_string() + "\n```\n\n"
            "## Criteria\n\n" + markdown(res))
    (a.out / "results.md").write_text(text)
    print(text)
    print(f"3/3 criteria: S1 {'met' if res['S1']['met'] else 'not met'}, S2 {'met' if res['S2']['met'] else 'not met'}, "
          f"S3 {'met' if res['S3']['met'] else 'not met'}, S4 confound: {'yes' if res['S4']['confound'] else 'no'} "
          f"({res['seconds']:.0f} s); {a.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
