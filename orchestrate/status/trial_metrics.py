"""The latest training loss and the WERs a trial folder holds, read from the end of its outbox (the records its job
writes for MLflow, :mod:`asr_core.contract.folder.outbox_files`): what ``status`` shows beside the trials that matter
now and the best configuration so far, without MLflow and without reading a whole outbox.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from asr_core.contract.metrics import CLEAN, parse_metric_key
from asr_core.contract.folder.outbox_files import outbox_dir, parse_record, record_files

__all__ = ["LOSS_KEY", "TAIL_BYTES", "TrialMetrics", "trial_metrics"]

LOSS_KEY = "train/loss"  # the trainer's CTC loss of a step (asr_core.training.step)
TAIL_BYTES = 65_536  # the end of the newest outbox file read: the last steps' metrics, and the WERs of an evaluation


@dataclass(frozen=True)
class TrialMetrics:
    """``loss``: the newest ``train/loss`` and its ``step`` (None when the tail holds none); ``wers``: the greedy
    clean WER of each dataset evaluated ({dataset: percent}, from ``wer/<DATASET>``)."""

    loss: float | None = None
    step: int | None = None
    wers: dict[str, float] = field(default_factory=dict)

    @property
    def wer(self) -> float | None:
        """The mean of :attr:`wers`, or None without any."""
        return sum(self.wers.values()) / len(self.wers) if self.wers else None


def _tail(path: Path, n: int) -> bytes:
    """The last ``n`` bytes of ``path``, from the first whole line in them (b"" when unreadable)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - n))
            data = f.read(n)
    except OSError:
        return b""
    if size > n:
        data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
    return data


def trial_metrics(trial_dir: Path | str, tail_bytes: int = TAIL_BYTES) -> TrialMetrics:
    """The :class:`TrialMetrics` at the end of a trial folder's newest outbox file (the current or last segment's);
    an empty one when the folder has no outbox yet."""
    box = outbox_dir(trial_dir)
    files = record_files(box)
    if not files:
        return TrialMetrics()
    loss: float | None = None
    step: int | None = None
    wers: dict[str, float] = {}
    for line in _tail(box / files[-1], tail_bytes).splitlines():
        if b'"metrics"' not in line:
            continue
        rec = parse_record(line)
        if rec is None or rec.get("kind") != "metrics" or not isinstance(rec.get("metrics"), dict):
            continue
        for key, value in rec["metrics"].items():
            if not isinstance(value, (int, float)):
                continue
            if key == LOSS_KEY:
                loss, step = float(value), int(rec.get("step") or 0)
            elif (parsed := parse_metric_key(key)) is not None and parsed[1] == CLEAN and math.isfinite(value):
                wers[parsed[0]] = float(value)
    return TrialMetrics(loss=loss, step=step, wers=wers)
