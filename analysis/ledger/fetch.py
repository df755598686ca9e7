"""Read a sweep's runs from MLflow into :class:`RunRecord` s: what :func:`analysis.ledger.collect.build_sweep` turns into
DataFrames.

Every run of the sweep's experiment, with the per-recording tables (artifacts ``eval/*.csv``) of its finished trial
runs, downloaded to a temporary folder; then the LM runs the trials' beam decoders name (``lm_run`` in their tags
``eval.decoder.<D>``) that lie in other experiments, and the LM runs (those with ``lm_ppl/`` metrics) of the
experiments given as ``lm_experiments``; those are read without tables (an LM run has none). mlflow is imported
only here, and only when a sweep is read; an unreachable server is a :class:`CollectError` within seconds
(:func:`check_tracker`), as is one that stops answering while it is read.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import urlparse

from analysis.ledger.cache import TableCache, entry_key
from asr_core.contract.metrics import LM_TAG, is_lm_ppl_key, parse_decoder_tag
from asr_core.contract.tracking import missing_ledger
from asr_core.contract.tracking import tracking_uri as ledger_uri
from asr_core.contract.trial import EVAL_DIR, FINISHED, ROLE_TRIAL, TAG_ROLE

log = logging.getLogger(__name__)

TRACKER_TIMEOUT_S = 5.0  # how long the first look at an mlflow server waits (an answering one replies in ms)


class CollectError(RuntimeError):
    """The sweep cannot be read at all (no such experiment, no trial runs); the message says what exists."""


@dataclass(frozen=True)
class RunRecord:
    """What one MLflow run holds that the analysis needs; ``tables`` maps the stem of each ``eval/*.csv`` artifact
    (``<dataset>`` greedy, ``<dataset>.<decoder>`` a beam decoder's,
    :func:`asr_core.contract.metrics.table_name`) -> its text."""

    run_id: str
    status: str
    tags: Mapping[str, str]
    params: Mapping[str, str]
    metrics: Mapping[str, float]
    tables: Mapping[str, str] = field(default_factory=dict)


def is_lm_run(rec: RunRecord) -> bool:
    """An LM training run (``python -m asr_core lm train``): its tag ``lm.data_fingerprint`` or perplexity metrics."""
    return LM_TAG in rec.tags or any(is_lm_ppl_key(k) for k in rec.metrics)


def decoder_lm_runs(records: Iterable[RunRecord]) -> set[str]:
    """The LM runs that trial runs' decoders name (``lm_run`` in their ``eval.decoder.<D>`` tags)."""
    out = set()
    for rec in records:
        for key, value in rec.tags.items():
            if parse_decoder_tag(key) is not None:
                try:
                    lm_run = json.loads(value).get("lm_run")
                except (ValueError, AttributeError):
                    continue
                if isinstance(lm_run, str) and lm_run:
                    out.add(lm_run)
    return out


def check_tracker(uri: str, timeout: float = TRACKER_TIMEOUT_S) -> None:
    """Raise :class:`CollectError` (one line naming ``uri``) when the mlflow server at an ``http(s)`` URI does not
    answer within ``timeout`` seconds; any HTTP answer, an error status included, means it is there. Other stores
    (sqlite, a database) are opened by MLflow itself."""
    if urlparse(uri).scheme not in ("http", "https"):
        return
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout):  # noqa: S310 - the user's own server
            pass
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        if isinstance(reason, ssl.SSLError):  # a server answered; its certificate is MLflow's to judge (its settings)
            return
        raise CollectError(f"tracking URI {uri} is unreachable ({reason}); start the mlflow server, or pass the "
                           "--tracking-uri it listens on") from None


def _experiment_id(client: Any, uri: str, name: str, what: str = "MLflow experiment") -> str:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise CollectError(f"no {what} named {name!r} at {uri}; experiments there: "
                           + (", ".join(repr(n) for n in names) or "none"))
    return exp.experiment_id


SEARCH_PAGE = 200  # runs a search request asks for: each answer well within MLflow's request timeout (10 s here,
# analysis.__main__.MLFLOW_BOUNDS) on a busy server; a page of 1,000 paper-grid runs has taken more on 2 busy cores


def _search_all(client: Any, experiment_id: str) -> list[Any]:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], max_results=SEARCH_PAGE, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def fetch_records(experiment: str, tracking_uri: str | None = None, *, progress: bool = True,
                  lm_experiments: Iterable[str] = (), cache: TableCache | None = None) -> list[RunRecord]:
    """Every run of the experiment named ``experiment`` with its eval CSVs (downloaded to a temporary folder, or
    read from ``cache`` where it holds them: :mod:`analysis.ledger.cache`); then the LM runs its decoders name that lie
    elsewhere, and the LM runs (those with ``lm_ppl/`` metrics) of the experiments ``lm_experiments``."""
    from mlflow.exceptions import MlflowException

    uri = ledger_uri(tracking_uri) or ""  # the one rule (asr_core.contract.tracking), never MLflow's ./mlflow.db
    missing = missing_ledger(uri)
    if missing:
        raise CollectError(missing)
    check_tracker(uri)
    t0 = time.monotonic()
    try:
        records = _fetch(experiment, uri, progress, lm_experiments, cache)
    except (MlflowException, OSError) as e:  # e.g. the server went away while read (requests' errors are OSErrors)
        first = " ".join(str(e).split())[:300]
        raise CollectError(f"reading the sweep at {uri} failed: {first}; check the mlflow server and run the "
                           "command again") from None
    log.info("fetched %d runs from %s in %.1f s", len(records), uri, time.monotonic() - t0)
    return records


def _fetch(experiment: str, uri: str, progress: bool, lm_experiments: Iterable[str],
           cache: TableCache | None) -> list[RunRecord]:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp_id = _experiment_id(client, uri, experiment)
    lm_ids = [_experiment_id(client, uri, name, "LM experiment (--lm-experiment)") for name in lm_experiments]
    runs = _search_all(client, exp_id)
    log.info("experiment %r: %d runs at %s", experiment, len(runs), uri)
    # one progress bar for the runs, not one per downloaded folder
    quiet = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    try:
        records = _read_runs(uri, runs, progress, cache)
    finally:
        if quiet is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = quiet
    have = {r.run_id for r in records}
    extra = []
    for run_id in sorted(decoder_lm_runs(records) - have):
        try:
            extra.append(client.get_run(run_id))
        except MlflowException as e:  # deleted, or logged to another server: the report says it has no perplexity
            log.warning("LM run %s named by a decoder cannot be read at %s: %s", run_id, uri, str(e)[:200])
    for lm_id in lm_ids:
        extra.extend(r for r in _search_all(client, lm_id) if any(is_lm_ppl_key(k) for k in r.data.metrics))
    for run in extra:
        if run.info.run_id not in have:
            have.add(run.info.run_id)
            records.append(RunRecord(run.info.run_id, run.info.status, dict(run.data.tags), dict(run.data.params),
                                     dict(run.data.metrics)))
    return records


FETCH_WORKERS = 8  # runs whose tables are read at once: requests in flight to the server, not CPU


def _read_runs(uri: str, runs: list[Any], progress: bool, cache: TableCache | None = None) -> list[RunRecord]:
    """The records of ``runs`` (a search's results), in their order, each finished trial with its eval CSVs. Each
    run's artifacts are read from the artifact store its ``artifact_uri`` names, opened once for the run (no lookup of
    the run behind each call, as ``MlflowClient.list_artifacts`` and ``mlflow.artifacts.download_artifacts`` make),
    and up to :data:`FETCH_WORKERS` runs are read at once; a run whose tables ``cache`` holds (under the key of its
    listing and metrics) is not downloaded. The first error of any run is raised."""
    from concurrent.futures import ThreadPoolExecutor

    with tempfile.TemporaryDirectory(prefix="analysis-") as tmp, ThreadPoolExecutor(FETCH_WORKERS) as pool:
        futures = [pool.submit(_read_run, uri, run, Path(tmp), cache) for run in runs]
        try:
            for future in _progress(futures, progress, "reading runs"):
                future.result()  # as they finish in order; an error stops the rest
        finally:
            for future in futures:
                future.cancel()
        return [f.result() for f in futures]


def _read_run(uri: str, run: Any, tmp: Path, cache: TableCache | None = None) -> RunRecord:
    """One run's record; a finished trial's ``eval/*.csv`` read from its artifact store (listed there always;
    downloaded unless ``cache`` holds them for that listing)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    tags, rid = dict(run.data.tags), run.info.run_id
    tables: dict[str, str] = {}
    if tags.get(TAG_ROLE) == ROLE_TRIAL and run.info.status == FINISHED:
        repo = get_artifact_repository(run.info.artifact_uri, tracking_uri=uri)
        files = [f for f in repo.list_artifacts(EVAL_DIR) if not f.is_dir and f.path.endswith(".csv")]
        names = [f.path for f in files]
        key = entry_key(rid, ((f.path, f.file_size) for f in files), run.data.metrics) if cache is not None else ""
        cached = cache.get(rid, key) if cache is not None and names else None
        if cached is not None:
            tables = cached
        elif names:
            (tmp / rid).mkdir()
            local = Path(repo.download_artifacts(EVAL_DIR, dst_path=str(tmp / rid)))
            for name in names:
                path = local / Path(name).name
                tables[Path(name).stem] = path.read_text(encoding="utf-8", errors="replace")
            if cache is not None:
                cache.put(rid, key, tables)
    return RunRecord(rid, run.info.status, tags, dict(run.data.params), dict(run.data.metrics), tables)


def _progress(items: list[Any], enabled: bool, desc: str) -> Iterable[Any]:
    if not enabled or len(items) < 2:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="run", leave=False)
