"""``python -m orchestrate.tools.loadtest --tracking-uri URI``: many trainers logging to one MLflow tracking server at once.

Each of ``--processes`` processes behaves like a trial job's trainer: it creates its own run, writes its status at
the start (RUNNING) and at the end (FINISHED), and in between logs one ``log_batch`` of six metrics per training
step at ``--steps-per-second`` for ``--seconds``, synchronously, retrying a failed request with backoff as MLflow's
client does. At the end every run's metric history is read back with ``MlflowClient`` and each point that the
server acknowledged must be there exactly once. Prints a table:

    processes  seconds  points sent  points/s  errors  lost  duplicated  p50 ms  p99 ms

Then a fault phase (``--fault-seconds``, 0 skips it): ``--fault-processes`` trainers log through the trial job's
own outbox (:class:`asr_core.runtime.outbox.Outbox`, a trial folder each under a temporary folder) to a
:class:`orchestrate.tools.flaky_proxy.FlakyProxy` in front of the server, which for ``--fault-seconds`` in the
middle of the phase answers, first, 400 BAD_REQUEST (a database error, as under a connection-pool timeout), then
503, 500 and 502, some of them after forwarding (the server did the work, the answer was lost). Every point logged
must then be in the run exactly once, nothing kept as refused or left unshipped:

    phase  processes  seconds  points logged  faulted requests  kept  left  lost  duplicated

Exits 0 when nothing was lost, duplicated or refused in either phase, 1 otherwise.

The load processes speak MLflow's REST API (``/api/2.0/mlflow/runs/log-batch``) through ``requests``: importing
mlflow costs about 2 s of CPU per process, which would be the benchmark on a small machine. Credentials are found
as MLflow's client finds them: MLFLOW_TRACKING_USERNAME/PASSWORD, else ``~/.mlflow/credentials``. Start the server
with ``slurm/mlflow-server.sh`` (a loopback bind needs none; a network bind writes them to ~/.mlflow/credentials).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import queue
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import requests

from asr_core.contract.options import renamed
from asr_core.contract.tracking import tracking_uri as ledger_uri
from orchestrate.ledger.mlflow_rest import credentials
from orchestrate.tools.flaky_proxy import DATABASE_ERRORS, SERVER_ERRORS, FlakyProxy

API = "/api/2.0/mlflow"
# What a trainer logs every step (asr_core.training.train logs a handful of train/* values per log_batch).
METRICS = ("train/loss", "train/lr", "train/grad_norm", "train/audio_s_per_s", "train/step_time_s", "train/mem_gb")
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})  # what MLflow's client retries
MAX_RETRIES = 5
BACKOFF_S = 0.5  # first retry after 0.5 s, then 1, 2, 4, 8 (plus jitter)
TIMEOUT_S = 120.0  # MLflow's MLFLOW_HTTP_REQUEST_TIMEOUT default


class LoadTestError(RuntimeError):
    """The load test could not start (server unreachable, credentials refused)."""


def read_credentials() -> tuple[str, str] | None:
    """(user, password) as MLflow's client resolves them (:func:`orchestrate.ledger.mlflow_rest.credentials`); None when
    there is no user."""
    user, password = credentials()
    return (user, password or "") if user else None


class RestClient:
    """The few REST calls a trainer makes, over one keep-alive connection, with MLflow's retry policy."""

    def __init__(self, uri: str, auth: tuple[str, str] | None) -> None:
        self.base = uri.rstrip("/") + API
        self.session = requests.Session()
        self.session.auth = auth
        self.retries = 0

    def call(self, method: str, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST/GET ``endpoint`` with ``body``; retries connection errors, timeouts and 429/5xx answers (the same
        body, as MLflow's client does) and raises LoadTestError naming the endpoint when it still fails."""
        last = ""
        for attempt in range(MAX_RETRIES + 1):
            if attempt:
                self.retries += 1
                time.sleep(BACKOFF_S * 2 ** (attempt - 1) * (1 + random.random()))
            try:
                if method == "GET":
                    r = self.session.get(self.base + endpoint, params=body, timeout=TIMEOUT_S)
                else:
                    r = self.session.post(self.base + endpoint, json=body, timeout=TIMEOUT_S)
            except requests.RequestException as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if r.status_code == 200:
                return r.json() if r.content else {}
            last = f"HTTP {r.status_code}: {r.text[:200]}"
            if r.status_code not in RETRY_STATUS:
                break
        raise LoadTestError(f"{method} {self.base}{endpoint} failed: {last}")

    def create_experiment(self, name: str) -> str:
        return self.call("POST", "/experiments/create", {"name": name})["experiment_id"]

    def create_run(self, experiment_id: str, name: str) -> str:
        body = {"experiment_id": experiment_id, "run_name": name, "start_time": int(time.time() * 1000)}
        return self.call("POST", "/runs/create", body)["run"]["info"]["run_id"]

    def set_status(self, run_id: str, status: str) -> None:
        body: dict[str, Any] = {"run_id": run_id, "status": status}
        if status != "RUNNING":
            body["end_time"] = int(time.time() * 1000)
        self.call("POST", "/runs/update", body)

    def log_batch(self, run_id: str, step: int, values: dict[str, float]) -> None:
        ts = int(time.time() * 1000)
        metrics = [{"key": k, "value": v, "timestamp": ts, "step": step} for k, v in values.items()]
        self.call("POST", "/runs/log-batch", {"run_id": run_id, "metrics": metrics})


@dataclass(frozen=True)
class TrainerReport:
    """What one load process did: its run, the steps the server acknowledged and those it refused, the latency of
    every log_batch (seconds, retries included), retries, and the first error it saw."""

    index: int
    run_id: str
    steps_ok: tuple[int, ...]
    steps_failed: tuple[int, ...]
    latencies: tuple[float, ...]
    retries: int
    status_errors: int
    error: str


def trainer(index: int, uri: str, auth: tuple[str, str] | None, experiment_id: str, start_at: float,
            seconds: float, steps_per_second: float, out: Any) -> None:
    """One load process: a run, RUNNING, a log_batch per step until `seconds` after `start_at`, FINISHED; puts its
    TrainerReport on the queue `out`."""
    client = RestClient(uri, auth)
    ok: list[int] = []
    failed: list[int] = []
    latencies: list[float] = []
    status_errors = 0
    error = ""
    run_id = ""
    try:
        run_id = client.create_run(experiment_id, f"trainer-{index:03d}")
        time.sleep(max(0.0, start_at - time.time()))
        try:
            client.set_status(run_id, "RUNNING")
        except LoadTestError as e:
            status_errors, error = status_errors + 1, str(e)
        period = 1.0 / steps_per_second
        t0 = time.monotonic()
        next_step = t0 + random.random() * period  # trainers do not step in lockstep
        step = 0
        rng = random.Random(index)
        while True:
            now = time.monotonic()
            if now - t0 >= seconds:
                break
            if next_step > now:
                time.sleep(next_step - now)
            step += 1
            values = {k: rng.random() for k in METRICS}
            t = time.perf_counter()
            try:
                client.log_batch(run_id, step, values)
                ok.append(step)
            except LoadTestError as e:
                failed.append(step)
                error = error or str(e)
            latencies.append(time.perf_counter() - t)
            next_step = max(next_step + period, time.monotonic())  # a slow server slows the trainer down
        try:
            client.set_status(run_id, "FINISHED")
        except LoadTestError as e:
            status_errors, error = status_errors + 1, error or str(e)
    except LoadTestError as e:  # the run could not even be created
        error = str(e)
    out.put(TrainerReport(index, run_id, tuple(ok), tuple(failed), tuple(latencies), client.retries, status_errors,
                          error))


@dataclass(frozen=True)
class LoadResult:
    """The outcome of a load test: what was sent and acknowledged, what the server holds, and the latencies."""

    processes: int
    seconds: float  # wall time from the common start to the last trainer's end
    points_sent: int  # metric values in every log_batch attempted
    points_acked: int  # of which the server acknowledged
    errors: int  # log_batch and status requests that failed after their retries, and runs that never started
    retries: int
    lost: int  # acknowledged points missing from the metric history
    duplicated: int  # surplus points in the history (a (metric, step) there more than once)
    unfinished: int  # runs whose status is not FINISHED at the end
    p50_ms: float
    p99_ms: float
    first_error: str

    @property
    def points_per_second(self) -> float:
        return self.points_acked / self.seconds if self.seconds > 0 else 0.0

    @property
    def ok(self) -> bool:
        return self.errors == 0 and self.lost == 0 and self.duplicated == 0 and self.unfinished == 0

    def table(self) -> str:
        head = ("processes", "seconds", "points sent", "points/s", "errors", "lost", "duplicated", "p50 ms", "p99 ms")
        row = (str(self.processes), f"{self.seconds:.0f}", str(self.points_sent), f"{self.points_per_second:.0f}",
               str(self.errors), str(self.lost), str(self.duplicated), f"{self.p50_ms:.0f}", f"{self.p99_ms:.0f}")
        widths = [max(len(h), len(c)) for h, c in zip(head, row)]
        lines = ["  ".join(x.rjust(w) for x, w in zip(line, widths)) for line in (head, row)]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`, nearest-rank; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def check_history(uri: str, reports: list[TrainerReport]) -> tuple[int, int, int]:
    """Reads every run's metric history and status with MlflowClient: (lost, duplicated, unfinished). A point of a
    refused log_batch may or may not be there (the server can fail after writing); it is neither lost nor owed."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    lost = duplicated = unfinished = 0
    for rep in reports:
        if not rep.run_id:
            continue
        unfinished += client.get_run(rep.run_id).info.status != "FINISHED"
        for key in METRICS:
            counts = Counter(m.step for m in client.get_metric_history(rep.run_id, key))
            lost += sum(1 for s in rep.steps_ok if counts[s] == 0)
            duplicated += sum(n - 1 for n in counts.values() if n > 1)
    return lost, duplicated, unfinished


def run_load(uri: str, processes: int, seconds: float, steps_per_second: float = 4.0,
             experiment: str | None = None) -> LoadResult:
    """Starts `processes` trainers against the tracking server at `uri` for `seconds`, then checks the history."""
    auth = read_credentials()
    setup = RestClient(uri, auth)
    name = experiment or f"loadtest-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    try:
        experiment_id = setup.create_experiment(name)
    except LoadTestError as e:
        hint = "" if auth else " (no credentials found: set MLFLOW_TRACKING_USERNAME/PASSWORD or ~/.mlflow/credentials)"
        raise LoadTestError(f"cannot create experiment {name!r} on {uri}: {e}{hint}") from None
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    reports_q = ctx.Queue()
    start_at = time.time() + 1.0 + 0.02 * processes  # every process has its run before the clock starts
    procs = [ctx.Process(target=trainer, args=(i, uri, auth, experiment_id, start_at, seconds, steps_per_second,
                                               reports_q), daemon=True) for i in range(processes)]
    for p in procs:
        p.start()
    reports: list[TrainerReport] = []
    deadline = start_at + seconds + 6 * TIMEOUT_S
    while len(reports) < processes and time.time() < deadline:
        try:
            reports.append(reports_q.get(timeout=1.0))
        except queue.Empty:  # a process that died without a report is counted below
            if not any(p.is_alive() for p in procs) and reports_q.empty():
                break
    elapsed = time.time() - start_at
    for p in procs:
        p.join(timeout=5)
    missing = processes - len(reports)
    lost, duplicated, unfinished = check_history(uri, reports)
    latencies = [x for r in reports for x in r.latencies]
    errors = missing + sum(len(r.steps_failed) + r.status_errors + (not r.run_id) for r in reports)
    first_error = next((r.error for r in reports if r.error), "")
    if missing and not first_error:
        first_error = f"{missing} load process(es) ended without a report"
    return LoadResult(
        processes=processes, seconds=elapsed,
        points_sent=sum(len(r.steps_ok) + len(r.steps_failed) for r in reports) * len(METRICS),
        points_acked=sum(len(r.steps_ok) for r in reports) * len(METRICS),
        errors=errors, retries=sum(r.retries for r in reports), lost=lost, duplicated=duplicated,
        unfinished=unfinished, p50_ms=1000 * percentile(latencies, 50), p99_ms=1000 * percentile(latencies, 99),
        first_error=first_error,
    )


# ---- the fault phase --------------------------------------------------------------------------------------------
FAULT_FLUSH_S = 120.0  # how long each trainer's outbox may take to catch up after the phase


@dataclass(frozen=True)
class OutboxReport:
    """What one trainer of the fault phase did: its :class:`TrainerReport` (every step it logged counts as owed),
    and the records its outbox kept as refused and left unshipped at the end."""

    report: TrainerReport
    kept: int
    left: int


def outbox_trainer(index: int, uri: str, proxy_uri: str, auth: tuple[str, str] | None, experiment_id: str,
                   folder: str, start_at: float, seconds: float, steps_per_second: float, out: Any) -> None:
    """One trainer of the fault phase: a run made on the server itself, then RUNNING, a metrics record per step and
    FINISHED through an outbox shipping to ``proxy_uri``, as the trial job does; puts its OutboxReport on ``out``."""
    from asr_core.runtime.outbox import Outbox, fail_fast_http
    from asr_core.contract.folder.outbox_files import kept, pending

    fail_fast_http()  # as the trial job: one call fails fast, the outbox retries
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # no run links amid the table
    steps, error, run_id, n_kept, left = 0, "", "", 0, 0
    trial = os.path.join(folder, f"trainer-{index:03d}")
    try:
        run_id = RestClient(uri, auth).create_run(experiment_id, f"outbox-trainer-{index:03d}")
        box = Outbox(trial, segment=1, tracking_uri=proxy_uri, run_id=run_id).start()
        time.sleep(max(0.0, start_at - time.time()))
        box.status("RUNNING")
        rng, period, t0 = random.Random(index), 1.0 / steps_per_second, time.monotonic()
        while time.monotonic() - t0 < seconds:
            steps += 1
            box.metrics(steps, {k: rng.random() for k in METRICS})
            box.kick()
            time.sleep(max(0.0, t0 + steps * period - time.monotonic()))
        box.status("FINISHED")
        if not box.flush(FAULT_FLUSH_S):
            error = f"outbox not shipped within {FAULT_FLUSH_S:g} s: {box.last_error}"
        box.close()
        n_kept, left = kept(trial), pending(trial)
    except LoadTestError as e:
        error = str(e)
    report = TrainerReport(index, run_id, tuple(range(1, steps + 1)), (), (), 0, 0, error)
    out.put(OutboxReport(report, n_kept, left))


@dataclass(frozen=True)
class FaultResult:
    """The outcome of the fault phase: points logged, the requests the proxy answered with a fault (by HTTP status),
    and what the runs hold at the end."""

    processes: int
    seconds: float
    fault_seconds: float
    points: int
    faulted: dict[int, int]
    kept: int  # outbox records kept as refused for good (none may be: every fault was transient)
    left: int  # outbox records never shipped
    lost: int
    duplicated: int
    unfinished: int
    missing: int  # trainers that ended without a report
    first_error: str

    @property
    def ok(self) -> bool:
        return not (self.kept or self.left or self.lost or self.duplicated or self.unfinished or self.missing)

    def table(self) -> str:
        faults = " ".join(f"{code}x{n}" for code, n in sorted(self.faulted.items())) or "none"
        head = ("phase", "processes", "seconds", "points logged", "faulted requests", "kept", "left", "lost",
                "duplicated")
        row = (f"{self.fault_seconds:g} s of 400/5xx", str(self.processes), f"{self.seconds:.0f}", str(self.points),
               faults, str(self.kept), str(self.left), str(self.lost), str(self.duplicated))
        widths = [max(len(h), len(c)) for h, c in zip(head, row)]
        lines = ["  ".join(x.rjust(w) for x, w in zip(line, widths)) for line in (head, row)]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


def run_fault_phase(uri: str, processes: int, fault_seconds: float, steps_per_second: float = 4.0,
                    experiment: str | None = None) -> FaultResult:
    """``processes`` outbox trainers log through a :class:`FlakyProxy` in front of ``uri`` for ``fault_seconds``
    plus a lead and a tail (a quarter of it each, at least 2 s); the proxy answers faults for ``fault_seconds`` in the
    middle: 400 BAD_REQUEST for the first half, 5xx for the second. Then every run's history is checked (:func:`check_history`)."""
    import importlib

    importlib.import_module("mlflow.tracking")  # once here, before the trainers fork, instead of once in each

    auth = read_credentials()
    name = experiment or f"loadtest-faults-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    try:
        experiment_id = RestClient(uri, auth).create_experiment(name)
    except LoadTestError as e:
        raise LoadTestError(f"cannot create experiment {name!r} on {uri}: {e}") from None
    lead = max(2.0, fault_seconds / 4)
    seconds = fault_seconds + 2 * lead
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    reports_q = ctx.Queue()
    proxy = FlakyProxy(uri)  # listening; served once the trainers are forked (a fork copies no serving thread)
    try:
        with tempfile.TemporaryDirectory(prefix="loadtest-faults-") as folder:
            start_at = time.time() + 3.0 + 0.05 * processes  # every trainer has its run and outbox by then
            procs = [ctx.Process(target=outbox_trainer, daemon=True,
                                 args=(i, uri, proxy.uri, auth, experiment_id, folder, start_at, seconds,
                                       steps_per_second, reports_q)) for i in range(processes)]
            for p in procs:
                p.start()
            proxy.start()
            half = fault_seconds / 2  # 400s first, then 5xx
            timers = [threading.Timer(max(0.0, start_at + lead + i * half - time.time()), proxy.fail, (half, faults))
                      for i, faults in enumerate((DATABASE_ERRORS, SERVER_ERRORS))]
            for timer in timers:
                timer.start()
            got: list[OutboxReport] = []
            deadline = start_at + seconds + FAULT_FLUSH_S + 60
            while len(got) < processes and time.time() < deadline:
                try:
                    got.append(reports_q.get(timeout=1.0))
                except queue.Empty:
                    if not any(p.is_alive() for p in procs) and reports_q.empty():
                        break
            elapsed = time.time() - start_at
            for timer in timers:
                timer.cancel()
            for p in procs:
                p.join(timeout=5)
            faulted = dict(proxy.by_status)
    finally:
        proxy.close()
    reports = [g.report for g in got]
    lost, duplicated, unfinished = check_history(uri, reports)
    missing = processes - len(got)
    first_error = next((r.error for r in reports if r.error), "")
    if missing and not first_error:
        first_error = f"{missing} fault-phase trainer(s) ended without a report"
    return FaultResult(processes=processes, seconds=elapsed, fault_seconds=fault_seconds,
                       points=sum(len(r.steps_ok) for r in reports) * len(METRICS), faulted=faulted,
                       kept=sum(g.kept for g in got), left=sum(g.left for g in got), lost=lost,
                       duplicated=duplicated, unfinished=unfinished, missing=missing, first_error=first_error)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrate.tools.loadtest", description=__doc__.split("\n\n")[0])
    renamed(ap, "--uri", ap.add_argument("--tracking-uri", dest="uri", help="the tracking server, e.g. "
                                         "http://login01:5000 (default: $MLFLOW_TRACKING_URI)"))
    ap.add_argument("--processes", type=int, default=64, help="trainers logging at once (default 64)")
    ap.add_argument("--seconds", type=float, default=120.0, help="how long each logs (default 120)")
    ap.add_argument("--steps-per-second", type=float, default=4.0,
                    help="each trainer's step rate, one log_batch per step (default 4)")
    renamed(ap, "--experiment", ap.add_argument("--sweep", dest="experiment", help="the experiment to create "
                                                "(default loadtest-<time>-<pid>)"))
    ap.add_argument("--fault-seconds", type=float, default=10.0,
                    help="how long the fault phase's proxy answers 400s and 5xx (default 10; 0 skips the phase)")
    ap.add_argument("--fault-processes", type=int, default=None,
                    help="trainers logging through their outbox in the fault phase (default: --processes, at most 4)")
    a = ap.parse_args(argv)
    fault_processes = a.fault_processes if a.fault_processes is not None else min(a.processes, 4)
    for flag, value in (("--processes", a.processes), ("--seconds", a.seconds),
                        ("--steps-per-second", a.steps_per_second), ("--fault-processes", fault_processes)):
        if value <= 0:
            ap.error(f"{flag} {value} must be positive")
    if a.fault_seconds < 0:
        ap.error(f"--fault-seconds {a.fault_seconds} must be 0 (no fault phase) or positive")
    a.uri = ledger_uri(a.uri, local_default=False) or ""
    if not a.uri.startswith(("http://", "https://")):
        ap.error(f"--tracking-uri {a.uri!r} is not a tracking server's http(s):// address (start one with "
                 "slurm/mlflow-server.sh)")
    try:
        result = run_load(a.uri, a.processes, a.seconds, a.steps_per_second, a.experiment)
    except LoadTestError as e:
        print(f"loadtest: {e}", file=sys.stderr)
        return 2
    print(result.table())
    extra = [f"{result.retries} retried requests"] if result.retries else []
    if result.unfinished:
        extra.append(f"{result.unfinished} runs not FINISHED")
    if result.first_error:
        extra.append(f"first error: {result.first_error}")
    for line in extra:
        print(line)
    if not a.fault_seconds:
        return 0 if result.ok else 1
    try:
        faults = run_fault_phase(a.uri, fault_processes, a.fault_seconds, a.steps_per_second,
                                 f"{a.experiment}-faults" if a.experiment else None)
    except LoadTestError as e:
        print(f"loadtest: {e}", file=sys.stderr)
        return 2
    print()
    print(faults.table())
    if faults.unfinished:
        print(f"{faults.unfinished} runs not FINISHED")
    if faults.first_error:
        print(f"first error: {faults.first_error}")
    return 0 if result.ok and faults.ok else 1


if __name__ == "__main__":
    sys.exit(main())
