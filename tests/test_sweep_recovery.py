"""Recovery on the real SLURM test cluster: the submitting process killed mid-submission, a job killed with
``scancel``, and the node set DOWN are each repaired by ``orchestrate resume`` with no trial lost or run twice, and
every interrupted trial continues from its checkpoint rather than training again from step 0."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrate.cli.commands import main
from orchestrate.plan.grid import load_grid
from orchestrate.ledger.ledger import Ledger, wait_for
from orchestrate.sweep.folder import SweepDir
from tests.test_backend import (CHECKPOINT_EVERY, MAX_STEPS, SMOKE, assert_one_run_per_key, cluster_env,
                                last_checkpoint, loss_steps, resumed_at, smoke_corpus, squeue_states,
                                steps_logged_before, submit_args, unique, wait_until, write_profile)

__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

# Far enough that a periodic checkpoint surely exists: the trainer writes checkpoint 4 before it logs step 5.
PAST_FIRST_CHECKPOINT = CHECKPOINT_EVERY + 1


def _finish_and_check(root: Path, name: str, uri: str, corpus: Path) -> tuple[Ledger, SweepDir]:
    grid = load_grid(SMOKE, [f"data.train=podcast:{corpus}/train"])
    ledger = Ledger(uri, name)
    runs = wait_for(ledger, [t.key for t in grid.trials], timeout=800)
    assert {r.status for r in runs.values()} == {"FINISHED"}, {r.label: (r.status, r.error) for r in runs.values()}
    assert_one_run_per_key(ledger, len(grid.trials))
    for r in runs.values():
        assert loss_steps(ledger, r.run_id) == list(range(1, MAX_STEPS + 1)), r.label
    return ledger, SweepDir(root, name)


def _assert_resumed(starts: list[int | None], logged: int, label: str) -> None:
    """A trial that had logged ``logged`` steps (0 < logged < MAX_STEPS) when its job was killed started twice, the
    second time from a checkpoint no older than the newest one it had written by then."""
    assert len(starts) == 2 and starts[0] is None, (label, starts)
    floor = last_checkpoint(logged)
    assert starts[1] is not None or floor == 0, f"{label} trained again from step 0: {starts}, {logged} logged"
    assert floor <= (starts[1] or 0) < MAX_STEPS, (label, starts, logged)


@pytest.mark.parametrize("point", ["after-runs", "after-submit"])
def test_submitter_killed_mid_submission_is_recovered_by_resume(point: str, tmp_path: Path, smoke_corpus: Path,
                                                                request: pytest.FixtureRequest) -> None:
    uri = cluster_env(request)
    root, name = tmp_path / "runs", unique(f"crash-{point}")
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
    # after-runs died before the backend wrote its submission file; after-submit, after sbatch.
    assert len(sweep.submissions()) == (1 if point == "after-submit" else 0)
    assert main(["resume", name, "--sweep-root", str(root)]) == 0
    after = ledger.trial_runs()
    assert {k: r.run_id for k, r in after.items()} == {k: r.run_id for k, r in before.items()}  # same runs
    # after-submit: the array that was submitted is re-attached, not submitted a second time; after-runs: the
    # trials go out once, in resume's submission.
    assert len(sweep.submissions()) == 1
    ledger, sweep = _finish_and_check(root, name, uri, smoke_corpus)
    assert all(r.job_id for r in ledger.trial_runs().values())  # each job tagged its run
    for k in after:
        assert resumed_at(sweep.trial_dir(k)) == [None], k  # every trial started exactly once, from step 0


def test_scancelled_job_is_resubmitted_and_resumes_its_checkpoint(tmp_path: Path, smoke_corpus: Path,
                                                                  request: pytest.FixtureRequest) -> None:
    uri = cluster_env(request)
    root, name = tmp_path / "runs", unique("scancelled")
    assert main(submit_args("slurm", root, smoke_corpus, uri, write_profile(tmp_path, "a100:1"), sweep=name)) == 0
    ledger, sweep = Ledger(uri, name), SweepDir(root, name)
    victim = wait_until(lambda: next((r for r in ledger.trial_runs().values()
                                      if r.status == "RUNNING"
                                      and len(loss_steps(ledger, r.run_id)) >= PAST_FIRST_CHECKPOINT), None),
                        400, f"no trial reached step {PAST_FIRST_CHECKPOINT}")
    t_cancel = time.time()
    subprocess.run(["scancel", victim.job_id], check=True)
    wait_until(lambda: victim.job_id not in squeue_states(f"orch.{name}."), 120, "the cancelled task lingers")
    assert main(["resume", name, "--sweep-root", str(root)]) == 0
    assert len(sweep.submissions()) == 2  # the lost trial went out again in a new array
    ledger, sweep = _finish_and_check(root, name, uri, smoke_corpus)
    logged = steps_logged_before(ledger, victim.run_id, t_cancel)
    assert logged >= PAST_FIRST_CHECKPOINT
    _assert_resumed(resumed_at(sweep.trial_dir(victim.key)), logged, victim.label)
    others = [k for k in ledger.trial_runs() if k != victim.key]
    assert all(resumed_at(sweep.trial_dir(k)) == [None] for k in others)


def test_node_down_is_recovered_by_resume(tmp_path: Path, smoke_corpus: Path, request: pytest.FixtureRequest) -> None:
    uri = cluster_env(request)
    root, name = tmp_path / "runs", unique("nodedown")
    assert main(submit_args("slurm", root, smoke_corpus, uri, write_profile(tmp_path, "a100:1"), sweep=name)) == 0
    ledger, sweep = Ledger(uri, name), SweepDir(root, name)
    wait_until(lambda: any(r.status == "RUNNING" and len(loss_steps(ledger, r.run_id)) >= PAST_FIRST_CHECKPOINT
                           for r in ledger.trial_runs().values()),
               400, f"no trial reached step {PAST_FIRST_CHECKPOINT}")
    node = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True,
                          check=True).stdout.split()[0]
    t_down = time.time()
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=orchestrate-test"], check=True)
    try:
        wait_until(lambda: all(s != "RUNNING" for s in squeue_states(f"orch.{name}.").values()), 120,
                   "tasks still running on a DOWN node")
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=True)
    assert main(["resume", name, "--sweep-root", str(root)]) == 0
    ledger, sweep = _finish_and_check(root, name, uri, smoke_corpus)
    interrupted = 0
    for key, run in ledger.trial_runs().items():
        starts = resumed_at(sweep.trial_dir(key))
        assert 1 <= len(starts) <= 2 and starts[0] is None, (run.label, starts)  # never trained from scratch twice
        logged = steps_logged_before(ledger, run.run_id, t_down)
        if 0 < logged < MAX_STEPS:  # mid-training when the node went down
            _assert_resumed(starts, logged, run.label)
            interrupted += logged >= PAST_FIRST_CHECKPOINT
    assert interrupted >= 1  # the trial seen past its first checkpoint was interrupted and resumed from it
