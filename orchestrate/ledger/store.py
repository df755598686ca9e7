"""Where a sweep's ledger lives: its tracking URI (the rule: :mod:`asr_core.contract.tracking`; checked by
:func:`check_tracking_uri` before anything is created), and for a ``sqlite:`` file the store
:class:`orchestrate.ledger.ledger.Ledger` speaks to (:class:`ClientStore`: the calls of
:class:`~orchestrate.ledger.mlflow_rest.MlflowRest` on an ``MlflowClient``), with write-ahead logging and
``synchronous=NORMAL`` so that many trial jobs write while ``status`` reads.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar
from urllib.parse import urlparse

from asr_core.contract.ledger import artifact_location
from asr_core.contract.tracking import sqlite_file
from orchestrate.ledger.mlflow_rest import MAX_PER_BATCH, Experiment, LedgerError, Run, auth_header


def check_tracking_uri(uri: str, timeout: float = 5.0, hint: str = "") -> None:
    """Fail fast (before anything is created) when the tracking URI cannot work. ``hint``: what to do about an
    unreachable server, for a caller whose URI is fixed (an existing sweep's); by default, start one or use sqlite."""
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        url = uri.rstrip("/") + "/health"
        auth = auth_header()
        request = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:  # noqa: S310 - the user's own server
                if r.status != 200:
                    raise LedgerError(f"tracking URI {uri}: {url} answered HTTP {r.status}; is it an mlflow server?")
        except urllib.error.HTTPError as e:
            raise LedgerError(f"tracking URI {uri}: {url} answered HTTP {e.code}; is it an mlflow server?") from None
        except (urllib.error.URLError, OSError) as e:
            raise LedgerError(f"tracking URI {uri} is unreachable ({getattr(e, 'reason', e)}); " + (
                hint or "start one with slurm/mlflow-server.sh or pass --tracking-uri sqlite:///PATH/mlflow.db")
            ) from None
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


def enable_wal(uri: str) -> None:
    """Write-ahead logging for a sqlite ledger: many trial jobs write while ``status`` reads, and one fsync per
    commit instead of several makes creating hundreds of runs several times faster. The mode sticks to the file."""
    db = sqlite_file(uri)
    if db is not None:
        con = sqlite3.connect(db, timeout=30)
        try:
            con.execute("PRAGMA journal_mode=WAL")
        finally:
            con.close()


_PRAGMAS_SET = False


def sqlite_sync_normal() -> None:
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


T = TypeVar("T")
R = TypeVar("R")


class ClientStore:
    """The calls of :class:`~orchestrate.ledger.mlflow_rest.MlflowRest` on an ``MlflowClient`` (a ``sqlite:`` ledger,
    which has no server to talk REST to), returning the same records. ``client`` is asked for the client at every
    call: the ledger makes it on first use."""

    def __init__(self, client: Callable[[], Any]) -> None:
        self._client = client

    def get_experiment_by_name(self, name: str) -> Experiment | None:
        exp = self._client().get_experiment_by_name(name)
        return None if exp is None else Experiment(experiment_id=exp.experiment_id, name=exp.name,
                                                   lifecycle_stage=exp.lifecycle_stage, tags=dict(exp.tags))

    def create_experiment(self, name: str, tags: Mapping[str, str] | None = None) -> str | None:
        from mlflow.exceptions import MlflowException

        try:
            client = self._client()
            return client.create_experiment(name, tags=dict(tags) if tags else None,
                                            artifact_location=artifact_location(client.tracking_uri, name))
        except MlflowException as e:
            if e.error_code == "RESOURCE_ALREADY_EXISTS":
                return None
            raise

    def set_experiment_tag(self, experiment_id: str, key: str, value: str) -> None:
        self._client().set_experiment_tag(experiment_id, key, value)

    def create_run(self, experiment_id: str, run_name: str, tags: Mapping[str, str] | None = None) -> Run:
        return _record(self._client().create_run(experiment_id, run_name=run_name, tags=dict(tags or {})))

    def update_run(self, run_id: str, status: str) -> None:
        # MlflowClient.update_run reads the whole run back first; the store's own update (the documented store
        # interface) does not, which matters when a sweep creates hundreds of runs.
        from mlflow.entities import RunStatus

        client = self._client()
        store = getattr(getattr(client, "_tracking_client", None), "store", None)
        if store is not None and hasattr(store, "update_run_info"):
            store.update_run_info(run_id, RunStatus.from_string(status), end_time=None, run_name=None)
        else:
            client.update_run(run_id, status=status)

    def set_terminated(self, run_id: str, status: str) -> None:
        self._client().set_terminated(run_id, status=status)

    def log_batch(self, run_id: str, params: Mapping[str, str] | None = None,
                  tags: Mapping[str, str] | None = None) -> None:
        from mlflow.entities import Param, RunTag

        p = [Param(k, str(v)) for k, v in (params or {}).items()]
        t = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
        while p or t:  # MLflow takes at most 100 params and 100 tags per batch
            self._client().log_batch(run_id, params=p[:MAX_PER_BATCH], tags=t[:MAX_PER_BATCH])
            p, t = p[MAX_PER_BATCH:], t[MAX_PER_BATCH:]

    def search_runs(self, experiment_ids: list[str], filter_string: str = "", *, max_results: int = 1000,
                    order_by: list[str] | None = None,
                    page_token: str | None = None) -> tuple[list[Run], str | None]:
        page = self._client().search_runs(experiment_ids, filter_string=filter_string, max_results=max_results,
                                          order_by=order_by, page_token=page_token)
        return [_record(r) for r in page], page.token or None

    def search_all_runs(self, experiment_ids: list[str], filter_string: str = "", *, page_size: int = 5000,
                        order_by: list[str] | None = None) -> list[Run]:
        runs: list[Run] = []
        token: str | None = None
        while True:
            page, token = self.search_runs(experiment_ids, filter_string, max_results=page_size,
                                           order_by=order_by, page_token=token)
            runs += page
            if not token:
                return runs

    def map(self, fn: Callable[[T], R], items: list[T]) -> list[R]:
        """One after the other: a sqlite file takes one writer at a time."""
        return [fn(i) for i in items]


def _record(run: Any) -> Run:
    """An ``mlflow.entities.Run`` as the ledger's :class:`~orchestrate.ledger.mlflow_rest.Run`."""
    i = run.info
    return Run(run_id=i.run_id, run_name=i.run_name or "", status=i.status, start_time=i.start_time or 0,
               end_time=i.end_time, lifecycle_stage=i.lifecycle_stage, tags=dict(run.data.tags),
               params=dict(run.data.params))
