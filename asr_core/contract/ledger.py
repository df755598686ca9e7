"""The sweep's saved view of the MLflow runs table, and the experiment description line linking to it: the contract
between the ledger, which saves the view when a sweep is first submitted (so the dashboard shows every trial's WER
columns before any report), and ``python -m analysis report``, which rewrites it with the datasets the runs logged and
adds the link to the report (:mod:`analysis.dashboard`, whose docstring says what MLflow's UI does with these).

A saved view is an experiment tag ``mlflow.sharedViewState.<id>`` whose value is ``{"name", "createdAt", "updatedAt",
"state"}`` (``state``: the runs page's state as JSON text), opened by
``#/experiments/<experiment>/runs?viewStateShareKey=<id>``. All pure.

The view's columns are the trial's label (the name ``orchestrate status`` prints; the run name is a short form of it)
and the *shown WERs*: run tags ``WER <dataset>`` (:func:`shown_tag`) holding the clean greedy WER ``wer/<dataset>``
rounded to 2 decimals (:func:`shown_value`), and ``WER <dataset> <decoder>`` each other decoder's
(``wer_<decoder>/<dataset>``: beam search, fusion, other windows). MLflow's runs table prints a metric with every digit
(``18.197260273972602``, cut to ``18.19726…`` by the column), and no setting of the page or the server formats
it; a tag is printed as it is. The metric stays the record (and what ``analysis`` reads); the tag is written beside
it by ``evaluate`` and ``score`` when they log the metric, and by ``python -m analysis report`` for runs that lack
it (logged before, or by other tools). A tag column sorts as text, so the view keeps sorting by run name.
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any, Iterable, Mapping, Sequence

from asr_core.contract.metrics import CLEAN, GREEDY, metric_key, parse_decoder_metric_key
from asr_core.contract.tracking import sqlite_file
from asr_core.contract.trial import ROLE_PARENT, TAG_LABEL, TAG_ROLE

log = logging.getLogger(__name__)

VIEW_ID = "sweep-wer"  # the saved view's id: one per experiment, rewritten by every report
VIEW_NAME = "WER per run (analysis report)"
VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # the UI's prefix of saved-view tags
VIEW_URL_PARAM = "viewStateShareKey"  # the URL parameter that opens a saved view
NOTE_TAG = "mlflow.note.content"  # the experiment's description, Markdown
NOTE_START = "**Sweep report**"  # the description line this module owns starts with this
RUN_NAME_SORT_KEY = "tags.`mlflow.runName`"  # the UI's sort key of the Run Name column
NOT_PARENT_FILTER = f"tags.`{TAG_ROLE}` != '{ROLE_PARENT}'"


def headline_metrics(datasets: Iterable[str]) -> list[str]:
    """The clean WER metrics of ``datasets`` as the trials log them, ``wer/<dataset>``, sorted by dataset. A name with
    a backtick cannot be written as a column of the UI and is left out (with a warning)."""
    out = []
    for ds in sorted(set(datasets)):
        if "`" in ds:
            log.warning("dataset %r has a backtick in its name; the MLflow view cannot show its column", ds)
            continue
        out.append(metric_key(ds))
    return out


def metric_column(metric: str) -> str:
    """The UI's column id of a metric: ``metrics.`wer/dev```."""
    return f"metrics.`{metric}`"


SHOWN_DIGITS = 2  # decimals of the WERs the view shows


def shown_tag(dataset: str, decoder: str = GREEDY) -> str:
    """The run tag the saved view shows for the clean WER of ``dataset`` by ``decoder``: ``WER test`` (the trial's
    own greedy decoding), ``WER test beam-lm1024`` (another decoder's, ``wer_beam-lm1024/test``)."""
    return f"WER {dataset}" if decoder == GREEDY else f"WER {dataset} {decoder}"


SHOWN_WIDTH = 6  # "100.00": padded with spaces on the left, so that sorting the column (as text) sorts the WERs


def shown_value(wer: float) -> str:
    """A WER (percent) as the view shows it: ``18.197…`` -> ``" 18.20"`` (a tag is text, and MLflow sorts a tag
    column as text: right-aligned in a fixed width, text order is numeric order up to 999.99%)."""
    return f"{wer:{SHOWN_WIDTH}.{SHOWN_DIGITS}f}"


def shown_tags(metrics: Mapping[str, float]) -> dict[str, str]:
    """The shown-WER tags of the clean WERs of every decoder (``wer/<dataset>``, ``wer_<decoder>/<dataset>``) among
    ``metrics``; NaN is left out."""
    out = {}
    for key, value in metrics.items():
        parsed = parse_decoder_metric_key(key)
        if parsed is not None and parsed[2] == CLEAN and "`" not in key and math.isfinite(value):
            out[shown_tag(parsed[1], parsed[0])] = shown_value(value)
    return out


