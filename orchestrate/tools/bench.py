"""``python -m orchestrate bench``: how long the daily operations take, against their goals, in one table.

* plan the paper grid (321 trials) and a 10,000-trial grid (goal: < 5 s each);
* submit 321 trials (goal < 5 s): the whole ``python -m orchestrate submit grids/paper.yaml --backend slurm`` in a
  fresh process, imports included, against a real MLflow server (321 runs created SCHEDULED with their identity
  tags, one submitit job array; each job logs its params and job id when it starts). The bench's cluster profile
  submits the array held (``--hold``), so no task runs; it is cancelled afterwards;
* the ledger query of that sweep (every trial run, one paged search; goal < 2 s);
* ``python -m orchestrate status`` in a fresh process on a full-size sweep folder of 321 and of 3,000 trials
  (:func:`orchestrate.tools.fake_sweep.make_fake_sweep`: a sweep half-way through, read from its folders; goals < 1 s
  and < 3 s);
* adding one test set to a finished 321-model paper sweep (every model trained and evaluated): ``plan_default``
  on the sweep's trials merged with ``grids/paper.yaml`` given one more eval dataset plans one evaluation job per
  model and no training (goal < 2 s).

The server: ``--tracking-uri`` (else ``MLFLOW_TRACKING_URI``) when it names an http(s) server, else one started for
the bench with ``slurm/mlflow-server.sh`` under the bench's temporary folder and stopped afterwards (its start is
not timed; neither is a first request that warms it). The submission needs a SLURM cluster (``SLURM_CONF``;
``slurm/testcluster/start.sh DIR`` makes one); without one those rows say they were skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar
from urllib.parse import urlparse

import yaml

from asr_core.contract.tracking import tracking_uri as ledger_uri
from orchestrate.assets import grids_dir, server_script
from orchestrate.plan.grid import load_grid

if TYPE_CHECKING:
    from orchestrate.ledger.mlflow_rest import MlflowRest
    from orchestrate.sweep.folder import SweepDir

REPO = Path(__file__).resolve().parents[2]
GRIDS = grids_dir()
SERVER_SCRIPT = server_script()
CLI_TIMEOUT_S = 600
STATUS_GOALS = ((321, 1.0), (3000, 3.0))  # (trials in the sweep folder, seconds ``status`` may take)
NEW_TEST_SET = "spotify=podcast:data/spotify/test"  # the test set added to a finished sweep (its data need not exist)
NEW_TEST_SET_GOAL = 2.0


T = TypeVar("T")


@dataclass(frozen=True)
class Row:
    """One line of the table: what was timed, how long it took (None: not measured), its goal and a note."""

    what: str
    seconds: float | None
    goal: float
    note: str


def _timed(fn: Callable[[], T]) -> tuple[float, T]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _grid_10k(path: Path) -> Path:
    """10 contexts x 10 depths x 20 learning rates x 5 seeds = 10,000 trials."""
    body = {"name": "bench10k", "seeds": [0, 1, 2, 3, 4], "base": {"preset": "tiny"},
            "subgrids": {"big": {"axes": {
                "data.context_s": [5.12 * 2 ** i for i in range(10)],
                "model.layers": list(range(1, 11)),
                "train.lr": [round(1e-4 * (i + 1), 6) for i in range(20)]}}}}
    path.write_text(yaml.safe_dump(body))
    return path


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m orchestrate ARGS`` in a fresh process, as a person runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "orchestrate", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S)


def run_bench(skip_slurm: bool = False, tracking_uri: str | None = None,
              status_goals: tuple[tuple[int, float], ...] = STATUS_GOALS) -> int:
    """Time every operation and print the table; returns 0 (a slow figure is reported, not an error).
    ``status_goals``: the sizes of sweep folder ``status`` is timed on, each with its goal."""
    rows: list[Row] = []
    work = Path(tempfile.mkdtemp(prefix="orchestrate-bench-"))
    try:
        t, n = _timed(lambda: len(load_grid(GRIDS / "paper.yaml").trials))
        rows.append(Row("plan paper grid (321 trials)", t, 5.0, f"{n} trials"))
        t, n = _timed(lambda: len(load_grid(_grid_10k(work / "g10k.yaml")).trials))
        rows.append(Row("plan 10k-trial grid", t, 5.0, f"{n} trials"))
        _say(f"planned: paper {rows[0].seconds:.2f}s, 10k {rows[1].seconds:.2f}s")
        if skip_slurm or shutil.which("sbatch") is None:
            why = "skipped (--skip-slurm)" if skip_slurm else "skipped: no sbatch (start slurm/testcluster/start.sh)"
            rows += [Row("submit 321 trials (slurm, mlflow server)", None, 5.0, why),
                     Row("ledger query, 321-trial sweep", None, 2.0, why)]
        else:
            rows += _bench_submit(work, ledger_uri(tracking_uri, local_default=False))
        rows += _bench_status(work, status_goals)
        rows.append(bench_new_test_set(work).row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"orchestrate bench: {os.cpu_count()} cores, load average {load:.1f} at the end")
    _print(rows)
    return 0


def _say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# ---- the server ------------------------------------------------------------------------------------------------------
def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    """The bench's own MLflow server (``slurm/mlflow-server.sh --detach`` under ``folder``), stopped on exit."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        p = subprocess.run(["bash", str(SERVER_SCRIPT), "--dir", str(folder), "--port", str(_free_port()),
                            "--detach"], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("MLFLOW_TRACKING_URI=")), "")
        if p.returncode != 0 or not line:
            raise RuntimeError(f"the bench's MLflow server did not start (exit {p.returncode}): "
                               f"{(p.stderr or p.stdout).strip()[-800:]}")
        self.uri = line.split("=", 1)[1].strip()

    def stop(self) -> None:
        subprocess.run(["bash", str(SERVER_SCRIPT), "--dir", str(self.folder), "--stop"], capture_output=True,
                       timeout=120, stdin=subprocess.DEVNULL)


