"""The sweep throttle (:mod:`orchestrate.backends.slurm_throttle`) against a model of SLURM's scheduler, over many
random interleavings: ``max_parallel`` is never exceeded, every task runs once, and no array is left waiting forever.

The model (a stand-in for slurmctld, which cannot be driven step by step; the real cluster is
``tests/test_slurm_arrays.py``) keeps what the throttle relies on: an array's ``ArrayTaskThrottle`` (counting its
RUNNING tasks), ``afterany`` dependencies (fulfilled once the task has left RUNNING), holds, and ``squeue`` rows
without ``-r`` (running tasks one a row, pending ones grouped). Between any two SLURM commands of a rebalance, the
scheduler may start an eligible task and a task that has handed its slot on may leave RUNNING, as on a real cluster.
Tasks end one at a time under the throttle lock (as ``hand_on_slot`` does), and ``resume`` submits a new array of
cancelled tasks through :meth:`SweepThrottle.admit`.
"""

from __future__ import annotations

import random
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrate.backends import slurm_commands
from orchestrate.backends.slurm_throttle import SweepThrottle
from orchestrate.sweep.folder import SweepDir

RUN, ENDING = "RUNNING", "ENDING"  # ENDING: has handed its slot on, still RUNNING in squeue


@dataclass
class Task:
    index: int
    state: str = "PENDING"  # PENDING, RUNNING, ENDING (still RUNNING for SLURM), DONE, CANCELLED
    deps: list[str] = field(default_factory=list)
    held: bool = False
    split: bool = False  # changed apart from its array's pending rest (a job record of its own)


@dataclass
class Array:
    job_id: str
    name: str
    tasks: list[Task]
    throttle: int

    def running(self) -> int:
        return sum(t.state in (RUN, ENDING) for t in self.tasks)


