#!/usr/bin/env python
"""The CPU check of the estimate (issue 15): calibrate the demo's model on this machine, estimate the demo grid's
trials, and compare with the durations its MLflow runs recorded: each trial within +-25%, the total within +-15%.

    .venv/bin/python scripts/estimate_check.py [--demo DIR] [--calibration FILE] [--steps N] [--run]

``--demo DIR`` is a finished demo (``DIR/corpus``, ``DIR/runs``; default ``demo-out/demo``, what
``./scripts/demo.sh`` writes); ``--run`` runs ``./scripts/demo.sh`` first (about 20 minutes on 2 cores; it reuses
what is finished). The calibration (``python -m asr_core bench calibrate`` on the demo grid's base config, one
CPU thread as the local backend gives each trial, the demo's own training corpus) is written to
``DIR/calibration.json``; ``--calibration FILE`` uses a file instead. The local backend ran the trials side by
side, one per core, so the calibration runs as many copies at once (``--parallel``, default: the cores, at most the
trials) and averages them: timings taken alone on an idle machine would miss the contention the trials had.

A recorded duration is the run's end time minus its job's start (the trial folder's first segment in
``segments.jsonl``): the MLflow run is created at submission, so its start time also counts the wait for a free
CPU (shown as ``queued``).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TRIAL_TOLERANCE = 0.25
TOTAL_TOLERANCE = 0.15


def recorded(demo: Path, experiment: str = "demo") -> dict[str, dict[str, float]]:
    """{trial key: {"job_s", "mlflow_s"}} of the finished trial runs of the demo's sweep."""
    runs = demo / "runs"
    manifest = json.loads((runs / experiment / "sweep.json").read_text())
    uri = manifest["tracking_uri"]
    if not uri.startswith("sqlite:///"):
        raise SystemExit(f"{runs}: the ledger {uri} is not a sqlite file; this check reads the demo's own")
    db = sqlite3.connect(uri[len("sqlite:///"):])
    rows = db.execute(
        "SELECT r.run_uuid, r.start_time, r.end_time, r.status, t.value FROM runs r "
        "JOIN experiments e ON r.experiment_id = e.experiment_id "
        "JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'trial.key' WHERE e.name = ?", (experiment,)).fetchall()
    out = {}
    for _, start, end, status, key in rows:
        if status != "FINISHED" or not end:
            continue
        seg = runs / experiment / "trials" / key / "segments.jsonl"
        job_start = start / 1000.0
        if seg.exists():
            first = seg.read_text().splitlines()[0]
            job_start = float(json.loads(first)["time"])
        out[key] = {"job_s": end / 1000.0 - job_start, "mlflow_s": (end - start) / 1000.0,
                    "queued_s": job_start - start / 1000.0}
    return out


