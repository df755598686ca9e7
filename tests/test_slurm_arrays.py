"""Arrays that fit the cluster and one ``max_parallel`` per sweep, on real SLURM clusters of this machine.

* 3,000 no-op trials on a cluster with ``MaxArraySize=1001``: submitted as three arrays (1,001 + 1,001 + 998);
  ``squeue``, polled throughout, never shows more than ``max_parallel`` (3) running, while tasks of all three
  arrays run side by side; a resume in the middle (after five pending tasks were cancelled) submits exactly those
  trials as a fourth array and adds no running task beyond the limit; no trial runs twice. Scaled: the tasks are
  cancelled after about 35 s (some 40 trials have run by then): an array task of this cluster costs about a
  second of scheduling and Python start-up whatever it does, so 3,000 of them, 3 at a time, would take some 25
  minutes.
* Run to the end, through the command line (``submit``, a ``resume`` in the middle): 60 no-op trials on a cluster
  with ``MaxArraySize=21`` (three arrays: the same split, at a size that finishes in about a minute); every trial
  runs exactly once, the resumed ones in the fourth array (which gets its slots as the others drain), never more
  than 3 at once.

Each cluster is its own (``slurm/testcluster/start.sh`` with ``TESTCLUSTER_MAX_ARRAY_SIZE`` and
``TESTCLUSTER_CPUS=8``, so the node could run more than ``max_parallel`` tasks): under ``SLURM_TEST_STATE-mas<N>``
(reused, left running) when ``SLURM_TEST_STATE`` is set, else under pytest's temporary folder (stopped at the end).
Its ports are chosen free at random by ``start.sh``, so it runs beside the session's cluster.

Without a cluster: the shares, the rows ``squeue`` shows for arrays, and the order of the moves (lower before raise; a
slot handed on by an ending task waits for that task) against fake ``squeue``/``scontrol`` commands.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from asr_core.contract.trial import EXIT_OK
from orchestrate.backends.base import Job
from orchestrate.plan.profile import Profile
from orchestrate.backends.slurm import SlurmBackend, TrialTask
from orchestrate.sweep.folder import SweepDir
from tests.plugins.slurm_cluster import SlurmCluster, own_cluster

REPO = Path(__file__).resolve().parents[1]
MAX_PARALLEL = 3
SLEEP_S = 1.0  # what a no-op trial does


class NoopTask(TrialTask):
    """A trial that sleeps: it notes its job id in ``ran`` (one line per run) and leaves ``DONE``."""

    def run(self, sweep: SweepDir, index: int, job_id: str) -> int:
        key = sweep.submission(self.sub_id).keys[index]
        folder = sweep.trial_dir(key)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "ran", "a") as f:
            f.write(f"{job_id}\n")
        time.sleep(SLEEP_S)
        (folder / "DONE").write_text("finished\n")
        return EXIT_OK


class NoopBackend(SlurmBackend):
    task_class = NoopTask


def _cluster(tmp_path_factory: pytest.TempPathFactory, max_array_size: int) -> Iterator[SlurmCluster]:
    """A cluster of its own with ``MaxArraySize=max_array_size`` and 8 CPUs (see the module docstring)."""
    yield from own_cluster(tmp_path_factory, f"mas{max_array_size}",
                           {"TESTCLUSTER_MAX_ARRAY_SIZE": str(max_array_size), "TESTCLUSTER_CPUS": "8"},
                           f"the test cluster with MaxArraySize={max_array_size}")


@pytest.fixture(scope="module")
def cluster_1001(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from _cluster(tmp_path_factory, 1001)


@pytest.fixture(scope="module")
def cluster_21(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from _cluster(tmp_path_factory, 21)


@pytest.fixture
def on_cluster(monkeypatch: pytest.MonkeyPatch) -> object:
    """Point this test's SLURM commands (and its jobs, which inherit the environment) at ``cluster``; the jobs
    import this module to unpickle their task."""

    def use(cluster: SlurmCluster) -> None:
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        cluster.cancel_all()

    return use


class Poller:
    """``squeue`` every 0.2 s in a thread: the most tasks RUNNING at once, and which arrays ran together."""

    def __init__(self, cluster: SlurmCluster) -> None:
        self.cluster = cluster
        self.most = 0
        self.polls = 0
        self.together: set[frozenset[str]] = set()  # sets of arrays seen running at the same time
        self.over: list[list[str]] = []  # every poll that saw more than MAX_PARALLEL running
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "Poller":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            out = self.cluster.run("squeue", "-h", "-r", "-t", "RUNNING", "-o", "%i", check=False).stdout.split()
            self.polls += 1
            self.most = max(self.most, len(out))
            if len(out) > MAX_PARALLEL:
                self.over.append(out)
            self.together.add(frozenset(j.split("_")[0] for j in out))
            time.sleep(0.2)


def runs_of(sweep: SweepDir, keys: list[str]) -> dict[str, list[str]]:
    """{trial key: the job ids that ran it}, for the trials that ran."""
    out = {}
    for k in keys:
        p = sweep.trial_dir(k) / "ran"
        if p.exists():
            out[k] = p.read_text().split()
    return out


def moves(sweep: SweepDir) -> str:
    """What the sweep's tasks did to the throttles (and what failed), from their logs, oldest log first."""
    logs = sorted((sweep.path / "slurm").glob("*/*_log.*"), key=lambda p: p.stat().st_mtime)
    return "\n".join(f"{p.name}: {line}" for p in logs for line in p.read_text(errors="replace").splitlines()
                     if line.startswith("[orchestrate] sweep"))