class Slurm:
    """The model scheduler; ``squeue``/``scontrol`` as the throttle calls them (see the module docstring)."""

    def __init__(self, rng: random.Random, max_parallel: int) -> None:
        self.rng = rng
        self.m = max_parallel
        self.arrays: dict[str, Array] = {}
        self.next_id = 1
        self.worst = 0
        self.log: list[str] = []
        self.in_command = False

    # ---- the world moving on its own --------------------------------------------------------------------------------
    def task(self, job: str) -> Task | None:
        a, _, i = job.partition("_")
        arr = self.arrays.get(a)
        return arr.tasks[int(i)] if arr is not None and i.isdigit() and int(i) < len(arr.tasks) else None

    def fulfilled(self, gate: str) -> bool:
        t = self.task(gate.split(":", 1)[1])
        return t is None or t.state in ("DONE", "CANCELLED")

    def eligible(self) -> list[tuple[Array, Task]]:
        out = []
        for arr in self.arrays.values():
            if arr.throttle and arr.running() >= arr.throttle:
                continue
            for t in arr.tasks:
                if t.state == "PENDING" and not t.held and all(self.fulfilled(g) for g in t.deps):
                    out.append((arr, t))
                    break  # SLURM starts an array's tasks in index order
        return out

    def check(self) -> None:
        running = [f"{a.job_id}_{t.index}" for a in self.arrays.values() for t in a.tasks if t.state in (RUN, ENDING)]
        self.worst = max(self.worst, len(running))
        assert len(running) <= self.m, f"{len(running)} running: {running}\n" + "\n".join(self.log[-30:])

    def step(self) -> bool:
        """One thing SLURM does by itself: start an eligible task, or let an ending task leave RUNNING."""
        moves = [("start", a, t) for a, t in self.eligible()]
        moves += [("exit", a, t) for a in self.arrays.values() for t in a.tasks if t.state == ENDING]
        if not moves:
            return False
        what, arr, t = self.rng.choice(moves)
        t.state = RUN if what == "start" else "DONE"
        self.log.append(f"slurm: {what} {arr.job_id}_{t.index}")
        self.check()
        return True

    def maybe_step(self) -> None:
        while self.rng.random() < 0.4 and self.step():
            pass

    # ---- squeue and scontrol, as their text ------------------------------------------------------------------------
    def run(self, cmd: list[str], capture_output: bool = True, text: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``squeue``/``scontrol`` as ``slurm_commands`` runs them: their exit code and text as the real ones print
        it. An update of an array some of whose tasks have finished is made and exits 1 all the same, naming the
        finished tasks ("Job has already finished") and the others ("No error")."""
        out, err = "", []
        if cmd[0] == "squeue":
            names = cmd[cmd.index("--name") + 1].split(",")
            out = "".join(f"{'|'.join(row)}\n" for row in self.rows(names, per_task="-r" in cmd))
        elif cmd[1:3] == ["show", "job"]:
            out = f"JobId=9 ArrayTaskThrottle={self.arrays[cmd[3].split('_')[0]].throttle}\n"
        elif cmd[1] == "update" and cmd[3].startswith("ArrayTaskThrottle="):
            arr, n = self.arrays[cmd[2].removeprefix("JobId=")], int(cmd[3].split("=")[1])
            self.command(f"{arr.job_id} throttle {n}", lambda: setattr(arr, "throttle", n))
            err = self.answer(arr, [t for t in arr.tasks if t.state not in ("DONE", "CANCELLED")])
        else:
            expr = cmd[2].removeprefix("JobId=")
            arr, tasks = self.tasks_of(expr)
            pending = [t for t in tasks if t.state == "PENDING"]
            if cmd[1] == "update":
                value = cmd[3].split("=", 1)[1]
                self.command(f"{expr} dependency {value}", lambda: self.set_dependency(arr, pending, value))
            else:
                self.command(f"{expr} {cmd[1]}", lambda: self.set_held(arr, pending, cmd[1] == "hold"))
            err = self.answer(arr, pending)
        if cmd[0] == "scontrol":
            self.check()
            self.maybe_step()
        return subprocess.CompletedProcess(cmd, 1 if err else 0, out, "\n".join(err))

    def answer(self, arr: Array, done: list[Task]) -> list[str]:
        """scontrol's lines for an update that reached the tasks ``done`` of ``arr`` (none when it reached all)."""
        missed = [t for t in arr.tasks if t not in done]
        if not missed:
            return []
        finished = [t.index for t in missed if t.state in ("DONE", "CANCELLED")]
        started = [t.index for t in missed if t.state not in ("DONE", "CANCELLED")]
        return ([f"{arr.job_id}_{_ranges(finished)}: Job has already finished"] if finished else []) + \
            ([f"{arr.job_id}_{_ranges(started)}: Job is no longer pending execution"] if started else []) + \
            ([f"{arr.job_id}_{_ranges([t.index for t in done])}: No error"] if done else [])

    def rows(self, names: list[str], per_task: bool) -> list[tuple[str, ...]]:
        """squeue's rows (``%i|%j|%T|%E|%r``). Without ``-r``, as SLURM folds them: while the array's own pending
        record holds two or more tasks, every pending task (split off or not) is in its one row, which shows the
        first task's dependency, the distinct reasons joined by commas and the throttle only if no task was split."""
        self.maybe_step()
        out = []
        for arr in self.arrays.values():
            if arr.name not in names:
                continue
            out += [(f"{arr.job_id}_{t.index}", arr.name, "RUNNING", "(null)", "None") for t in arr.tasks
                    if t.state in (RUN, ENDING)]
            pending = [t for t in arr.tasks if t.state == "PENDING"]
            shown = [(t, self.dependency(t), self.reason(t)) for t in pending]
            if per_task or sum(not t.split for t in pending) < 2:
                out += [(f"{arr.job_id}_{t.index}", arr.name, "PENDING", dep, why) for t, dep, why in shown]
            elif pending:
                throttle = f"%{arr.throttle}" if arr.throttle and not any(t.split for t in pending) else ""
                reasons = ",".join(dict.fromkeys(why for _, _, why in shown))
                out.append((f"{arr.job_id}_[{_ranges([t.index for t in pending])}{throttle}]", arr.name, "PENDING",
                            shown[0][1], reasons))
        return out

    def dependency(self, t: Task) -> str:
        return ",".join(f"{g}(unfulfilled)" for g in t.deps if not self.fulfilled(g)) or "(null)"

    def reason(self, t: Task) -> str:
        return "JobHeldAdmin" if t.held else "Dependency" if self.dependency(t) != "(null)" else "JobArrayTaskLimit"

    def tasks_of(self, expr: str) -> tuple[Array, list[Task]]:
        """The array and the tasks that ``123``, ``123_4`` or ``123_[4-6,9]`` names."""
        m = re.fullmatch(r"(\d+)(?:_(\d+)|_\[([\d,\-]+)\])?", expr)
        assert m, expr
        arr = self.arrays[m.group(1)]
        wanted = {t.index for t in arr.tasks}
        if m.group(2) is not None:
            wanted = {int(m.group(2))}
        elif m.group(3) is not None:
            wanted = set()
            for part in m.group(3).split(","):
                lo, _, hi = part.partition("-")
                wanted |= set(range(int(lo), int(hi or lo) + 1))
        return arr, [t for t in arr.tasks if t.index in wanted]

    def command(self, what: str, fn: object) -> None:
        self.maybe_step()
        self.log.append(f"throttle: {what}")
        fn()  # type: ignore[operator]

    @staticmethod
    def split(arr: Array, tasks: list[Task]) -> None:
        """A part of the pending rest changed alone becomes a job record of its own."""
        if len(tasks) < sum(t.state == "PENDING" for t in arr.tasks):
            for t in tasks:
                t.split = True

    def set_dependency(self, arr: Array, tasks: list[Task], dep: str) -> None:
        self.split(arr, tasks)
        for t in tasks:
            t.deps = [d for d in dep.split(",") if d]

    def set_held(self, arr: Array, tasks: list[Task], held: bool) -> None:
        self.split(arr, tasks)
        for t in tasks:
            t.held = held


def _ranges(indices: list[int]) -> str:
    """``[2, 3, 4, 7]`` → ``2-4,7``."""
    out: list[str] = []
    for i in sorted(indices):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)


