"""One suite for every backend (local, slurm, ray-slurm): REAL trials of grids/smoke.yaml to FINISHED, then
submitting again submits nothing and creates no duplicate runs. Then preemption on SLURM: USR2 or
``scontrol requeue`` mid-training → the same MLflow run ends FINISHED with the same step count as without; for
ray-slurm, USR2 to the allocation's batch step → every trial checkpoints, the allocation requeues itself, Tune
resumes the trial in the same run.

The SLURM cases use the session fixtures ``slurm_cluster`` (a real single-node cluster with fake A100s) and
``mlflow_server`` (a real ``mlflow server``)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from asr_core.contract.trial import progress_records
from orchestrate.cli.commands import main
from orchestrate.plan.grid import load_grid
from orchestrate.ledger.ledger import Ledger, wait_for
from orchestrate.sweep.folder import SweepDir

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "grids" / "smoke.yaml"
MAX_STEPS = 30  # grids/smoke.yaml train.max_steps; the corpus below holds more than 30 steps of audio
CHECKPOINT_EVERY = 4  # grids/smoke.yaml (and ONE_TRIAL below) train.checkpoint_every
# What the trainer prints when it continues a checkpoint instead of starting from step 0.


@pytest.fixture(scope="session")
def smoke_corpus(request: pytest.FixtureRequest) -> Path:
    """A synthetic podcast corpus (~13 min, more than MAX_STEPS steps of 20 s), made once and cached."""
    out = Path(request.config.cache.mkdir("orchestrate-smoke-corpus-v1"))
    with (out / "lock").open("w") as lock:  # two test workers may ask at once: one makes it, the other waits
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "COMPLETE").exists():
            shutil.rmtree(out / "c", ignore_errors=True)  # what a run killed while making it left
            subprocess.run([sys.executable, "-m", "asr_core", "synth", str(out / "c"), "--hours", "0.2", "--seed",
                            "1", "--eval-hours", "0.01", "--min-minutes", "0.5", "--max-minutes", "1", "--splits",
                            "train"], check=True)
            (out / "COMPLETE").write_text("ok\n")
    return out / "c"


def unique(name: str) -> str:
    """A sweep name no other test of the session uses: a sweep owns its experiment on the session-wide server."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def cluster_env(request: pytest.FixtureRequest) -> str:
    """Start (once) the SLURM test cluster and the MLflow server; returns the tracking URI."""
    request.getfixturevalue("slurm_cluster")
    server = request.getfixturevalue("mlflow_server")
    return str(getattr(server, "uri", server))


def write_profile(tmp_path: Path, gpus: str, **extra: Any) -> Path:
    p = tmp_path / "profile.yaml"
    body = {"partition": "gpu", "gpus_per_node": gpus, "cpus_per_task": 1, "mem_gb": 1, "time_limit": "00:30:00",
            "signal_delay_s": 30, **extra}
    p.write_text("".join(f"{k}: {v!r}\n" if isinstance(v, str) else f"{k}: {v}\n" for k, v in body.items()))
    return p


def submit_args(backend: str, root: Path, corpus: Path, uri: str | None, profile: Path | None,
                grid: Path = SMOKE, sweep: str = "smoke") -> list[str]:
    args = ["submit", str(grid), "--backend", backend, "--sweep-root", str(root), "--sweep", sweep,
            "--set", f"data.train=podcast:{corpus}/train"]
    if uri:
        args += ["--tracking-uri", uri]
    if profile:
        args += ["--profile", str(profile)]
    return args


def loss_steps(ledger: Ledger, run_id: str) -> list[int]:
    return sorted(m.step for m in ledger.client.get_metric_history(run_id, "train/loss"))


def steps_logged_before(ledger: Ledger, run_id: str, t: float) -> int:
    """The last training step the run had logged before Unix time ``t`` (0: none)."""
    history = ledger.client.get_metric_history(run_id, "train/loss")
    return max((m.step for m in history if m.timestamp < t * 1000), default=0)


