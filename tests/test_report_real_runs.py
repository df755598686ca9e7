"""The report from a real sweep: a grid expanded by orchestrate, ledgered in MLflow, each trial trained and evaluated
by ``python -m asr_core trial`` on a synthetic corpus (tiny models, a few steps), then ``python -m analysis report``.

Nothing here is synthetic on the analysis side: params, tags, metrics and eval tables are what the system writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from analysis.__main__ import main
from orchestrate.plan.grid import load_grid
from orchestrate.ledger.ledger import Ledger

ROOT = Path(__file__).resolve().parents[1]
# four real trials (about a minute of CPU on 2 cores), made once: both tests on one worker, so the module's
# fixture is not built twice
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("report_real_runs")]
GRID = """\
name: tiny-real
seeds: [1, 2]
base:
  preset: tiny
  data:
    train: podcast:{corpus}/train
    batch_audio_s: 10.24
    seqlen_warmup: none
  train:
    max_steps: 6
    warmup_steps: 2
    checkpoint_every: 100
    device: cpu
    precision: fp32
  eval:
    datasets: [test=podcast:{corpus}/test]
    snrs: [0]
    stride: 0.5
subgrids:
  context:
    section: "context"
    axes:
      data.context_s: [2.56, 5.12]
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("real-sweep")
    corpus = tmp / "corpus"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "asr_core", "synth", str(corpus), "--hours", "0.02", "--eval-hours",
                    "0.01", "--min-minutes", "0.3", "--max-minutes", "0.5", "--seed", "5", "--splits", "train,test"],
                   check=True, capture_output=True, cwd=ROOT, env=env)
    grid_path = tmp / "grid.yaml"
    grid_path.write_text(GRID.format(corpus=corpus))
    grid = load_grid(grid_path)
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    ledger = Ledger(uri, grid.name)
    parent = ledger.ensure_sweep(str(grid_path), "local")
    runs = ledger.create_trial_runs(parent, grid.trials, "local")
    for trial in grid.trials:
        tdir = tmp / "trials" / trial.label
        tdir.mkdir(parents=True)
        (tdir / "config.json").write_text(json.dumps(trial.config.to_dict()))
        proc = subprocess.run([sys.executable, "-m", "asr_core", "trial", "--config", str(tdir / "config.json"),
                               "--out", str(tdir), "--tracking-uri", uri, "--run-id", runs[trial.key]],
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = tmp / "report"
    rc = main(["report", "--experiment", grid.name, "--tracking-uri", uri, "--out", str(out),
               "--baseline-context", "2.56", "--bootstrap", "500"])
    assert rc == 0
    return {"uri": uri, "name": grid.name, "out": out, "n": len(grid.trials)}


def test_report_of_real_runs_has_every_table_and_no_other_problems(sweep: dict) -> None:
    out = sweep["out"]
    trials = pd.read_csv(out / "trials.csv")
    assert len(trials) == sweep["n"] == 4 and set(trials["status"]) == {"FINISHED"}
    # every run wrote every metric and table; the only problem listed is the one these 6-step models have by design:
    # they have not learned to transcribe yet (the report says so, and still tabulates them)
    problems = pd.read_csv(out / "problems.csv")
    assert set(problems["run_id"]) <= set(trials["run_id"]), problems
    assert problems["problem"].str.contains("has not learned to transcribe").all(), problems
    assert sorted(trials["context_s"].unique()) == [2.56, 5.12]
    sig = pd.read_csv(out / "significance.csv")
    assert set(zip(sig["dataset"], sig["condition"])) == {("test", "clean"), ("test", "snr0")}
    assert sig["p_permutation"].between(0, 1).all() and sig["p_holm"].notna().all()
    assert (sig["seeds"] == "1,2").all() and (sig["n_recordings"] > 0).all()
    # a configuration that has not learned is compared in significance.csv, but no figure or sentence is drawn
    # from it: with two contexts, one such is enough to leave nothing to draw
    assert not list(out.glob("*.png"))
    md = (out / "report.md").read_text()
    assert "**Left out**: " in md and "not learned to transcribe, so left out of the comparisons and figures" in md
    assert " against 2.56 s on test" not in md


def test_report_wer_equals_the_logged_metrics(sweep: dict) -> None:
    client = MlflowClient(sweep["uri"])
    exp = client.get_experiment_by_name(sweep["name"])
    logged: dict[tuple[str, str], list[float]] = {}
    for run in client.search_runs([exp.experiment_id], "tags.`sweep.role` = 'trial'"):
        cfg = run.data.tags["trial.label"].rsplit("-s", 1)[0]
        for key in ("wer/test", "wer/test/snr0"):
            logged.setdefault((cfg, key), []).append(run.data.metrics[key])
    wer = pd.read_csv(sweep["out"] / "wer.csv")
    for _, row in wer.iterrows():
        key = "wer/test" + ("" if row["condition"] == "clean" else "/" + row["condition"])
        values = logged[(row["config"], key)]
        assert row["wer_mean"] == pytest.approx(sum(values) / len(values))
        assert row["n_seeds"] == 2