def _patch(monkeypatch: pytest.MonkeyPatch, slurm: Slurm) -> None:
    """``slurm_commands`` runs the model's commands (its own parsing and error handling stay real)."""
    monkeypatch.setattr(slurm_commands, "subprocess", SimpleNamespace(
        run=slurm.run, TimeoutExpired=subprocess.TimeoutExpired, CompletedProcess=subprocess.CompletedProcess))


def _submit(sweep: SweepDir, slurm: Slurm, sizes: list[int]) -> None:
    """What ``SlurmBackend.submit`` does with ``max_parallel``: records, then admit and sbatch under the lock."""
    subs = []
    for j, n in enumerate(sizes):
        keys = [f"k{slurm.next_id}-{j}-{i}" for i in range(n)]
        subs.append(sweep.new_submission("slurm", keys, {k: f"run-{k}" for k in keys}))
    throttle = SweepThrottle(sweep)
    with throttle.locked():
        starts = throttle.admit([(s.id, n) for s, n in zip(subs, sizes)], slurm.m)
        for sub, n, (limit, held) in zip(subs, sizes, starts):
            job_id = str(slurm.next_id)
            slurm.next_id += 1
            slurm.arrays[job_id] = Array(job_id, sub.job_name(), [Task(i, held=held) for i in range(n)], limit)
            sub.record_job(job_id)
            slurm.log.append(f"sbatch {job_id}: {n} tasks %{limit}{' held' if held else ''}")
            slurm.maybe_step()


def _play(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> Slurm:
    rng = random.Random(seed)
    m = rng.choice([1, 2, 3, 4])
    slurm = Slurm(rng, m)
    _patch(monkeypatch, slurm)
    sweep = SweepDir(tmp_path / str(seed), "s")
    _submit(sweep, slurm, [rng.randint(1, 25) for _ in range(rng.randint(1, 3))])
    resumed = False
    for _ in range(20000):
        running = [(a, t) for a in slurm.arrays.values() for t in a.tasks if t.state == RUN]
        choice = rng.random()
        if not resumed and choice < 0.03:  # cancel some pending tasks, then `resume` sends them out again
            pending = [t for a in slurm.arrays.values() for t in a.tasks if t.state == "PENDING"]
            cancel = rng.sample(pending, min(len(pending), rng.randint(1, 4)))
            for t in cancel:
                t.state = "CANCELLED"
            slurm.log.append(f"scancel {len(cancel)} tasks")
            if cancel:
                SweepThrottle(sweep).rebalance()  # resume reconciles (live_jobs) before it submits
                _submit(sweep, slurm, [len(cancel)])
            resumed = True
        elif running and choice < 0.06:  # preempted and requeued: pending again, a job record of its own; it keeps
            arr, t = rng.choice(running)  # its slot (no hand-on), so it may start again as soon as its throttle lets
            t.state, t.split = "PENDING", True
            slurm.log.append(f"requeue {arr.job_id}_{t.index}")
        elif running and choice < 0.5:  # a task's trial ends: it hands its slot on, then leaves RUNNING
            arr, t = rng.choice(running)
            t.state = ENDING
            slurm.log.append(f"task {arr.job_id}_{t.index} ends")
            SweepThrottle(sweep).rebalance(ending=f"{arr.job_id}_{t.index}")
        elif not slurm.step() and not running:
            if all(t.state in ("DONE", "CANCELLED") for a in slurm.arrays.values() for t in a.tasks):
                return slurm
            if all(t.state != ENDING for a in slurm.arrays.values() for t in a.tasks):
                stuck = [f"{a.job_id}_{t.index}" for a in slurm.arrays.values() for t in a.tasks
                         if t.state == "PENDING"]
                SweepThrottle(sweep).rebalance()  # what `resume` would do; nothing else will move them
                if not slurm.eligible() and not any(t.state in (RUN, ENDING) for a in slurm.arrays.values()
                                                    for t in a.tasks):
                    pytest.fail(f"seed {seed}: {stuck} wait forever\n" + "\n".join(slurm.log[-30:]) + "\n" +
                                "\n".join(f"{a.job_id}: throttle {a.throttle}, {a.tasks}" for a in slurm.arrays.values())
                                + f"\n{SweepThrottle(sweep).load()}")
    pytest.fail(f"seed {seed}: not finished after 20000 moves\n" + "\n".join(slurm.log[-30:]))


@pytest.mark.parametrize("block", range(8))
def test_max_parallel_holds_over_random_interleavings_of_a_modelled_scheduler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    worst = []
    for seed in range(block * 100, block * 100 + 100):
        slurm = _play(tmp_path, monkeypatch, seed)
        worst.append(slurm.worst == slurm.m)
    assert sum(worst) > 50  # the limit is what holds the tasks back: most plays fill it