def pending_tasks(cluster: SlurmCluster, array: str) -> list[str]:
    out = cluster.run("squeue", "-h", "-r", "-t", "PENDING", "-j", array, "-o", "%i").stdout.split()
    return sorted(out, key=lambda j: int(j.split("_")[1]))


def wait_gone(cluster: SlurmCluster, job_ids: list[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(cluster.squeue_state(j) for j in job_ids):
            return
        time.sleep(0.2)
    raise TimeoutError(f"jobs {job_ids} still queued after {timeout:.0f}s")


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_3000_trials_go_out_as_three_arrays_under_one_max_parallel(cluster_1001: SlurmCluster, on_cluster: object,
                                                                   tmp_path: Path) -> None:
    from orchestrate.tools.fake_sweep import fake_trials

    on_cluster(cluster_1001)  # type: ignore[operator]
    sweep = SweepDir(tmp_path / "runs", "arrays3000")
    trials = fake_trials(3000)
    assert len({t.key for t in trials}) == 3000
    profile = Profile(name="arrays", partition="gpu", cpus_per_task=1, time_limit="00:10:00",
                      max_parallel=MAX_PARALLEL)
    backend = NoopBackend(sweep, "sqlite:///unused.db", profile)
    backend.validate()

    def jobs(keys: list[str]) -> list[Job]:
        by_key = {t.key: t for t in trials}
        return [Job(by_key[k], f"run-{k}", sweep.trial_dir(k)) for k in keys]

    with Poller(cluster_1001) as poll:
        t0 = time.monotonic()
        backend.submit(jobs([t.key for t in trials]), lambda ids: None)
        submit_s = time.monotonic() - t0
        subs = sweep.submissions()
        # indices 0..1000 are below MaxArraySize=1001: three arrays, the first two full
        assert [len(s.keys) for s in sorted(subs, key=lambda s: s.data["created"])] == [1001, 1001, 998]
        arrays = [s.job_id for s in sorted(subs, key=lambda s: s.data["created"])]
        assert len(set(arrays)) == 3 and all(arrays)
        time.sleep(15)

        # A resume in the middle: five pending trials of the last array were cancelled, so they go out again (in a
        # fourth array), and everything else is live or done.
        cancelled = pending_tasks(cluster_1001, str(arrays[2]))[-5:]
        assert len(cancelled) == 5
        cluster_1001.run("scancel", *cancelled)
        wait_gone(cluster_1001, cancelled)
        live = backend.live_jobs(settle_s=30)
        todo = [t.key for t in trials if t.key not in live and not (sweep.trial_dir(t.key) / "DONE").exists()]
        last = sorted(subs, key=lambda s: s.data["created"])[2]
        assert sorted(todo) == sorted(last.keys[int(j.split("_")[1])] for j in cancelled)
        backend.submit(jobs(todo), lambda ids: None)
        assert len(sweep.submissions()) == 4
        time.sleep(20)
        cluster_1001.cancel_all()
        wait_gone(cluster_1001, [str(a) for a in arrays])

    ran = runs_of(sweep, [t.key for t in trials])
    print(f"submit of 3000 trials: {submit_s:.1f}s; {poll.polls} polls of squeue, at most {poll.most} running; "
          f"{len(ran)} trials ran; arrays running together: {sorted(len(s) for s in poll.together)[-1]}")
    assert not poll.over, f"more than {MAX_PARALLEL} running: {poll.over[:3]}"
    assert poll.most == MAX_PARALLEL  # the limit is what holds the tasks back, not the node
    assert any(len(s) == 3 for s in poll.together), "the three arrays never ran side by side"
    assert len(ran) >= 20
    twice = {k: j for k, j in ran.items() if len(j) > 1}
    assert not twice, f"trials that ran twice: {twice}"


GRID60 = """
name: arrays60
seeds: [{seeds}]
base:
  preset: tiny
  data: {{context_s: 5.12}}
subgrids:
  only: {{}}
"""


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_every_trial_runs_once_across_arrays_and_a_resume(cluster_21: SlurmCluster, on_cluster: object,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrate.cli.commands import main

    on_cluster(cluster_21)  # type: ignore[operator]
    monkeypatch.setattr(SlurmBackend, "task_class", NoopTask)
    grid = tmp_path / "grid60.yaml"
    grid.write_text(GRID60.format(seeds=", ".join(str(i) for i in range(60))))
    profile = tmp_path / "profile.yaml"
    profile.write_text(f"partition: gpu\ncpus_per_task: 1\ntime_limit: '00:10:00'\nmax_parallel: {MAX_PARALLEL}\n")
    root, name = tmp_path / "runs", "arrays60"
    sweep = SweepDir(root, name)
    with Poller(cluster_21) as poll:
        assert main(["submit", str(grid), "--backend", "slurm", "--profile", str(profile), "--sweep-root", str(root),
                     "--sweep", name, "--allow-sqlite", "--no-check-data"]) == 0
        subs = sorted(sweep.submissions(), key=lambda s: s.data["created"])
        assert [len(s.keys) for s in subs] == [21, 21, 18]
        keys = [k for s in subs for k in s.keys]
        time.sleep(8)
        # cancel four trials that wait in the second and third arrays; `resume` sends them out again
        cancelled = [j for s in subs[1:] for j in pending_tasks(cluster_21, str(s.job_id))[-2:]]
        assert len(cancelled) == 4
        by_job = {f"{s.job_id}_{i}": k for s in subs for i, k in enumerate(s.keys)}
        resubmitted = sorted(by_job[j] for j in cancelled)
        cluster_21.run("scancel", *cancelled)
        wait_gone(cluster_21, cancelled)
        assert main(["resume", name, "--sweep-root", str(root)]) == 0
        subs = sorted(sweep.submissions(), key=lambda s: s.data["created"])
        assert len(subs) == 4 and sorted(subs[3].keys) == resubmitted
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not all((sweep.trial_dir(k) / "DONE").exists() for k in keys):
            time.sleep(1)
        wait_gone(cluster_21, [str(s.job_id) for s in subs], timeout=30)

    ran = runs_of(sweep, keys)
    print(f"{poll.polls} polls of squeue, at most {poll.most} running; {len(ran)} of {len(keys)} trials ran")
    assert not poll.over, f"more than {MAX_PARALLEL} running: {poll.over[:3]}; the tasks' moves:\n{moves(sweep)}"
    assert poll.most == MAX_PARALLEL
    assert sorted(ran) == sorted(keys), f"never ran: {sorted(set(keys) - set(ran))}"
    assert Counter(len(j) for j in ran.values()) == Counter({1: len(keys)}), {k: j for k, j in ran.items()
                                                                             if len(j) != 1}
    fourth = str(subs[3].job_id)
    assert all(ran[k][0].split("_")[0] == fourth for k in resubmitted)


# ---- without a cluster ---------------------------------------------------------------------------------------------
def test_fair_shares_and_array_rows() -> None:
    from orchestrate.backends.slurm_throttle import ArrayState, fair_shares
    from orchestrate.backends.slurm_commands import ArrayRow

    assert fair_shares([1000, 1000, 1000, 5], 3) == [1, 1, 1, 0]  # older arrays first when slots are fewer
    assert fair_shares([1000, 2], 8) == [6, 2]
    assert fair_shares([0, 5, 1], 4) == [0, 3, 1]
    assert fair_shares([2, 2], 0) == [0, 0] and fair_shares([], 3) == []

    rest = ArrayRow("12_[5-9,20,30-34:2%3]", "orch.s.a", "PENDING", "afterany:7_1(unfulfilled)", "Dependency")
    assert (rest.tasks(), rest.throttle(), rest.expression(), rest.gates()) == (9, 3, "12_[5-9,20,30-34:2]",
                                                                               ["afterany:7_1"])
    requeued = ArrayRow("12_4", "orch.s.a", "PENDING", "(null)", "JobHeldAdmin")
    assert (requeued.tasks(), requeued.throttle(), requeued.held, requeued.gates()) == (1, None, True, [])
    a = ArrayState("a", ["12_0", "12_1"], [rest], 3, lone=False, held_by_us=False)
    assert (a.demand(), a.own(), a.own("12_0")) == (11, 3, 3)
    held = ArrayState("b", [], [ArrayRow("13_[0-4%1]", "orch.s.b", "PENDING", "(null)", "JobHeldAdmin")], 1,
                      lone=False, held_by_us=True)
    assert (held.demand(), held.own()) == (5, 0)  # held by the throttle: starts nothing
    held.held_by_us = False
    assert held.own() == 1  # held by its user, who may release it: it counts with its throttle
    draining = ArrayState("c", ["14_7"], [], 2, lone=False, held_by_us=False)
    assert (draining.own(), draining.own("14_7")) == (1, 0)  # no more tasks than it has


def test_pending_tasks_are_read_one_a_row_and_grouped_by_how_they_wait(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``squeue`` without ``-r`` folds an array's pending tasks into one row that shows one task's dependency, every
    reason joined (``JobHeldAdmin,Dependency,None``) and no throttle, as SLURM 23 prints after a part of the array was
    updated; rows are read one task a row and grouped by dependency and hold."""
    from orchestrate.backends import slurm_commands

    bins = tmp_path / "bin"
    bins.mkdir()
    (bins / "squeue").write_text("""#!/bin/bash
case " $* " in
  *" -r "*) printf '%s\\n' '32_7|a|PENDING|afterany:31(unfulfilled)|None' \\
      '32_5|a|PENDING|afterany:31(unfulfilled)|Dependency' '32_3|a|PENDING|afterany:31(unfulfilled)|Dependency' \\
      '32_2|a|PENDING|(null)|JobHeldAdmin' '32_6|a|PENDING|(null)|JobHeldAdmin' '32_0|a|RUNNING|(null)|None' \\
      '40|b|PENDING|(null)|Priority' ;;
  *) echo '32_[2-7]|a|PENDING|(null)|JobHeldAdmin,Dependency,None'; echo '32_0|a|RUNNING|(null)|None' ;;
esac
""")
    (bins / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bins}:{os.environ['PATH']}")
    rows = {r.job_id: r for r in slurm_commands.array_rows(["a", "b"])}
    assert sorted(rows) == ["32_0", "32_[2,6]", "32_[3,5,7]", "40"]
    assert rows["32_[2,6]"].held and rows["32_[2,6]"].tasks() == 2 and rows["32_[2,6]"].gates() == []
    assert not rows["32_[3,5,7]"].held and rows["32_[3,5,7]"].gates() == ["afterany:31"]
    assert rows["32_[3,5,7]"].expression() == "32_[3,5,7]" and rows["40"].lone
    assert slurm_commands.index_ranges([7, 2, 3, 4, 9, 10]) == "2-4,7,9-10"


@pytest.mark.parametrize("answer,made", [
    ("1_0-17: Job has already finished\n1_18-20: No error", True),  # SLURM 23, an array with finished tasks
    ("1_0-20: Job has already finished", True),
    ("1_19: Job is no longer pending execution\n1_20: No error", False),
    ("slurm_update error: Invalid job id specified", False)])
def test_an_update_that_exits_1_is_made_when_it_says_so_for_every_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        answer: str, made: bool) -> None:
    """``scontrol update`` of an array some of whose tasks have finished changes the rest and exits 1: a throttle
    taken for unchanged then leaves the recorded shares wrong (more than max_parallel ran). Any other line fails."""
    from orchestrate.backends import slurm_commands
    from orchestrate.backends.base import BackendError

    bins = tmp_path / "bin"
    bins.mkdir()
    (bins / "scontrol").write_text(f"#!/bin/bash\nprintf '%s\\n' {' '.join(repr(x) for x in answer.splitlines())} >&2\n"
                                   "exit 1\n")
    (bins / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bins}:{os.environ['PATH']}")
    for move in (lambda: slurm_commands.set_throttle("1", 2), lambda: slurm_commands.hold("1_[19-20]"),
                 lambda: slurm_commands.set_dependency("1_[19-20]", "afterany:2_3")):
        if made:
            move()
        else:
            with pytest.raises(BackendError, match="failed \\(1\\)"):
                move()


def _fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: str) -> Path:
    """squeue prints ``rows``; scontrol logs its arguments (one call a line) and answers MaxArraySize."""
    bins, calls = tmp_path / "bin", tmp_path / "calls"
    bins.mkdir()
    (tmp_path / "rows").write_text(rows)
    (bins / "squeue").write_text(f"#!/bin/bash\ncat {tmp_path / 'rows'}\n")
    (bins / "scontrol").write_text(f"""#!/bin/bash
[ "$1 $2" = "show config" ] && {{ echo "MaxArraySize            = 21"; exit 0; }}
echo "$*" >> {calls}
""")
    for f in bins.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bins}:{os.environ['PATH']}")
    return calls


def _subs(sweep: SweepDir, n: int) -> list[str]:
    ids = []
    for i in range(n):
        sub = sweep.new_submission("slurm", [f"k{i}"], {f"k{i}": f"r{i}"})
        sub.data["created"] = 1000.0 + i
        sub.record_job(str(100 * (i + 1)))
        ids.append(sub.id)
    return ids


def test_an_ending_task_hands_its_slot_to_a_held_array_that_waits_for_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """max_parallel 2: array 100 runs its last task (ending), 200 runs one of ten, 300 is held by the throttle. The
    ending task's slot goes to 300, which waits for the ending task before it may start: gate, throttle, release."""
    from orchestrate.backends.slurm_throttle import SweepThrottle

    sweep = SweepDir(tmp_path, "s")
    a, b, c = _subs(sweep, 3)
    calls = _fake_slurm(tmp_path, monkeypatch, f"""100_0|orch.s.{a}|RUNNING|(null)|None
200_[1-9%1]|orch.s.{b}|PENDING|(null)|JobArrayTaskLimit
200_0|orch.s.{b}|RUNNING|(null)|None
300_[0-4%1]|orch.s.{c}|PENDING|(null)|JobHeldAdmin
""")
    throttle = SweepThrottle(sweep)
    throttle.save({"max_parallel": 2, "throttle": {a: 1, b: 1, c: 1}, "held": [c]})
    throttle.rebalance(ending="100_0")
    assert calls.read_text().splitlines() == ["update JobId=300_[0-4] Dependency=afterany:100_0",
                                              "release 300_[0-4]"]  # its throttle is 1 already
    assert throttle.load()["held"] == []
    calls.unlink()
    throttle.rebalance()  # nothing ends and nothing is free: no move
    assert not calls.exists()


def test_a_slot_handed_on_is_not_taken_back_while_its_task_is_still_ending(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """max_parallel 3: 300's last task (300_15) has handed its slot to 400, which waits for it; before 300_15 has
    left RUNNING, 100_15 ends. 300_15 counts as gone: 400 keeps its share (it is not held again), nothing moves."""
    from orchestrate.backends.slurm_throttle import SweepThrottle

    sweep = SweepDir(tmp_path, "s")
    a, b, c, d = _subs(sweep, 4)
    calls = _fake_slurm(tmp_path, monkeypatch, f"""100_15|orch.s.{a}|RUNNING|(null)|None
100_[16-20%1]|orch.s.{a}|PENDING|(null)|JobArrayTaskLimit
200_16|orch.s.{b}|RUNNING|(null)|None
200_[17-20%1]|orch.s.{b}|PENDING|(null)|JobArrayTaskLimit
300_15|orch.s.{c}|RUNNING|(null)|None
400_[0-3%1]|orch.s.{d}|PENDING|afterany:300_15(unfulfilled)|Dependency
""")
    throttle = SweepThrottle(sweep)
    throttle.save({"max_parallel": 3, "throttle": {a: 1, b: 1, c: 1, d: 1}, "held": []})
    throttle.rebalance(ending="100_15")
    assert not calls.exists(), calls.read_text()


def test_a_resume_lowers_old_arrays_first_and_starts_new_ones_held_when_no_slot_is_free(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """max_parallel 3, all three slots taken by array 100 (18 more pending): a new array of 5 gets a fair share of 1,
    so 100 goes down to 2 at once (its three tasks go on), and the new array starts held: nothing is free yet."""
    from orchestrate.backends.slurm_throttle import SweepThrottle

    sweep = SweepDir(tmp_path, "s")
    (a,) = _subs(sweep, 1)
    calls = _fake_slurm(tmp_path, monkeypatch, "".join(f"100_{i}|orch.s.{a}|RUNNING|(null)|None\n" for i in range(3))
                        + f"100_[3-20%3]|orch.s.{a}|PENDING|(null)|JobArrayTaskLimit\n")
    throttle = SweepThrottle(sweep)
    throttle.save({"max_parallel": 3, "throttle": {a: 3}, "held": []})  # as the submission of 100 recorded it
    with throttle.locked():
        assert throttle.admit([("new", 5)], 3) == [(1, True)]
    assert calls.read_text().splitlines() == ["update JobId=100 ArrayTaskThrottle=2"]
    assert throttle.load() == {"max_parallel": 3, "throttle": {a: 2, "new": 1}, "held": ["new"]}


def test_a_held_profile_stays_held_and_no_limit_lifts_the_throttles(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile that submits held (``additional: {hold: true}``, as the benchmark's) is never released by the
    throttle; a later profile without ``max_parallel`` lifts the throttles and releases what the throttle held."""
    from orchestrate.backends.slurm_throttle import SweepThrottle

    sweep = SweepDir(tmp_path, "s")
    a, b = _subs(sweep, 2)
    running = "".join(f"200_{i}|orch.s.{b}|RUNNING|(null)|None\n" for i in range(3))
    calls = _fake_slurm(tmp_path, monkeypatch, running + f"200_[3-9%3]|orch.s.{b}|PENDING|(null)|None\n")
    throttle = SweepThrottle(sweep)
    throttle.save({"max_parallel": 3, "throttle": {b: 3}, "held": []})
    with throttle.locked():
        assert throttle.admit([("new", 4)], 3, user_hold=True) == [(1, False)]  # held by its profile, not by us
    assert calls.read_text().splitlines() == ["update JobId=200 ArrayTaskThrottle=2"]
    assert throttle.load()["held"] == []

    calls.unlink()
    (tmp_path / "rows").write_text(f"""100_[0-4%1]|orch.s.{a}|PENDING|(null)|JobHeldAdmin
200_0|orch.s.{b}|RUNNING|(null)|None
200_[1-9%2]|orch.s.{b}|PENDING|(null)|JobArrayTaskLimit
""")
    throttle.save({"max_parallel": 3, "throttle": {a: 1, b: 2}, "held": [a]})
    throttle.lift()
    assert calls.read_text().splitlines() == ["update JobId=100 ArrayTaskThrottle=0", "release 100_[0-4]",
                                              "update JobId=200 ArrayTaskThrottle=0"]
    assert throttle.load() == {"max_parallel": 0, "throttle": {}, "held": []}


def test_max_array_size_is_read_once_and_a_failure_says_what_it_is_for(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrate.backends import slurm_commands
    from orchestrate.backends.base import BackendError

    monkeypatch.setattr(slurm_commands, "_MAX_ARRAY_SIZE", {})
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "a.conf"))
    calls = _fake_slurm(tmp_path, monkeypatch, "")
    assert slurm_commands.max_array_size() == 21
    (tmp_path / "bin" / "scontrol").write_text("#!/bin/bash\necho 'slurm_load_ctl_conf error: Unable to contact "
                                               "slurm controller' >&2; exit 1\n")
    assert slurm_commands.max_array_size() == 21  # cached for this cluster
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "b.conf"))
    with pytest.raises(BackendError, match="cannot read the cluster's MaxArraySize.*Unable to contact"):
        slurm_commands.max_array_size()
    assert not calls.exists()
