"""In a real browser: the MLflow UI of a real server lists every run of a sweep (parent and trials).

The sweep is laid out as orchestrate's ledger lays it out (docs/ARCHITECTURE.md): one experiment, a parent run
tagged sweep.role=parent, one child run per trial tagged with mlflow.parentRunId and a readable trial label.
"""

from __future__ import annotations

import time

import pytest

from tests.plugins.browser import RUN_NAME_CELL, open_mlflow_run_list, save_screenshot, show_mlflow_runs
from tests.plugins.mlflow_server import MlflowServer

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

# The helpers live in tests.plugins.browser; this name stays for tests that imported it from here.
show_runs = show_mlflow_runs

def _make_sweep(server: MlflowServer, name: str, labels: list[str]) -> str:
    client = server.client()
    exp = client.create_experiment(name)
    parent = client.create_run(exp, run_name=name, tags={"sweep.role": "parent", "sweep.backend": "slurm"})
    for i, label in enumerate(labels):
        child = client.create_run(
            exp,
            run_name=label,
            tags={"mlflow.parentRunId": parent.info.run_id, "sweep.role": "trial", "trial.label": label},
        )
        client.log_metric(child.info.run_id, "wer/dev", 30.0 - 5 * i)
        client.set_terminated(child.info.run_id, "FINISHED")
    client.set_terminated(parent.info.run_id, "FINISHED")
    return exp


def test_mlflow_ui_lists_every_run_of_a_sweep(mlflow_server: MlflowServer, browser_page) -> None:
    sweep = f"ui-sweep-{time.time_ns() % 10**8}"
    labels = ["ctx5s-rope1.5M-tiny-s0", "ctx10s-rope1.5M-tiny-s0", "ctx20s-rope1.5M-tiny-s1", "ctx80s-none-tiny-s1"]
    exp = _make_sweep(mlflow_server, sweep, labels)

    page = browser_page
    open_mlflow_run_list(page, mlflow_server.uri, exp)
    show_mlflow_runs(page, [sweep, *labels])

    listed = [t.strip() for t in page.locator(f"{RUN_NAME_CELL} a").all_inner_texts()]
    assert sorted(listed) == sorted([sweep, *labels])
    shot = save_screenshot(page, "mlflow-ui-run-list", full_page=False)
    assert shot.stat().st_size > 10_000


_CUT_JS = (  # the text's laid-out right edge (an ellipsis only paints over it) and the right edge of what shows it
    "el => { const r = document.createRange(); r.selectNodeContents(el); let right = Infinity;"
    " for (let e = el; e; e = e.parentElement) { if (getComputedStyle(e).overflowX !== 'visible')"
    " right = Math.min(right, e.getBoundingClientRect().right); if (e.getAttribute('role') === 'gridcell') break; }"
    " return [r.getBoundingClientRect().right, right]; }")


def _cut(page, names: list[str]) -> dict[str, float]:
    """{name: pixels cut off} of the run names in NAMES the open run table shows cut."""
    out = {}
    for n in names:
        text_right, shown_right = page.get_by_role("link", name=n, exact=True).first.evaluate(_CUT_JS)
        if text_right > shown_right + 0.5:
            out[n] = text_right - shown_right
    return out


def test_run_names_the_ledger_gives_are_shown_whole(mlflow_server: MlflowServer, browser_page, tmp_path) -> None:
    """The Run Name column (190 px) cut the labels (``ctx82s-rope1....``): the ledger's run names of the paper grid
    show whole in the sweep's saved view (a flat list), and those of its main model also nested under the parent
    (the default view)."""
    from asr_core.contract.ledger import view_link
    from orchestrate.plan.grid import load_grid
    from orchestrate.ledger.ledger import RUN_NAME_CHARS, Ledger, run_names

    trials = list(load_grid("grids/paper.yaml").trials)
    names = run_names(trials)
    assert max(map(len, names.values())) <= RUN_NAME_CHARS  # every name of the grid, e.g. 3600s 3x2048 16h s1
    kinds: dict[str, object] = {}  # per kind of name (what differs from the main model), its longest
    for t in sorted(trials, key=lambda t: len(names[t.key])):
        kinds[" ".join(names[t.key].split()[1:-1])] = t
    fitting = list(kinds.values())
    ledger = Ledger(mlflow_server.uri, f"names-{time.time_ns() % 10**8}")
    parent = ledger.ensure_sweep("grids/paper.yaml", "local", "id-names", str(tmp_path), datasets=["test"])
    ledger.create_trial_runs(parent, fitting, "local", sweep=trials)
    shown = [names[t.key] for t in fitting]

    page = browser_page
    open_mlflow_run_list(page, mlflow_server.uri, ledger.experiment_id)
    show_mlflow_runs(page, shown)
    main = [n for n in shown if len(n.split()) == 2]  # context and seed: the main model
    assert main and _cut(page, main) == {}
    page.goto(f"{mlflow_server.uri}/{view_link(ledger.experiment_id)}")
    page.get_by_role("link", name=shown[0], exact=True).first.wait_for()
    assert _cut(page, shown) == {}, shown
    save_screenshot(page, "mlflow-ui-run-names", full_page=False)
