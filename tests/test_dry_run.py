"""``submit --dry-run`` prints what would be submitted and changes nothing (no folder, run, job or lock file), and
``cancel`` of a whole sweep asks first on a terminal (``--yes`` and ``--where`` do not ask; without a terminal it
goes on, as scripts and the other tests expect).

Real pieces: the smoke grid, a real ``mlflow server`` (or a sqlite file) holding the sweep's experiment and runs (made
by :class:`orchestrate.ledger.ledger.Ledger`), ``orchestrate`` run in a fresh process, and a real pseudo-terminal for
the question.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from asr_core.contract.trial import TrialFolder
from orchestrate.plan.grid import load_grid
from orchestrate.ledger.ledger import Ledger
from orchestrate.sweep.folder import Manifest, SweepDir, new_sweep_id
from tests.folder_snapshot import snapshot

REPO = Path(__file__).resolve().parents[1]
GRID = REPO / "grids" / "smoke.yaml"


def orchestrate(*args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrate", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, stdin=stdin)


def ledger_counts(client) -> tuple[int, int]:  # noqa: ANN001 - an MlflowClient
    experiments = client.search_experiments()
    return len(experiments), len(client.search_runs([e.experiment_id for e in experiments]))


def existing_sweep(root: Path, uri: str = "", name: str = "smoke") -> tuple[SweepDir, list]:
    """The smoke grid's sweep as a submit leaves it: manifest, trials, runs in its ledger (a sqlite file in
    ``root`` unless ``uri``), a submission; one trial finished."""
    trials = list(load_grid(GRID).trials)
    sweep = SweepDir(root, name)
    uri = uri or f"sqlite:///{root.resolve() / 'mlflow.db'}"
    manifest = Manifest(name=name, grid=str(GRID), backend="local", profile="", tracking_uri=uri,
                        workdir=str(REPO), sweep_id=new_sweep_id())
    sweep.write_manifest(manifest)
    sweep.write_trials(trials)
    ledger = Ledger(uri, name)
    parent = ledger.ensure_sweep(str(GRID), "local", manifest.sweep_id, str(sweep.path))
    run_ids = ledger.create_trial_runs(parent, trials, "local")
    sweep.new_submission("local", [t.key for t in trials], run_ids).record_job("local:1:x")
    for t in trials:
        sweep.prepare_trial(t)
    TrialFolder(sweep.trial_dir(trials[0].key)).done.write_text("finished\n")
    return sweep, trials


def test_dry_run_of_a_new_sweep_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    p = orchestrate("submit", str(GRID), "--backend", "local", "--sweep-root", str(root), "--dry-run",
                    "--no-check-data")
    assert p.returncode == 0, p.stderr
    assert not root.exists(), sorted(root.rglob("*"))
    assert "dry run: nothing created" in p.stdout and "4 new" in p.stdout and "would submit 4:" in p.stdout
    assert "(would be created)" in p.stdout
    for t in load_grid(GRID).trials:
        assert f"  {t.label}  {t.key}  new" in p.stdout


def test_dry_run_of_an_existing_sweep_changes_no_byte_and_no_run(tmp_path: Path, mlflow_server) -> None:  # noqa: ANN001
    root = tmp_path / "runs"
    name = f"dry-{uuid.uuid4().hex[:8]}"
    sweep, trials = existing_sweep(root, mlflow_server.uri, name)
    client = mlflow_server.client()
    before, counts = snapshot(root), ledger_counts(client)
    p = orchestrate("submit", str(GRID), "--backend", "local", "--sweep-root", str(root), "--sweep", name,
                    "--dry-run", "--no-check-data")
    assert p.returncode == 0, p.stderr
    assert snapshot(root) == before  # no lock file, no manifest rewritten, no folder, no submission
    assert ledger_counts(client) == counts  # no experiment, no run
    assert "1 finished (skipped)" in p.stdout and "3 lost (resubmitted)" in p.stdout and "would submit 3" in p.stdout
    assert trials[0].key not in p.stdout.split("would submit", 1)[1]

    bad = orchestrate("submit", str(GRID), "--backend", "slurm", "--sweep-root", str(root), "--sweep", name,
                      "--dry-run", "--no-check-data")
    assert bad.returncode == 2 and "exists with backend 'local'" in bad.stderr and snapshot(root) == before


def on_a_terminal(*args: str, answer: bytes) -> subprocess.CompletedProcess[str]:
    """``orchestrate ARGS`` with a pseudo-terminal as its stdin, ``answer`` typed into it."""
    main, tty = os.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "orchestrate", *args], stdin=tty, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO)
        os.close(tty)
        os.write(main, answer)
        out, err = p.communicate(timeout=120)
    finally:
        os.close(main)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_cancel_of_a_whole_sweep_asks_on_a_terminal(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    sweep, trials = existing_sweep(root)
    before = snapshot(sweep.path / "trials")
    p = on_a_terminal("cancel", "smoke", "--sweep-root", str(root), "--offline", answer=b"n\n")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "3 unfinished trials end KILLED" in p.stderr and "nothing cancelled" in p.stderr
    assert snapshot(sweep.path / "trials") == before

    p = on_a_terminal("cancel", "smoke", "--sweep-root", str(root), "--offline", "--where",
                      f"key={trials[1].key}", answer=b"")  # a part: no question
    assert p.returncode == 0 and "Go on?" not in p.stderr, p.stderr
    assert TrialFolder(sweep.trial_dir(trials[1].key)).cancelled.exists()
    assert not TrialFolder(sweep.trial_dir(trials[2].key)).cancelled.exists()

    p = on_a_terminal("cancel", "smoke", "--sweep-root", str(root), "--offline", answer=b"y\n")
    assert p.returncode == 0, p.stderr
    assert all(TrialFolder(sweep.trial_dir(t.key)).cancelled.exists() for t in trials[1:])


def test_cancel_with_yes_or_without_a_terminal_does_not_ask(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    sweep, trials = existing_sweep(root)
    p = on_a_terminal("cancel", "smoke", "--sweep-root", str(root), "--offline", "--yes", answer=b"")
    assert p.returncode == 0 and "Go on?" not in p.stderr, p.stderr
    assert TrialFolder(sweep.trial_dir(trials[3].key)).cancelled.exists()
    p = orchestrate("cancel", "smoke", "--sweep-root", str(root), "--offline")  # stdin not a terminal
    assert p.returncode == 0 and "Go on?" not in p.stderr, p.stderr
