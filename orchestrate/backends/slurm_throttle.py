"""The ``slurm`` backend's one ``max_parallel`` for a whole sweep (:class:`SweepThrottle`), across its arrays and
across ``resume`` calls.

Each array's ``ArrayTaskThrottle`` is its share, and the shares never add up to more than ``max_parallel``. The shares
are fair (each array with work gets one slot in turn, older arrays first); an array whose share is 0 is held. They
move only under a lock (``<sweep>/slurm/throttle.lock``) and always lower before they raise, checking ``squeue``
in between, so no state ever lets more than ``max_parallel`` tasks run: a submission (``resume`` included) gives new
arrays only the slots nobody holds, and each array task that ends for good hands its slot on as it ends
(:func:`hand_on_slot`, to an array below its share: that array's pending tasks wait on
``--dependency=afterany:<ending task>``, so it starts nothing before the ending task has left RUNNING). A task that
requeues itself keeps its slot; a pending, held, suspended or requeued task is never cancelled or lost, only held
back. ``resume`` (any reconciliation) rebalances too, so an array a crashed submitter left held gets its slots.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Collection, Iterator

from orchestrate.backends import slurm_commands
from orchestrate.backends.base import BackendError
from orchestrate.backends.slurm_commands import ArrayRow
from orchestrate.sweep.folder import SweepDir

BACKEND = "slurm"  # the backend whose submissions are the sweep's arrays (``SlurmBackend.name``)

# squeue states of a task that holds a slot (SLURM's throttle counts it) and of one that waits for one
RUNNING_STATES = ("RUNNING", "CONFIGURING", "SUSPENDED", "STOPPED")
PENDING_STATES = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "RESV_DEL_HOLD")
LOCK_WAIT_S = 300.0  # how long a rebalance waits for another (a submission of many arrays holds the lock seconds)


def fair_shares(demands: list[int], slots: int) -> list[int]:
    """``slots`` shared among arrays that want ``demands`` (oldest first): one slot to each array that still wants
    one, in turn, older arrays first, until the slots or the demands run out (max-min fair)."""
    out = [0] * len(demands)
    left = max(0, slots)
    while left > 0:
        gave = False
        for i, d in enumerate(demands):
            if left > 0 and out[i] < d:
                out[i] += 1
                left -= 1
                gave = True
        if not gave:
            break
    return out


@dataclass
class ArrayState:
    """One of the sweep's arrays (or lone jobs) as ``squeue`` shows it now."""

    sub_id: str
    running: list[str]  # job ids of its tasks that hold a slot
    pending: list[ArrayRow]  # its rows that wait (the array's pending rest, requeued tasks)
    throttle: int  # its ArrayTaskThrottle; 0: none (anything pending may start)
    lone: bool  # a submission of one trial: a plain job, no throttle (it needs one slot)
    held_by_us: bool  # the throttle holds its pending rows (its share is 0)

    @property
    def array_id(self) -> str:
        return (self.pending[0].array_id if self.pending else self.running[0].split("_", 1)[0])

    def n_pending(self) -> int:
        return sum(r.tasks() for r in self.pending)

    def n_running(self, gone: Collection[str] = ()) -> int:
        return sum(1 for j in self.running if j not in gone)

    def demand(self, gone: Collection[str] = ()) -> int:
        """Slots it could fill: its running tasks (less those ``gone``: ending, their slot handed on) and its pending
        ones."""
        return self.n_running(gone) + self.n_pending()

    def own(self, gone: Collection[str] = ()) -> int:
        """Slots it holds or may fill without asking anyone (the tasks ``gone`` gone): its running tasks, and as many
        more as its throttle lets start, never more than it has tasks (a requeued task was one of the running ones).
        Rows held by the throttle start nothing; rows held by their user count (the user may release them)."""
        r = self.n_running(gone)
        startable = sum(row.tasks() for row in self.pending if not (self.held_by_us and row.held))
        if self.lone:
            return min(1, r + startable)
        if self.throttle <= 0:
            return r + startable
        return min(max(self.throttle, r), r + startable)


def handed_on(arrays: list[ArrayState]) -> set[str]:
    """Running tasks whose slot another array already waits for (``afterany:<task>``): they are ending, and count
    no longer as their own array's work (else the next rebalance would give their slot back to it)."""
    running = {j for a in arrays for j in a.running}
    waited = {j for a in arrays for r in a.pending for g in r.gates() if g.startswith("afterany:")
              for j in g.split(":")[1:]}
    return waited & running


