"""In a real browser: a sweep's report in the MLflow UI.

``python -m analysis report`` logs the report to the sweep's parent run and saves a view of the runs table with the
clean WER columns; the experiment's description links to both (analysis/dashboard.py says why a link: MLflow 3.17
keeps a table's visible columns in the browser, never on the server). The sweep is the synthetic one of
tests/fixtures/analysis (a parent run, trials with the metric names real trials log, ``wer/<dataset>`` and
``wer/<dataset>/snr<DB>``, their per-recording tables, and unfinished trials), logged to a real ``mlflow server``
with served artifacts. Screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from analysis.__main__ import main
from asr_core.contract.ledger import LABEL_COLUMN, VIEW_ID, shown_tag, shown_value, tag_column
from tests.plugins.browser import mlflow_run_rows, open_link_in_new_page, open_mlflow_run_list, save_screenshot
from tests.plugins.mlflow_server import MlflowServer

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "analysis"))
import synthetic_sweep as synth  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


@dataclass(frozen=True)
class Reported:
    uri: str
    experiment: str
    experiment_id: str
    parent_run_id: str
    out: Path  # the report folder written by the command


def _log_sweep(server: MlflowServer, name: str) -> tuple[str, str]:
    """The synthetic sweep as the ledger and the trials log it, artifacts served by the server (its default
    location); returns (experiment id, parent run id)."""
    records = synth.make_records()
    ids = synth.write_to_mlflow(records, server.uri, None, name)
    parent = next(r.run_id for r in records if r.tags.get("sweep.role") == "parent")
    return server.client().get_experiment_by_name(name).experiment_id, ids[parent]


@pytest.fixture(scope="module")
def reported(mlflow_server: MlflowServer, tmp_path_factory: pytest.TempPathFactory) -> Reported:
    name = f"dashboard-sweep-{time.time_ns() % 10**8}"
    exp_id, parent = _log_sweep(mlflow_server, name)
    out = tmp_path_factory.mktemp("dashboard-report")
    rc = main(["report", "--experiment", name, "--tracking-uri", mlflow_server.uri, "--out", str(out),
               "--bootstrap", "200"])
    assert rc == 0
    return Reported(mlflow_server.uri, name, exp_id, parent, out)


def test_the_parent_run_holds_the_report_and_renders_it(reported: Reported, browser_page) -> None:
    page = browser_page
    open_mlflow_run_list(page, reported.uri, reported.experiment_id)
    run_page = open_link_in_new_page(page, "the report")  # the first line of the experiment's description
    assert f"/runs/{reported.parent_run_id}/artifacts/report/index.html" in run_page.url

    written = sorted(p.name for p in reported.out.iterdir())
    figures = [n for n in written if n.endswith(".png")]
    assert {"index.html", "report.md"} <= set(written) and figures
    tree = run_page.get_by_text("index.html", exact=True)
    tree.first.wait_for()
    for name in written:  # every file of the folder is listed among the parent run's artifacts
        assert run_page.get_by_text(name, exact=True).count() >= 1, name

    # MLflow shows .html in a sandboxed iframe; the report's figures are inline and decode there
    report = run_page.frame_locator("iframe.mlflow-html-iframe")
    report.locator("h1").wait_for()
    assert reported.experiment in report.locator("h1").inner_text()
    widths = report.locator("img").evaluate_all("els => els.map(e => e.complete ? e.naturalWidth : 0)")
    assert len(widths) == len(figures) and min(widths) > 100, widths
    # sized to read: each figure drawn at least 800 px wide (or the page's whole width, if narrower)
    shown = report.locator("img").evaluate_all(
        "els => els.map(e => [e.getBoundingClientRect().width, e.parentElement.getBoundingClientRect().width])")
    assert all(w >= min(800, page_w) - 1 for w, page_w in shown), shown
    assert "significan" in report.locator("body").inner_text().lower()
    assert save_screenshot(run_page, "dashboard-report-in-mlflow", full_page=False).stat().st_size > 20_000

    run_page.get_by_text(figures[0], exact=True).first.click()  # a .png artifact shows as an image
    image = run_page.locator("img[src^='blob:'] >> visible=true").first  # the artifact fetched, shown as a blob
    image.wait_for()
    run_page.wait_for_function("img => img.complete && img.naturalWidth > 100", arg=image.element_handle())
    assert save_screenshot(run_page, "dashboard-figure-in-mlflow", full_page=False).stat().st_size > 20_000
    run_page.close()


def test_the_runs_list_shows_every_wer_column_and_value(reported: Reported, browser_page) -> None:
    client = __import__("mlflow").tracking.MlflowClient(tracking_uri=reported.uri)
    runs = [r for r in client.search_runs([reported.experiment_id], max_results=100)
            if r.data.tags.get("sweep.role") != "parent"]
    metrics = sorted({k for r in runs for k in r.data.metrics if k.count("/") == 1 and k.startswith("wer/")})
    assert metrics == [f"wer/{ds}" for ds in sorted(synth.DATASETS)]  # what the trials log, clean

    page = browser_page
    open_mlflow_run_list(page, reported.uri, reported.experiment_id)
    view = open_link_in_new_page(page, "every run with its WER columns")
    assert f"viewStateShareKey={VIEW_ID}" in view.url
    columns = {m: tag_column(shown_tag(m.split("/", 1)[1])) for m in metrics}
    viewport = view.viewport_size
    assert viewport is not None
    for m, col in columns.items():  # in sight without a click on "Show more columns" or a scroll
        header = view.locator(f'[role=columnheader][col-id="{col}"]').first
        header.wait_for()
        assert header.inner_text().strip() == shown_tag(m.split("/", 1)[1])
        box = header.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"], (col, box)

    deadline = time.monotonic() + 30
    while len(rows := mlflow_run_rows(view)) < len(runs) and time.monotonic() < deadline:
        view.wait_for_timeout(500)
    # every trial is its own row (not folded under the parent, which the view leaves out) with its WERs
    assert sorted(rows) == sorted(r.info.run_name for r in runs)
    for r in runs:  # the label column: the name `orchestrate status` prints
        assert rows[r.info.run_name][LABEL_COLUMN].strip() == r.data.tags["trial.label"], r.info.run_name
        for m in metrics:
            cell = rows[r.info.run_name][columns[m]]
            if m in r.data.metrics:  # rounded to 2 decimals, as the report writes WERs
                assert cell.strip() == shown_value(r.data.metrics[m]).strip(), (r.info.run_name, m, cell)
            else:  # an unfinished trial
                assert cell == "-", (r.info.run_name, m, cell)
    assert save_screenshot(view, "dashboard-runs-wer-columns", full_page=False).stat().st_size > 20_000
    view.close()


def test_a_report_of_models_that_learned_nothing_shows_no_figure(browser_page, tmp_path: Path) -> None:
    """The quick demo's report drew flat-zero WERR figures after saying every run was left out."""
    from analysis.ledger.collect import build_sweep
    from analysis.document.report import build_report
    from tests.test_report import _family_records, _unlearned

    build_report(build_sweep("blank", _unlearned(_family_records())), tmp_path, bootstrap_resamples=100)
    page = browser_page
    page.goto((tmp_path / "index.html").resolve().as_uri())
    assert page.locator("img").count() == 0
    body = page.locator("body").inner_text()
    assert "Left out: every configuration" in body and "No figure is drawn" in body
    save_screenshot(page, "report-nothing-learned", full_page=False)