def calibrate_parallel(cfg, contexts: list[float], steps: int, threads: int, parallel: int, demo: Path) -> dict:
    """``parallel`` runs of ``python -m asr_core bench calibrate`` on ``cfg`` at once; their mean."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="estimate-check-") as tmp:
        conf = Path(tmp) / "demo-base.json"
        conf.write_text(json.dumps(cfg.to_dict()))
        procs, outs = [], []
        for i in range(parallel):
            out = Path(tmp) / f"cal{i}.json"
            outs.append(out)
            cmd = [sys.executable, "-m", "asr_core", "bench", "calibrate", "--config", str(conf), "--contexts-s",
                   ",".join(f"{c:g}" for c in contexts), "--steps", str(steps), "--warmup", "2", "--data",
                   cfg.data.train, "--threads", str(threads), "--out", str(out)]
            env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                          stderr=open(Path(tmp) / f"cal{i}.log", "w")))
        for i, p in enumerate(procs):
            if p.wait() != 0:
                raise SystemExit(f"calibration {i} failed:\n{(Path(tmp) / f'cal{i}.log').read_text()[-2000:]}")
        runs = [json.loads(o.read_text()) for o in outs]
    return mean_calibration(runs)


def mean_calibration(runs: list[dict]) -> dict:
    """The first calibration with the timings every estimate uses averaged over ``runs``."""
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    out = json.loads(json.dumps(runs[0]))
    tr = out["train"]
    tr["fit"]["a"] = mean([r["train"]["fit"]["a"] for r in runs])
    tr["fit"]["b"] = mean([r["train"]["fit"]["b"] for r in runs])
    tr["overhead_s"] = mean([r["train"]["overhead_s"] for r in runs])
    for i, c in enumerate(tr["contexts"]):
        for k in ("full_step_s", "fit_step_s", "frames_per_s"):
            c[k] = mean([r["train"]["contexts"][i][k] for r in runs])
        c["step_s"]["median"] = mean([r["train"]["contexts"][i]["step_s"]["median"] for r in runs])
    for i, d in enumerate(out["eval"]["decode"]):
        d["frames_per_s"] = mean([r["eval"]["decode"][i]["frames_per_s"] for r in runs])
    for k in ("features_s_per_audio_s", "music_s_per_audio_s", "music_s_per_call"):
        out["eval"][k] = mean([r["eval"][k] for r in runs])
    out["data"]["stats_s_per_audio_s"] = mean([r["data"]["stats_s_per_audio_s"] for r in runs])
    out["checkpoint"]["save_s"] = mean([r["checkpoint"]["save_s"] for r in runs])
    out["startup_s"] = mean([r["startup_s"] for r in runs])
    out["source"] += f" (the mean of {len(runs)} run at once)"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", type=Path, default=REPO / "demo-out" / "demo",
                    help="a finished demo (default demo-out/demo)")
    ap.add_argument("--grid", type=Path, default=REPO / "grids" / "demo.yaml")
    ap.add_argument("--calibration", type=Path, default=None, help="use this calibration instead of measuring one")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per context when calibrating (default 8)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads when calibrating (default 1: a trial's)")
    ap.add_argument("--parallel", type=int, default=0,
                    help="calibrations run at once, as the trials ran (default: the cores, at most the trials)")
    ap.add_argument("--run", action="store_true", help="run ./scripts/demo.sh first (DEMO_OUT = the parent of --demo)")
    args = ap.parse_args(argv)
    demo: Path = args.demo.resolve()
    if args.run:
        subprocess.run(["bash", str(REPO / "scripts" / "demo.sh")], check=True, cwd=REPO,
                       env={**__import__("os").environ, "DEMO_OUT": str(demo.parent)})
    if not (demo / "runs").exists():
        raise SystemExit(f"{demo}: no finished demo (runs/ missing); run ./scripts/demo.sh or pass --run / --demo")

    from asr_core.bench.calibrate import table
    from asr_core.contract.calibration import CalibrationFile
    from orchestrate.budget.calibration import calibration_from_dict
    from orchestrate.budget.estimate import estimate_grid
    from orchestrate.plan.grid import load_grid

    manifest = json.loads((demo / "runs" / "demo" / "sweep.json").read_text())
    grid = load_grid(args.grid, manifest.get("overrides", []))
    if args.calibration:
        raw = json.loads(args.calibration.read_text())
        cal_path = str(args.calibration)
    else:
        base = grid.trials[0].config
        contexts = sorted({t.config.data.context_s for t in grid.trials} | {base.data.seqlen_warmup_start_s})
        parallel = args.parallel or max(1, min(os.cpu_count() or 1, len(grid.trials)))
        raw = calibrate_parallel(base, contexts, args.steps, args.threads, parallel, demo)
        cal_path = str(demo / "calibration.json")
        Path(cal_path).write_text(json.dumps(raw, indent=1) + "\n")
        print(table(CalibrationFile.from_dict(raw, cal_path)))
        print(f"written: {cal_path} (the mean of {parallel} calibrations run at once)\n")
    cal = calibration_from_dict(raw, cal_path)
    est = estimate_grid(grid, cal)
    rec = recorded(demo)
    head = f"{'trial':<32} {'ctx s':>6} {'est s':>7} {'train':>6} {'eval':>5} {'other':>5} {'recorded s':>10} " \
           f"{'queued':>6} {'est/rec':>7}  within"
    print(head)
    print("-" * len(head))
    est_total, rec_total, ok = 0.0, 0.0, True
    for t in est.trials:
        r = rec.get(t.key)
        other = t.checkpoint_s + t.startup_s
        if r is None:
            print(f"{t.label:<32} {t.context_s:>6g} {t.seconds:>7.0f} {t.train_s:>6.0f} {t.eval_s or 0:>5.0f} "
                  f"{other:>5.0f} {'(none)':>10}")
            ok = False
            continue
        ratio = t.seconds / r["job_s"]
        good = abs(ratio - 1) <= TRIAL_TOLERANCE
        ok &= good
        est_total += t.seconds
        rec_total += r["job_s"]
        print(f"{t.label:<32} {t.context_s:>6g} {t.seconds:>7.0f} {t.train_s:>6.0f} {t.eval_s or 0:>5.0f} "
              f"{other:>5.0f} {r['job_s']:>10.0f} {r['queued_s']:>6.0f} {ratio:>7.2f}  "
              f"{'yes' if good else 'NO'} (+-{TRIAL_TOLERANCE:.0%})")
    total_ratio = est_total / rec_total if rec_total else float("nan")
    total_ok = abs(total_ratio - 1) <= TOTAL_TOLERANCE
    print("-" * len(head))
    print(f"{'total':<32} {'':>6} {est_total:>7.0f} {'':>6} {'':>5} {'':>5} {rec_total:>10.0f} {'':>6} "
          f"{total_ratio:>7.2f}  {'yes' if total_ok else 'NO'} (+-{TOTAL_TOLERANCE:.0%})")
    print(f"calibration: {cal.device}, {raw.get('threads')} threads ({cal_path}); recorded: {demo / 'runs'}")
    for note in est.corpora:
        print(f"training data {note}")
    return 0 if ok and total_ok else 1


if __name__ == "__main__":
    sys.exit(main())
