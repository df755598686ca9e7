"""``orchestrate status`` as a monitor: ``--state`` and ``--where`` narrow it, each trial's folder and log are named
(text and ``--json``), a running trial shows its rate and the time left, the sweep its share done and GPU-hours,
``--watch`` redraws until nothing runs or waits (or Ctrl-C, exit 0), and a trial queued but not started is PENDING.

Real pieces: sweep folders written with the trial contract's own writers (:mod:`orchestrate.tools.fake_sweep`), a
real lease held by this process, ``status`` run in a fresh process as a person runs it, and (``slurm``) real held
jobs of the SLURM test cluster.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from asr_core.contract.trial import Progress, TrialFolder, write_progress
from asr_core.contract.folder.lease import Lease
from orchestrate.sweep.progress import rate_of, trial_pace
from orchestrate.sweep.folder import Manifest, SweepDir
from orchestrate.tools.fake_sweep import fake_trials, make_fake_sweep

REPO = Path(__file__).resolve().parents[1]


def status(root: Path, name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([sys.executable, "-m", "orchestrate", "status", name, "--sweep-root", str(root), *args],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    if check:
        assert p.returncode == 0, f"status exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> SweepDir:
    return make_fake_sweep(tmp_path_factory.mktemp("watch"), 40, backend="local")


def rows_of(out: str) -> dict[str, dict]:
    return {r["key"]: r for r in map(json.loads, out.splitlines())}


def test_state_and_where_narrow_status_and_each_trial_names_its_folder_and_log(fake: SweepDir) -> None:
    root = fake.path.parent
    every = rows_of(status(root, fake.name, "--json", "--no-reconcile").stdout)
    running = {k for k, r in every.items() if r["status"] == "RUNNING"}
    assert running
    for k, r in every.items():
        assert r["folder"] == str(fake.trial_dir(k)) and r["log"] == str(TrialFolder(fake.trial_dir(k)).log)
    for k in running:  # the fake trainer logs 10 steps a second
        assert every[k]["rate"] == pytest.approx(10.0, rel=0.01)
        r = every[k]
        assert r["eta_s"] == pytest.approx((60000 - int(r["phase"].split()[1].split("/")[0])) / 10.0, rel=0.01)

    p = status(root, fake.name, "--state", "running", "--no-reconcile")
    listed = [ln for ln in p.stdout.splitlines() if ln.startswith("  ") and "steps/s" in ln]
    assert {ln.split()[1] for ln in listed} == running, p.stdout
    assert all(f"    log {fake.trial_dir(k) / 'trial.log'}" in p.stdout for k in running)
    assert "10 steps/s" in p.stdout and " left" in p.stdout
    # a local sweep's hours are not GPU-hours: its trials ran on this machine's cores
    assert "progress " in p.stdout and "trial-hours spent on this machine" in p.stdout and "GPU-hours" not in p.stdout
    assert "lost" not in p.stdout.split("\n\n", 1)[1].lower().split("ledger:")[0]  # only the state asked for

    only = rows_of(status(root, fake.name, "--json", "--no-reconcile", "--state", "RUNNING").stdout)
    assert set(only) == running

    ctx = rows_of(status(root, fake.name, "--json", "--no-reconcile", "--where", "data.context_s=10.24").stdout)
    assert ctx and len(ctx) < len(every)
    assert all(t.config.data.context_s == 10.24 for t in fake.read_trials() if t.key in ctx)
    p = status(root, fake.name, "--no-reconcile", "--where", "data.context_s=10.24")
    assert f"{len(ctx)} models" in p.stdout.splitlines()[0]

    bad = status(root, fake.name, "--where", "data.context_s=3", check=False)
    assert bad.returncode == 2 and "matches none" in bad.stderr and "Traceback" not in bad.stderr
    bad = status(root, fake.name, "--state", "SLEEPING", check=False)
    assert bad.returncode == 2 and "PENDING" in bad.stderr and "Traceback" not in bad.stderr


def test_the_rate_comes_from_the_records_of_the_current_segment_only(tmp_path: Path) -> None:
    now = 1_000_000.0
    write_progress(tmp_path, [Progress("start", time=now - 3000), Progress("train", 0, 1000, time=now - 2900),
                              Progress("train", 500, 1000, time=now - 2000),  # an earlier, faster segment
                              Progress("start", time=now - 200), Progress("train", 500, 1000, time=now - 100),
                              Progress("train", 600, 1000, time=now)])
    pace = trial_pace(tmp_path, done=False, live=True, attempts=(), now=now)
    assert pace.rate == pytest.approx(1.0) and pace.eta_s == pytest.approx(400.0) and pace.unit == "steps"
    assert pace.progress == pytest.approx(0.6)
    assert trial_pace(tmp_path, done=False, live=False, attempts=(), now=now).rate is None  # not running: no rate
    assert rate_of([Progress("train", 5, 10, time=now)]) is None  # one record: nothing to compare


def running_sweep(root: Path) -> tuple[SweepDir, Lease, Path]:
    """A local sweep of two trials: one finished, one running (its lease held by this process)."""
    a, b = fake_trials(2)
    sweep = SweepDir(root, f"w{uuid.uuid4().hex[:6]}")
    sweep.write_manifest(Manifest(name=sweep.name, grid="grids/paper.yaml", backend="local", profile="",
                                  tracking_uri=f"sqlite:///{root / 'none.db'}", workdir=str(REPO)))
    sweep.write_trials([a, b])
    for t in (a, b):
        sweep.prepare_trial(t)
    TrialFolder(sweep.trial_dir(a.key)).done.write_text("finished\n")
    run = sweep.trial_dir(b.key)
    now = time.time()
    write_progress(run, [Progress("start", time=now - 30), Progress("train", 100, 1000, time=now - 20),
                         Progress("train", 300, 1000, time=now)])
    return sweep, Lease(run, "local").acquire(), run


def watch(sweep: SweepDir, every: str = "0.3", sigint: Any = signal.SIG_DFL) -> subprocess.Popen[str]:
    """``orchestrate status --watch`` started with SIGINT's disposition ``sigint`` (SIG_IGN: as a background job of a
    non-interactive shell starts it)."""
    return subprocess.Popen([sys.executable, "-m", "orchestrate", "status", sweep.name, "--sweep-root",
                             str(sweep.path.parent), "--watch", every, "--no-reconcile"], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))


def frames(p: subprocess.Popen[str], n: int, timeout: float = 60.0) -> str:
    """Read ``p``'s output until it drew ``n`` frames."""
    out, deadline = "", time.monotonic() + timeout
    assert p.stdout is not None
    while out.count("Ctrl-C ends") < n and time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        out += line
    return out


