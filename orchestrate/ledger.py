"""MLflow as the sweep's ledger (schema: docs/ARCHITECTURE.md, "MLflow ledger schema").

One experiment per sweep (named after it), a parent run (``sweep.role=parent``), and one child run per trial
created SCHEDULED at submission, tagged ``trial.key`` and friends; the trial job continues that run. Every lookup is
one paged ``search_runs`` with a tag filter, never a call per run, so ``status`` stays fast for hundreds of trials.
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlparse

from orchestrate.trial import Trial

# Run states of MLflow, in the order ``status`` prints them.
STATES = ("SCHEDULED", "RUNNING", "FINISHED", "FAILED", "KILLED")


class LedgerError(RuntimeError):
    """The tracking server or database cannot be used; the message says which URI and what to do."""


@dataclass(frozen=True)
class TrialRun:
    """What the ledger knows of one trial (one child run)."""

    run_id: str
    key: str
    label: str
    status: str
    job_id: str  # "" until the backend has submitted it
    backend: str
    subgrids: str
    error: str  # last line of the error for FAILED runs
    preemptions: int


def default_tracking_uri(sweep_root: str | Path) -> str:
    return f"sqlite:///{Path(sweep_root).resolve() / 'mlflow.db'}"


def check_tracking_uri(uri: str, timeout: float = 5.0) -> None:
    """Fail fast (before anything is created) when the tracking URI cannot work."""
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        url = uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - the user's own server
                if r.status != 200:
                    raise LedgerError(f"tracking URI {uri}: {url} answered HTTP {r.status}; is it an mlflow server?")
        except (urllib.error.URLError, OSError) as e:
            raise LedgerError(f"tracking URI {uri} is unreachable ({getattr(e, 'reason', e)}); start one with "
                              "slurm/mlflow-server.sh or pass --tracking-uri sqlite:///PATH/mlflow.db") from None
    elif parsed.scheme == "sqlite":
        path = Path(uri[len("sqlite:///"):])
        if not path.parent.exists():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise LedgerError(f"tracking URI {uri}: cannot create {path.parent}: {e}") from None
        if not os.access(path.parent, os.W_OK):
            raise LedgerError(f"tracking URI {uri}: {path.parent} is not writable")
    elif parsed.scheme in ("", "file"):
        raise LedgerError(f"tracking URI {uri!r}: MLflow 3 refuses plain file stores; valid: sqlite:///PATH/mlflow.db "
                          "or http://HOST:PORT (an mlflow server)")


def _enable_wal(uri: str) -> None:
    """Write-ahead logging for a sqlite ledger: many trial jobs write while ``status`` reads, and one fsync per
    commit instead of several makes creating hundreds of runs several times faster. The mode sticks to the file."""
    if uri.startswith("sqlite:///"):
        con = sqlite3.connect(uri[len("sqlite:///"):], timeout=30)
        try:
            con.execute("PRAGMA journal_mode=WAL")
        finally:
            con.close()


_PRAGMAS_SET = False


def _sqlite_sync_normal() -> None:
    """``synchronous=NORMAL`` on this process's sqlite connections: with WAL it survives a crash of any process
    (only a power cut can lose the last commits) and skips an fsync per commit, which halves the time to create a
    sweep's runs. Registered once, before MLflow makes its engine."""
    global _PRAGMAS_SET
    if _PRAGMAS_SET:
        return
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _on_connect(dbapi_con: Any, record: Any) -> None:
        if type(dbapi_con).__module__.startswith("sqlite3"):
            mode = dbapi_con.execute("PRAGMA journal_mode").fetchone()
            if mode and str(mode[0]).lower() == "wal":
                dbapi_con.execute("PRAGMA synchronous=NORMAL")

    _PRAGMAS_SET = True


