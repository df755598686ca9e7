"""The report in the MLflow UI: ``python -m analysis report`` logs the report to the sweep's parent run and saves a
view of the runs table whose columns are the sweep's headline WERs.

What MLflow 3.17's UI does, and so what is written here:

* **Artifacts.** The run page's artifact viewer shows ``.html`` in a sandboxed iframe (the report's ``index.html``
  is self-contained, figures inline, so it renders there), ``.png`` as images, ``.csv`` as tables and ``.md`` as
  Markdown (without its figures: relative image links are not followed). The report's files go to ``report/`` of the
  parent run (tag ``sweep.role=parent``); a later report replaces them, and files it no longer writes (a figure not
  drawn this time) are deleted.
* **Columns.** The runs table shows a metric column only when it is in the page's ``selectedColumns``, which start as
  Source, Models and Dataset and are kept in the browser's local storage: no setting on the server makes a metric
  column visible by default, and parent-run metrics, run tags or the experiment kind change nothing there. What the
  server can hold is a *saved view*: an experiment tag ``mlflow.sharedViewState.<id>`` whose value is
  ``{"name", "createdAt", "updatedAt", "state"}`` (``state``: the page's state as JSON text), listed in the page's
  Views menu and opened by ``#/experiments/<experiment>/runs?viewStateShareKey=<id>``. The view written here selects
  the trial's label (``trial.label``, the name ``orchestrate status`` prints) and the clean WERs (``wer/<dataset>``,
  what ``asr_core.evaluation.evaluate`` logs; then ``wer_<decoder>/<dataset>`` of every other decoder the runs hold)
  rounded to 2 decimals, as the run tags ``WER <dataset>`` (``WER <dataset> <decoder>``) that ``evaluate`` writes
  beside them (the table prints a metric with all its digits; see
  :mod:`asr_core.contract.ledger`); :func:`publish` writes those tags on every run that lacks them. The view leaves
  the parent run out and sorts by run name: sorted by anything but the start time the table lists child runs flat
  instead of folded under their parent, so every trial's WER shows without a click.
* **The way in.** The experiment's description (experiment tag ``mlflow.note.content``) is shown under the title of
  every tab of the experiment, folded to its first line; that line (starting with :data:`NOTE_START`, replaced on
  every report, the rest of the description kept below it) links to the report and to that view.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from asr_core.contract.ledger import (NOTE_TAG, VIEW_ID, VIEW_TAG_PREFIX, decoder_metrics, headline_metrics, note_line,
                                     saved_view_value, shown_tags, view_created_ms, view_link, with_note_line)
from asr_core.contract.tracking import tracking_uri as ledger_uri
from asr_core.contract.trial import ROLE_PARENT, TAG_ROLE

log = logging.getLogger(__name__)

ARTIFACT_DIR = "report"  # the report's folder among the parent run's artifacts

class DashboardError(RuntimeError):
    """The report cannot be published to MLflow; the message says what is missing."""


@dataclass(frozen=True)
class Published:
    """What :func:`publish` wrote."""

    experiment_id: str
    parent_run_id: str | None  # None: the experiment has no parent run, no report was logged
    files: tuple[str, ...]  # artifact paths uploaded, e.g. "report/index.html"
    removed: tuple[str, ...]  # artifact paths of an earlier report that this one no longer has, deleted
    metrics: tuple[str, ...]  # the columns of the saved view
    view_link: str | None  # the UI route (from "#") of the saved view; None when there are no metrics
    report_link: str | None  # the UI route of the logged index.html
    shown: int = 0  # runs whose shown-WER tags (the view's columns) were written or brought up to date

    def url(self, link: str, tracking_uri: str) -> str:
        """``link`` as an address to open: after the server's URL for an ``http(s)`` tracking URI; else the route
        to follow in a UI serving that store (``mlflow ui --backend-store-uri URI``)."""
        if tracking_uri.startswith(("http://", "https://")):
            return f"{tracking_uri.rstrip('/')}/{link}"
        return f"{link} (in an MLflow UI serving {tracking_uri})"


# ---- pure: what the UI is given (the view itself: asr_core.contract.ledger) -------------------------------------

def report_link(experiment_id: str, run_id: str, artifact_dir: str = ARTIFACT_DIR) -> str:
    """The UI route of the report's ``index.html`` in the run's artifact viewer."""
    return f"#/experiments/{experiment_id}/runs/{run_id}/artifacts/{artifact_dir}/index.html"


# ---- MLflow ----------------------------------------------------------------------------------------------------

def parent_run_id(client: Any, experiment_id: str) -> str | None:
    """The sweep's parent run (tag ``sweep.role=parent``; the oldest if there are several, as the ledger reads it),
    or None."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{TAG_ROLE}` = '{ROLE_PARENT}'",
                              max_results=10, order_by=["attributes.start_time ASC"])
    return runs[0].info.run_id if runs else None


def remote_files(client: Any, run_id: str, path: str) -> list[str]:
    """Every file under artifact folder ``path`` of the run (recursive), as artifact paths."""
    out: list[str] = []
    for info in client.list_artifacts(run_id, path):
        out.extend(remote_files(client, run_id, info.path) if info.is_dir else [info.path])
    return out


