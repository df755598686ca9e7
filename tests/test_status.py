"""``orchestrate status`` reads the trial folders (the truth), asks the scheduler once, and works while MLflow is
down: the counts come from DONE, CANCELLED, the lease, attempts.jsonl and segments.jsonl, never from the ledger. A
status of a full-size sweep never imports mlflow (that import alone costs seconds).

Real pieces throughout: an `mlflow server` started and stopped by the test with slurm/mlflow-server.sh, the SLURM
test cluster holding a real (held) job for a queued trial, trial folders written with the trial contract's own
writers and a real lease (asr_core.contract.folder.lease) held by this process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from asr_core.contract.folder.lease import Lease
from asr_core.contract.trial import (OUTCOME_CANCELLED, OUTCOME_FAILED, OUTCOME_FINISHED, OUTCOME_KILLED,
                                     OUTCOME_PREEMPTED, RUNNING, ProgressLog, TrialFolder, record_attempt)
from orchestrate.tools.fake_sweep import MIX, fake_trials, make_fake_sweep
from orchestrate.sweep.folder import Manifest, SweepDir
from orchestrate.sweep.trial import Trial
from orchestrate.sweep.trial_state import read_folder_state
from tests.plugins.mlflow_server import free_port

REPO = Path(__file__).resolve().parents[1]
SERVER = REPO / "slurm" / "mlflow-server.sh"


# ---- helpers -----------------------------------------------------------------------------------------------------
def status(root: Path, name: str, *args: str, module: tuple[str, ...] = ("orchestrate", "status"),
           check: bool = True) -> subprocess.CompletedProcess[str]:
    """``python -m orchestrate status NAME --sweep-root ROOT ARGS`` in a fresh process, as a person runs it."""
    p = subprocess.run([sys.executable, "-m", *module, name, "--sweep-root", str(root), *args], capture_output=True,
                       text=True, cwd=REPO, timeout=300)
    if check:
        assert p.returncode == 0, f"status exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def counts(out: str) -> dict[str, int]:
    """{STATE: n} from the count lines of status's output."""
    states = ("FINISHED", "RUNNING", "PENDING", "QUEUED", "PREEMPTED", "FAILED", "KILLED", "LOST")
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in states and parts[1].isdigit() and line.startswith("  "):
            found[parts[0]] = int(parts[1])
    return found


def segment(folder: TrialFolder, n: int, job_id: str, code: str = "3f2a9c1d0b7e") -> None:
    """A segments.jsonl record as the trial job appends it at each start."""
    folder.path.mkdir(parents=True, exist_ok=True)
    with open(folder.segments, "a") as f:
        f.write(json.dumps({"segment": n, "time": 1.0, "code": code, "commit": code[:12], "dirty": False,
                            "host": "gpu-node-01", "job_id": job_id}) + "\n")