# ---- submit and the ledger query -------------------------------------------------------------------------------------
def _bench_submit(work: Path, uri: str | None) -> list[Row]:
    from orchestrate.ledger.ledger import Ledger
    from orchestrate.ledger.mlflow_rest import MlflowRest
    from orchestrate.sweep.folder import SweepDir

    server = None
    if not uri or urlparse(uri).scheme not in ("http", "https"):
        _say("starting an MLflow server for the bench (not timed)")
        try:
            server = _Server(work / "mlflow-server")
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            why = f"skipped: {e}"
            return [Row("submit 321 trials (slurm, mlflow server)", None, 5.0, why),
                    Row("ledger query, 321-trial sweep", None, 2.0, why)]
        uri = server.uri
    try:
        MlflowRest(uri).get_experiment_by_name("Default")  # the server's first request, not timed
        partition = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True).stdout.split()
        profile = work / "held.yaml"
        profile.write_text(yaml.safe_dump({"partition": partition[0] if partition else "", "time_limit": "00:05:00",
                                           "max_parallel": 2, "additional": {"hold": True}}))
        root, name = work / "runs", f"bench321-{time.strftime('%H%M%S')}-{os.getpid()}"
        args = ["submit", str(GRIDS / "paper.yaml"), "--backend", "slurm", "--profile", str(profile),
                "--sweep", name, "--sweep-root", str(root), "--tracking-uri", uri, "--no-check-data"]
        _say(f"submitting 321 trials to {uri} (held array)")
        t, p = _timed(lambda: _cli(args, work))
        subs = SweepDir(root, name).submissions()
        for s in subs:  # held, so nothing ran; a refused scancel is not a failed benchmark
            if s.job_id:
                subprocess.run(["scancel", str(s.job_id)], check=False, capture_output=True)
        if p.returncode != 0:
            why = f"failed (exit {p.returncode}): {(p.stderr or p.stdout).strip().splitlines()[-1:]}"
            return [Row("submit 321 trials (slurm, mlflow server)", None, 5.0, why),
                    Row("ledger query, 321-trial sweep", None, 2.0, "no sweep")]
        t_query, runs = _timed(lambda: len(Ledger(uri, name).trial_runs()))
        _say("creating 321 bare runs (the server's own floor)")
        rest = MlflowRest(uri)
        t_floor = _server_floor(rest, f"{name}-floor", 321)
        return [Row("submit 321 trials (slurm, mlflow server)", t, 5.0, _submit_note(p.stderr)),
                Row("  of which the server's floor", t_floor, 5.0,
                    f"321 runs made SCHEDULED by bare REST calls (create + update, {rest.workers} threads): "
                    "MLflow's own time, whatever the client"),
                Row("ledger query, 321-trial sweep", t_query, 2.0, f"{runs} runs, one paged runs/search")]
    finally:
        if server is not None:
            server.stop()


def _server_floor(rest: "MlflowRest", experiment: str, n: int) -> float:
    """Seconds the server takes to make ``n`` SCHEDULED runs from bare REST calls in a scratch experiment: a run
    needs two writes (MLflow creates every run RUNNING and has no batch creation), so no client goes faster."""
    eid = rest.create_experiment(experiment)
    if eid is None:
        raise RuntimeError(f"experiment {experiment!r} exists already")

    def one(i: int) -> None:
        run = rest.create_run(eid, f"floor-{i}", {"trial.role": "trial", "trial.key": f"{i:016x}"})
        rest.update_run(run.run_id, "SCHEDULED")

    t, _ = _timed(lambda: rest.map(one, list(range(n))))
    return t


def _submit_note(stderr: str) -> str:
    """Where a submission's time went, from its own log lines."""
    ledger = re.search(r"ledger ready in ([\d.]+)s", stderr)
    sbatch = re.search(r"job array (\S+) with (\d+) tasks \(([\d.]+)s\)", stderr)
    parts = ["fresh process"]
    if ledger:
        parts.append(f"runs created in {ledger.group(1)}s")
    if sbatch:
        parts.append(f"array {sbatch.group(1)} submitted in {sbatch.group(3)}s")
    return ", ".join(parts)