def decoder_metrics(keys: Iterable[str]) -> list[str]:
    """The clean WERs of decoders other than the trials' own among metric ``keys`` (``wer_<decoder>/<dataset>``),
    sorted by decoder and dataset, each once: the view's columns after the headline ones."""
    found = set()
    for key in keys:
        parsed = parse_decoder_metric_key(key)
        if parsed is not None and parsed[0] != GREEDY and parsed[2] == CLEAN and "`" not in key:
            found.add((parsed[0], parsed[1], key))
    return [key for _, _, key in sorted(found)]


def tag_column(tag: str) -> str:
    """The UI's column id of a run tag: ``tags.`WER dev```."""
    return f"tags.`{tag}`"


LABEL_COLUMN = tag_column(TAG_LABEL)  # the trial's label, as `orchestrate status` names it


def view_columns(metrics: Sequence[str]) -> list[str]:
    """The view's column ids: the trial's label (:data:`LABEL_COLUMN`, the name ``orchestrate status`` prints), then
    the shown-WER tags of ``metrics`` (clean WERs: ``wer/<dataset>``, ``wer_<decoder>/<dataset>``)."""
    out = [LABEL_COLUMN]
    for m in metrics:
        parsed = parse_decoder_metric_key(m)
        if parsed is None or parsed[2] != CLEAN:
            raise ValueError(f"{m!r} is not a clean WER metric (wer/<dataset> or wer_<decoder>/<dataset>); the view "
                             "shows only those")
        out.append(tag_column(shown_tag(parsed[1], parsed[0])))
    return out


def view_state(metrics: Sequence[str]) -> dict[str, Any]:
    """The runs page's state of the saved view: the trial's label and the shown WERs of ``metrics`` as the visible
    columns, every run but the parent, listed flat by run name. Fields left out keep the UI's defaults."""
    return {
        "selectedColumns": view_columns(metrics),
        "searchFilter": NOT_PARENT_FILTER,
        "orderByKey": RUN_NAME_SORT_KEY,
        "orderByAsc": True,
        "runsHiddenMode": "SHOW_ALL",  # charts of this view draw every run, not the UI's first ten
    }


def saved_view_value(metrics: Sequence[str], *, created_ms: int, now_ms: int) -> str:
    """The experiment tag's value of the saved view (the UI's envelope, its state as plain JSON text)."""
    return json.dumps({"name": VIEW_NAME, "createdAt": created_ms, "updatedAt": now_ms,
                       "state": json.dumps(view_state(metrics), separators=(",", ":"))}, separators=(",", ":"))


def view_created_ms(existing: str | None, default: int) -> int:
    """``createdAt`` of an existing saved-view tag value, or ``default`` when there is none or it is unreadable."""
    try:
        value = json.loads(existing) if existing else None
    except ValueError:
        return default
    created = value.get("createdAt") if isinstance(value, dict) else None
    return created if isinstance(created, int) else default


def view_link(experiment_id: str) -> str:
    """The UI route of the saved view."""
    return f"#/experiments/{experiment_id}/runs?{VIEW_URL_PARAM}={VIEW_ID}"


def note_line(view: str | None, report: str | None, when: str, source: str = "python -m analysis report") -> str:
    """The description line: links to the saved view and the report (routes relative to the UI's own address),
    with when and by which command it was written."""
    parts = []
    if report:
        parts.append(f"[the report]({report})")
    if view:
        parts.append(f"[every run with its WER columns]({view})")
    return f"{NOTE_START} ({when}, `{source}`): " + " · ".join(parts)


def with_note_line(description: str, line: str) -> str:
    """``line`` first (the UI shows a description folded to its first line), then ``description`` without its
    earlier :data:`NOTE_START` lines: everything else people wrote is kept."""
    kept = "\n".join(ln for ln in description.splitlines() if not ln.startswith(NOTE_START)).strip("\n")
    return f"{line}\n\n{kept}" if kept.strip() else line


def artifact_location(tracking_uri: str | None, experiment: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside the database for a ``sqlite:///PATH`` store, since MLflow's
    default there (``./mlruns``) is whatever folder the command happens to run in; None (the server's own
    ``--artifacts-destination``) for every other store."""
    db = sqlite_file(tracking_uri or "")
    if db is None:
        return None
    return (db.resolve().parent / "artifacts" / re.sub(r"[^A-Za-z0-9._-]", "_", experiment)).as_uri()


def experiment_id(client: Any, name: str) -> str:
    """The id of the experiment called ``name`` on ``client`` (an ``MlflowClient``), created with
    :func:`artifact_location` when there is none yet."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    return client.create_experiment(name, artifact_location=artifact_location(client.tracking_uri, name))
