"""A sweep whose MLflow server is down (a real ``mlflow server`` of slurm/mlflow-server.sh, stopped and started again
on the same folder and port).

* ``cancel`` without the tracker: the folders are marked and the jobs stopped all the same (a line says MLflow does
  not answer), and the next command that reaches MLflow marks the runs KILLED; ``cancel --offline`` leaves a
  server that answers alone the same way. ``resume``'s message names what works (start the server again, or
  ``cancel --offline``), never a second ledger it would refuse. On the SLURM test cluster: the running jobs end.
* A blocking local ``submit`` whose trials ran while the server went down exits 3 (not 2: nothing was wrong with the
  input) with one line naming what to run once MLflow answers; that command then brings every run to FINISHED.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from asr_core.contract.trial import (FAILURE_OUTCOMES, FINISHED, KILLED, OUTCOME_CANCELLED, SCHEDULED, TrialFolder,
                                     read_attempts, read_progress)
from orchestrate.ledger.ledger import Ledger
from orchestrate.sweep.folder import SweepDir
from orchestrate.sweep.trial_state import read_folder_states
from tests.test_backend import CHECKPOINT_EVERY, smoke_corpus, squeue_states, wait_until, write_profile
from tests.test_tracker_outage import Server, server  # noqa: F401 - the fixture: a real server, stopped after

__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend

pytestmark = pytest.mark.timeout(900)

EXIT_USAGE, EXIT_TRACKER, EXIT_FAULT = 2, 3, 137
GRID = """
name: offline
seeds: [%s]
base:
  preset: tiny
  data: {train: "podcast:%s/train", batch_audio_s: 20.48, seqlen_warmup: none, context_s: 5.12}
  train: {max_steps: %d, warmup_steps: 4, checkpoint_every: %d, device: cpu, precision: fp32}
  eval: {datasets: []}
subgrids:
  only: {}
