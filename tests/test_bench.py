"""``orchestrate bench`` prints every figure against its goal, with the ratio, in one table; a figure it cannot
measure here says why instead of a number. (The full-size run, with the SLURM submission to an MLflow server, is
``python -m orchestrate bench``; here the sweep folder that ``status`` is timed on is small.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrate.tools.bench import bench_new_test_set, run_bench

pytestmark = pytest.mark.timeout(300)

ROW = re.compile(r"^(?P<what>.+?)\s{2,}(?P<t>[\d.]+|-)\s+(?P<goal>[\d.]+)\s+(?P<ratio>[\d.]+|-)\s+(?P<ok>ok|SLOW)?\s*"
                 r"(?P<note>.*)$")


def test_bench_prints_each_figure_against_its_goal(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench(skip_slurm=True, status_goals=((12, 60.0),)) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if line.startswith("operation"))
    assert all(w in out[header] for w in ("time (s)", "goal (s)", "time/goal", "note"))
    rows = {m["what"].strip(): m for m in map(ROW.match, out[header + 2:]) if m}
    assert set(rows) == {"plan paper grid (321 trials)", "plan 10k-trial grid", "submit 321 trials (slurm, mlflow "
                         "server)", "ledger query, 321-trial sweep", "status, 12-trial sweep",
                         "add 1 test set, 321-model sweep (plan)"}, out
    for what in ("plan paper grid (321 trials)", "plan 10k-trial grid", "status, 12-trial sweep",
                 "add 1 test set, 321-model sweep (plan)"):
        r = rows[what]
        assert r["t"] != "-" and r["ok"] in ("ok", "SLOW"), r.string
        assert float(r["ratio"]) == pytest.approx(float(r["t"]) / float(r["goal"]), abs=0.01), r.string
    assert rows["plan 10k-trial grid"]["note"] == "10000 trials"
    assert "fresh process" in rows["status, 12-trial sweep"]["note"]  # it ran, and exited 0
    for what in ("submit 321 trials (slurm, mlflow server)", "ledger query, 321-trial sweep"):
        assert rows[what]["t"] == "-" and "skipped (--skip-slurm)" in rows[what]["note"]
    assert float(rows["submit 321 trials (slurm, mlflow server)"]["goal"]) == 5.0


def test_one_more_test_set_plans_an_evaluation_per_model_and_no_training(tmp_path: Path) -> None:
    """A finished 321-model paper sweep given one more eval dataset: every model gets one evaluation job, none is
    trained again (how long the plan takes is the bench's row, not this test's)."""
    r = bench_new_test_set(tmp_path)
    assert (r.models, r.evaluations, r.trainings) == (321, 321, 0), r.row
    assert r.row.seconds is not None and r.row.note.startswith("321 evaluation jobs, 0 trainings"), r.row
