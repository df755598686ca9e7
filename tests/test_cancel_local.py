"""``cancel`` of a local sweep while the ``submit`` that runs it is still going: the running command holds the lock,
so cancel marks the trial folders and stops the trainers of this machine instead of reporting the sweep busy; the
trials end KILLED and nothing starts them again but ``retry --cancelled``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from asr_core.contract.trial import KILLED, OUTCOME_CANCELLED, TrialFolder, read_attempts
from orchestrate.ledger.ledger import Ledger
from orchestrate.sweep.folder import SweepDir
from orchestrate.sweep.trial_state import read_folder_states
from tests.test_backend import smoke_corpus, wait_until

__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend

pytestmark = pytest.mark.timeout(600)

GRID = """
name: two
seeds: [5, 6]
base:
  preset: tiny
  data: {train: "podcast:%s/train", batch_audio_s: 20.48, seqlen_warmup: none, context_s: 5.12}
  train: {max_steps: 400, warmup_steps: 4, checkpoint_every: 4, device: cpu, precision: fp32}
  eval: {datasets: []}
subgrids:
  only: {}
"""


@pytest.mark.slow
def test_cancel_while_the_local_submit_runs_stops_its_trainers_and_is_final(tmp_path: Path,
                                                                           smoke_corpus: Path) -> None:
    grid = tmp_path / "two.yaml"
    grid.write_text(textwrap.dedent(GRID % smoke_corpus))
    root, name = tmp_path / "runs", f"busy-{uuid.uuid4().hex[:8]}"
    submit = [sys.executable, "-m", "orchestrate", "submit", str(grid), "--backend", "local", "--sweep-root",
              str(root), "--sweep", name, "--no-check-data"]
    runner = subprocess.Popen(submit, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        sweep = SweepDir(root, name)
        keys = lambda: [t.key for t in sweep.read_trials()] if (sweep.path / "trials.json").exists() else []  # noqa: E731
        wait_until(lambda: keys() and any(fs.live for fs in read_folder_states(sweep, keys()).values()), 300,
                   "no trainer started")
        cancel = subprocess.run([sys.executable, "-m", "orchestrate", "cancel", name, "--sweep-root", str(root)],
                                capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert cancel.returncode == 0, cancel.stderr
        assert "is being run (submit by pid" in cancel.stderr and "marked CANCELLED" in cancel.stderr
        out, _ = runner.communicate(timeout=300)
    finally:
        if runner.poll() is None:
            runner.kill()
    states = read_folder_states(sweep, keys())
    assert all(fs.cancelled and not fs.done and not fs.live for fs in states.values()), out[-3000:]
    started = [k for k in keys() if read_attempts(TrialFolder(sweep.trial_dir(k)).path)]
    assert started, out[-3000:]
    for k in started:
        assert [a.outcome for a in read_attempts(sweep.trial_dir(k))] == [OUTCOME_CANCELLED], k
    # the trainers' last records reach MLflow from their outboxes; status ships what a trainer left behind
    shown = subprocess.run([sys.executable, "-m", "orchestrate", "status", name, "--sweep-root", str(root)],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    runs = Ledger(sweep.read_manifest().tracking_uri, name).trial_runs()
    assert {runs[k].status for k in keys()} == {KILLED}, ({k: runs[k].status for k in keys()}, shown.stdout)
    again = subprocess.run(submit, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=os.environ)
    assert again.returncode == 0, again.stderr
    assert all(len(read_attempts(sweep.trial_dir(k))) <= 1 for k in keys())  # nothing ran again