"""


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrate", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=300)


def grid(tmp_path: Path, seeds: str, corpus: str = "/nonexistent", steps: int = 4, name: str = "g.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(GRID % (seeds, corpus, steps, CHECKPOINT_EVERY)))
    return p


@pytest.mark.slow  # two starts of a real mlflow server: about 40 s
def test_cancel_without_the_tracker_marks_the_folders_and_the_ledger_catches_up(tmp_path: Path,
                                                                               server: Server) -> None:
    root = tmp_path / "runs"
    names = {"down": f"down-{uuid.uuid4().hex[:6]}", "offline": f"off-{uuid.uuid4().hex[:6]}"}
    for seeds, name in (("1, 2", names["down"]), ("3", names["offline"])):  # runs made, the submitter died
        p = cli("submit", str(grid(tmp_path, seeds)), "--backend", "local", "--sweep-root", str(root), "--sweep", name,
                "--tracking-uri", server.uri, "--no-check-data", cwd=tmp_path, env={"ORCHESTRATE_FAULT": "after-runs"})
        assert p.returncode == EXIT_FAULT, p.stderr
    sweeps = {k: SweepDir(root, n) for k, n in names.items()}
    keys = {k: [t.key for t in s.read_trials()] for k, s in sweeps.items()}

    p = cli("cancel", names["offline"], "--offline", "--sweep-root", str(root), cwd=tmp_path)  # the server is up
    assert p.returncode == 0, p.stderr
    assert "--offline" in p.stderr and "marks the runs KILLED" in p.stderr, p.stderr
    assert {r.status for r in Ledger(server.uri, names["offline"]).trial_runs().values()} == {SCHEDULED}

    server.stop()
    p = cli("resume", names["down"], "--sweep-root", str(root), cwd=tmp_path)
    assert p.returncode == EXIT_USAGE and "unreachable" in p.stderr, p.stderr
    assert "sqlite" not in p.stderr and "cancel --offline" in p.stderr, p.stderr  # what works, nothing refused
    p = cli("cancel", names["down"], "--sweep-root", str(root), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "MLflow does not answer" in p.stderr and "cancelling without it" in p.stderr, p.stderr
    for k, s in sweeps.items():
        assert all(fs.cancelled for fs in read_folder_states(s, keys[k]).values()), k

    server.start()
    for k, name in names.items():
        p = cli("status", name, "--sweep-root", str(root), cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        runs = Ledger(server.uri, name).trial_runs()
        assert set(runs) == set(keys[k]) and {r.status for r in runs.values()} == {KILLED}, (k, p.stdout)


@pytest.mark.slurm
def test_cancel_stops_the_slurm_jobs_while_the_tracker_is_down(tmp_path: Path, smoke_corpus: Path, server: Server,
                                                               request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("slurm_cluster")
    root, name = tmp_path / "runs", f"offslurm-{uuid.uuid4().hex[:8]}"
    # 400 steps: neither trial may finish in the seconds the cancel takes (a finished one is rightly left unmarked)
    p = cli("submit", str(grid(tmp_path, "3, 4", str(smoke_corpus), 400)), "--backend", "slurm", "--sweep-root",
            str(root), "--sweep", name, "--tracking-uri", server.uri, "--profile",
            str(write_profile(tmp_path, "a100:1")), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    sweep = SweepDir(root, name)
    folders = [TrialFolder(sweep.trial_dir(t.key)) for t in sweep.read_trials()]
    wait_until(lambda: all((pr := read_progress(f.path)) is not None and pr.phase == "train" for f in folders), 400,
               "the trials never started training", poll=0.2)
    server.stop()
    p = cli("cancel", name, "--sweep-root", str(root), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "MLflow does not answer" in p.stderr and "cancelled 2 jobs" in p.stdout, (p.stdout, p.stderr)
    wait_until(lambda: not squeue_states(f"orch.{name}."), 120, "the cancelled jobs run on", poll=0.5)
    for f in folders:
        outcomes = [a.outcome for a in read_attempts(f.path)]
        assert f.cancelled.exists() and not f.done.exists(), (f.path, read_progress(f.path), outcomes)
        assert OUTCOME_CANCELLED in outcomes and not set(outcomes) & set(FAILURE_OUTCOMES), outcomes
    server.start()
    p = cli("status", name, "--sweep-root", str(root), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert {r.status for r in Ledger(server.uri, name).trial_runs().values()} == {KILLED}, p.stdout


@pytest.mark.slow
def test_a_local_submit_whose_tracker_went_down_exits_3_and_the_next_command_catches_up(
        tmp_path: Path, smoke_corpus: Path, server: Server) -> None:
    root, name = tmp_path / "runs", f"endsdown-{uuid.uuid4().hex[:8]}"
    submit = subprocess.Popen([sys.executable, "-m", "orchestrate", "submit",
                               str(grid(tmp_path, "5", str(smoke_corpus), 24)), "--backend", "local", "--sweep-root",
                               str(root), "--sweep", name, "--tracking-uri", server.uri],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                              # the trainer's last wait for the dead tracker (60 s by default) is not under test
                              env={**os.environ, "ASR_CORE_FINAL_FLUSH_S": "3"})
    try:
        sweep = SweepDir(root, name)
        keys = lambda: [t.key for t in sweep.read_trials()] if (sweep.path / "trials.json").exists() else []  # noqa: E731
        wait_until(lambda: keys() and all(fs.live for fs in read_folder_states(sweep, keys()).values()), 300,
                   "no trainer started")
        server.stop()
        out, err = submit.communicate(timeout=600)
    finally:
        if submit.poll() is None:
            submit.kill()
    assert submit.returncode == EXIT_TRACKER, err[-3000:]
    assert all(TrialFolder(sweep.trial_dir(k)).done.exists() for k in keys()), err[-3000:]
    last = err.strip().splitlines()[-1]
    assert "outboxes" in last and f"orchestrate status {name}" in last, last
    server.start()
    p = cli("status", name, "--sweep-root", str(root), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    runs = Ledger(server.uri, name).trial_runs()
    assert {runs[k].status for k in keys()} == {FINISHED}, p.stdout
