"""Two sweep folders that give one shared `mlflow server` the same sweep name never touch each other's runs.

A sweep owns its experiment (tag ``sweep.id``, the id in its folder's ``sweep.json``). Here sweep folder A submits
a grid to a real server; then a second folder B, under another sweep root, tries the same grid under the same name
through the real CLI. B's ``submit`` exits 2 naming A's folder and ``--sweep``, before writing anything. B's
``status``/``resume``/``cancel`` from a folder of that name (one submitted to B's own sqlite ledger, then pointed
at the server by editing its sweep.json, or a copy of A's folder given another id) exit 2 too; pointing B's folder
at the server with ``--tracking-uri`` is refused before that (a second ledger for one sweep). Afterwards A's runs
(ids, states, tags, params, count) and A's files (bytes and mtimes) are exactly as before.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from asr_core.contract import trial as tc
from orchestrate.ledger.ledger import Ledger
from orchestrate.sweep.folder import SweepDir
from tests.folder_snapshot import snapshot
from tests.plugins.mlflow_server import MlflowServer

pytestmark = pytest.mark.timeout(900)

CLI_TIMEOUT_S = 300  # one CLI call imports MLflow and talks to the server; slow on 2 busy cores, never minutes
EXIT_USAGE = 2
EXIT_FAULT = 137  # ORCHESTRATE_FAULT: the dispatcher dies right after creating the runs


def _write_grid(directory: Path, name: str) -> Path:
    """A two-trial grid of the tiny preset; its data is never read (the trials are never started)."""
    path = directory / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        seeds: [1]
        base:
          preset: tiny
          data:
            train: podcast:{directory}/no-corpus/train
          train:
            max_steps: 2
            device: cpu
            precision: fp32
        subgrids:
          context:
            section: "ownership: context"
            axes:
              data.context_s: [5.12, 10.24]
        """))
    return path


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m orchestrate ARGS`` as a user runs it, with ORCHESTRATE_FAULT=after-runs: a call that gets as far
    as submitting dies before any trainer starts (A's first submit relies on it; for the calls that must be refused
    it turns a regression into a quick failure instead of minutes of training)."""
    env = {**os.environ, "ORCHESTRATE_FAULT": "after-runs"}
    return subprocess.run([sys.executable, "-m", "orchestrate", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S)


def _submit(cwd: Path, grid: Path, root: Path, uri: str | None) -> subprocess.CompletedProcess[str]:
    args = ["submit", str(grid), "--backend", "local", "--sweep-root", str(root), "--no-check-data"]
    return _cli(cwd, *args, *(["--tracking-uri", uri] if uri else []))


def _experiment(server: MlflowServer, name: str) -> dict[str, Any]:
    """The experiment named ``name`` and every run in it, with all that a sweep operation could change."""
    from mlflow.entities import ViewType

    client = server.client()
    exp = client.get_experiment_by_name(name)
    assert exp is not None, f"no experiment {name!r} on {server.uri}"
    runs = client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL, max_results=1000)
    return {"id": exp.experiment_id, "stage": exp.lifecycle_stage, "tags": dict(exp.tags),
            "runs": {r.info.run_id: (r.info.status, r.info.lifecycle_stage, r.info.end_time, dict(r.data.tags),
                                     dict(r.data.params)) for r in runs}}


def _manifest(sweep: SweepDir) -> dict[str, Any]:
    return json.loads(sweep.manifest_path.read_text())


def _refused(p: subprocess.CompletedProcess[str], owner_root: Path, what: str) -> None:
    assert p.returncode == EXIT_USAGE, f"{what}: exit {p.returncode}, expected 2\n{p.stdout}\n{p.stderr}"
    assert str(owner_root.resolve()) in p.stderr, f"{what}: the message does not name the owner's folder\n{p.stderr}"
    assert "--sweep" in p.stderr, f"{what}: the message does not say how to choose another name\n{p.stderr}"


@pytest.mark.slow
def test_a_second_sweep_folder_cannot_submit_resume_or_cancel_a_sweep_it_does_not_own(
        mlflow_server: MlflowServer, tmp_path: Path) -> None:
    uri = mlflow_server.uri
    name = f"paper-{uuid.uuid4().hex[:8]}"  # the session's server is shared with other tests
    grid = _write_grid(tmp_path, name)
    root_a, root_b, root_c = tmp_path / "ann" / "runs", tmp_path / "bob" / "runs", tmp_path / "carl" / "runs"

    # Sweep A: its runs are created, then the dispatcher dies; they stay SCHEDULED (what a `resume` calls lost).
    p = _submit(tmp_path, grid, root_a, uri)
    assert p.returncode == EXIT_FAULT, f"submit A: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    sweep_a = SweepDir(root_a, name)
    runs_a = Ledger(uri, name).trial_runs()
    assert len(runs_a) == 2 and {r.status for r in runs_a.values()} == {tc.SCHEDULED}
    before = _experiment(mlflow_server, name)
    assert len(before["runs"]) == 3  # the parent and two trials
    sweep_id_a = _manifest(sweep_a).get("sweep_id", "")
    assert sweep_id_a and before["tags"].get(tc.TAG_SWEEP_ID) == sweep_id_a
    assert str(root_a.resolve()) in before["tags"].get(tc.TAG_SWEEP_ROOT, "")
    files_a = snapshot(sweep_a.path)
    assert "sweep.json" in files_a and "trials.json" in files_a
    assert {f"trials/{k}/{tc.CONFIG_FILE}" for k in runs_a} <= set(files_a)

    # B submits the same grid under the same name: refused before anything is written.
    p = _submit(tmp_path, grid, root_b, uri)
    _refused(p, root_a, "submit from a second sweep root")
    assert not SweepDir(root_b, name).path.exists(), "the refused submit wrote a sweep folder"
    assert not root_b.exists() or not any(root_b.iterdir()), sorted(map(str, root_b.rglob("*")))

    # Folders of that name with another id: B's own sweep (its own sqlite ledger), pointed at the server; and C, a
    # copy of A's folder given a new id (hand-made, or a second `submit` of a copied grid folder).
    p = _submit(tmp_path, grid, root_b, None)
    assert p.returncode == EXIT_FAULT, f"submit B to its own ledger: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    sweep_b = SweepDir(root_b, name)
    assert _manifest(sweep_b).get("sweep_id") not in ("", None, sweep_id_a)
    sweep_c = SweepDir(root_c, name)
    shutil.copytree(sweep_a.path, sweep_c.path, symlinks=True)
    (sweep_c.path / "lock").unlink(missing_ok=True)
    sweep_c.manifest_path.write_text(json.dumps({**_manifest(sweep_a), "sweep_id": uuid.uuid4().hex}, indent=1))
    own_b = _manifest(sweep_b)["tracking_uri"]
    for command in ("status", "resume", "cancel"):  # one sweep, one ledger: the jobs read sweep.json's
        p = _cli(tmp_path, command, name, "--sweep-root", str(root_b), "--tracking-uri", uri)
        assert p.returncode == EXIT_USAGE, f"{command} --tracking-uri: exit {p.returncode}\n{p.stderr}"
        assert own_b in p.stderr and uri in p.stderr and "sweep.json" in p.stderr, p.stderr
    sweep_b.manifest_path.write_text(json.dumps({**_manifest(sweep_b), "tracking_uri": uri}, indent=1))
    files_b, files_c = snapshot(sweep_b.path), snapshot(sweep_c.path)

    for root in (root_b, root_c):
        for command in ("status", "resume", "cancel"):
            p = _cli(tmp_path, command, name, "--sweep-root", str(root))
            _refused(p, root_a, f"{command} from {root}")

    after = _experiment(mlflow_server, name)
    assert after == before, "sweep A's experiment or runs changed"
    assert snapshot(sweep_a.path) == files_a, "sweep A's folder changed"
    assert snapshot(sweep_b.path) == files_b and snapshot(sweep_c.path) == files_c, "a refused call changed its folder"

    # A itself is untouched in its rights: its own status still reads its two trials, never started (their runs
    # SCHEDULED, no job ever submitted: lost, for `resume` to submit).
    p = _cli(tmp_path, "status", name, "--sweep-root", str(root_a), "--json")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert {r["key"] for r in rows} == set(runs_a)
    assert {r["status"] for r in rows} == {"LOST"}
    assert {r.status for r in Ledger(uri, name).trial_runs().values()} == {tc.SCHEDULED}
