"""The failure budget on the real SLURM test cluster with a real ``mlflow server``.

* The decision table (``dispatch.classify``) on real trial folders: finished whatever the ledger says, live by
  lease, cancelled, given up, failed or killed (left by ``submit``, resubmitted by ``resume``), preempted, lost,
  new; what ``retry --failed`` and ``retry --cancelled`` pick.
* How jobs ended, from the accounting (``sacct``, one call): a signal → killed, a non-zero exit → failed, the
  user's own ``scancel`` → preempted (not a failure), a job the accounting does not know → lost; and the states in
  which the system ends jobs (out of memory, time limit, node failure, cancelled by someone else) → killed.
* A trial that raises at the same step every time (``ASR_CORE_FAULT=raise-at-step:N``): after ``max_failures``
  attempts it stays FAILED with its error in ``status``, ``resume`` and ``submit`` submit nothing for it, and only
  ``retry --failed`` (the count reset) starts it again.
* A trainer killed with SIGKILL mid-training (``ASR_CORE_FAULT=sleep-at-step:N:S`` holds it there; its pid is in
  its lease) is recorded as killed by the system, left by a plain ``submit``, resubmitted by ``resume`` within the
  budget, and finishes from its checkpoint with every step logged once.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest

from asr_core.config import Config
from asr_core.contract.folder.lease import Lease, read_lease
from asr_core.contract.trial import (FAILED, FINISHED, OUTCOME_FAILED, OUTCOME_KILLED, OUTCOME_LOST,
                                     OUTCOME_PREEMPTED, OUTCOME_RESET, failures, read_attempts, read_progress,
                                     record_attempt)
from orchestrate.backends import slurm_commands
from orchestrate.cli.commands import main
from orchestrate.dispatch.dispatch import Plan, classify
from orchestrate.ledger.ledger import Ledger, TrialRun, wait_for
from orchestrate.sweep.folder import SweepDir
from orchestrate.sweep.trial import Trial
from orchestrate.sweep.trial_state import read_folder_states
from tests.plugins.slurm_cluster import SlurmCluster
from tests.test_backend import (CHECKPOINT_EVERY, cluster_env, loss_steps, resumed_at, smoke_corpus, squeue_states,
                                wait_until, write_profile)
from tests.test_sweep_lock import one_trial_grid

__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend

pytestmark = pytest.mark.timeout(900)

STEPS = 8  # a short trial: it fails at step 3, or is killed mid-training at step 6 (checkpoint 4 written)


def _run(key: str, status: str) -> TrialRun:
    return TrialRun(run_id=f"run-{key}", key=key, label=key, status=status, job_id="", backend="slurm", subgrids="",
                    error="", preemptions=0)


def test_each_trial_is_decided_from_its_folder_within_the_budget(tmp_path: Path) -> None:
    sweep = SweepDir(tmp_path, "table")
    keys = ["done", "live", "cancelled", "gave_up", "failed", "killed", "preempted", "lost", "never_ran", "new"]
    trials = [Trial(key=k, label=k, subgrids=("s",), seed=1, config=Config()) for k in keys]
    d = {k: sweep.trial_dir(k) for k in keys}
    for k in keys:
        d[k].mkdir(parents=True)
    (d["done"] / "DONE").write_text("finished\n")
    lease = Lease(d["live"], "12_1").acquire()  # a trainer heartbeating in its folder, whatever squeue says
    sweep.cancel_trial("cancelled", "test")
    for i in (1, 2):
        record_attempt(d["gave_up"], OUTCOME_FAILED, "RuntimeError: boom", segment=i, job_id=f"1_{i}", by="job")
    record_attempt(d["failed"], OUTCOME_FAILED, "RuntimeError: boom", segment=1, job_id="2_0", by="job")
    record_attempt(d["killed"], OUTCOME_KILLED, "trainer killed by SIGKILL", segment=1, job_id="3_0", by="task")
    record_attempt(d["preempted"], OUTCOME_PREEMPTED, "", segment=1, job_id="4_0", by="job")
    record_attempt(d["lost"], OUTCOME_LOST, "job 5_0 ended without a word", segment=1, job_id="5_0", by="resume")
    runs = {k: _run(k, s) for k, s in (("done", "RUNNING"), ("live", "RUNNING"), ("cancelled", "KILLED"),
                                        ("gave_up", "FAILED"), ("failed", "FAILED"), ("killed", "RUNNING"),
                                        ("preempted", "SCHEDULED"), ("lost", "RUNNING"), ("never_ran", "SCHEDULED"))}
    try:
        states = read_folder_states(sweep, keys)
        live = {k: fs.job_id for k, fs in states.items() if fs.live}
        assert live == {"live": "12_1"}

        def plan(**kw: object) -> Plan:
            return classify(trials, runs, live, states, max_failures=2, **kw)  # type: ignore[arg-type]

        submit = plan(include_failed=False)
        assert (submit.finished, list(submit.attached), submit.cancelled) == (["done"], ["live"], ["cancelled"])
        assert list(submit.gave_up) == ["gave_up"] and submit.gave_up["gave_up"].startswith("gave up after 2")
        assert submit.left_failed == ["failed", "killed"] and submit.failed == []
        assert (submit.preempted, submit.lost, submit.new) == (["preempted"], ["lost", "never_ran"], ["new"])
        resume = plan(include_failed=True)
        assert (resume.failed, resume.left_failed, list(resume.gave_up)) == (["failed", "killed"], [], ["gave_up"])
        assert sorted(resume.to_submit()) == sorted(["failed", "killed", "preempted", "lost", "never_ran", "new"])
        retry = plan(include_failed=True, retry=("failed",))
        assert sorted(retry.to_submit()) == sorted(retry.reset) == ["failed", "gave_up", "killed"]
        assert plan(include_failed=True, retry=("cancelled",)).to_submit() == ["cancelled"]
    finally:
        lease.release()


def test_a_diverged_trial_is_a_failure_of_the_budget_and_says_diverged(tmp_path: Path) -> None:
    """The outcome of a trial whose loss stayed non-finite (exit EXIT_DIVERGED) counts against max_failures like any
    failure, and status and the ledger say "diverged" with its step, not a generic error."""
    from asr_core.contract import trial as contract
    from orchestrate.ledger.reconcile import ledger_target
    from orchestrate.sweep.trial_state import failure_reason

    sweep = SweepDir(tmp_path, "div")
    trials = [Trial(key="div", label="div", subgrids=("s",), seed=1, config=Config())]
    sweep.trial_dir("div").mkdir(parents=True)
    why = "diverged: loss nan at steps 3-7 (train.max_nonfinite_steps=5)"
    record_attempt(sweep.trial_dir("div"), contract.OUTCOME_DIVERGED, why, segment=1, job_id="1_0", by="job")
    runs = {"div": _run("div", "RUNNING")}
    fs = read_folder_states(sweep, ["div"])["div"]
    assert fs.failed and len(fs.failures) == 1
    assert failure_reason(fs, 2) == f"1/2 failures: {why}"
    assert classify(trials, runs, {}, {"div": fs}, max_failures=2, include_failed=False).left_failed == ["div"]
    assert classify(trials, runs, {}, {"div": fs}, max_failures=2, include_failed=True).failed == ["div"]
    target = ledger_target(fs, max_failures=2)
    assert target is not None and (target.state, target.error) == (FAILED, f"1/2 failures: {why}")
    record_attempt(sweep.trial_dir("div"), contract.OUTCOME_DIVERGED, why, segment=2, job_id="1_1", by="job")
    fs = read_folder_states(sweep, ["div"])["div"]
    plan = classify(trials, runs, {}, {"div": fs}, max_failures=2, include_failed=True)
    assert plan.gave_up == {"div": f"gave up after 2 failures: {why}"} and plan.to_submit() == []


@pytest.mark.slurm
def test_sacct_says_how_jobs_ended(slurm_cluster: SlurmCluster) -> None:
    killed = slurm_cluster.sbatch("-p", "gpu", "--wrap", "kill -9 $$")
    failed = slurm_cluster.sbatch("-p", "gpu", "--wrap", "exit 3")
    cancelled = slurm_cluster.sbatch("-p", "gpu", "--wrap", "sleep 300")
    slurm_cluster.wait_for_state(cancelled, "RUNNING")
    slurm_cluster.run("scancel", cancelled)
    for job, state in ((killed, "FAILED"), (failed, "FAILED"), (cancelled, "CANCELLED")):
        slurm_cluster.wait_for_accounting(job, state)
    unknown = "987654321"
    ends = slurm_commands.job_ends([killed, failed, cancelled, unknown])
    assert (ends[killed].outcome, ends[killed].state) == (OUTCOME_KILLED, "FAILED")
    assert "SIGKILL" in ends[killed].reason and killed in ends[killed].reason
    assert ends[failed].outcome == OUTCOME_FAILED and "exit code 3" in ends[failed].reason
    assert ends[cancelled].outcome == OUTCOME_PREEMPTED  # the user's own scancel is not the trial's failure
    assert ends[unknown].outcome == OUTCOME_LOST
    # the states in which the system ends a job, as sacct spells them, and a job it still runs
    row = slurm_commands.AccountedJob
    for state in ("OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", f"CANCELLED by {os.getuid() + 1}"):
        end = slurm_commands.job_end(row("7_1", state, 0, 0), "7_1")
        assert end is not None and end.outcome == OUTCOME_KILLED and state in end.reason, state
    assert slurm_commands.job_end(row("7_1", "RUNNING", 0, 0), "7_1") is None


def _sweep(tmp_path: Path, corpus: Path, request: pytest.FixtureRequest, prefix: str,
           *extra: str) -> tuple[list[str], Path, str, Ledger]:
    uri = cluster_env(request)
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "runs"
    submit = ["submit", str(one_trial_grid(tmp_path, corpus, STEPS)), "--backend", "slurm", "--sweep-root",
              str(root), "--sweep", name, "--tracking-uri", uri, "--profile", str(write_profile(tmp_path, "a100:1")),
              *extra]
    return submit, root, name, Ledger(uri, name)


def _ended(name: str, trial_dir: Path, n_failures: int, timeout: float = 400) -> None:
    """Wait until the trial has ``n_failures`` failures recorded and the queue holds no job of the sweep."""
    wait_until(lambda: len(failures(read_attempts(trial_dir))) >= n_failures and not squeue_states(f"orch.{name}."),
               timeout, f"{trial_dir} never reached {n_failures} failures: {read_attempts(trial_dir)}", poll=1)


@pytest.mark.slurm
def test_a_trial_failing_at_the_same_step_gives_up_after_max_failures(
        tmp_path: Path, smoke_corpus: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ASR_CORE_FAULT", "raise-at-step:3")  # the submitting process's environment reaches the jobs
    submit, root, name, ledger = _sweep(tmp_path, smoke_corpus, request, "giveup", "--max-failures", "2")
    assert main(submit) == 0
    sweep = SweepDir(root, name)
    assert sweep.read_manifest().max_failures == 2
    ((key, run),) = ledger.trial_runs().items()
    trial_dir = sweep.trial_dir(key)
    _ended(name, trial_dir, 1)
    capsys.readouterr()
    assert main(["resume", name, "--sweep-root", str(root)]) == 0  # 1 failure of 2: resubmitted
    assert "1 failed/killed (resubmitted)" in capsys.readouterr().out
    assert len(sweep.submissions()) == 2
    _ended(name, trial_dir, 2)

    resume = ["resume", name, "--sweep-root", str(root)]
    for argv in (resume, submit, resume):  # 2 failures of 2: nothing goes out again
        assert main(argv) == 0, argv
        assert "1 gave up (left FAILED; retry --failed)" in capsys.readouterr().out
        assert len(sweep.submissions()) == 2
    attempts = read_attempts(trial_dir)
    assert [a.outcome for a in failures(attempts)] == [OUTCOME_FAILED, OUTCOME_FAILED], attempts
    assert all("fault injected at step 3" in a.reason for a in failures(attempts))
    final = ledger.trial_runs()[key]
    assert final.run_id == run.run_id and final.status == FAILED
    assert final.error.startswith("gave up after 2 failures") and "fault injected at step 3" in final.error
    assert main(["status", name, "--sweep-root", str(root)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if key in ln)
    assert "FAILED" in line and "gave up after 2 failures" in line and "fault injected at step 3" in line, out

    # only retry --failed starts it again, its count reset; without the fault it finishes in the same run
    monkeypatch.delenv("ASR_CORE_FAULT")
    assert main(["retry", name, "--failed", "--sweep-root", str(root)]) == 0
    assert len(sweep.submissions()) == 3
    assert read_attempts(trial_dir)[len(attempts)].outcome == OUTCOME_RESET
    runs = wait_for(ledger, [key], timeout=400)
    assert runs[key].status == FINISHED and runs[key].run_id == run.run_id, runs[key]
    assert loss_steps(ledger, run.run_id) == list(range(1, STEPS + 1))


@pytest.mark.slurm
def test_a_trainer_killed_by_sigkill_is_killed_by_the_system_and_resumed_within_the_budget(
        tmp_path: Path, smoke_corpus: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    at = CHECKPOINT_EVERY + 2  # checkpoint 4 is written before step 5 trains
    monkeypatch.setenv("ASR_CORE_FAULT", f"sleep-at-step:{at}:300")
    submit, root, name, ledger = _sweep(tmp_path, smoke_corpus, request, "sigkill")
    assert main(submit) == 0
    sweep = SweepDir(root, name)
    ((key, run),) = ledger.trial_runs().items()
    trial_dir = sweep.trial_dir(key)

    def sleeping() -> bool:
        p = read_progress(trial_dir)
        return p is not None and p.phase == "train" and p.done >= at - 1 and read_lease(trial_dir) is not None

    wait_until(sleeping, 400, "the trainer never reached its sleep", poll=0.5)
    lease = read_lease(trial_dir)
    assert lease is not None and lease.alive() and lease.pid > 0
    os.kill(lease.pid, signal.SIGKILL)  # what the kernel's OOM killer does
    _ended(name, trial_dir, 1)
    (killed,) = failures(read_attempts(trial_dir))
    assert killed.outcome == OUTCOME_KILLED and "SIGKILL" in killed.reason and killed.by == "task", killed
    assert killed.segment == 1 and killed.job_id
    assert not read_lease(trial_dir).alive()  # freed by the task that saw its trainer die

    capsys.readouterr()
    monkeypatch.delenv("ASR_CORE_FAULT")
    assert main(submit) == 0  # a plain submit leaves a killed trial (it counts as failed), as a FAILED one
    assert "1 failed/killed (left; resume or retry --failed)" in capsys.readouterr().out
    assert len(sweep.submissions()) == 1
    assert ledger.trial_runs()[key].status == FAILED
    assert main(["resume", name, "--sweep-root", str(root)]) == 0  # 1 failure of 3: resubmitted
    assert "1 failed/killed (resubmitted)" in capsys.readouterr().out
    assert len(sweep.submissions()) == 2
    runs = wait_for(ledger, [key], timeout=400)
    assert runs[key].status == FINISHED and runs[key].run_id == run.run_id, runs[key]
    assert loss_steps(ledger, run.run_id) == list(range(1, STEPS + 1))  # every step once
    first, second = resumed_at(trial_dir)
    assert first is None and second is not None and CHECKPOINT_EVERY <= second < at, (first, second)
    assert [a.outcome for a in failures(read_attempts(trial_dir))] == [OUTCOME_KILLED]  # counted once