# ---- status ----------------------------------------------------------------------------------------------------------
def _bench_status(work: Path, goals: tuple[tuple[int, float], ...]) -> list[Row]:
    try:
        from orchestrate.tools.fake_sweep import make_fake_sweep
    except ImportError as e:
        return [Row(f"status, {n}-trial sweep", None, goal, f"skipped: no sweep generator ({e})") for n, goal in goals]
    rows = []
    for n, goal in goals:
        root = work / f"fake{n}"
        _say(f"making a {n}-trial sweep folder (not timed)")
        sweep = make_fake_sweep(root, n)
        t, p = _timed(lambda: _cli(["status", sweep.name, "--sweep-root", str(root)], work))
        note = "python -m orchestrate status, fresh process, folders only"
        if p.returncode != 0:
            note = f"exit {p.returncode}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}"
        rows.append(Row(f"status, {n}-trial sweep", t, goal, note))
    return rows


# ---- one more test set ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NewTestSet:
    """What :func:`bench_new_test_set` measured: its row, and what the plan holds beyond the sweep's trials."""

    row: Row
    models: int  # trained and evaluated models in the sweep
    evaluations: int  # evaluation jobs planned
    trainings: int  # trials planned under keys the sweep did not have (models to train)


def _finished_sweep(root: Path) -> "SweepDir":
    """The fake paper sweep with every model finished, its folder as a finished trial leaves it: ``config.json``,
    ``TRAINED``, ``eval/`` tables, ``EVALUATED`` (what its own evaluation decoded, and how) and ``DONE``."""
    from asr_core.contract.evaluation import default_evaluation, evaluated_record
    from asr_core.contract.trial import TrialFolder, mark_done, mark_evaluated, write_config
    from orchestrate.tools.fake_sweep import make_fake_sweep

    sweep = make_fake_sweep(root, 321, name="paper-finished", mix=(("finished", 1.0),))
    for t in sweep.read_trials():
        folder = TrialFolder(sweep.trial_dir(t.key))
        write_config(folder.path, t.config)
        mark_evaluated(folder.path, evaluated_record(*default_evaluation(t.config.eval)))
        if not folder.done.exists():
            mark_done(folder.path)
    return sweep


def bench_new_test_set(work: Path, new: str = NEW_TEST_SET) -> NewTestSet:
    """Add the test set ``new`` (``NAME=FORMAT:PATH``) to a finished 321-model paper sweep: the paper grid with it
    appended to ``eval.datasets`` (as ``--set`` does), merged into the sweep's trials as ``submit`` merges them,
    then :func:`orchestrate.plan.evaluations.plan_default` timed. Every model lacks the new set only: one evaluation job
    each, no training."""
    from orchestrate.sweep.folder import merge_trials
    from orchestrate.plan.evaluations import EvaluationError, plan_default

    what = "add 1 test set, 321-model sweep (plan)"
    _say("making a finished 321-model sweep folder (not timed)")
    sweep = _finished_sweep(work / "finished321")
    before = sweep.read_trials()
    datasets: list[str] = []
    for t in before:
        datasets += [d for d in t.config.eval.datasets if d not in datasets]
    t_grid, grid = _timed(lambda: load_grid(GRIDS / "paper.yaml",
                                            overrides=[f"eval.datasets=[{', '.join([*datasets, new])}]"]))
    t_merge, merged = _timed(lambda: merge_trials(before, list(grid.trials)))
    try:
        t, planned = _timed(lambda: plan_default(sweep, merged))
    except EvaluationError as e:
        return NewTestSet(Row(what, None, NEW_TEST_SET_GOAL, f"refused: {e}"), len(before), 0, 0)
    known = {m.key for m in before}
    evaluations = sum(1 for p in planned if p.is_evaluation and p.key not in known)
    trainings = sum(1 for p in planned if not p.is_evaluation and p.key not in known)
    note = (f"{evaluations} evaluation jobs, {trainings} trainings for {len(before)} models (grid "
            f"{t_grid:.2f}s and merge {t_merge:.2f}s before it)")
    if (evaluations, trainings) != (len(before), 0):
        note = f"WRONG, expected {len(before)} evaluation jobs and 0 trainings: {note}"
    return NewTestSet(Row(what, t, NEW_TEST_SET_GOAL, note), len(before), evaluations, trainings)


def _print(rows: list[Row]) -> None:
    w = max(len(r.what) for r in rows)
    print(f"{'operation':<{w}}  {'time (s)':>9}  {'goal (s)':>8}  {'time/goal':>9}  {'':4}  note")
    print("-" * (w + 48))
    for r in rows:
        if r.seconds is None:
            print(f"{r.what:<{w}}  {'-':>9}  {r.goal:>8.1f}  {'-':>9}  {'':4}  {r.note}")
        else:
            ok = "ok" if r.seconds <= r.goal else "SLOW"
            print(f"{r.what:<{w}}  {r.seconds:>9.2f}  {r.goal:>8.1f}  {r.seconds / r.goal:>9.2f}  {ok:4}  {r.note}")
