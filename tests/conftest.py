"""Session fixtures shared by the test suite (the local SLURM cluster, an MLflow server, headless Chromium, the quick
demo), the groups that let two workers run the suite at once, and the check that it writes nothing into the checkout.

``./scripts/test.sh`` runs the suite on two pytest-xdist workers (``--dist loadgroup``). The tests of the quick demo
go to one worker, so the demo runs once, and so do the tests of a module that share a module-scoped fixture.
Everything else is spread over both workers; each worker that needs them has
its own SLURM test cluster (start.sh picks free ports and its own state folder), MLflow server and browser.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest_plugins = ["tests.plugins.slurm_cluster", "tests.plugins.mlflow_server", "tests.plugins.browser",
                  "tests.plugins.demo"]

REPO = Path(__file__).resolve().parents[1]
# What a test run may leave in the checkout: the environment scripts/setup.sh made, CI's reports, Python's bytecode.
ALLOWED = (".venv/", "artifacts/", "__pycache__/", "long_context_asr_study.egg-info/")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (its worker hook is registered after this file)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = _test_seconds()
    for item in items:
        demo = "quick_demo" in getattr(item, "fixturenames", ())
        if demo:
            item.add_marker(pytest.mark.xdist_group("demo"))
        elif item.get_closest_marker("xdist_group") is None and _uses_module_fixture(item):  # built once, not per worker
            item.add_marker(pytest.mark.xdist_group(f"module-{item.nodeid.split('::')[0]}"))
        # the fast tier ("not slow") leaves out what needs the quick demo and every test that took FAST_LIMIT_S
        # or more in the recorded run
        if demo or tests.get(item.nodeid, 0.0) >= FAST_LIMIT_S:
            item.add_marker(pytest.mark.slow)


FAST_LIMIT_S = 4.0


def _uses_module_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a module-scoped fixture (a trained model, a server): the tests of its module that do
    then go to one worker together, so the fixture is built once and not once per worker."""
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) if info is not None else {}
    return any(d and getattr(d[-1], "scope", None) == "module" for d in defs.values())


def _test_seconds() -> dict[str, float]:
    """{test node id: seconds} from tests/durations.json (scripts/test_durations.py), the tests of a recorded run of
    the suite that took a second or more; empty if it is missing or unreadable."""
    try:
        table = json.loads((REPO / "tests" / "durations.json").read_text())
        return {str(k): float(v) for k, v in table.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _checkout_paths() -> set[str] | None:
    """Untracked and ignored paths of the checkout (folders as one entry), or None outside a git checkout."""
    r = subprocess.run(["git", "status", "--porcelain", "--ignored=matching", "--untracked-files=normal"],
                       cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return {line[3:] for line in r.stdout.splitlines() if line[:2] in ("??", "!!")}


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller (or a run without workers) checks
        session.config.stash[_BEFORE] = _checkout_paths()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_BEFORE, None)
    after = _checkout_paths() if before is not None else None
    if before is None or after is None:
        return
    new = sorted(p for p in after - before if not any(p.endswith(a) or p.startswith(a) for a in ALLOWED))
    if new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = f"the test run wrote into the checkout {REPO}: {', '.join(new)}; tests write under tmp_path only"
        if reporter is not None:
            reporter.write_line(text, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_BEFORE = pytest.StashKey[set[str] | None]()


@pytest.fixture(scope="session", autouse=True)
def _report_cache_is_the_sessions_own(tmp_path_factory: pytest.TempPathFactory):
    """``python -m analysis report`` keeps finished runs' tables in a cache (:mod:`analysis.ledger.cache`, by default under
    ~/.cache): the tests' reports keep theirs in a folder of the session, unless a test names another."""
    import os

    from analysis.ledger.cache import CACHE_ENV

    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("report-cache"))
    yield
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before


@pytest.fixture(autouse=True)
def _stop_signals_are_the_tests_own():
    """The stop-signal handlers as each test found them: a command run in-process (``train``, ``trial``, ``lm
    train``) installs them for good, as a job needs, and a signal one test sends itself would then stay recorded and
    stop every later training in the worker."""
    from asr_core.runtime import signals

    was = signals.is_installed()
    yield
    if not was:
        signals.uninstall()


@pytest.fixture(autouse=True)
def _tracking_uri_stays_put():
    """``MLFLOW_TRACKING_URI`` as each test found it: ``mlflow.set_tracking_uri`` sets it for the whole process, and
    every command honours it (the ledger's address rule), so one test's ledger must not become the next test's."""
    import os

    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before
