"""Trial identity across a sweep's life on the local backend: the training corpus moves to another path and the
loader gets more workers between ``submit`` and ``resume``; every key stays, the finished trial is skipped, the
half-trained one resumes from its checkpoint in the same run, and a ``resume --set`` that would change the science
is refused before anything changes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from asr_core.contract.trial import FINISHED, TrialFolder, read_progress
from orchestrate.cli.commands import main
from orchestrate.ledger.ledger import Ledger
from orchestrate.sweep.folder import SweepDir
from orchestrate.backends.runner import SEGMENT_HEADER
from tests.test_backend import assert_one_run_per_key, loss_steps, resumed_at, smoke_corpus, wait_until

__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend

pytestmark = pytest.mark.timeout(900)

SHORT, LONG = 8, 40  # steps of the two trials: the short one finishes while the long one is mid-training
GRID = """\
name: moving
seeds: [1]
base:
  preset: tiny
  data: {train: "podcast:%s", batch_audio_s: 20.48, seqlen_warmup: none}
  train: {warmup_steps: 4, checkpoint_every: 4, device: cpu, precision: fp32}
subgrids:
  steps:
    set: {data.context_s: 5.12}
    axes: {train.max_steps: [%d, %d]}
"""


def _starts(folder: TrialFolder) -> int:
    """Every start of the job, whether or not it had work to do (the runner heads each one in the log)."""
    return folder.log.read_text().count(SEGMENT_HEADER) if folder.log.exists() else 0


@pytest.mark.slow
def test_moved_corpus_and_more_workers_keep_every_key_skip_finished_and_resume_half_trained(
        tmp_path: Path, smoke_corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = tmp_path / "scratch-a" / "train"  # a real copy of the corpus, moved later
    shutil.copytree(smoke_corpus / "train", first)
    grid = tmp_path / "moving.yaml"
    grid.write_text(textwrap.dedent(GRID % (first, SHORT, LONG)))
    root = tmp_path / "runs"
    submit = subprocess.Popen([sys.executable, "-m", "orchestrate", "submit", str(grid), "--backend", "local",
                               "--sweep-root", str(root)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    sweep = SweepDir(root, "moving")
    try:
        trials = wait_until(lambda: sweep.read_trials() if (sweep.path / "trials.json").exists() else None, 120,
                            "submit wrote no trials.json")
        short, long_ = sorted(trials, key=lambda t: t.config.train.max_steps)
        fs, fl = TrialFolder(sweep.trial_dir(short.key)), TrialFolder(sweep.trial_dir(long_.key))

        def half_way() -> bool:
            p = read_progress(fl.path)
            return fs.done.exists() and p is not None and p.phase == "train" and 12 <= p.done < LONG - 8

        wait_until(half_way, 600, "the short trial never finished while the long one trained", poll=0.2)
    finally:
        submit.send_signal(signal.SIGTERM)  # the submitter stops; its trainers checkpoint and stop
        out = submit.communicate(timeout=180)[0]
    assert submit.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in out, out  # as a shell says it
    assert fs.done.exists() and not fl.done.exists() and fl.checkpoint.exists(), out
    # the long trial's trainer was told to stop, not killed with its worker: it checkpointed where it was
    stopped_at = re.search(r"received: checkpointed at step (\d+)", fl.log.read_text())
    assert stopped_at is not None, fl.log.read_text()[-2000:]
    ledger = Ledger(f"sqlite:///{root / 'mlflow.db'}", "moving")
    before = ledger.trial_runs()
    assert before[short.key].status == FINISHED and before[long_.key].status != FINISHED
    keys = [t.key for t in trials]

    # the corpus moves to another filesystem; the old path is gone
    moved = tmp_path / "scratch-b" / "train"
    moved.parent.mkdir()
    shutil.move(str(first), moved)

    # a resume that would change what the trials are is refused, and changes nothing
    trials_json = (sweep.path / "trials.json").read_bytes()
    assert main(["resume", "moving", "--sweep-root", str(root), "--set", "train.lr=1e-3"]) == 2
    assert "not only how it runs" in capsys.readouterr().err
    assert (sweep.path / "trials.json").read_bytes() == trials_json

    assert main(["resume", "moving", "--sweep-root", str(root), "--set", f"data.train=podcast:{moved}",
                 "--set", "data.num_workers=2"]) == 0
    assert "1 finished (skipped)" in capsys.readouterr().out
    after = ledger.trial_runs()
    assert [t.key for t in sweep.read_trials()] == keys
    assert {k: r.run_id for k, r in after.items()} == {k: r.run_id for k, r in before.items()}
    assert {r.status for r in after.values()} == {FINISHED}
    assert_one_run_per_key(ledger, 2)
    assert _starts(fs) == 1, fs.log.read_text()  # the finished trial never ran again
    assert _starts(fl) == 2
    start_1, start_2 = resumed_at(fl.path)
    assert start_1 is None and start_2 == int(stopped_at.group(1)) >= 12  # from the checkpoint of its stop
    assert resumed_at(fs.path) == [None]
    assert "2 data workers" in fl.log.read_text().split(SEGMENT_HEADER)[-1]  # the resumed trainer took the setting
    assert loss_steps(ledger, after[long_.key].run_id) == list(range(1, LONG + 1))  # each step logged once
    cfg = json.loads(fl.config.read_text())
    assert cfg["data"]["train"] == f"podcast:{moved}" and cfg["data"]["num_workers"] == 2
    assert json.loads(fs.config.read_text())["data"]["train"] == f"podcast:{first}"  # as it ran

    # submitting the grid again from the new place adds nothing and runs nothing
    grid.write_text(textwrap.dedent(GRID % (moved, SHORT, LONG)))
    assert main(["submit", str(grid), "--backend", "local", "--sweep-root", str(root),
                 "--set", "data.num_workers=3"]) == 0
    summary = capsys.readouterr().out
    assert "2 finished (skipped)" in summary and " 0 new" in summary, summary
    assert [t.key for t in sweep.read_trials()] == keys
    assert _starts(fs) == 1 and _starts(fl) == 2
