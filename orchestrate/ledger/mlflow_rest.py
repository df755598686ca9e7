"""MLflow's REST API over one pooled HTTP session: how the sweep ledger talks to an ``http(s)://`` tracking server.

Why not ``MlflowClient`` here: importing mlflow costs 2-3 s of every ``orchestrate`` command that touches a server,
and its client reads a run back before it updates it. The REST API (``/api/2.0/mlflow/...``, documented at
https://mlflow.org/docs/latest/rest-api.html) is MLflow's stable public contract between its clients and servers,
so speaking it directly costs nothing in compatibility: ``requests`` imports in a tenth of a second, connections
are kept open and shared by a thread pool, and every call is one request. A ``sqlite:`` ledger has no server and
keeps ``MlflowClient`` (:mod:`orchestrate.ledger.ledger`).

Credentials are found exactly as MLflow's own clients find them: basic auth from ``MLFLOW_TRACKING_USERNAME`` /
``MLFLOW_TRACKING_PASSWORD``, each falling back to ``~/.mlflow/credentials`` (section ``[mlflow]``, keys
``mlflow_tracking_username`` / ``mlflow_tracking_password``); else a bearer token from ``MLFLOW_TRACKING_TOKEN``.
``MLFLOW_TRACKING_INSECURE_TLS``, ``MLFLOW_TRACKING_SERVER_CERT_PATH`` and ``MLFLOW_TRACKING_CLIENT_CERT_PATH``
mean what they mean to MLflow.

Failures: a server that cannot be reached, or answers 429 or 5xx, is asked again with exponential back-off, a
bounded number of times; then, like any other HTTP error, the call raises :class:`RestError` (a
:class:`LedgerError`) naming the URI and what to do. A write that is not safe to repeat (creating a run) is
repeated only when the server certainly did not carry it out; otherwise it raises :class:`UncertainWrite`, and the
caller looks for what it may have created before it tries again.
"""

from __future__ import annotations

import base64
import configparser
import json
import os
import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, TypeVar

if TYPE_CHECKING:  # imported on first use: every command imports this module, few talk to a server
    import requests

__all__ = ["API", "CREDENTIALS_FILE", "Experiment", "LedgerError", "MAX_PER_BATCH", "MlflowRest", "RestError", "Run",
           "UncertainWrite", "auth_header", "credentials"]

API = "/api/2.0/mlflow/"
CREDENTIALS_FILE = Path("~/.mlflow/credentials")
MAX_PER_BATCH = 100  # MLflow takes at most 100 params and 100 tags in one runs/log-batch call
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
UNSENT_STATUS = frozenset({429, 503})  # the server turned the request away without carrying it out

T = TypeVar("T")
R = TypeVar("R")


class LedgerError(RuntimeError):
    """The tracking server or database cannot be used; the message says which URI and what to do.

    Defined here, the lowest layer that raises it, and re-exported by :mod:`orchestrate.ledger.ledger`."""


class RestError(LedgerError):
    """A REST call failed: the server is unreachable, refused the request, or failed. ``error_code`` is MLflow's
    (``RESOURCE_DOES_NOT_EXIST``, ...) or "" when the answer carried none; ``status`` the HTTP status (None when
    no answer came)."""

    def __init__(self, message: str, *, error_code: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.status = status


class UncertainWrite(RestError):
    """A write that is not safe to repeat may or may not have been carried out (the connection broke after the
    request was sent, or the server failed half-way); look before writing again."""


@dataclass(frozen=True)
class Experiment:
    """An MLflow experiment as the ledger reads it."""

    experiment_id: str
    name: str
    lifecycle_stage: str
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Run:
    """An MLflow run as the ledger reads it (metrics are not kept)."""

    run_id: str
    run_name: str
    status: str
    start_time: int
    end_time: int | None
    lifecycle_stage: str
    tags: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)


def _pairs(d: Mapping[str, str] | None) -> list[dict[str, str]]:
    return [{"key": k, "value": str(v)} for k, v in (d or {}).items()]


def _unpairs(items: Iterable[Mapping[str, Any]] | None) -> dict[str, str]:
    return {i["key"]: i.get("value", "") for i in items or ()}


def _experiment(d: Mapping[str, Any]) -> Experiment:
    return Experiment(experiment_id=str(d["experiment_id"]), name=d.get("name", ""),
                      lifecycle_stage=d.get("lifecycle_stage", "active"), tags=_unpairs(d.get("tags")))


