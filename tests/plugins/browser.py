"""Headless Chromium for the tests: the `browser_page` fixture, `save_screenshot`, and helpers for the MLflow UI.

Playwright drives Debian's /usr/bin/chromium (Playwright's own browser downloads are not reachable here, and
never needed: the Debian package is the browser). One browser per session with a fresh profile in a temporary
folder; each test gets a new page. Screenshots go to artifacts/screenshots/, which CI keeps.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, Page

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT_DIR = REPO / "artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",  # the tests run as root, where Chromium's sandbox cannot start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    """The Chromium to drive: $CHROMIUM, else Debian's /usr/bin/chromium, else one on PATH."""
    for candidate in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def save_screenshot(page: Page, name: str, *, full_page: bool = True) -> Path:
    """Saves a PNG of PAGE as artifacts/screenshots/NAME.png (NAME sanitised to letters, digits, '-', '_', '.')."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "screenshot"
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOT_DIR / f"{safe}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


@pytest.fixture(scope="session")
def browser_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    """One headless Chromium for the session, with a fresh user-data-dir."""
    executable = chromium_path()
    if executable is None:
        message = "no Chromium found (install the Debian package `chromium`, or set CHROMIUM=/path/to/chromium)"
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=executable,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1600, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Keeps each phase's report on the item, so that `browser_page` knows whether the test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"_browser_report_{report.when}", report)


@pytest.fixture
def browser_page(browser_context: BrowserContext, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A new page in the session's headless Chromium; closed (and cookies cleared) after the test. When the
    test fails, the page is saved as artifacts/screenshots/FAILED-<test>.png first."""
    page = browser_context.new_page()
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        report = getattr(request.node, "_browser_report_call", None)
        if report is not None and report.failed:
            try:
                save_screenshot(page, f"FAILED-{request.node.name}")
            except Exception as exc:  # a failed screenshot must not hide the test's own failure
                print(f"could not save the failure screenshot: {exc}")
        page.close()
        browser_context.clear_cookies()


# --- the MLflow UI (3.x) ----------------------------------------------------------------------------------------

# A cell of the run table's "Run Name" column (an ag-grid cell); its link's text is the run name.
RUN_NAME_CELL = '[role=gridcell][col-id="attributes.`Run Name`"]'
# The expander of a collapsed parent row shows a plus-in-a-square icon; an expanded one shows minus.
COLLAPSED_EXPANDER = f'{RUN_NAME_CELL} button:has(path[d^="M7.25 7.25V4.5"])'


def open_mlflow_run_list(page: Page, tracking_uri: str, experiment_id: str, timeout_s: float = 90) -> None:
    """Opens the experiment's run table and waits until the React app has rendered its first row.

    In MLflow 3.x the table ("Training runs") lives at #/experiments/<id>/runs; plain #/experiments/<id> opens
    the GenAI overview instead. The assistant side panel, which covers part of the table, is closed."""
    page.goto(f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs")
    page.locator(f"{RUN_NAME_CELL} a").first.wait_for(timeout=timeout_s * 1000)
    close = page.get_by_role("button", name="Close")
    if close.count():
        close.first.click()


def show_mlflow_runs(page: Page, names: list[str], timeout_s: float = 60) -> None:
    """Expands parent rows until every run in NAMES is listed in the open run table; raises TimeoutError naming
    the runs still missing.

    MLflow nests child runs under their parent, collapsed, and the table may re-render (and collapse again) while
    its data loads, so this checks and expands in a loop rather than clicking once."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [n for n in names if page.get_by_role("link", name=n, exact=True).count() == 0]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the MLflow run table does not list {missing} after {timeout_s:.0f}s")
        expanders = page.locator(COLLAPSED_EXPANDER)
        if expanders.count() == 0:  # an icon this helper does not know: toggle every expander instead
            expanders = page.locator(f"{RUN_NAME_CELL} button")
        for i in range(expanders.count()):
            try:
                expanders.nth(i).click(timeout=5_000)
            except Exception:  # the table re-rendered under the click; the next round looks again
                break
        page.wait_for_timeout(1_000)


def open_link_in_new_page(page: Page, text: str, timeout_s: float = 30) -> Page:
    """Clicks the first link on PAGE whose text contains TEXT and that opens a new tab (target=_blank, as MLflow
    renders the links of descriptions), and returns the new tab once it has loaded."""
    link = page.locator("a", has_text=text).first
    link.wait_for(timeout=timeout_s * 1000)
    with page.context.expect_page(timeout=timeout_s * 1000) as opened:
        link.click()
    new = opened.value
    new.set_default_timeout(timeout_s * 1000)
    new.wait_for_load_state()
    return new


def mlflow_run_rows(page: Page) -> dict[str, dict[str, str]]:
    """The rows the open MLflow run table has rendered, by run name: {run name: {column id: cell text}}.

    ag-grid draws the pinned columns (run name, date) and the others in separate row elements that share a
    `row-index`; they are joined on it. Column ids are MLflow's, e.g. metrics.`wer/dev`; a missing value is '-'."""
    rows = page.evaluate(
        """() => {
          const byIndex = {};
          for (const row of document.querySelectorAll('[role=row][row-index]')) {
            const cells = byIndex[row.getAttribute('row-index')] ??= {};
            for (const cell of row.querySelectorAll('[role=gridcell][col-id]')) {
              const link = cell.querySelector('a');
              cells[cell.getAttribute('col-id')] = (link ?? cell).innerText.trim();
            }
          }
          return Object.values(byIndex);
        }"""
    )
    name = "attributes.`Run Name`"
    return {r[name]: r for r in rows if r.get(name)}
