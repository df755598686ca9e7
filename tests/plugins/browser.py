"""Headless Chromium for the tests: the `browser_page` fixture and `save_screenshot`.

Playwright drives Debian's /usr/bin/chromium (Playwright's own browser downloads are not reachable here, and
never needed: the Debian package is the browser). One browser per session with a fresh profile in a temporary
folder; each test gets a new page. Screenshots go to artifacts/screenshots/, which CI keeps.
"""

from __future__ import annotations

import os
import re
import shutil
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


@pytest.fixture
def browser_page(browser_context: BrowserContext) -> Iterator[Page]:
    """A new page in the session's headless Chromium; closed (and cookies cleared) after the test."""
    page = browser_context.new_page()
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        page.close()
        browser_context.clear_cookies()
