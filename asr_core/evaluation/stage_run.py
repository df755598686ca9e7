"""The MLflow run that a stage after training logs into: ``evaluate`` and ``heads``, run by the trial job or by hand.

One owner for what both stages do alike:

* :func:`stage_run`: which run (the trial job's outbox; else the ``--run-id``/``--tracking-uri`` given; else the
  run id and tracking URI stored in the checkpoint, :func:`checkpoint_run`);
* :func:`known_tags` and :func:`check_fingerprints`: a dataset *name* stands for one content within a run. Each
  dataset's content fingerprint is recorded as the run's tag ``eval.<NAME>.fingerprint``
  (:func:`asr_core.contract.trial.eval_fingerprint_tag`); the same name met with other content raises
  :class:`EvalDataChanged` before anything is measured;
* :func:`log_stage`: tags, metrics (step 0) and files through an :class:`~asr_core.runtime.outbox.Outbox`: the trial job's
  (the first value of a metric stays, so a stage interrupted after logging is not logged twice), or one in the
  stage's output folder, flushed for at most :data:`~asr_core.runtime.outbox.FINAL_FLUSH_S` seconds, whose leftovers can be
  shipped later with ``python -m asr_core outbox``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from asr_core.runtime.outbox import FINAL_FLUSH_S, Outbox
from asr_core.contract.trial import eval_fingerprint_tag
from asr_core.training.checkpoint import read_header

Run = tuple[str, "str | None"]  # (run id, tracking URI)


class EvalDataChanged(ValueError):
    """A dataset's name is recorded on the run with other content than it has now."""


def checkpoint_run(checkpoint: str | Path) -> tuple[str | None, str | None]:
    """(mlflow_run_id, tracking_uri) stored in a checkpoint (None where absent); never unpickles."""
    ckpt = read_header(checkpoint)
    return ckpt.get("mlflow_run_id") or None, ckpt.get("tracking_uri") or None


def stage_run(checkpoint: str | Path, run_id: str | None, tracking_uri: str | None, outbox: Outbox | None,
              stage: str) -> Run | None:
    """(run id, tracking URI) for ``stage`` (``eval``, ``heads``: the prefix of its messages) to log into: the trial
    job's outbox (its run unless ``run_id`` is given), else the ones given, else the checkpoint's; None (said on
    stderr) when no run is known."""
    if outbox is not None:
        rid = run_id or outbox.run_id
        return (rid, tracking_uri or outbox.tracking_uri) if rid else None
    ck_run, ck_uri = checkpoint_run(checkpoint)
    if not (run_id or ck_run):
        print(f"[{stage}] no MLflow run id (none given, none in the checkpoint): results written locally only",
              file=sys.stderr)
        return None
    return str(run_id or ck_run), tracking_uri or ck_uri


def known_tags(run: Run, outbox: Outbox | None) -> dict[str, str]:
    """The run's tags: those the trial job's outbox recorded, else read once from MLflow (the standalone command)."""
    if outbox is not None:
        return outbox.known_tags()
    from mlflow.tracking import MlflowClient

    return dict(MlflowClient(run[1]).get_run(run[0]).data.tags)


def check_fingerprints(run_id: str, known: dict[str, str], fingerprints: dict[str, str]) -> dict[str, str]:
    """Refuse a dataset name the run knows with other content (:class:`EvalDataChanged`); return the fingerprint
    tags the run does not hold yet."""
    for name, fp in fingerprints.items():
        before = known.get(eval_fingerprint_tag(name))
        if before and before != fp:
            raise EvalDataChanged(
                f"dataset {name!r} has other content than when MLflow run {run_id} was evaluated or measured on it "
                f"(fingerprint {before} then, {fp} now); its metrics would mix two test sets: give the new content "
                f"another dataset name (NAME=FORMAT:PATH), or start a new sweep")
    return {eval_fingerprint_tag(n): fp for n, fp in fingerprints.items() if known.get(eval_fingerprint_tag(n)) != fp}


def log_stage(outbox: Outbox | None, out: Path, run: Run, tags: dict[str, str], metrics: dict[str, float],
              files: Sequence[Path], artifact_dir: str, stage: str) -> None:
    """Tags, metrics (step 0) and ``files`` (into the run's ``artifact_dir``) through the trial job's outbox, or
    through one in ``out`` flushed here for at most :data:`~asr_core.runtime.outbox.FINAL_FLUSH_S` seconds."""
    run_id, tracking_uri = run
    own = outbox is None
    box = Outbox(out, tracking_uri=tracking_uri, run_id=run_id).start() if own else outbox
    assert box is not None
    if tags:
        box.tags(tags)
    # the trial job keeps the first value per key (a stage interrupted after logging is not logged twice); a
    # standalone command logs what it computed
    box.metrics(0, dict(sorted(metrics.items())), first_only=not own)
    for path in files:
        box.artifact(path, artifact_dir)
    what = f"{len(metrics)} metrics and {len(files)} files"
    if not own:
        print(f"[{stage}] {what} queued for run {run_id}", file=sys.stderr)
        return
    if box.flush(FINAL_FLUSH_S):
        print(f"[{stage}] logged {what} to run {run_id}", file=sys.stderr)
    else:
        print(f"[{stage}] MLflow at {tracking_uri} has not taken everything yet ({box.last_error or 'no answer in time'}"
              f"); ship the rest later: python -m asr_core outbox {out} --tracking-uri {tracking_uri} --run-id "
              f"{run_id}", file=sys.stderr)
    box.close()
