"""A sweep found from anywhere: ``ASR_STUDY_SWEEP_ROOT`` names the folder sweeps live in for every command that takes
``--sweep-root``, and the next commands a command prints carry the root they need, so they work as printed from any
folder. (Uses the fake sweep of ``orchestrate.tools.fake_sweep``: folders only, nothing trains.)"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from asr_core.contract.tracking import DEFAULT_SWEEP_ROOT, SWEEP_ROOT_ENV, default_sweep_root, tracking_uri
from orchestrate.sweep.folder import SweepDir, SweepError
from orchestrate.tools.fake_sweep import make_fake_sweep

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> SweepDir:
    return make_fake_sweep(tmp_path_factory.mktemp("root with space"), 12)


def _orchestrate(args: list[str], cwd: Path, root: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != SWEEP_ROOT_ENV}
    if root is not None:
        env[SWEEP_ROOT_ENV] = root
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "orchestrate", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_root_comes_from_the_variable_else_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(SWEEP_ROOT_ENV, raising=False)
    assert default_sweep_root() == DEFAULT_SWEEP_ROOT
    monkeypatch.setenv(SWEEP_ROOT_ENV, "  ")
    assert default_sweep_root() == DEFAULT_SWEEP_ROOT  # blank is unset
    monkeypatch.setenv(SWEEP_ROOT_ENV, str(tmp_path))
    assert default_sweep_root() == str(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri(None) == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"  # the default ledger follows it


def test_status_from_another_folder_finds_the_sweep_by_the_variable_alone(fake: SweepDir, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    lost = _orchestrate(["status", fake.name], elsewhere, None)
    assert lost.returncode == 2 and SWEEP_ROOT_ENV in lost.stderr, lost.stderr
    found = _orchestrate(["status", fake.name], elsewhere, str(fake.path.parent))
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.startswith(f"sweep {fake.name}"), found.stdout[:1000]
    given = _orchestrate(["status", fake.name, "--sweep-root", str(fake.path.parent)], elsewhere, "/nonexistent")
    assert given.returncode == 0  # --sweep-root comes before the variable
    assert given.stdout.splitlines()[0] == found.stdout.splitlines()[0]


def test_a_printed_next_command_works_as_printed_from_any_folder(fake: SweepDir, tmp_path: Path) -> None:
    """What `submit`, `resume` and a Ctrl-C'd local sweep print (:meth:`SweepDir.command`) spells out the root, also
    one with a space in its name; run from another folder with no variable set, it finds the sweep."""
    line = fake.command("status")
    assert line.startswith(f"orchestrate status {fake.name} --sweep-root ")
    argv = shlex.split(line)
    assert Path(argv[-1]) == fake.path.parent and " " in argv[-1]
    done = _orchestrate(argv[1:], tmp_path, None)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_missing_sweep_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match=SWEEP_ROOT_ENV):
        SweepDir(tmp_path, "nothing-here").read_manifest()


def test_a_tracking_uri_alone_finds_the_sweep_in_the_folder_its_ledger_recorded(tmp_path: Path) -> None:
    """Issue 48: given the ledger (``--tracking-uri``) and not the root, a command finds the sweep in the folder the
    experiment's ``sweep.root`` tag names, says so, and its printed next commands carry that root; a ledger naming a
    folder that does not hold the sweep leaves the usual refusal."""
    import sqlite3

    from asr_core.contract.trial import TAG_SWEEP_ID, TAG_SWEEP_ROOT

    uri = f"sqlite:///{tmp_path / 'ledger' / 'mlflow.db'}"
    (tmp_path / "ledger").mkdir()
    sweep = make_fake_sweep(tmp_path / "far away", 6, name="far", backend="local", tracking_uri=uri)
    with sqlite3.connect(tmp_path / "ledger" / "mlflow.db") as con:  # the two tables the lookup reads
        con.execute("CREATE TABLE experiments (experiment_id INTEGER, name TEXT, lifecycle_stage TEXT)")
        con.execute("CREATE TABLE experiment_tags (key TEXT, value TEXT, experiment_id INTEGER)")
        con.execute("INSERT INTO experiments VALUES (1, 'far', 'active')")
        con.executemany("INSERT INTO experiment_tags VALUES (?, ?, 1)",
                        [(TAG_SWEEP_ROOT, str(sweep.path)), (TAG_SWEEP_ID, sweep.read_manifest().sweep_id)])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    found = _orchestrate(["status", "far", "--tracking-uri", uri], elsewhere, None)
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.startswith("sweep far") and f"found in {sweep.path}" in found.stderr, found.stderr
    logs = _orchestrate(["logs", "far", "nothing-like-it", "--tracking-uri", uri], elsewhere, None)
    assert logs.returncode == 2 and "nothing-like-it" in logs.stderr and "no sweep" not in logs.stderr, logs.stderr
    with sqlite3.connect(tmp_path / "ledger" / "mlflow.db") as con:
        con.execute("UPDATE experiment_tags SET value = ? WHERE key = ?", (str(tmp_path / "gone" / "far"),
                                                                           TAG_SWEEP_ROOT))
    lost = _orchestrate(["status", "far", "--tracking-uri", uri], elsewhere, None)
    assert lost.returncode == 2 and "no sweep 'far'" in lost.stderr, lost.stderr


def test_resume_dry_run_from_another_folder_with_the_variable_alone(fake: SweepDir, tmp_path: Path) -> None:
    """Issue 48's must-hold: with only ``ASR_STUDY_SWEEP_ROOT`` set, from a folder that is not the sweep's,
    ``resume --dry-run`` finds the sweep, names what it would resubmit, and writes nothing there or here."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    before = sorted(p.name for p in fake.path.rglob("*"))
    done = _orchestrate(["resume", fake.name, "--dry-run"], elsewhere, str(fake.path.parent))
    assert done.returncode == 0, done.stderr[-2000:]
    assert fake.name in done.stdout and "would" in done.stdout.lower(), done.stdout[:2000]
    assert sorted(p.name for p in fake.path.rglob("*")) == before and not any(elsewhere.iterdir())
