"""``cancel`` is final (real SLURM test cluster, real ``mlflow server``): cancelled during training, every trial
ends KILLED (its trainer checkpoints and is never requeued, and never writes SCHEDULED back); ``submit`` and
``resume`` start nothing; ``retry --cancelled`` restarts them from their checkpoints in the same runs, and they
finish with every step logged once."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest

from asr_core.contract.trial import (FAILURE_OUTCOMES, FINISHED, KILLED, OUTCOME_CANCELLED, TrialFolder,
                                     read_attempts, read_progress)
from orchestrate.cli.commands import main
from orchestrate.ledger.ledger import Ledger, wait_for
from orchestrate.sweep.folder import SweepDir
from tests.test_backend import (CHECKPOINT_EVERY, cluster_env, loss_steps, resumed_at, smoke_corpus, squeue_states,
                                wait_until, write_profile)

__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

STEPS = 40  # long enough that the trials are mid-training when the cancel comes
TWO_TRIALS = """
name: two
seeds: [3, 4]
base:
  preset: tiny
  data: {train: "podcast:%s/train", batch_audio_s: 20.48, seqlen_warmup: none, context_s: 5.12}
  train: {max_steps: %d, warmup_steps: 4, checkpoint_every: %d, device: cpu, precision: fp32}
subgrids:
  only: {}
"""


def test_cancel_is_final_and_retry_cancelled_resumes_from_the_checkpoints(
        tmp_path: Path, smoke_corpus: Path, request: pytest.FixtureRequest,
        capsys: pytest.CaptureFixture[str]) -> None:
    uri = cluster_env(request)
    name = f"cancel-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "runs"
    grid = tmp_path / "two.yaml"
    grid.write_text(textwrap.dedent(TWO_TRIALS % (smoke_corpus, STEPS, CHECKPOINT_EVERY)))
    submit = ["submit", str(grid), "--backend", "slurm", "--sweep-root", str(root), "--sweep", name,
              "--tracking-uri", uri, "--profile", str(write_profile(tmp_path, "a100:1"))]
    assert main(submit) == 0
    sweep, ledger = SweepDir(root, name), Ledger(uri, name)
    before = ledger.trial_runs()
    assert len(before) == 2
    folders = {k: TrialFolder(sweep.trial_dir(k)) for k in before}

    def past_a_checkpoint() -> bool:
        return all((p := read_progress(f.path)) is not None and p.phase == "train" and p.done > CHECKPOINT_EVERY
                   for f in folders.values())

    wait_until(past_a_checkpoint, 400, "the trials never got past their first checkpoint", poll=0.2)
    capsys.readouterr()
    assert main(["cancel", name, "--sweep-root", str(root)]) == 0
    assert "cancelled 2 jobs" in capsys.readouterr().out
    wait_until(lambda: not squeue_states(f"orch.{name}."), 120, "the cancelled jobs linger", poll=0.5)
    for key, f in folders.items():
        assert f.cancelled.exists() and not f.done.exists(), key
        outcomes = [a.outcome for a in read_attempts(f.path)]
        assert OUTCOME_CANCELLED in outcomes and not set(outcomes) & set(FAILURE_OUTCOMES), (key, outcomes)
        p = read_progress(f.path)
        assert p is not None and p.done < STEPS, (key, p)  # stopped mid-training
    runs = ledger.trial_runs()
    assert {r.status for r in runs.values()} == {KILLED}, {r.label: r.status for r in runs.values()}

    for argv in (submit, ["resume", name, "--sweep-root", str(root)]):  # a cancel is final: nothing starts
        assert main(argv) == 0, argv
        assert "2 cancelled (left KILLED; retry --cancelled)" in capsys.readouterr().out
        assert len(sweep.submissions()) == 1
    assert {r.status for r in ledger.trial_runs().values()} == {KILLED}
    assert main(["status", name, "--sweep-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert all(key in out for key in folders) and "KILLED" in out, out

    assert main(["retry", name, "--cancelled", "--sweep-root", str(root)]) == 0
    assert "2 cancelled (resubmitted)" in capsys.readouterr().out
    assert len(sweep.submissions()) == 2
    assert not any(f.cancelled.exists() for f in folders.values())
    runs = wait_for(ledger, list(folders), timeout=600)
    for key, f in folders.items():
        assert runs[key].status == FINISHED and runs[key].run_id == before[key].run_id, runs[key]
        assert loss_steps(ledger, runs[key].run_id) == list(range(1, STEPS + 1)), key  # each step once
        first, second = resumed_at(f.path)
        assert first is None and second is not None and CHECKPOINT_EVERY <= second < STEPS, (key, first, second)
