"""In a real browser: the quick demo's report renders its figures, and the MLflow UI lists every trial of the demo
sweep. Screenshots go to artifacts/screenshots/."""

from __future__ import annotations

import pytest

from tests.plugins.browser import RUN_NAME_CELL, open_mlflow_run_list, save_screenshot, show_mlflow_runs
from tests.plugins.demo import QuickDemo
from tests.test_demo import TRIALS
from tests.plugins.mlflow_server import start_server, stop_server

# No per-test timeout: the first test here also runs the quick demo (the session fixture); the global one applies.
pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_demo_report_renders_every_figure(quick_demo: QuickDemo, browser_page) -> None:
    assert quick_demo.first.returncode == 0, quick_demo.first.output[-3000:]
    page = browser_page
    page.goto((quick_demo.root / "report" / "index.html").resolve().as_uri())
    images = page.locator("img")
    body = page.locator("body").inner_text()
    assert "Left out: every configuration" not in body and "No figure is drawn" not in body  # the models learned
    assert images.count() >= 2
    for i in range(images.count()):  # every embedded figure decoded into real pixels, drawn wide enough to read
        img = images.nth(i)
        img.scroll_into_view_if_needed()
        width = img.evaluate("el => el.complete ? el.naturalWidth : 0")
        assert width > 100, f"figure {i} did not render ({img.get_attribute('alt')})"
        assert img.evaluate("el => el.getBoundingClientRect().width") >= 800, img.get_attribute("alt")
    assert "WERR" in body and "significan" in body.lower()
    assert save_screenshot(page, "demo-report").stat().st_size > 20_000


def test_mlflow_ui_lists_every_demo_trial(quick_demo: QuickDemo, browser_page, tmp_path) -> None:
    client = __import__("mlflow").tracking.MlflowClient(tracking_uri=quick_demo.tracking_uri)
    exp = client.get_experiment_by_name("demo-quick")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    names = sorted(r.info.run_name for r in runs)
    assert len(names) == TRIALS + 1  # the sweep's parent and the trials
    server = start_server(tmp_path / "ui", extra=["--backend-store-uri", quick_demo.tracking_uri])
    try:
        page = browser_page
        open_mlflow_run_list(page, server.uri, exp.experiment_id)
        show_mlflow_runs(page, names)
        listed = sorted(t.strip() for t in page.locator(f"{RUN_NAME_CELL} a").all_inner_texts())
        assert listed == names
        save_screenshot(page, "demo-mlflow-runs", full_page=False)
    finally:
        stop_server(server.process)