class Ledger:
    """The sweep ``name`` in the MLflow tracking store at ``tracking_uri``."""

    def __init__(self, tracking_uri: str, name: str) -> None:
        if tracking_uri.startswith("sqlite:"):
            _sqlite_sync_normal()
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri
        self.name = name
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self._experiment_id: str | None = None
        # An http server takes concurrent requests; a sqlite file is written by one writer at a time.
        self._workers = 8 if urlparse(tracking_uri).scheme in ("http", "https") else 1

    # ---- the sweep --------------------------------------------------------------------------------------------------
    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            exp = self.client.get_experiment_by_name(self.name)
            if exp is None:
                raise LedgerError(f"no sweep {self.name!r} in {self.uri}; submit it first")
            self._experiment_id = exp.experiment_id
        return self._experiment_id

    def exists(self) -> bool:
        return self.client.get_experiment_by_name(self.name) is not None

    def ensure_sweep(self, grid: str, backend: str) -> str:
        """Create the experiment and parent run once (the submitting process, before any job); returns the parent id."""
        exp = self.client.get_experiment_by_name(self.name)
        if exp is None:
            self._experiment_id = self.client.create_experiment(self.name)
            _enable_wal(self.uri)
        else:
            self._experiment_id = exp.experiment_id
        parent = self.parent_run_id()
        if parent is None:
            run = self.client.create_run(self.experiment_id, run_name=self.name,
                                         tags={"sweep.role": "parent", "sweep.grid": grid, "sweep.backend": backend})
            parent = run.info.run_id
        return parent

    def parent_run_id(self) -> str | None:
        runs = self.client.search_runs([self.experiment_id], filter_string="tags.`sweep.role` = 'parent'",
                                       max_results=10)
        return runs[0].info.run_id if runs else None

    # ---- trials -----------------------------------------------------------------------------------------------------
    def trial_runs(self) -> dict[str, TrialRun]:
        """Every child run by trial key (one paged search). If a key appears twice the oldest run wins."""
        out: dict[str, TrialRun] = {}
        token: str | None = None
        runs: list[Any] = []
        while True:
            page = self.client.search_runs([self.experiment_id], filter_string="tags.`sweep.role` = 'trial'",
                                           max_results=5000, order_by=["attributes.start_time ASC"],
                                           page_token=token)
            runs += list(page)
            token = page.token
            if not token:
                break
        for r in runs:
            tags = r.data.tags
            key = tags.get("trial.key", "")
            if not key or key in out:
                continue
            out[key] = TrialRun(run_id=r.info.run_id, key=key, label=tags.get("trial.label", r.info.run_name or ""),
                                status=r.info.status, job_id=tags.get("trial.job_id", ""),
                                backend=tags.get("trial.backend", ""), subgrids=tags.get("trial.subgrids", ""),
                                error=tags.get("trial.error", ""),
                                preemptions=int(tags.get("trial.preemptions", "0") or 0))
        return out

    def create_trial_runs(self, parent_id: str, trials: Iterable[Trial], backend: str) -> dict[str, str]:
        """Create a SCHEDULED child run for every trial whose key has none yet; returns {key: run_id} of all trials.

        Idempotent: keys already in the ledger keep their run (the caller holds the sweep lock, so no other
        submitter races us between the lookup and the creation).
        """
        from mlflow.entities import Param

        existing = self.trial_runs()
        todo = [t for t in trials if t.key not in existing]
        out = {k: r.run_id for k, r in existing.items()}

        def create(t: Trial) -> tuple[str, str]:
            tags = {"mlflow.parentRunId": parent_id, "sweep.role": "trial", "trial.key": t.key,
                    "trial.subgrids": ",".join(t.subgrids), "trial.label": t.label, "trial.seed": str(t.seed),
                    "trial.backend": backend, "trial.job_id": ""}
            run = self.client.create_run(self.experiment_id, run_name=t.label, tags=tags)
            params = [Param(k, str(v)) for k, v in t.config.flat().items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(run.info.run_id, params=params[i:i + 100])
            self._set_scheduled(run.info.run_id)
            return t.key, run.info.run_id

        out.update(self._map(create, todo))
        return out

    def _set_scheduled(self, run_id: str) -> None:
        # MlflowClient.update_run reads the whole run back first; the store's own update (the documented store
        # interface) does not, which matters when a sweep creates hundreds of runs.
        from mlflow.entities import RunStatus

        store = getattr(getattr(self.client, "_tracking_client", None), "store", None)
        if store is not None and hasattr(store, "update_run_info"):
            store.update_run_info(run_id, RunStatus.from_string("SCHEDULED"), end_time=None, run_name=None)
        else:
            self.client.update_run(run_id, status="SCHEDULED")

    def tag_runs(self, tags_by_run: dict[str, dict[str, str]]) -> None:
        """Set tags on many runs (one batch call per run)."""
        from mlflow.entities import RunTag

        def tag(item: tuple[str, dict[str, str]]) -> None:
            run_id, tags = item
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

        self._map(tag, list(tags_by_run.items()))

    def set_status(self, run_ids: Iterable[str], status: str, tags: dict[str, str] | None = None) -> None:
        """Move runs to ``status`` (SCHEDULED to queue again, KILLED on cancel), optionally with tags."""
        def one(run_id: str) -> None:
            if tags:
                self.tag_runs({run_id: tags})
            if status == "SCHEDULED":
                self._set_scheduled(run_id)
            elif status == "RUNNING":
                self.client.update_run(run_id, status=status)
            else:
                self.client.set_terminated(run_id, status=status)

        self._map(one, list(run_ids))

    def finish_parent(self) -> None:
        parent = self.parent_run_id()
        if parent is not None:
            self.client.set_terminated(parent, status="FINISHED")

    def _map(self, fn: Any, items: list[Any]) -> list[Any]:
        if self._workers == 1 or len(items) < 2:
            return [fn(i) for i in items]
        with ThreadPoolExecutor(self._workers) as ex:
            return list(ex.map(fn, items))


def counts(runs: Iterable[TrialRun], expected: int) -> dict[str, int]:
    """Trials per state; trials of the sweep with no run yet count as MISSING."""
    out = {s: 0 for s in STATES}
    n = 0
    for r in runs:
        out[r.status] = out.get(r.status, 0) + 1
        n += 1
    out["MISSING"] = max(0, expected - n)
    return out


def wait_for(ledger: Ledger, keys: Iterable[str], states: tuple[str, ...] = ("FINISHED", "FAILED", "KILLED"),
             timeout: float = 600.0, poll: float = 2.0) -> dict[str, TrialRun]:
    """Poll until every key's run is in one of ``states``; returns the runs (raises TimeoutError with the rest)."""
    keys = set(keys)
    deadline = time.monotonic() + timeout
    while True:
        runs = ledger.trial_runs()
        left = [k for k in keys if k not in runs or runs[k].status not in states]
        if not left:
            return runs
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(left)} trials not done after {timeout:.0f}s: "
                               + ", ".join(f"{runs[k].label if k in runs else k}={runs[k].status if k in runs else 'MISSING'}"
                                           for k in sorted(left)[:10]))
        time.sleep(poll)
