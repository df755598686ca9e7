"""A model's ``TRAINED`` record (:data:`~asr_core.contract.trial.TRAINED_FILE` in its trial folder): training
finished, with which checkpoint, after how many steps, and the sha256 of that checkpoint as every evaluation reads it.

One writer (:func:`mark_trained`), one reader (:func:`read_trained`); :func:`seal_trained` adds the hash once the
trial has dropped the optimizer state, and every evaluation job of the model refuses another file
(:func:`asr_core.evaluation.checkpoint_read.verify`). The record is JSON ``{"checkpoint", "steps"[, "sha256"]}``,
written whole or not at all; an unreadable record counts as absent (the checkpoint itself then says whether training
finished).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from asr_core.contract.atomic import write_atomic
from asr_core.contract.folder.checkpoint_file import file_sha256
from asr_core.contract.trial import TrialFolder


@dataclass(frozen=True)
class Trained:
    """What a ``TRAINED`` record says."""

    checkpoint: Path
    steps: int
    sha256: str = ""  # "" for a model trained before records held it, or not sealed yet


def mark_trained(trial_dir: Path | str, checkpoint: Path | str, steps: int, sha256: str = "") -> None:
    """Write the ``TRAINED`` record: training finished with ``checkpoint`` after ``steps`` steps; ``sha256``: of the
    checkpoint as evaluations read it (:func:`seal_trained`)."""
    record = {"checkpoint": str(checkpoint), "steps": steps, **({"sha256": sha256} if sha256 else {})}
    write_atomic(TrialFolder(Path(trial_dir)).trained, json.dumps(record))


def read_trained(trial_dir: Path | str, *, warn: bool = False) -> Trained | None:
    """The trial's ``TRAINED`` record; None when there is none or it cannot be read (``warn``: then say so on stderr,
    as the trial job does before it asks the checkpoint instead)."""
    path = TrialFolder(Path(trial_dir)).trained
    try:
        record = json.loads(path.read_text())
        return Trained(Path(record["checkpoint"]), int(record["steps"]), str(record.get("sha256") or ""))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        if warn:
            print(f"[trial] warning: {path} is unreadable ({type(e).__name__}: {e}); treated as absent: the trainer "
                  "finds from the checkpoint whether training finished", file=sys.stderr, flush=True)
        return None


def trained_checkpoint(trial_dir: Path | str) -> Path | None:
    """The checkpoint the ``TRAINED`` record names; None when there is none, or (with a warning on stderr) when it
    cannot be read."""
    record = read_trained(trial_dir, warn=True)
    return record.checkpoint if record is not None else None


def seal_trained(trial_dir: str | Path) -> str:
    """Record in the trial's ``TRAINED`` the sha256 of the checkpoint it names, as training left it for evaluation
    (the optimizer state dropped), once; that hash ("" where there is no readable record or checkpoint). Every
    evaluation job of the model then refuses another file."""
    record = read_trained(trial_dir)
    if record is None:
        return ""
    if record.sha256:
        return record.sha256
    try:
        sha = file_sha256(record.checkpoint)
    except OSError:
        return ""
    mark_trained(trial_dir, record.checkpoint, record.steps, sha)
    return sha