def _delete_artifact(client: Any, tracking_uri: str, run_id: str, path: str) -> None:
    """Delete one artifact of the run. MlflowClient has no call for it; the run's artifact repository does (a
    served ``mlflow-artifacts:`` store answers HTTP DELETE, a local folder removes the file)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo = get_artifact_repository(client.get_run(run_id).info.artifact_uri, tracking_uri=tracking_uri)
    repo.delete_artifacts(path)


def upload_report(client: Any, tracking_uri: str, run_id: str, files: Sequence[Path],
                  artifact_dir: str = ARTIFACT_DIR) -> tuple[list[str], list[str]]:
    """Log ``files`` (one folder's files) under ``artifact_dir`` of the run, then delete what an earlier report left
    there that these files do not replace. Uploading first keeps a report in place throughout.

    Returns (artifact paths uploaded, artifact paths deleted)."""
    if not files:
        raise ValueError(f"no report files to log to {artifact_dir}/ (an empty report would delete the last one)")
    names = [Path(f).name for f in files]
    if len(set(names)) != len(names):
        raise ValueError(f"report files with the same name cannot share {artifact_dir}/: {sorted(names)}")
    for f in files:
        client.log_artifact(run_id, str(f), artifact_dir)
    uploaded = [f"{artifact_dir}/{n}" for n in names]
    stale = sorted(set(remote_files(client, run_id, artifact_dir)) - set(uploaded))
    for path in stale:
        _delete_artifact(client, tracking_uri, run_id, path)
    return uploaded, stale


def tag_shown_wers(client: Any, experiment_id: str) -> tuple[int, list[str]]:
    """Write the shown-WER tags (:func:`asr_core.contract.ledger.shown_tags`) on every run of the experiment whose
    clean WER metrics lack them or disagree with them (runs logged before ``evaluate`` wrote them, or by other
    tools); returns how many runs were written and the other decoders' clean WERs the runs hold
    (:func:`asr_core.contract.ledger.decoder_metrics`). One call per such run."""
    from mlflow.entities import RunTag

    written, token, keys = 0, None, set()
    while True:
        runs = client.search_runs([experiment_id], max_results=1000, page_token=token)
        for r in runs:
            keys.update(r.data.metrics)
            stale = {k: v for k, v in shown_tags(r.data.metrics).items() if r.data.tags.get(k) != v}
            if stale:
                client.log_batch(r.info.run_id, tags=[RunTag(k, v) for k, v in sorted(stale.items())])
                written += 1
        token = runs.token
        if not token:
            return written, decoder_metrics(keys)


def save_view(client: Any, experiment_id: str, tags: Mapping[str, str], metrics: Sequence[str]) -> str:
    """Write the saved view of ``metrics`` as the experiment tag (one tag, rewritten each time; its ``createdAt``
    kept) and return its UI route."""
    key = VIEW_TAG_PREFIX + VIEW_ID
    now = int(time.time() * 1000)
    client.set_experiment_tag(experiment_id, key,
                              saved_view_value(metrics, created_ms=view_created_ms(tags.get(key), now), now_ms=now))
    return view_link(experiment_id)


def publish(experiment: str, files: Sequence[Path], datasets: Iterable[str], tracking_uri: str | None = None,
            *, artifact_dir: str = ARTIFACT_DIR) -> Published:
    """Log a written report to sweep ``experiment`` in MLflow: ``files`` to ``artifact_dir/`` of its parent run,
    the saved view (the trials' labels, the clean WER columns of ``datasets``, then every other decoder's the runs
    hold), and the description line linking to both.

    An experiment without a parent run gets the view and the line but no report (``Published.parent_run_id`` is
    None); the caller says so. Raises :class:`DashboardError` when there is no such experiment."""
    from mlflow.tracking import MlflowClient

    uri = ledger_uri(tracking_uri) or ""  # the one rule (asr_core.contract.tracking)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise DashboardError(f"no MLflow experiment named {experiment!r} at {uri}")
    eid = exp.experiment_id
    parent = parent_run_id(client, eid)
    uploaded: list[str] = []
    removed: list[str] = []
    if parent is not None:
        uploaded, removed = upload_report(client, uri, parent, files, artifact_dir)
        log.debug("report logged to run %s: %d files under %s/, %d stale removed", parent, len(uploaded),
                  artifact_dir, len(removed))
    metrics = headline_metrics(datasets)
    shown, others = tag_shown_wers(client, eid) if metrics else (0, [])
    metrics += others
    view = save_view(client, eid, exp.tags, metrics) if metrics else None
    report = report_link(eid, parent, artifact_dir) if parent is not None else None
    if view or report:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        client.set_experiment_tag(eid, NOTE_TAG, with_note_line(exp.tags.get(NOTE_TAG, ""),
                                                                note_line(view, report, when)))
    return Published(eid, parent, tuple(uploaded), tuple(removed), tuple(metrics), view, report, shown)