class SweepThrottle:
    """One ``max_parallel`` for all of a sweep's arrays (see the module docstring). State, under
    ``<sweep>/slurm/``: ``throttle.json`` (the sweep's ``max_parallel``, the throttle last set on each array, the
    arrays it holds) and ``throttle.lock``; SLURM's own ``squeue`` is the truth for what runs and waits."""

    def __init__(self, sweep: SweepDir) -> None:
        self.sweep = sweep
        self.dir = sweep.path / "slurm"
        self.state_path = self.dir / "throttle.json"
        self.moves: list[str] = []  # what this process changed, for the log

    # ---- state -----------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
        """The sweep's throttle lock (``flock``; compute nodes take it too), waited for up to ``wait_s``."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / "throttle.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise BackendError(f"sweep {self.sweep.name}: its throttle lock "
                                           f"({self.dir / 'throttle.lock'}) stayed busy for {wait_s:.0f}s") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    def load(self) -> dict[str, Any]:
        try:
            d = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            d = {}
        return {"max_parallel": int(d.get("max_parallel", 0)), "throttle": dict(d.get("throttle", {})),
                "held": list(d.get("held", []))}

    def save(self, state: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, self.state_path)

    def arrays(self, state: dict[str, Any]) -> list[ArrayState]:
        """The sweep's arrays that SLURM still holds, oldest first."""
        subs = [s for s in self.sweep.submissions() if s.data.get("backend") == BACKEND]
        subs.sort(key=lambda s: (float(s.data.get("created", 0.0)), s.id))
        rows_by_name: dict[str, list[ArrayRow]] = {}
        for row in slurm_commands.array_rows([s.job_name() for s in subs]):
            rows_by_name.setdefault(row.name, []).append(row)
        out = []
        for sub in subs:
            rows = rows_by_name.get(sub.job_name(), [])
            running = [r.job_id for r in rows if r.state in RUNNING_STATES]
            pending = [r for r in rows if r.state in PENDING_STATES]
            if not running and not pending:
                continue
            lone = all(r.lone for r in rows)
            if lone:
                throttle = 1
            elif sub.id in state["throttle"]:  # set by the sweep's throttle alone, and recorded each time
                throttle = int(state["throttle"][sub.id])
            else:  # an array submitted without max_parallel: ask one of its tasks
                throttle = slurm_commands.array_throttle((running or [r.job_id for r in pending])[0])
            out.append(ArrayState(sub.id, running, pending, throttle, lone, sub.id in state["held"]))
        return out

    # ---- moves -------------------------------------------------------------------------------------------------------
    def _try(self, what: str, fn: Any, *args: Any) -> bool:
        """Run one SLURM move; note it (:meth:`_report`) or print why it failed. A failed move is never raised: the
        state is read again before anything is raised, so a move that did not happen only leaves a slot unused."""
        try:
            fn(*args)
        except BackendError as e:
            print(f"[orchestrate] sweep {self.sweep.name}: {what} failed: {e}", file=sys.stderr, flush=True)
            return False
        self.moves.append(what)
        return True

    def _report(self, m: int) -> None:
        if self.moves:
            print(f"[orchestrate] sweep {self.sweep.name} (max_parallel {m}): {'; '.join(self.moves)}",
                  file=sys.stderr, flush=True)
        self.moves = []

    def _lower(self, arrays: list[ArrayState], targets: dict[str, int], state: dict[str, Any]) -> None:
        """Every array down to its share: throttle lowered (running tasks above it go on), share 0 → held."""
        for a in arrays:
            share = targets.get(a.sub_id, 0)
            if not a.lone:
                want = max(1, share)
                if (a.throttle <= 0 or a.throttle > want) and self._try(
                        f"array {a.array_id} throttle {a.throttle or 'none'} -> {want}", slurm_commands.set_throttle,
                        a.array_id, want):
                    state["throttle"][a.sub_id] = want
            if share > 0 or not a.pending:
                continue
            if not a.held_by_us and all(r.held for r in a.pending):
                continue  # held by its user: theirs to release (it counts with its throttle meanwhile)
            if a.sub_id not in state["held"]:
                state["held"].append(a.sub_id)
                self.save(state)  # recorded before the hold: a later rebalance releases it even if this one dies
            for r in a.pending:
                if not r.held:
                    self._try(f"{r.expression()} held", slurm_commands.hold, r.expression())

    def _raise(self, arrays: list[ArrayState], targets: dict[str, int], state: dict[str, Any], free: int,
               ending: str | None = None, gated: int = 0, gone: Collection[str] = ()) -> int:
        """Arrays below their share get ``free`` slots (nobody holds them), then the ``gated`` slots of task
        ``ending`` (its array no longer counts it): an array given one of those waits on ``afterany:<ending>``.
        ``gone``: running tasks not to count as their arrays' (``ending``, and those whose slot was handed on).
        Returns the free slots left."""
        for a in arrays:
            share = targets.get(a.sub_id, 0)
            have = a.own(gone)
            need = share - have
            if need <= 0 or a.n_pending() == 0:
                continue
            allot = min(need, free + gated)
            if allot <= 0:
                break
            if allot > free:  # part of it is the ending task's slot: start nothing before that task has ended
                if not all(self._try(f"{r.expression()} waits for {ending} to end", slurm_commands.set_dependency,
                                     r.expression(), ",".join(sorted({*r.gates(), f"afterany:{ending}"})))
                           for r in a.pending):
                    continue
            to = have + allot
            if not a.lone and to != a.throttle:
                if not self._try(f"array {a.array_id} throttle {a.throttle} -> {to}", slurm_commands.set_throttle,
                                 a.array_id, to):
                    continue
                state["throttle"][a.sub_id] = to
            if a.held_by_us:
                for r in a.pending:
                    if r.held:
                        self._try(f"{r.expression()} released", slurm_commands.release, r.expression())
                state["held"] = [h for h in state["held"] if h != a.sub_id]
            used_free = min(allot, free)
            free -= used_free
            gated -= allot - used_free
        return free

    def rebalance(self, ending: str | None = None) -> None:
        """Shares again for the sweep's arrays, as they are now (``ending``: the job id of a task that is ending for
        good; its slot goes to an array below its share, which starts nothing before that task has ended)."""
        with self.locked():
            state = self.load()
            m = state["max_parallel"]
            if m <= 0:
                if state["held"] or state["throttle"]:
                    self._unlimit(state)
                return
            arrays = self.arrays(state)
            live = {a.sub_id for a in arrays}
            state["held"] = [h for h in state["held"] if h in live]
            if not arrays:
                self.save(state)
                return
            gone = handed_on(arrays) | ({ending} if ending else set())
            targets = dict(zip([a.sub_id for a in arrays], fair_shares([a.demand(gone) for a in arrays], m)))
            self._lower(arrays, targets, state)
            arrays = self.arrays(state)  # after lowering: what may start now is known, and only shrinks
            free = m - sum(a.own() for a in arrays)
            gated = 0
            if ending is not None:
                mine = [a for a in arrays if ending in a.running]
                gated = mine[0].own() - mine[0].own({ending}) if mine else 0
            self._raise(arrays, targets, state, max(0, free), ending, gated, handed_on(arrays) | gone)
            self.save(state)
            self._report(m)

    def lift(self) -> None:
        """No ``max_parallel`` for the sweep from now on (a profile without one): throttles off, held arrays
        released."""
        with self.locked():
            state = self.load()
            if state["max_parallel"] > 0 or state["held"] or state["throttle"]:
                state["max_parallel"] = 0
                self._unlimit(state)

    def _unlimit(self, state: dict[str, Any]) -> None:
        """``max_parallel`` 0 (no limit): throttles off, the arrays the throttle held released."""
        for a in self.arrays(state):
            if not a.lone and a.throttle != 0:
                self._try(f"array {a.array_id} throttle {a.throttle} -> none", slurm_commands.set_throttle,
                          a.array_id, 0)
            if a.held_by_us:
                for r in a.pending:
                    if r.held:
                        self._try(f"{r.expression()} released", slurm_commands.release, r.expression())
        state["held"], state["throttle"] = [], {}
        self.save(state)
        self._report(0)

    def admit(self, new: list[tuple[str, int]], max_parallel: int, user_hold: bool = False) -> list[tuple[int, bool]]:
        """Make room for new arrays (``(submission id, trials)``, in submission order) and say how each starts:
        (throttle, held). Call it holding :meth:`locked`, and submit before letting go. Old arrays go down to their
        fair share at once (their running tasks go on: the slots come free as they end, and each hands its slot to
        an array below its share); the new ones start with the slots nobody holds, held when there are none.
        ``user_hold``: the profile submits them held (``additional: {hold: true}``): never released here, and each
        counts with its throttle (at least 1) until its user releases it."""
        state = self.load()
        state["max_parallel"] = max_parallel
        arrays = self.arrays(state)
        state["held"] = [h for h in state["held"] if h in {a.sub_id for a in arrays}]
        gone = handed_on(arrays)
        shares = fair_shares([a.demand(gone) for a in arrays] + [n for _, n in new], max_parallel)
        old, new_shares = dict(zip([a.sub_id for a in arrays], shares)), shares[len(arrays):]
        self._lower(arrays, old, state)
        arrays = self.arrays(state)
        free = self._raise(arrays, old, state, max(0, max_parallel - sum(a.own() for a in arrays)),
                           gone=handed_on(arrays))
        out = []
        for (sub_id, _), share in zip(new, new_shares):
            allot = min(share, free)
            free -= allot
            throttle = allot if allot > 0 else max(1, share)
            state["throttle"][sub_id] = throttle
            held = allot == 0 and not user_hold
            if held:
                state["held"].append(sub_id)
            out.append((throttle, held))
        self.save(state)
        self._report(max_parallel)
        return out


def hand_on_slot(sweep: SweepDir, job_id: str) -> None:
    """An array task that ends for good gives its slot of the sweep's ``max_parallel`` to an array below its share
    (:meth:`SweepThrottle.rebalance`); a failure is printed, never raised (the slot then stays with the task's own
    array until the next task ends, or ``resume``)."""
    try:
        SweepThrottle(sweep).rebalance(ending=job_id)
    except Exception as e:  # noqa: BLE001 - the trial's own outcome is what the task reports
        print(f"[orchestrate] task {job_id}: could not hand its slot of the sweep's max_parallel on "
              f"({type(e).__name__}: {e}); the next task that ends, or `orchestrate resume`, does", flush=True)


