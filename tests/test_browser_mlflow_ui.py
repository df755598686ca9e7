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
