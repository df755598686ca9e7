"""A ``sqlite:`` ledger keeps its artifacts beside its database, never in the folder a command runs in (MLflow's
default, ``./mlruns``, left an ``mlruns/`` folder in whatever folder trainers, reports or tests ran from)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asr_core.contract.ledger import artifact_location, experiment_id


def test_sqlite_artifacts_go_beside_the_database_and_other_stores_choose_their_own(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}"
    assert artifact_location(uri, "smoke/1 a") == (tmp_path / "db" / "artifacts" / "smoke_1_a").as_uri()
    assert artifact_location("http://127.0.0.1:5000", "smoke") is None
    assert artifact_location(None, "smoke") is None


@pytest.mark.parametrize("creator", ["trainer", "ledger"])
def test_a_run_logged_from_another_folder_writes_nothing_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               creator: str) -> None:
    from mlflow.tracking import MlflowClient

    from orchestrate.ledger.store import ClientStore

    (tmp_path / "db").mkdir()
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}")
    exp = experiment_id(client, "exp") if creator == "trainer" else ClientStore(lambda: client).create_experiment("exp")
    run = client.create_run(exp).info.run_id
    (tmp_path / "note.txt").write_text("hello\n")
    client.log_artifact(run, str(tmp_path / "note.txt"))
    assert list(cwd.iterdir()) == []
    assert (tmp_path / "db" / "artifacts" / "exp").is_dir()
