"""A SLURM job queued before an upgrade still runs after it: submitit pickled its task when it was submitted
(``<job>_submitted.pkl``: a ``DelayedSubmission`` around :class:`orchestrate.backends.slurm.TrialTask`), and the
job unpickles it only when it starts, with whatever code is installed by then.

``fixtures/queued_job/trial_task_submitted.pkl`` was written by submitit's own ``DelayedSubmission.dump`` at commit
de6e623, before orchestrate's modules moved into folders. Its sweep path is relative (``sweeps/queued``) so that the
test can run it from a folder of its own; a real job's path is absolute, and nothing else differs.
"""

from __future__ import annotations

import json
import pickletools
import signal
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "queued_job" / "trial_task_submitted.pkl"
SUB_ID = "20260101000000-abc123"  # what the pickled task names
KEY = "k" * 16


def test_the_pickle_of_a_queued_job_names_the_task_where_it_has_always_been():
    names = [arg for op, arg, _ in pickletools.genops(FIXTURE.read_bytes()) if isinstance(arg, str)]
    assert ["orchestrate.backends.slurm", "TrialTask"] == names[names.index("orchestrate.backends.slurm"):][:2]


@pytest.fixture
def keep_signals():
    """The task forwards USR2 and TERM to its trainer from the main thread: pytest's own handlers come back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_a_job_queued_before_the_move_loads_and_runs_its_trial(tmp_path, monkeypatch, keep_signals):
    from submitit.core.utils import DelayedSubmission

    import orchestrate.backends.slurm as slurm

    sweep = tmp_path / "sweeps" / "queued"
    (sweep / "submissions").mkdir(parents=True)
    (sweep / "sweep.json").write_text(json.dumps({
        "name": "queued", "grid": "grid.yaml", "backend": "slurm", "profile": "", "tracking_uri": "sqlite:///none.db",
        "workdir": str(tmp_path)}))
    (sweep / "submissions" / f"{SUB_ID}.json").write_text(json.dumps({
        "id": SUB_ID, "backend": "slurm", "keys": [KEY], "run_ids": ["run0"], "job_id": "41"}))
    (sweep / "trials" / KEY).mkdir(parents=True)

    def fake_trainer(trial_dir: Path, uri: str, run_id: str) -> list[str]:
        """What the trainer is asked, written down; it exits 0 (finished)."""
        return [sys.executable, "-c", "import pathlib, sys; pathlib.Path(sys.argv[1], 'ran').write_text(' '.join("
                "sys.argv[2:]))", str(trial_dir), uri, run_id]

    monkeypatch.setattr(slurm, "trial_command", fake_trainer)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "41")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")

    job = DelayedSubmission.load(FIXTURE)
    assert type(job.function) is slurm.TrialTask
    assert job.result() == 0
    assert (sweep / "trials" / KEY / "ran").read_text() == "sqlite:///none.db run0"
