"""One line of progress for trials running on this machine, read from their folders (no MLflow round trip).

The trial job appends structured progress records to its folder (:class:`asr_core.trial_contract.ProgressLog`);
:func:`trial_phase` reads the last one with :func:`asr_core.trial_contract.read_progress` and never parses the
trainer's log text. A glance at the folders says how far each trial is:
``[orchestrate] 2/8 finished, 2 running, 4 waiting: ctx10s-…-s1 train 30/60, ctx10s-…-s2 eval test 4/12``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from asr_core.trial_contract import TrialFolder, read_progress


def trial_phase(trial_dir: Path) -> str | None:
    """``"done"``, ``"train 30/60"``, ``"eval test 1/4"``, ``"starting"`` (and the other
    :meth:`~asr_core.trial_contract.Progress.describe` texts), or None if the trial has not started.

    ``DONE`` in the folder means done whatever the records say; a job that started (its log exists) but has not
    written a record yet is ``"starting"``."""
    folder = TrialFolder(Path(trial_dir))
    if folder.done.exists():
        return "done"
    progress = read_progress(folder.path)
    if progress is not None:
        return progress.describe()
    return "starting" if folder.log.exists() else None


class ProgressPrinter:
    """Prints a progress line every ``every_s`` seconds when it changed; call :meth:`tick` from a polling loop."""

    def __init__(self, trials: dict[str, Path], labels: dict[str, str], every_s: float = 20.0) -> None:
        self.trials, self.labels, self.every_s = trials, labels, every_s
        self._last_print = time.monotonic()
        self._last_line = ""

    def line(self) -> str:
        """``[orchestrate] D/N finished, R running, W waiting: LABEL PHASE, ...`` for the trials now."""
        phases = {k: trial_phase(d) for k, d in self.trials.items()}
        done = sum(p == "done" for p in phases.values())
        running = [f"{self.labels.get(k, k)} {p}" for k, p in phases.items() if p not in (None, "done")]
        waiting = sum(p is None for p in phases.values())
        text = f"[orchestrate] {done}/{len(phases)} finished, {len(running)} running, {waiting} waiting"
        return text + (": " + ", ".join(running) if running else "")

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
