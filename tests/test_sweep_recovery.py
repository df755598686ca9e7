"""Recovery on the real SLURM test cluster: the submitting process killed mid-submission, a job killed with
``scancel``, and the node set DOWN are each repaired by ``orchestrate resume`` with no trial lost or run twice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrate.cli import main
from orchestrate.grid import load_grid
from orchestrate.ledger import Ledger, wait_for
from orchestrate.sweep import SweepDir
from tests.test_backend import (MAX_STEPS, SMOKE, assert_one_run_per_key, cluster_env, loss_steps, smoke_corpus,
                                squeue_states, submit_args, wait_until, write_profile)

__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]


def _starts(sweep: SweepDir, key: str) -> int:
    p = sweep.trial_dir(key) / "trial.log"
    return p.read_text().count("==== ") if p.exists() else 0


def _finish_and_check(root: Path, name: str, uri: str, corpus: Path) -> tuple[Ledger, SweepDir]:
    grid = load_grid(SMOKE, [f"data.train=podcast:{corpus}/train"])
    ledger = Ledger(uri, name)
    runs = wait_for(ledger, [t.key for t in grid.trials], timeout=800)
    assert {r.status for r in runs.values()} == {"FINISHED"}, {r.label: (r.status, r.error) for r in runs.values()}
    assert_one_run_per_key(ledger, len(grid.trials))
    for r in runs.values():
        assert loss_steps(ledger, r.run_id) == list(range(1, MAX_STEPS + 1)), r.label
    return ledger, SweepDir(root, name)


@pytest.mark.parametrize("point", ["after-runs", "after-submit"])
def test_submitter_killed_mid_submission_is_recovered_by_resume(point: str, tmp_path: Path, smoke_corpus: Path,
                                                                request: pytest.FixtureRequest) -> None:
    uri = cluster_env(request)
    root, name = tmp_path / "runs", f"crash-{point}"
    args = submit_args("slurm", root, smoke_corpus, uri, write_profile(tmp_path, "a100:1"), sweep=name)
    p = subprocess.run([sys.executable, "-m", "orchestrate", *args], env={**os.environ, "ORCHESTRATE_FAULT": point},
                       capture_output=True, text=True)
    assert p.returncode == 137, p.stderr
    sweep = SweepDir(root, name)
    ledger = Ledger(uri, name)
    before = ledger.trial_runs()
    assert before and all(not r.job_id for r in before.values())  # died before any job id was recorded
    live_before = squeue_states(f"orch.{name}.")
    assert bool(live_before) == (point == "after-submit")
    assert main(["resume", name, "--sweep-root", str(root)]) == 0
    after = ledger.trial_runs()
    assert {k: r.run_id for k, r in after.items()} == {k: r.run_id for k, r in before.items()}  # same runs
    assert all(r.job_id for r in after.values())
    # after-submit: the array that was submitted is re-attached, not submitted a second time.
    assert len(sweep.submissions()) == 1 if point == "after-submit" else 2
    ledger, sweep = _finish_and_check(root, name, uri, smoke_corpus)
    for k in after:
        assert _starts(sweep, k) == 1  # every trial started exactly once


def test_scancelled_job_is_resubmitted_and_resumes_its_checkpoint(tmp_path: Path, smoke_corpus: Path,
                                                                  request: pytest.FixtureRequest) -> None:
    uri = cluster_env(request)
    root, name = tmp_path / "runs", "scancelled"
    assert main(submit_args("slurm", root, smoke_corpus, uri, write_profile(tmp_path, "a100:1"), sweep=name)) == 0
    ledger, sweep = Ledger(uri, name), SweepDir(root, name)
    victim = wait_until(lambda: next((r for r in ledger.trial_runs().values()
                                      if r.status == "RUNNING" and len(loss_steps(ledger, r.run_id)) >= 4), None),
                        400, "no trial reached step 4")
    subprocess.run(["scancel", victim.job_id], check=True)
    wait_until(lambda: victim.job_id not in squeue_states(f"orch.{name}."), 120, "the cancelled task lingers")
    assert main(["resume", name, "--sweep-root", str(root)]) == 0
    assert len(sweep.submissions()) == 2  # the lost trial went out again in a new array
    ledger, sweep = _finish_and_check(root, name, uri, smoke_corpus)
    assert _starts(sweep, victim.key) == 2 and "resum" in (sweep.trial_dir(victim.key) / "trial.log").read_text()
    others = [k for k in ledger.trial_runs() if k != victim.key]
    assert all(_starts(sweep, k) == 1 for k in others)


def test_node_down_is_recovered_by_resume(tmp_path: Path, smoke_corpus: Path, request: pytest.FixtureRequest) -> None:
    uri = cluster_env(request)
    root, name = tmp_path / "runs", "nodedown"
    assert main(submit_args("slurm", root, smoke_corpus, uri, write_profile(tmp_path, "a100:1"), sweep=name)) == 0
    ledger, sweep = Ledger(uri, name), SweepDir(root, name)
    wait_until(lambda: any(r.status == "RUNNING" and len(loss_steps(ledger, r.run_id)) >= 4
                           for r in ledger.trial_runs().values()), 400, "no trial reached step 4")
    node = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True,
                          check=True).stdout.split()[0]
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=orchestrate-test"], check=True)
    try:
        wait_until(lambda: all(s != "RUNNING" for s in squeue_states(f"orch.{name}.").values()), 120,
                   "tasks still running on a DOWN node")
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=True)
    assert main(["resume", name, "--sweep-root", str(root)]) == 0
    ledger, sweep = _finish_and_check(root, name, uri, smoke_corpus)
    # Interrupted trials resumed from their checkpoints (two starts at most); none was trained from scratch twice.
    for k in ledger.trial_runs():
        assert _starts(sweep, k) in (1, 2)
