"""One line of progress for trials running on this machine, read from their folders (no MLflow round trip).

The trial job appends structured progress records to its folder (:class:`asr_core.contract.trial.ProgressLog`);
:func:`trial_phase` reads the last one with :func:`asr_core.contract.trial.read_progress` and never parses the
trainer's log text. A glance at the folders says how far each trial is:
``[orchestrate] 2/8 finished, 2 running, 4 waiting: ctx10s-…-s1 train 30/60, ctx10s-…-s2 eval test 4/12``;
a trial whose job failed, or checkpointed and stopped when preempted, is counted as such, not as running:
``[orchestrate] 2/8 finished, 1 running, 1 failed, 1 preempted, 3 waiting: ctx10s-…-s1 train 30/60, ctx10s-…-s2
failed, ctx10s-…-s3 preempted``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from asr_core.contract.trial import Progress, TrialFolder, read_progress

STOPPED = ("failed", "preempted", "cancelled")  # phases of a trial whose job is no longer running (and not finished)


def trial_phase(trial_dir: Path) -> str | None:
    """``"done"``, ``"train 30/60"``, ``"eval test 1/4"``, ``"starting"`` (and the other
    :meth:`~asr_core.contract.trial.Progress.describe` texts), or None if the trial has not started.

    ``DONE`` in the folder means done whatever the records say; a job that started (its log exists) but has not
    written a record yet is ``"starting"``."""
    folder = TrialFolder(Path(trial_dir))
    if folder.done.exists():
        return "done"
    progress = read_progress(folder.path)
    return phase_text(False, progress, progress is not None or folder.log.exists())


def phase_text(done: bool, progress: Progress | None, started: bool) -> str | None:
    """The phase :func:`trial_phase` reports, from what a caller has already read: ``done`` (DONE exists), the last
    progress record, and whether the job has started at all (``starting`` until its first record)."""
    if done:
        return "done"
    if progress is not None:
        return progress.describe()
    return "starting" if started else None


class ProgressPrinter:
    """Prints a progress line every ``every_s`` seconds when it changed; call :meth:`tick` from a polling loop."""

    def __init__(self, trials: dict[str, Path], labels: dict[str, str], every_s: float = 20.0) -> None:
        self.trials, self.labels, self.every_s = trials, labels, every_s
        self._last_print = time.monotonic()
        self._last_line = ""

    def line(self) -> str:
        """``[orchestrate] D/N finished, R running[, F failed][, P preempted], W waiting: LABEL PHASE, ...`` for the
        trials now: the running ones with their phase, then the failed and the preempted ones. A job that failed or
        checkpointed on preemption is not running; the counts of failed and preempted show only when not zero."""
        phases = {k: trial_phase(d) for k, d in self.trials.items()}
        done = sum(p == "done" for p in phases.values())
        waiting = sum(p is None for p in phases.values())
        stopped = {phase: [k for k, p in phases.items() if p == phase] for phase in STOPPED}
        running = [k for k, p in phases.items() if p is not None and p != "done" and p not in STOPPED]
        parts = [f"{done}/{len(phases)} finished", f"{len(running)} running"]
        parts += [f"{len(keys)} {phase}" for phase, keys in stopped.items() if keys]
        parts.append(f"{waiting} waiting")
        shown = [f"{self.labels.get(k, k)} {phases[k]}" for k in running + [k for keys in stopped.values()
                                                                          for k in keys]]
        return "[orchestrate] " + ", ".join(parts) + (": " + ", ".join(shown) if shown else "")

    def tick(self) -> bool:
        """Print if due and changed. Returns False, so it can serve as a never-stopping poll callback."""
        now = time.monotonic()
        if now - self._last_print >= self.every_s:
            self._last_print = now
            line = self.line()
            if line != self._last_line:
                print(line, file=sys.stderr, flush=True)
                self._last_line = line
        return False
