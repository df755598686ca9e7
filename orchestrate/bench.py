"""``python -m orchestrate bench``: how long the daily operations take, against their goals.

* plan the paper grid (321 trials) and a 10,000-trial grid (goal: 10k < 5 s);
* submit 321 trials to SLURM (goal < 10 s): the real submission path (sweep folder, 321 MLflow runs created
  SCHEDULED with their params, one submitit job array, job ids tagged), except that each array task runs a
  trivial function instead of training, so only submission is timed; the array is cancelled afterwards;
* ``status`` on that 321-trial sweep (goal < 2 s): the ledger query alone, and ``python -m orchestrate status`` as
  a new process (what a person typing it waits for, imports included).

Needs a SLURM cluster for the submission timing (``SLURM_CONF``; ``slurm/testcluster/start.sh DIR`` makes one);
without one that row says it was skipped.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import yaml

from orchestrate.grid import load_grid

GRIDS = Path(__file__).resolve().parents[1] / "grids"


class _TrivialTask:
    """Bench stand-in for TrialTask: returns at once, so the benchmark measures submission, not training."""

    def __init__(self, sweep_path: str, sub_id: str) -> None:
        self.sweep_path = sweep_path
        self.sub_id = sub_id

    def __call__(self) -> int:
        return 0


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
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


def run_bench(skip_slurm: bool = False) -> int:
    rows: list[tuple[str, float | None, float, str]] = []  # (what, seconds, goal, note)
    work = Path(tempfile.mkdtemp(prefix="orchestrate-bench-"))
    try:
        t, g = _timed(lambda: load_grid(GRIDS / "paper.yaml"))
        rows.append(("plan paper grid (321 trials)", t, 5.0, f"{len(g.trials)} trials"))  # type: ignore[attr-defined]
        big = _grid_10k(work / "g10k.yaml")
        t, g = _timed(lambda: load_grid(big))
        rows.append(("plan 10k-trial grid", t, 5.0, f"{len(g.trials)} trials"))  # type: ignore[attr-defined]
        print(f"[bench] planned: paper {rows[0][1]:.2f}s, 10k {rows[1][1]:.2f}s", file=sys.stderr, flush=True)
        if skip_slurm or shutil.which("sbatch") is None:
            why = "skipped (--skip-slurm)" if skip_slurm else "skipped: no sbatch (start slurm/testcluster/start.sh)"
            rows.append(("submit 321 trials to SLURM", None, 10.0, why))
            rows.append(("ledger query, 321-trial sweep", None, 2.0, why))
            rows.append(("status, 321-trial sweep", None, 2.0, why))
        else:
            rows += _bench_slurm(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _print(rows)
    return 0


def _bench_slurm(work: Path) -> list[tuple[str, float | None, float, str]]:
    from orchestrate.backends.profile import Profile
    from orchestrate.backends.slurm import SlurmBackend
    from orchestrate.dispatch import new_manifest, run_sweep
    from orchestrate.ledger import Ledger, default_tracking_uri
    from orchestrate.sweep import SweepDir

    class TrivialSlurm(SlurmBackend):
        task_class = _TrivialTask

    rows: list[tuple[str, float | None, float, str]] = []
    root = work / "runs"
    grid = load_grid(GRIDS / "paper.yaml")
    uri = default_tracking_uri(root)
    sweep = SweepDir(root, "bench321")
    # The database and its tables are created once per cluster, not per sweep: outside the timing.
    Ledger(uri, "warmup").ensure_sweep("-", "slurm")
    partition = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True).stdout.split()
    profile = Profile(partition=partition[0] if partition else "", time_limit="00:05:00", max_parallel=2)
    manifest = new_manifest(sweep.name, GRIDS / "paper.yaml", "slurm", "", uri, ())

    def submit() -> object:
        sweep.write_manifest(manifest)
        sweep.write_trials(list(grid.trials))
        with contextlib.redirect_stderr(io.StringIO()):
            return run_sweep(sweep, manifest, list(grid.trials), profile, include_failed=False,
                             backend=TrivialSlurm(sweep, uri, profile))

    t, _ = _timed(submit)
    sub = sweep.submissions()[0]
    rows.append(("submit 321 trials to SLURM", t, 10.0,
                 f"array {sub.job_id}: 321 runs + sbatch; tasks are trivial (submission only)"))
    # the array's tasks are trivial and may have ended already: a refused scancel is not a failed benchmark
    subprocess.run(["scancel", str(sub.job_id)], check=False, capture_output=True)
    t_query, runs = _timed(lambda: len(Ledger(uri, sweep.name).trial_runs()))
    rows.append(("ledger query, 321-trial sweep", t_query, 2.0, f"{runs} runs, one search_runs"))
    # `status` as a person runs it: a new process, so the imports it pays for are counted (and this module never
    # imports the CLI that imports it).
    t_cli, _ = _timed(lambda: subprocess.run([sys.executable, "-m", "orchestrate", "status", sweep.name,
                                              "--sweep-root", str(root)], capture_output=True, check=True))
    rows.append(("status, 321-trial sweep", t_cli, 2.0, "python -m orchestrate status: a new process"))
    return rows


def _print(rows: list[tuple[str, float | None, float, str]]) -> None:
    w = max(len(r[0]) for r in rows)
    print(f"{'operation':<{w}}  {'time (s)':>9}  {'goal (s)':>8}  {'time/goal':>9}  {'':4}  note")
    print("-" * (w + 48))
    for what, t, goal, note in rows:
        if t is None:
            print(f"{what:<{w}}  {'-':>9}  {goal:>8.1f}  {'-':>9}  {'':4}  {note}")
        else:
            ok = "ok" if t <= goal else "SLOW"
            print(f"{what:<{w}}  {t:>9.2f}  {goal:>8.1f}  {t / goal:>9.2f}  {ok:4}  {note}")