def test_watch_redraws_until_the_last_trial_ends(tmp_path: Path) -> None:
    sweep, lease, run = running_sweep(tmp_path)
    p = watch(sweep)
    try:
        out = frames(p, 2)
        assert out.count("Ctrl-C ends") >= 2 and "RUNNING" in out and "10 steps/s" in out, out
        lease.release()
        TrialFolder(run).done.write_text("finished\n")
        rest, err = p.communicate(timeout=60)
    finally:
        lease.release()
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "watch ends" in err and "Traceback" not in err
    assert re.search(r"^  FINISHED +2$", rest.rsplit("Ctrl-C ends", 1)[-1], re.M), rest


@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["default", "inherited-ignored"])
def test_watch_ends_on_ctrl_c_with_exit_0_and_no_traceback(tmp_path: Path, sigint: Any) -> None:
    """Also where the process started with SIGINT ignored (a script's background job): before the watch set its own
    handler, Ctrl-C was ignored there and the watch drew on."""
    sweep, lease, _ = running_sweep(tmp_path)
    p = watch(sweep, "5", sigint)
    try:
        assert "Ctrl-C ends" in frames(p, 1)
        p.send_signal(signal.SIGINT)
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise AssertionError(f"the watch did not end on SIGINT; it drew on:\n{out[-1500:]}\n{err[-1500:]}")
    finally:
        lease.release()
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and "Traceback" not in err, err


def test_a_sweep_with_nothing_moving_draws_once(tmp_path: Path) -> None:
    done = make_fake_sweep(tmp_path, 3, backend="local", mix=(("finished", 1.0),))
    p = status(done.path.parent, done.name, "--watch", "60", "--no-reconcile")  # would hang if it waited
    assert p.stdout.count("Ctrl-C ends") == 1 and "watch ends" in p.stderr
    assert re.search(r"^  FINISHED +3$", p.stdout, re.M), p.stdout
    assert "progress 100.0%" in p.stdout


@pytest.mark.slurm
def test_trials_of_a_pending_array_are_pending_not_lost(tmp_path: Path, slurm_cluster) -> None:  # noqa: ANN001
    """A submission of three trials whose (held) array waits in the queue: each of them PENDING with its job."""
    trials = fake_trials(3)
    sweep = SweepDir(tmp_path, f"p{uuid.uuid4().hex[:6]}")
    sweep.write_manifest(Manifest(name=sweep.name, grid="grids/paper.yaml", backend="slurm", profile="",
                                  tracking_uri=f"sqlite:///{tmp_path / 'none.db'}", workdir=str(REPO)))
    sweep.write_trials(trials)
    keys = [t.key for t in trials]
    sub = sweep.new_submission("slurm", keys, {k: "" for k in keys})
    job = slurm_cluster.sbatch("--hold", f"--job-name={sub.job_name()}", "--array=0-2%1", "--time=00:01:00",
                               f"--partition={slurm_cluster.partition}", "--output=/dev/null", "--wrap", "sleep 1")
    sub.record_job(job)
    try:
        rows = rows_of(status(tmp_path, sweep.name, "--json", "--no-reconcile").stdout)
    finally:
        slurm_cluster.run("scancel", job, check=False)
    assert {r["status"] for r in rows.values()} == {"PENDING"}, rows
    assert sorted(r["job_id"] for r in rows.values()) == [f"{job}_{i}" for i in range(3)]
    assert all("not started yet" in r["reason"] for r in rows.values())