def server(directory: Path, port: int, *flags: str) -> None:
    """``slurm/mlflow-server.sh --dir DIR --port PORT --workers 1 FLAGS`` (``--detach`` waits for /health)."""
    p = subprocess.run(["bash", str(SERVER), "--dir", str(directory), "--port", str(port), "--workers", "1",
                        *flags], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, f"mlflow-server.sh {' '.join(flags)} exited {p.returncode}: {p.stderr[-2000:]}"


@dataclasses.dataclass
class Built:
    sweep: SweepDir
    trials: dict[str, Trial]  # by role: finished, running, queued, preempted, failed, gave_up, cancelled, lost, new
    lease: Lease


ROLES = ("finished", "running", "queued", "preempted", "failed", "gave_up", "cancelled", "lost", "new")


def build_sweep(root: Path, name: str, uri: str, backend: str = "slurm") -> Built:
    """A sweep of nine trials, one per situation a trial can be in, written the way the job and orchestrate write
    their folders. The running trial's lease is held by this process (released by the caller)."""
    trials = {role: dataclasses.replace(t, label=f"{role}-{t.label}")
              for role, t in zip(ROLES, fake_trials(len(ROLES)))}
    sweep = SweepDir(root, name)
    sweep.write_manifest(Manifest(name=name, grid="grids/paper.yaml", backend=backend, profile="", tracking_uri=uri,
                                  workdir=str(REPO), sweep_id=uuid.uuid4().hex,
                                  code=("3f2a9c1d0b7e", "8d41e0c2a9f3")))
    sweep.write_trials(list(trials.values()))
    for role, t in trials.items():
        if role != "new":
            sweep.prepare_trial(t)
    f = {role: TrialFolder(sweep.trial_dir(t.key)) for role, t in trials.items()}

    segment(f["finished"], 1, "100_0")
    record_attempt(f["finished"].path, OUTCOME_PREEMPTED, segment=1, job_id="100_0", by="job")
    segment(f["finished"], 2, "100_0", code="8d41e0c2a9f3")
    record_attempt(f["finished"].path, OUTCOME_FINISHED, segment=2, job_id="100_0", by="job")
    f["finished"].trained.write_text("{}")
    f["finished"].done.write_text("finished\n")

    segment(f["running"], 1, "100_1")
    ProgressLog(f["running"].path).write("train", 30, 60)
    lease = Lease(f["running"].path, "100_1").acquire()

    segment(f["preempted"], 1, "100_3")
    record_attempt(f["preempted"].path, OUTCOME_PREEMPTED, segment=1, job_id="100_3", by="job")

    segment(f["failed"], 1, "100_4")
    record_attempt(f["failed"].path, OUTCOME_FAILED, "RuntimeError: loss is nan at step 7", segment=1,
                   job_id="100_4", by="job")
    segment(f["failed"], 2, "101_0")
    record_attempt(f["failed"].path, OUTCOME_KILLED, "trainer killed by SIGKILL (out of memory or the system)",
                   segment=2, job_id="101_0", by="task")

    for n in (1, 2, 3):
        segment(f["gave_up"], n, f"10{n}_5")
        record_attempt(f["gave_up"].path, OUTCOME_KILLED, "killed by the system: out of memory", segment=n,
                       job_id=f"10{n}_5", by="resume")

    segment(f["cancelled"], 1, "100_6")
    f["cancelled"].cancelled.write_text(json.dumps({"time": 1.0, "by": "orchestrate cancel"}) + "\n")
    record_attempt(f["cancelled"].path, OUTCOME_CANCELLED, segment=1, job_id="100_6", by="job")

    segment(f["lost"], 1, "100_7")  # its job vanished without recording how the segment ended
    return Built(sweep, trials, lease)


EXPECTED = {"FINISHED": 1, "RUNNING": 1, "PENDING": 1, "PREEMPTED": 1, "FAILED": 2, "KILLED": 1, "LOST": 2}


def hold_queued_trial(cluster, built: Built) -> str:  # noqa: ANN001 - the slurm_cluster fixture's object
    """Submit the sweep's submission file and a real, held SLURM array task carrying the queued trial (job name
    ``orch.<sweep>.<submission id>``, task index = its place in the submission): squeue shows it PENDING."""
    keys = [t.key for t in built.trials.values()]
    sub = built.sweep.new_submission("slurm", keys, {k: "" for k in keys})
    index = keys.index(built.trials["queued"].key)
    job = cluster.sbatch("--hold", f"--job-name={sub.job_name()}", f"--array={index}", "--time=00:01:00",
                         f"--partition={cluster.partition}", "--output=/dev/null", "--wrap", "sleep 1")
    sub.record_job(job)
    return job


# ---- the folders, one at a time ----------------------------------------------------------------------------------
def test_folder_state_reads_what_the_job_wrote_and_never_raises_on_half_written_files(tmp_path: Path) -> None:
    folder = TrialFolder(tmp_path / "t")
    missing = read_folder_state(folder.path, "k")
    assert not missing.exists and missing.segments == 0 and not missing.live and missing.last_outcome is None

    segment(folder, 1, "7_1")
    record_attempt(folder.path, OUTCOME_PREEMPTED, segment=1, job_id="7_1", by="job")
    segment(folder, 2, "7_1", code="8d41e0c2a9f3")
    with open(folder.segments, "a") as f:
        f.write('{"segment": 3, "ti')  # a crash while the next start was being recorded
    with open(folder.attempts, "a") as f:
        f.write('{"outcome": "fai')
    ProgressLog(folder.path).write("train", 12, 60)
    with open(folder.progress, "a") as f:
        f.write('{"phase": "train", "done": "x", "total": 60}\n{"pha')
    (folder.lease_dir).mkdir()
    (folder.lease_dir / "000001.json").write_text("")  # a generation being created
    fs = read_folder_state(folder.path, "k")
    assert fs.exists and fs.segments == 2 and fs.codes == ("3f2a9c1d0b7e", "8d41e0c2a9f3")
    assert fs.last_segment is not None and fs.last_segment.job_id == "7_1"
    assert [a.outcome for a in fs.attempts] == [OUTCOME_PREEMPTED] and fs.unrecorded_segment
    assert fs.last_outcome is None  # segment 2 has no outcome yet
    assert fs.progress is None or fs.progress.describe() == "train 12/60"
    assert fs.lease is not None and fs.lease.token == ""

    text = folder.attempts.read_text()
    folder.attempts.write_text(text[:text.rindex("\n") + 1])  # (appending after a cut line would merge the two)
    record_attempt(folder.path, OUTCOME_KILLED, "OUT_OF_MEMORY", segment=2, job_id="7_1", by="resume")
    fs = read_folder_state(folder.path, "k")
    assert not fs.unrecorded_segment and fs.failed and len(fs.failures) == 1 and fs.last_outcome == OUTCOME_KILLED

    (folder.attempts).unlink()
    (folder.attempts).mkdir()  # not even a file: still no exception
    fs = read_folder_state(folder.path, "k")
    assert fs.attempts == () and fs.unrecorded_segment


# ---- the command, MLflow up and down -----------------------------------------------------------------------------
@pytest.mark.slow
def test_status_counts_from_the_folders_while_mlflow_is_down_then_reconciles_when_it_is_back(
        tmp_path: Path, slurm_cluster) -> None:  # noqa: ANN001
    from orchestrate.ledger.ledger import Ledger

    port = free_port()
    server_dir = tmp_path / "mlflow"
    uri = f"http://127.0.0.1:{port}"
    server(server_dir, port, "--detach")
    name = f"status-{uuid.uuid4().hex[:8]}"
    built = build_sweep(tmp_path / "runs", name, uri)
    job = ""
    try:
        ledger = Ledger(uri, name)
        manifest = built.sweep.read_manifest()
        parent = ledger.ensure_sweep(manifest.grid, "slurm", manifest.sweep_id, str(built.sweep.path))
        run_ids = ledger.create_trial_runs(parent, list(built.trials.values()), "slurm")
        by_role = {role: run_ids[t.key] for role, t in built.trials.items()}
        ledger.set_status([by_role["failed"], by_role["running"]], RUNNING)  # their jobs had started
        job = hold_queued_trial(slurm_cluster, built)

        server(server_dir, port, "--stop")
        p = status(built.sweep.path.parent, name)
        assert counts(p.stdout) == EXPECTED, p.stdout
        lines = {role: next(ln for ln in p.stdout.splitlines() if t.label in ln and t.key in ln)
                 for role, t in built.trials.items() if role in ("failed", "gave_up", "cancelled", "lost", "new",
                                                                  "running")}
        assert "2/3 failures: killed trainer killed by SIGKILL" in lines["failed"]
        assert "gave up after 3 failures: killed by the system: out of memory" in lines["gave_up"]
        assert "(1 gave up after 3 failures)" in p.stdout
        assert "cancelled" in lines["cancelled"] and "KILLED" in lines["cancelled"]
        assert "segment 1 (job 100_7) ended without a word" in lines["lost"]
        assert "never started" in lines["new"]
        assert "train 30/60" in lines["running"] and "job 100_1" in lines["running"]
        assert "MLflow unreachable" in p.stdout and "behind by" in p.stdout
        # the code versions: the sweep's, and the one trial whose segments ran different code
        assert "submitted and resumed from code 3f2a9c1d0b7e, 8d41e0c2a9f3" in p.stdout
        assert "1 trials ran different code in their segments" in p.stdout
        mixed = next(ln for ln in p.stdout.splitlines() if built.trials["finished"].label in ln)
        assert "2 segments  code 3f2a9c1d0b7e -> 8d41e0c2a9f3" in mixed
        rows = {r["key"]: r for r in map(json.loads, status(built.sweep.path.parent, name, "--json").stdout
                                         .splitlines())}
        assert Counter(r["status"] for r in rows.values()) == Counter(EXPECTED)
        queued = rows[built.trials["queued"].key]
        assert queued["status"] == "PENDING" and queued["job_id"] == f"{job}_{list(ROLES).index('queued')}"
        assert rows[built.trials["finished"].key]["code"] == ["3f2a9c1d0b7e", "8d41e0c2a9f3"]

        # MLflow is back: the folders say the ledger is behind (a cancel and failures only orchestrate mirrors), so
        # status brings it in line, within its deadline, and says so
        server(server_dir, port, "--detach")
        if slurm_cluster.squeue_state(job) is None:  # the shared test cluster's jobs were cancelled meanwhile
            job = hold_queued_trial(slurm_cluster, built)
        p = status(built.sweep.path.parent, name)
        assert counts(p.stdout) == EXPECTED, p.stdout
        assert "reconciled (bounded at" in p.stdout, p.stdout
        runs = Ledger(uri, name).trial_runs()
        got = {role: runs[t.key].status for role, t in built.trials.items()}
        assert got == {"finished": "FINISHED", "running": "RUNNING", "queued": "SCHEDULED",
                       "preempted": "SCHEDULED", "failed": "FAILED", "gave_up": "FAILED", "cancelled": "KILLED",
                       "lost": "SCHEDULED", "new": "SCHEDULED"}
        assert runs[built.trials["failed"].key].error.startswith("2/3 failures: killed trainer killed by SIGKILL")
        assert runs[built.trials["gave_up"].key].error.startswith("gave up after 3 failures")
        p = status(built.sweep.path.parent, name)
        assert "in step with the trial folders" in p.stdout, p.stdout
    finally:
        built.lease.release()
        if job:
            slurm_cluster.run("scancel", job, check=False)
        server(server_dir, port, "--stop")


def test_status_of_another_folders_sweep_is_refused_without_importing_mlflow(tmp_path: Path) -> None:
    """The sweep's experiment belongs to another sweep folder: status says whose, exit 2 (a sqlite ledger read
    with sqlite3 alone)."""
    from orchestrate.ledger.ledger import Ledger

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    built = build_sweep(tmp_path / "a", "owned", uri, backend="local")
    built.lease.release()
    Ledger(uri, "owned").ensure_sweep("g", "local", "someone-elses-id", "/elsewhere/owned")
    p = status(tmp_path / "a", "owned", check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "/elsewhere/owned" in p.stderr and "belongs to another sweep" in p.stderr


def test_a_local_sweep_being_run_holds_its_trials_and_status_leaves_its_ledger_alone(tmp_path: Path) -> None:
    """A local sweep runs inside the process holding the sweep's lock: its submitted trials that have not started
    are PENDING (not lost; QUEUED when a segment started without a word yet), and status does not write the
    ledger under that process (it says why)."""
    from orchestrate.ledger.ledger import Ledger

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    built = build_sweep(tmp_path / "runs", "local-run", uri, backend="local")
    built.lease.release()
    manifest = built.sweep.read_manifest()
    Ledger(uri, "local-run").ensure_sweep(manifest.grid, "local", manifest.sweep_id, str(built.sweep.path))
    submitted = ("new", "lost", "running", "preempted")  # what a `resume` would run: not the finished or failed
    keys = [built.trials[r].key for r in submitted]
    sub = built.sweep.new_submission("local", keys, {k: "" for k in keys})
    sub.record_job(f"local:{os.getpid()}:{sub.id}")

    idle = {r["key"]: r for r in map(json.loads, status(tmp_path / "runs", "local-run", "--json", "--no-reconcile")
                                      .stdout.splitlines())}
    assert idle[built.trials["new"].key]["status"] == "LOST"  # nobody runs the sweep: nothing holds it
    with built.sweep.lock("resume"):
        p = status(tmp_path / "runs", "local-run")
        rows = {r["key"]: r for r in map(json.loads, status(tmp_path / "runs", "local-run", "--json")
                                         .stdout.splitlines())}
    got = {role: rows[t.key]["status"] for role, t in built.trials.items()}
    assert got == {"finished": "FINISHED", "running": "QUEUED", "queued": "LOST", "preempted": "PREEMPTED",
                   "failed": "FAILED", "gave_up": "FAILED", "cancelled": "KILLED", "lost": "QUEUED", "new": "PENDING"}
    assert rows[built.trials["new"].key]["reason"] == f"job {sub.job_id} pending in the queue, not started yet"
    assert rows[built.trials["preempted"].key]["reason"].startswith(f"requeue pending (job {sub.job_id}")
    assert "scheduler: the sweep is being run (resume by pid" in p.stdout, p.stdout
    assert "not reconciled: sweep 'local-run' is busy" in p.stdout, p.stdout
    assert Ledger(uri, "local-run").trial_runs() == {}  # nothing was written


def test_status_says_how_the_scheduler_saw_a_silent_segment_end_without_recording_it(tmp_path: Path,
                                                                                      slurm_cluster) -> None:  # noqa: ANN001
    """A trial whose last segment's job ended without a word (here: a real job that exited 3) is LOST with what
    ``sacct`` says, read only: ``resume`` records it and counts it against the budget."""
    built = build_sweep(tmp_path / "runs", f"acct-{uuid.uuid4().hex[:8]}", f"sqlite:///{tmp_path / 'm.db'}")
    built.lease.release()
    job = slurm_cluster.sbatch(f"--partition={slurm_cluster.partition}", "--time=00:01:00", "--output=/dev/null",
                               "--wrap", "exit 3")
    slurm_cluster.wait_for_state(job, "FAILED", timeout=120)
    lost = TrialFolder(built.sweep.trial_dir(built.trials["lost"].key))
    segment(lost, 2, job)
    attempts = lost.path / "attempts.jsonl"
    before = attempts.read_bytes() if attempts.exists() else b""
    rows = {r["key"]: r for r in map(json.loads, status(built.sweep.path.parent, built.sweep.name, "--json",
                                                        "--no-reconcile").stdout.splitlines())}
    row = rows[built.trials["lost"].key]
    assert row["status"] == "LOST", row
    assert f"segment 2 (job {job}) ended without a word; exit code 3" in row["reason"], row
    assert "resume records it" in row["reason"]
    assert (attempts.read_bytes() if attempts.exists() else b"") == before  # status wrote nothing


# ---- a full-size sweep -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sweep321(tmp_path_factory: pytest.TempPathFactory) -> SweepDir:
    return make_fake_sweep(tmp_path_factory.mktemp("fake"), 321)


def test_status_of_a_321_trial_sweep_does_not_import_mlflow(sweep321: SweepDir) -> None:
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrate", "status", sweep321.name, "--sweep-root",
                        str(sweep321.path.parent)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in p.stderr.splitlines() if ln.startswith("import time:")}
    heavy = sorted(m for m in imported if m.split(".")[0] in ("mlflow", "torch", "ray", "submitit", "pandas",
                                                              "sqlalchemy"))
    assert not heavy, f"status imported {heavy[:10]}"
    assert sum(counts(p.stdout).values()) == 321, p.stdout[:2000]


def test_fake_sweep_holds_the_documented_mix(sweep321: SweepDir) -> None:
    """The generator the benchmark times: every state of MIX appears in its share (waiting trials have no job,
    so they read as LOST with the lost ones)."""
    rows = [json.loads(line) for line in status(sweep321.path.parent, sweep321.name, "--json").stdout.splitlines()]
    got = Counter(r["status"] for r in rows)
    share = {s: round(f * 321) for s, f in MIX}
    assert got["RUNNING"] == share["running"] and got["PREEMPTED"] == share["preempted"]
    assert got["FAILED"] == share["failed"] + share["gave_up"] and got["KILLED"] == share["cancelled"]
    assert got["LOST"] == share["lost"] + share["waiting"]
    assert got["FINISHED"] == 321 - sum(v for k, v in share.items() if k != "finished")
    assert sum(r["gave_up"] for r in rows) == share["gave_up"]
