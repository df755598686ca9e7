"""The MLflow ledger: schema (docs/ARCHITECTURE.md), idempotent run creation, status, and validation before any
state changes (exit 2, nothing created)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrate.cli import main
from orchestrate.grid import load_grid
from orchestrate.ledger import Ledger, counts, default_tracking_uri
from orchestrate.sweep import SweepDir

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "grids" / "smoke.yaml"


@pytest.fixture()
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(default_tracking_uri(tmp_path), "smoke")


def test_runs_follow_the_schema_and_are_created_once(ledger: Ledger) -> None:
    trials = list(load_grid(SMOKE).trials)
    parent = ledger.ensure_sweep("grids/smoke.yaml", "local")
    assert ledger.ensure_sweep("grids/smoke.yaml", "local") == parent  # one parent, however often we call
    ids = ledger.create_trial_runs(parent, trials, "local")
    again = ledger.create_trial_runs(parent, trials, "local")
    assert ids == again and len(set(ids.values())) == len(trials)
    c = ledger.client
    runs = c.search_runs([ledger.experiment_id], max_results=100)
    assert len(runs) == len(trials) + 1
    exp = c.get_experiment(ledger.experiment_id)
    assert exp.name == "smoke"
    p = c.get_run(parent)
    assert p.info.run_name == "smoke"
    assert p.data.tags["sweep.role"] == "parent" and p.data.tags["sweep.backend"] == "local"
    assert p.data.tags["sweep.grid"] == "grids/smoke.yaml"
    t = trials[0]
    r = c.get_run(ids[t.key])
    assert r.info.status == "SCHEDULED" and r.info.run_name == t.label
    tags = r.data.tags
    assert tags["mlflow.parentRunId"] == parent and tags["sweep.role"] == "trial"
    assert tags["trial.key"] == t.key and tags["trial.label"] == t.label and tags["trial.seed"] == str(t.seed)
    assert tags["trial.subgrids"] == ",".join(t.subgrids) and tags["trial.backend"] == "local"
    assert "trial.job_id" in tags
    assert r.data.params == {k: str(v) for k, v in t.config.flat().items()}


def test_trial_runs_reads_states_tags_and_errors(ledger: Ledger) -> None:
    trials = list(load_grid(SMOKE).trials)
    parent = ledger.ensure_sweep("g", "slurm")
    ids = ledger.create_trial_runs(parent, trials, "slurm")
    a, b = trials[0].key, trials[1].key
    ledger.tag_runs({ids[a]: {"trial.job_id": "12_0"}})
    ledger.set_status([ids[b]], "FAILED", tags={"trial.error": "RuntimeError: boom"})
    runs = ledger.trial_runs()
    assert runs[a].job_id == "12_0" and runs[a].status == "SCHEDULED"
    assert runs[b].status == "FAILED" and runs[b].error == "RuntimeError: boom"
    c = counts(runs.values(), len(trials) + 2)
    assert c["SCHEDULED"] == len(trials) - 1 and c["FAILED"] == 1 and c["MISSING"] == 2


def test_status_cli_lists_failed_trials_with_their_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrate.dispatch import new_manifest

    grid = load_grid(SMOKE)
    sweep = SweepDir(tmp_path, "smoke")
    uri = default_tracking_uri(tmp_path)
    sweep.write_manifest(new_manifest("smoke", SMOKE, "local", "", uri, ()))
    sweep.write_trials(list(grid.trials))
    ledger = Ledger(uri, "smoke")
    ids = ledger.create_trial_runs(ledger.ensure_sweep(str(SMOKE), "local"), list(grid.trials)[:3], "local")
    bad = grid.trials[1]
    ledger.set_status([ids[bad.key]], "FAILED", tags={"trial.error": "ValueError: loss is nan at step 7"})
    assert main(["status", "smoke", "--sweep-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "SCHEDULED" in out and "FAILED" in out and "MISSING" in out
    assert bad.label in out and "loss is nan at step 7" in out


@pytest.mark.parametrize("extra,needle", [
    (["--tracking-uri", "http://127.0.0.1:9"], "unreachable"),
    (["--profile", "no-such-profile"], "unknown profile 'no-such-profile'"),
    (["--tracking-uri", "./mlruns"], "sqlite:///"),
])
def test_invalid_submission_exits_2_and_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        extra: list[str], needle: str) -> None:
    root = tmp_path / "runs"
    rc = main(["submit", str(SMOKE), "--backend", "local", "--sweep-root", str(root), "--no-check-data", *extra])
    assert rc == 2
    assert needle in capsys.readouterr().err
    assert not (root / "smoke").exists() and not (root / "mlflow.db").exists()


def test_missing_data_exits_2_naming_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "runs"
    rc = main(["submit", str(SMOKE), "--backend", "local", "--sweep-root", str(root),
               "--set", f"data.train=podcast:{tmp_path}/nowhere"])
    assert rc == 2
    assert f"{tmp_path}/nowhere" in capsys.readouterr().err
    assert not root.exists() or not any(root.iterdir())


def test_unknown_sweep_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "nope", "--sweep-root", str(tmp_path)]) == 2
    assert "no sweep 'nope'" in capsys.readouterr().err