def _run(d: Mapping[str, Any]) -> Run:
    info, data = d.get("info", {}), d.get("data", {})
    end = info.get("end_time")
    return Run(run_id=info.get("run_id") or info["run_uuid"], run_name=info.get("run_name", ""),
               status=info.get("status", ""), start_time=int(info.get("start_time", 0) or 0),
               end_time=int(end) if end is not None else None,
               lifecycle_stage=info.get("lifecycle_stage", "active"), tags=_unpairs(data.get("tags")),
               params=_unpairs(data.get("params")))


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---- credentials -----------------------------------------------------------------------------------------------------
def credentials(env: Mapping[str, str] | None = None, path: Path | None = None) -> tuple[str | None, str | None]:
    """(user, password) as MLflow's clients read them: each from the environment, else from the credentials file
    (``~/.mlflow/credentials``, ``[mlflow]`` section); None where neither has it."""
    env = os.environ if env is None else env
    file_user = file_password = None
    p = (path or CREDENTIALS_FILE).expanduser()
    if p.is_file():
        ini = configparser.ConfigParser()
        try:
            ini.read(p)
        except configparser.Error as e:
            raise LedgerError(f"MLflow credentials file {p} is unreadable ({e}); fix it or remove it") from None
        if ini.has_section("mlflow"):
            file_user = ini["mlflow"].get("mlflow_tracking_username")
            file_password = ini["mlflow"].get("mlflow_tracking_password")
    return env.get("MLFLOW_TRACKING_USERNAME") or file_user, env.get("MLFLOW_TRACKING_PASSWORD") or file_password


def auth_header(env: Mapping[str, str] | None = None, path: Path | None = None) -> str | None:
    """The ``Authorization`` header MLflow's clients send: ``Basic`` when a user and a password are known
    (:func:`credentials`), else ``Bearer MLFLOW_TRACKING_TOKEN``, else None."""
    env = os.environ if env is None else env
    user, password = credentials(env, path)
    if user and password:
        return "Basic " + base64.standard_b64encode(f"{user}:{password}".encode()).decode()
    token = env.get("MLFLOW_TRACKING_TOKEN")
    return f"Bearer {token}" if token else None


def _tls_verify(env: Mapping[str, str]) -> bool | str:
    if env.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() in ("true", "1"):
        return False
    return env.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or True


# ---- the connection --------------------------------------------------------------------------------------------------
def _quick_ack(sock: Any) -> None:
    """Acknowledge the next segments at once (Linux ``TCP_QUICKACK``; elsewhere nothing)."""
    if sock is not None and hasattr(socket, "TCP_QUICKACK"):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass


