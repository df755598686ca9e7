"""One rule for the ledger's address, in every command (:func:`asr_core.contract.tracking.tracking_uri`):
``--tracking-uri``, else the sweep folder's recorded URI (commands on a sweep), else ``MLFLOW_TRACKING_URI``, else
``sqlite:///SWEEP_ROOT/mlflow.db`` (``./runs``); a lookup never creates a ledger file.

Against a real ``mlflow server``; the sweep's one trial fails at once (its data is missing), which is all the
ledger side needs: the experiment, its parent run and the trial's run exist where the rule says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = "MLFLOW_TRACKING_URI"
GRID = """\
name: address
seeds: [1]
base:
  preset: tiny
  data: {train: podcast:nowhere/train, context_s: 5.12}
  train: {max_steps: 2, device: cpu, precision: fp32}
subgrids:
  one: {section: "one trial"}
"""


def _run(cwd: Path, env: dict[str, str], *argv: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != ENV}
    full.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=timeout)


def _ledger_files(where: Path) -> list[Path]:
    return sorted(p for p in where.rglob("*.db"))


def test_the_rule_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from asr_core.contract.tracking import default_tracking_uri, tracking_uri

    monkeypatch.delenv(ENV, raising=False)
    root = tmp_path / "runs"
    assert tracking_uri(None, sweep_root=root) == default_tracking_uri(root) == f"sqlite:///{root}/mlflow.db"
    monkeypatch.setenv(ENV, "http://env:1")
    assert tracking_uri(None, sweep_root=root) == "http://env:1"
    (root / "s").mkdir(parents=True)
    (root / "s" / "sweep.json").write_text(json.dumps({"tracking_uri": "http://recorded:2"}))
    assert tracking_uri(None, sweep_root=root, sweep="s") == "http://recorded:2"
    assert tracking_uri(None, sweep_root=root, sweep="other") == "http://env:1"
    assert tracking_uri("http://given:3", sweep_root=root, sweep="s") == "http://given:3"
    monkeypatch.delenv(ENV)
    assert tracking_uri(None, local_default=False) is None  # a standalone trainer command: no ledger unless named
    from asr_core.contract.tracking import bad_uri, missing_ledger

    assert missing_ledger(default_tracking_uri(root)) and str(root / "mlflow.db") in missing_ledger(
        default_tracking_uri(root))
    assert missing_ledger("http://h:1") is None and bad_uri("http://h:1") is None
    assert bad_uri("postgresql+psycopg2://u@h/db") is None and bad_uri(default_tracking_uri(root)) is None
    assert "bogus://x" in bad_uri("bogus://x") and "./mlruns" in bad_uri("./mlruns")
    assert not list(tmp_path.rglob("*.db"))


@pytest.mark.slow  # a local sweep (Ray Tune) against a real server: about a minute
def test_only_mlflow_tracking_uri_set_every_command_uses_it(tmp_path: Path, mlflow_server) -> None:  # noqa: ANN001
    (tmp_path / "grid.yaml").write_text(GRID)
    env = {ENV: mlflow_server.uri}
    sub = _run(tmp_path, env, "-m", "orchestrate", "submit", "grid.yaml", "--backend", "local", "--no-check-data")
    manifest = json.loads((tmp_path / "runs" / "address" / "sweep.json").read_text())
    assert manifest["tracking_uri"] == mlflow_server.uri, sub.stderr[-2000:]
    exp = mlflow_server.client().get_experiment_by_name("address")
    assert exp is not None and mlflow_server.client().search_runs([exp.experiment_id])
    status = _run(tmp_path, env, "-m", "orchestrate", "status", "address")
    assert status.returncode == 0, status.stderr[-2000:]
    for argv in (["report", "address", "--out", "r", "--no-log"], ["compare", "address", "5.12", "10.24"]):
        done = _run(tmp_path, env, "-m", "analysis", *argv)
        assert "no experiment named" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    # the old spelling still reads the same ledger
    old = _run(tmp_path, env, "-m", "analysis", "report", "--experiment", "address", "--out", "r2", "--no-log")
    assert "no experiment named" not in old.stderr and "deprecated" in old.stderr, old.stderr[-2000:]
    assert _ledger_files(tmp_path) == [], "a ledger file was created beside the server"


def test_a_failed_lookup_creates_no_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "mlflow.db"
    done = _run(tmp_path, {}, "-m", "analysis", "report", "paper", "--tracking-uri", f"sqlite:///{missing}",
                "--out", "r")
    assert done.returncode == 2 and str(missing) in done.stderr, done.stderr[-2000:]  # a bad input
    assert "Traceback" not in done.stderr
    # no URI anywhere: the documented default (./runs/mlflow.db) is looked for, and not created
    done = _run(tmp_path, {}, "-m", "analysis", "report", "--experiment", "paper", "--out", "r")
    assert done.returncode == 2 and "runs/mlflow.db" in done.stderr, done.stderr[-2000:]
    done = _run(tmp_path, {}, "-m", "analysis", "compare", "paper", "a", "b")
    assert done.returncode == 2 and "runs/mlflow.db" in done.stderr, done.stderr[-2000:]
    assert not missing.parent.exists() and _ledger_files(tmp_path) == [] and not (tmp_path / "r").exists()