def last_checkpoint(steps_logged: int) -> int:
    """The step of the newest periodic checkpoint that surely exists once ``steps_logged`` steps are logged: the
    trainer writes checkpoint ``c`` before it trains (and logs) step ``c + 1``."""
    return CHECKPOINT_EVERY * ((steps_logged - 1) // CHECKPOINT_EVERY) if steps_logged > 0 else 0


def resumed_at(trial_dir: Path) -> list[int | None]:
    """One entry per start of the trial's job that had work to do, oldest first, from its progress records: the
    checkpoint step the trainer resumed from, or None where it did not resume (trained from step 0, or did not
    train). A trial restarted from scratch shows ``[None, None]``; one resumed from step 8 ``[None, 8]``."""
    recs = progress_records(trial_dir)
    out: list[int | None] = []
    for i, r in enumerate(recs):
        if r.phase == "start":
            nxt = recs[i + 1] if i + 1 < len(recs) else None
            out.append(nxt.done if nxt is not None and nxt.phase == "train" and nxt.done > 0 else None)
    return out


def assert_one_run_per_key(ledger: Ledger, n_trials: int) -> None:
    runs = ledger.client.search_runs([ledger.experiment_id], filter_string="tags.`sweep.role` = 'trial'",
                                     max_results=1000)
    keys = [r.data.tags["trial.key"] for r in runs]
    assert len(keys) == len(set(keys)) == n_trials, keys


BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("slurm", marks=pytest.mark.slurm, id="slurm"),
    pytest.param("ray-slurm", marks=[pytest.mark.slurm, pytest.mark.slow], id="ray-slurm"),
]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", BACKENDS)
def test_smoke_grid_finishes_and_resubmitting_adds_nothing(backend: str, tmp_path: Path, smoke_corpus: Path,
                                                          request: pytest.FixtureRequest) -> None:
    uri = profile = None
    if backend != "local":
        uri = cluster_env(request)
        profile = write_profile(tmp_path, "a100:2" if backend == "ray-slurm" else "a100:1")
    root = tmp_path / "runs"
    name = unique(f"smoke-{backend}")
    grid = load_grid(SMOKE, [f"data.train=podcast:{smoke_corpus}/train"])
    assert main(submit_args(backend, root, smoke_corpus, uri, profile, sweep=name)) == 0
    sweep = SweepDir(root, name)
    manifest = sweep.read_manifest()
    ledger = Ledger(manifest.tracking_uri, name)
    runs = wait_for(ledger, [t.key for t in grid.trials], timeout=800)
    assert {r.status for r in runs.values()} == {"FINISHED"}, {r.label: r.status for r in runs.values()}
    for t in grid.trials:
        r = runs[t.key]
        assert r.label == t.label and r.backend == backend and r.job_id
        assert loss_steps(ledger, r.run_id) == list(range(1, MAX_STEPS + 1))
        assert resumed_at(sweep.trial_dir(t.key)) == [None]  # started once, from step 0
    n_subs = len(sweep.submissions())
    assert n_subs == 1
    # Again: everything is finished, so nothing is submitted and no run is created.
    assert main(submit_args(backend, root, smoke_corpus, uri, profile, sweep=name)) == 0
    assert len(sweep.submissions()) == n_subs
    assert_one_run_per_key(ledger, len(grid.trials))
    assert ledger.client.get_run(ledger.parent_run_id()).info.status == "FINISHED"


ONE_TRIAL = """
name: one
seeds: [3]
base:
  preset: tiny
  data: {train: "podcast:%s/train", batch_audio_s: 20.48, seqlen_warmup: none, context_s: 5.12}
  train: {max_steps: %d, warmup_steps: 4, checkpoint_every: 4, device: cpu, precision: fp32}
subgrids:
  only: {}
"""


def squeue_states(name_prefix: str) -> dict[str, str]:
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%j|%T"], capture_output=True, text=True, check=True).stdout
    return {ln.split("|")[0]: ln.split("|")[2] for ln in out.split() if ln.split("|")[1].startswith(name_prefix)}


