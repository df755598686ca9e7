"""No SQLite on a cluster: ``submit --backend slurm`` (or ``ray-slurm``) with a ``sqlite:`` ledger, explicit or the
default, exits 2 with the reason and how to start a server, having created nothing; with ``--allow-sqlite`` (jobs
on this one host, as on the test cluster) it goes through, the manifest records it, the trial finishes, and a later
``resume`` accepts it."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from orchestrate.cli.commands import main
from orchestrate.ledger.ledger import Ledger, wait_for
from orchestrate.sweep.folder import SweepDir
from tests.test_backend import smoke_corpus, write_profile
from tests.test_sweep_lock import one_trial_grid

__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

EXIT_USAGE = 2


def test_a_cluster_backend_refuses_a_sqlite_ledger_unless_allowed(tmp_path: Path, smoke_corpus: Path,
                                                                  slurm_cluster: object,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    grid = one_trial_grid(tmp_path, smoke_corpus)
    profile = write_profile(tmp_path, "a100:1")
    root = tmp_path / "runs"
    name = f"sqlite-{uuid.uuid4().hex[:8]}"
    base = ["submit", str(grid), "--sweep-root", str(root), "--sweep", name, "--profile", str(profile)]
    explicit = f"sqlite:///{tmp_path / 'elsewhere' / 'mlflow.db'}"
    for backend, extra in (("slurm", []), ("ray-slurm", []), ("slurm", ["--tracking-uri", explicit])):
        assert main([*base, "--backend", backend, *extra]) == EXIT_USAGE, (backend, extra)
        msg = capsys.readouterr().err
        for needle in (f"--backend {backend}", "sqlite", "many hosts", "slurm/mlflow-server.sh", "--host 0.0.0.0",
                       "--tracking-uri", "--allow-sqlite"):
            assert needle in msg, (needle, msg)
        assert not root.exists() and not (tmp_path / "elsewhere").exists(), "a refused submit created files"

    assert main([*base, "--backend", "slurm", "--allow-sqlite"]) == 0
    sweep = SweepDir(root, name)
    manifest = sweep.read_manifest()
    assert manifest.allow_sqlite and manifest.tracking_uri.startswith("sqlite:")
    assert json.loads(sweep.manifest_path.read_text())["allow_sqlite"] is True
    (sub,) = sweep.submissions()
    assert sub.job_id
    estimate = json.loads((sweep.path / "estimate.json").read_text())  # recorded for status, as plan --estimate
    assert estimate["calibration"] == "a100-paper" and len(estimate["trials"]) == 1 and estimate["total_gpu_hours"] > 0
    ledger = Ledger(manifest.tracking_uri, name)
    runs = wait_for(ledger, list(ledger.trial_runs()), timeout=400)
    assert {r.status for r in runs.values()} == {"FINISHED"}, {r.label: (r.status, r.error) for r in runs.values()}
    capsys.readouterr()
    assert main(["status", name, "--sweep-root", str(root)]) == 0
    assert re.search(r"GPU-hours spent of [\d.]+ estimated \(\d+%", capsys.readouterr().out)
    assert main(["resume", name, "--sweep-root", str(root)]) == 0  # the manifest's --allow-sqlite stands
    assert "1 finished (skipped)" in capsys.readouterr().out
    assert len(sweep.submissions()) == 1