@lru_cache(maxsize=None)
def _adapter_class() -> type:
    """An ``HTTPAdapter`` whose kept-alive connections acknowledge each answer at once.

    An MLflow server (uvicorn) writes an answer's head and its body separately; on a kept-alive connection the body
    then waits for the client's delayed acknowledgement of the head, about 40 ms per call, which makes a pooled
    connection ten times slower than a new one unless the client acknowledges at once."""
    from requests.adapters import HTTPAdapter
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    class QuickAckHTTP(HTTPConnection):
        def getresponse(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            _quick_ack(self.sock)
            return super().getresponse(*args, **kwargs)

    class QuickAckHTTPS(HTTPSConnection):
        def getresponse(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            _quick_ack(self.sock)
            return super().getresponse(*args, **kwargs)

    class QuickAckPool(HTTPConnectionPool):
        ConnectionCls = QuickAckHTTP

    class QuickAckTLSPool(HTTPSConnectionPool):
        ConnectionCls = QuickAckHTTPS

    class PooledAdapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = {"http": QuickAckPool, "https": QuickAckTLSPool}

    return PooledAdapter


class MlflowRest:
    """The MLflow REST API of the tracking server at ``uri`` (``http(s)://HOST:PORT[/PATH]``).

    Thread-safe: :meth:`map` runs a function over many items on ``workers`` threads sharing the session's
    connection pool. ``attempts`` bounds how often one call is tried (first try included); back-off starts at
    ``backoff_s`` and doubles, and no retry starts after ``retry_s`` seconds."""

    def __init__(self, uri: str, *, workers: int = 8, timeout: tuple[float, float] = (5.0, 120.0),
                 attempts: int = 5, backoff_s: float = 0.2, retry_s: float = 30.0,
                 env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.uri = uri.rstrip("/")
        self.workers = max(1, workers)
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.retry_s = retry_s
        import requests

        self.session = requests.Session()
        adapter = _adapter_class()(pool_connections=2, pool_maxsize=self.workers, max_retries=0)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.headers["Content-Type"] = "application/json"
        self.session.verify = _tls_verify(env)
        if env.get("MLFLOW_TRACKING_CLIENT_CERT_PATH"):
            self.session.cert = env["MLFLOW_TRACKING_CLIENT_CERT_PATH"]
        auth = auth_header(env)
        if auth:
            self.session.headers["Authorization"] = auth

    def close(self) -> None:
        self.session.close()

    # ---- one call ----------------------------------------------------------------------------------------------------
    def call(self, endpoint: str, body: Mapping[str, Any] | None = None, *, method: str = "POST",
             idempotent: bool = True) -> dict[str, Any]:
        """``METHOD /api/2.0/mlflow/ENDPOINT`` with ``body`` (JSON, or the query of a GET); the answer's JSON.

        Retries connection failures, 429 and 5xx with back-off. ``idempotent=False``: retry only when the server
        certainly did not carry the request out (no connection, 429, 503); otherwise raise
        :class:`UncertainWrite`."""
        import requests

        url = self.uri + API + endpoint
        data = None if method == "GET" else json.dumps(body or {})
        params = body if method == "GET" else None
        t0 = time.monotonic()
        for attempt in range(1, self.attempts + 1):
            last = attempt == self.attempts or time.monotonic() - t0 > self.retry_s
            try:
                r = self.session.request(method, url, data=data, params=params, timeout=self.timeout)
            except requests.exceptions.ConnectionError as e:
                unsent = _unsent(e)
                if not idempotent and not unsent:
                    raise UncertainWrite(f"tracking server {self.uri}: the connection broke during {endpoint} "
                                         f"({_reason(e)}); it may or may not have been carried out") from None
                if last:
                    raise RestError(f"tracking server {self.uri} is unreachable ({_reason(e)}; {attempt} "
                                    "attempts): start it (asr-study mlflow-server --detach), or check the URI "
                                    "(--tracking-uri, or the sweep's sweep.json)") from None
                self._sleep(attempt, None)
                continue
            except requests.exceptions.Timeout as e:
                if not idempotent:
                    raise UncertainWrite(f"tracking server {self.uri} did not answer {endpoint} within "
                                         f"{self.timeout[1]:.0f} s; it may or may not have been carried out") from None
                if last:
                    raise RestError(f"tracking server {self.uri} did not answer {endpoint} ({_reason(e)}; "
                                    f"{attempt} attempts): is it overloaded? See its log") from None
                self._sleep(attempt, None)
                continue
            except requests.exceptions.RequestException as e:
                raise RestError(f"tracking URI {self.uri}: {endpoint} could not be sent ({e}); check the URI") \
                    from None
            if r.status_code == 200:
                try:
                    return r.json() if r.content else {}
                except ValueError:
                    raise RestError(f"tracking URI {self.uri}: {endpoint} answered something that is not JSON "
                                    f"({r.text[:80]!r}); is it an MLflow server?") from None
            if r.status_code in RETRY_STATUS:
                if not idempotent and r.status_code not in UNSENT_STATUS:
                    raise UncertainWrite(self._http_error(endpoint, r, attempt), status=r.status_code,
                                         error_code=_error_code(r))
                if not last:
                    self._sleep(attempt, r.headers.get("Retry-After"))
                    continue
            raise RestError(self._http_error(endpoint, r, attempt), error_code=_error_code(r), status=r.status_code)
        raise AssertionError("unreachable")  # the loop returns or raises on its last attempt

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        wait = self.backoff_s * 2 ** (attempt - 1)
        if retry_after:
            try:
                wait = max(wait, min(float(retry_after), 10.0))
            except ValueError:
                pass
        time.sleep(wait * (1 + random.random() / 2))

    def _http_error(self, endpoint: str, r: requests.Response, attempt: int) -> str:
        code, message = _error_code(r), _error_message(r)
        what = f"tracking server {self.uri}: {endpoint} failed with HTTP {r.status_code}"
        what += f" {code}" if code else ""
        what += f": {message}" if message else ""
        if r.status_code in (401, 403):
            return (what + "; give the server's credentials: MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, "
                    f"or {CREDENTIALS_FILE} ([mlflow] mlflow_tracking_username = USER, mlflow_tracking_password = "
                    "PASSWORD)")
        if r.status_code >= 500:
            return what + f" ({attempt} attempts); see the server's log, and run the command again"
        if r.status_code == 404 and code in ("", "ENDPOINT_NOT_FOUND"):
            return what + "; is it an MLflow server (asr-study mlflow-server), of version 2 or later?"
        return what

    # ---- experiments -------------------------------------------------------------------------------------------------
    def get_experiment_by_name(self, name: str) -> Experiment | None:
        """The experiment called ``name`` (active or deleted), or None."""
        try:
            out = self.call("experiments/get-by-name", {"experiment_name": name}, method="GET")
        except RestError as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        return _experiment(out["experiment"])

    def create_experiment(self, name: str, tags: Mapping[str, str] | None = None) -> str | None:
        """Create the experiment; its id, or None when an experiment of that name exists already."""
        try:
            out = self.call("experiments/create", {"name": name, "tags": _pairs(tags)})
        except RestError as e:
            if e.error_code == "RESOURCE_ALREADY_EXISTS":
                return None
            raise
        return str(out["experiment_id"])

    def set_experiment_tag(self, experiment_id: str, key: str, value: str) -> None:
        self.call("experiments/set-experiment-tag", {"experiment_id": experiment_id, "key": key, "value": value})

    # ---- runs --------------------------------------------------------------------------------------------------------
    def create_run(self, experiment_id: str, run_name: str, tags: Mapping[str, str] | None = None,
                   start_time: int | None = None) -> Run:
        """A new run (status RUNNING, as MLflow creates every run). Not idempotent: may raise
        :class:`UncertainWrite`. ``user_id`` is the tag ``mlflow.user`` or "unknown", as ``MlflowClient`` sends."""
        tags = dict(tags or {})
        body = {"experiment_id": experiment_id, "run_name": run_name, "tags": _pairs(tags),
                "start_time": start_time if start_time is not None else _now_ms(),
                "user_id": tags.get("mlflow.user", "unknown")}
        return _run(self.call("runs/create", body, idempotent=False)["run"])

    def update_run(self, run_id: str, status: str, end_time: int | None = None) -> None:
        """Set the run's status (and end time); MlflowClient's ``update_run`` / ``set_terminated`` in one call."""
        body: dict[str, Any] = {"run_id": run_id, "run_uuid": run_id, "status": status}
        if end_time is not None:
            body["end_time"] = end_time
        self.call("runs/update", body)

    def set_terminated(self, run_id: str, status: str) -> None:
        self.update_run(run_id, status, end_time=_now_ms())

    def log_batch(self, run_id: str, params: Mapping[str, str] | None = None,
                  tags: Mapping[str, str] | None = None) -> None:
        """Params and tags of one run, in as few calls as MLflow's limits allow (100 params and 100 tags each)."""
        p, t = _pairs(params), _pairs(tags)
        while p or t:
            self.call("runs/log-batch", {"run_id": run_id, "params": p[:MAX_PER_BATCH], "tags": t[:MAX_PER_BATCH]})
            p, t = p[MAX_PER_BATCH:], t[MAX_PER_BATCH:]

    def search_runs(self, experiment_ids: list[str], filter_string: str = "", *, max_results: int = 1000,
                    order_by: list[str] | None = None, page_token: str | None = None,
                    view: str = "ACTIVE_ONLY") -> tuple[list[Run], str | None]:
        """One page of ``runs/search``: the runs and the next page's token (None after the last page)."""
        body: dict[str, Any] = {"experiment_ids": experiment_ids, "filter": filter_string,
                                "max_results": max_results, "run_view_type": view}
        if order_by:
            body["order_by"] = order_by
        if page_token:
            body["page_token"] = page_token
        out = self.call("runs/search", body)
        return [_run(r) for r in out.get("runs", ())], out.get("next_page_token") or None

    def search_all_runs(self, experiment_ids: list[str], filter_string: str = "", *, page_size: int = 5000,
                        order_by: list[str] | None = None, view: str = "ACTIVE_ONLY") -> list[Run]:
        """Every run matching, page after page."""
        runs: list[Run] = []
        token: str | None = None
        while True:
            page, token = self.search_runs(experiment_ids, filter_string, max_results=page_size,
                                           order_by=order_by, page_token=token, view=view)
            runs += page
            if not token:
                return runs

    # ---- many calls --------------------------------------------------------------------------------------------------
    def map(self, fn: Callable[[T], R], items: list[T]) -> list[R]:
        """``[fn(i) for i in items]`` on up to ``workers`` threads sharing the connection pool; the first error
        is raised once every call has ended."""
        if len(items) < 2 or self.workers == 1:
            return [fn(i) for i in items]
        with ThreadPoolExecutor(min(self.workers, len(items))) as ex:
            futures = [ex.submit(fn, i) for i in items]
        return [f.result() for f in futures]


def _unsent(e: requests.exceptions.ConnectionError) -> bool:
    """True when the request certainly never reached the server (no connection could be made)."""
    import requests
    import urllib3.exceptions as u3

    if isinstance(e, requests.exceptions.ConnectTimeout):
        return True
    cause: BaseException | None = e.args[0] if e.args and isinstance(e.args[0], BaseException) else None
    reason = getattr(cause, "reason", None)
    return isinstance(cause, u3.NewConnectionError) or isinstance(reason, u3.NewConnectionError)


def _reason(e: BaseException) -> str:
    """The innermost useful words of a requests/urllib3 error ("Connection refused", ...)."""
    text = str(e)
    for marker in ("] ", "Error('"):
        if marker in text:
            text = text.rsplit(marker, 1)[-1]
    return text.strip("')\" ") or type(e).__name__


def _error_code(r: requests.Response) -> str:
    try:
        return str(r.json().get("error_code", ""))
    except (ValueError, AttributeError):
        return ""


def _error_message(r: requests.Response) -> str:
    try:
        return str(r.json().get("message", ""))[:500]
    except (ValueError, AttributeError):
        return r.text.strip()[:200]
