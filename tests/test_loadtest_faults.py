"""The load test's fault phase (``python -m orchestrate.loadtest``, :func:`orchestrate.tools.loadtest.run_fault_phase`):
trainers log through the trial job's outbox to a real ``mlflow server`` behind
:class:`orchestrate.tools.flaky_proxy.FlakyProxy`, which answers 400s and 5xx for a while; every point must be in
its run exactly once, nothing kept as refused or left unshipped. Run as a person runs it, in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrate.tools.flaky_proxy import Fault, FlakyProxy

ROOT = Path(__file__).resolve().parents[1]


def test_the_proxy_forwards_then_answers_mlflow_errors_for_a_while_then_forwards_again(mlflow_server) -> None:
    import requests

    url = "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default"
    with FlakyProxy(mlflow_server.uri) as proxy:
        assert requests.get(proxy.uri + url, timeout=30).status_code == 200
        proxy.fail(60, [Fault(400, "BAD_REQUEST"), Fault(503, "TEMPORARILY_UNAVAILABLE", forward=True)])
        first, second = (requests.get(proxy.uri + url, timeout=30) for _ in range(2))
        assert (first.status_code, first.json()["error_code"]) == (400, "BAD_REQUEST")
        assert (second.status_code, second.json()["error_code"]) == (503, "TEMPORARILY_UNAVAILABLE")
        assert requests.get(proxy.uri + "/health", timeout=30).status_code == 200  # only the API is faulted
        proxy.heal()
        assert requests.get(proxy.uri + url, timeout=30).json()["experiment"]["name"] == "Default"
        assert proxy.faulted == 2 and proxy.forwarded == 4 and proxy.by_status == {400: 1, 503: 1}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_loadtest_fault_phase_loses_and_doubles_no_point(mlflow_server) -> None:
    p = subprocess.run([sys.executable, "-m", "orchestrate.loadtest", "--tracking-uri", mlflow_server.uri, "--processes", "2",
                        "--seconds", "3", "--fault-seconds", "4", "--fault-processes", "2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=280)
    print(p.stdout)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    head, row = [line.split("  ") for line in p.stdout.strip().splitlines()[-3::2]]
    cells = dict(zip([h.strip() for h in head if h.strip()], [c.strip() for c in row if c.strip()]))
    assert cells["lost"] == "0" and cells["duplicated"] == "0" and cells["kept"] == "0" and cells["left"] == "0"
    assert int(cells["points logged"]) >= 2 * 8 * 6  # 2 trainers, 8 s at a quarter of 4 steps/s at least, 6 metrics
    faulted = dict(x.split("x") for x in cells["faulted requests"].split())
    assert int(faulted.get("400", 0)) >= 1, cells  # the phase did reach the shippers