def wait_until(pred: Any, timeout: float, what: str, poll: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(poll)
    raise TimeoutError(what)


def preempt_one_trial(backend: str, preempt: list[str], name: str, tmp_path: Path, smoke_corpus: Path,
                      request: pytest.FixtureRequest) -> str:
    """Submit a one-trial grid, run ``preempt + [job id]`` mid-training, and check that the trial then ends
    FINISHED in the same MLflow run with the steps of an uninterrupted run, resumed once from its checkpoint and
    requeued, never resubmitted. Returns the job id."""
    uri = cluster_env(request)
    grid_path = tmp_path / "one.yaml"
    grid_path.write_text(textwrap.dedent(ONE_TRIAL % (smoke_corpus, MAX_STEPS)))
    root = tmp_path / "runs"
    assert main(submit_args(backend, root, smoke_corpus, uri, write_profile(tmp_path, "a100:1"),
                            grid=grid_path, sweep=name)) == 0
    ledger = Ledger(uri, name)
    (key, run), = ledger.trial_runs().items()
    # Mid-training: some steps logged, far from the end.
    wait_until(lambda: len(loss_steps(ledger, run.run_id)) >= 6, 300, "training never reached step 6")
    job_id = ledger.trial_runs()[key].job_id
    t_preempt = time.time()
    subprocess.run([*preempt, job_id], check=True)
    runs = wait_for(ledger, [key], timeout=600)
    final = runs[key]
    assert final.status == "FINISHED" and final.run_id == run.run_id
    assert final.preemptions >= 1
    assert loss_steps(ledger, run.run_id) == list(range(1, MAX_STEPS + 1))  # as an uninterrupted run
    assert_one_run_per_key(ledger, 1)
    # Started twice, the second time from the checkpoint written on the signal: at or after the last step logged
    # before it (a restart from scratch would read [None, None]; one from an older checkpoint, a smaller step).
    logged = steps_logged_before(ledger, run.run_id, t_preempt)
    starts = resumed_at(SweepDir(root, name).trial_dir(key))
    assert len(starts) == 2 and starts[0] is None and starts[1] is not None, starts
    assert logged <= starts[1] < MAX_STEPS, (logged, starts)
    assert len(SweepDir(root, name).submissions()) == 1  # requeued, never resubmitted
    return job_id


@pytest.mark.slurm
@pytest.mark.timeout(900)
@pytest.mark.parametrize("how", ["usr2", "scontrol-requeue"])
def test_preempted_trial_resumes_in_the_same_run_with_the_same_steps(how: str, tmp_path: Path, smoke_corpus: Path,
                                                                     request: pytest.FixtureRequest) -> None:
    # USR2: what SLURM sends signal_delay_s before the time limit, and on preemption
    preempt = ["scancel", "--signal=USR2"] if how == "usr2" else ["scontrol", "requeue"]
    preempt_one_trial("slurm", preempt, unique(f"preempt-{how}"), tmp_path, smoke_corpus, request)


@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_ray_slurm_allocation_preempted_by_usr2_requeues_and_resumes_the_same_run(
        tmp_path: Path, smoke_corpus: Path, request: pytest.FixtureRequest) -> None:
    """ray-slurm: USR2 to the batch step (what ``--signal=B:USR2@...`` sends before the time limit) makes every
    trial checkpoint, the allocation requeue itself, and Tune resume the trial in the same MLflow run."""
    job_id = preempt_one_trial("ray-slurm", ["scancel", "--batch", "--signal=USR2"], unique("preempt-ray-slurm"),
                               tmp_path, smoke_corpus, request)

    def states() -> list[str]:  # every start of the job, oldest first
        return subprocess.run(["sacct", "-n", "-X", "-j", job_id, "-o", "State", "-D"], capture_output=True,
                              text=True, check=True).stdout.split()

    # the allocation ends by itself once Tune is done (Ray stopped, exit 0)
    wait_until(lambda: states()[-1:] == ["COMPLETED"], 180, f"job {job_id} did not complete: {states()}", poll=2)
    assert states() == ["REQUEUED", "COMPLETED"]


def test_local_ray_token_is_private_to_the_sweep(tmp_path: Path) -> None:
    """Ray's token auth stays on, with a token file private to the sweep."""
    from orchestrate.backends.tune_driver import ray_auth_env

    sweep = SweepDir(tmp_path, "s")
    env = ray_auth_env(sweep)
    token = Path(env["RAY_AUTH_TOKEN_PATH"])
    assert env["RAY_AUTH_MODE"] == "token" and token.parent == sweep.path
    assert oct(token.stat().st_mode & 0o777) == "0o600" and len(token.read_text()) == 64
    assert ray_auth_env(sweep) == env and len(token.read_text()) == 64  # stable across calls
    assert os.environ.get("RAY_AUTH_TOKEN_PATH") != str(token)  # the test process itself is untouched


def _fake_command(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


def test_settled_squeue_waits_out_every_settling_state_and_scancel_batches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both SLURM backends share these: squeue is asked again while a job is in any settling state (the union of
    what the backends used to wait on), and scancel never gets more than SCANCEL_BATCH ids at once."""
    from orchestrate.backends import slurm_commands
    from orchestrate.backends.base import BackendError

    bins, calls = tmp_path / "bin", tmp_path / "calls"
    # squeue answers STAGE_OUT, then SIGNALING, then COMPLETING, then RUNNING; it logs its arguments
    _fake_command(bins, "squeue", f"""echo "$*" >> {calls}/squeue
n=$(wc -l < {calls}/squeue)
states=(STAGE_OUT SIGNALING COMPLETING RUNNING)
echo "7_0|orch.s.a|${{states[$(( n < 4 ? n - 1 : 3 ))]}}"
echo "7_1|orch.s.a|PENDING"
""")
    _fake_command(bins, "scancel", f'echo "$#" >> {calls}/scancel\n')
    _fake_command(bins, "sbatch", 'echo "sbatch: error: invalid partition" >&2; exit 1\n')
    calls.mkdir()
    monkeypatch.setenv("PATH", f"{bins}:{os.environ['PATH']}")

    rows = slurm_commands.settled_squeue(["orch.s.a"], settle_s=30, poll_s=0.01)
    assert rows == [("7_0", "orch.s.a", "RUNNING"), ("7_1", "orch.s.a", "PENDING")]
    asked = (calls / "squeue").read_text().splitlines()
    assert len(asked) == 4 and all("-r" in a.split() and "orch.s.a" in a for a in asked)
    assert slurm_commands.settled_squeue([]) == []  # no submission: squeue is not even asked
    assert len((calls / "squeue").read_text().splitlines()) == 4

    slurm_commands.scancel([str(i) for i in range(1234)])
    assert (calls / "scancel").read_text().split() == ["500", "500", "234"]
    with pytest.raises(BackendError, match="invalid partition"):
        slurm_commands.sbatch(tmp_path / "job.sbatch")
