"""One line of progress for trials running on this machine, read from their folders (no MLflow round trip).

A trial folder holds ``trial.log`` (the trainer's output) and ``DONE`` once finished, so a glance at the folders
says how far each trial is: ``[orchestrate] 2/8 finished, 2 running: ctx10s-…-s1 train 30/60, ctx10s-…-s2 eval``.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

_STEP = re.compile(rb"\[train\] step (\d+)/(\d+)")
_EVAL = re.compile(rb"\[eval\] ([^\s:]+) (\d+)/(\d+)")


def _tail(path: Path, size: int = 8192) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - size))
            return f.read()
    except OSError:
        return b""


def trial_phase(trial_dir: Path) -> str | None:
    """``"done"``, ``"train 30/60"``, ``"eval test 1/4"``, ``"starting"``, or None if the trial has not started."""
    if (trial_dir / "DONE").exists():
        return "done"
    log = trial_dir / "trial.log"
    if not log.exists():
        return None
    tail = _tail(log)
    steps, evals = list(_STEP.finditer(tail)), list(_EVAL.finditer(tail))
    last_step = steps[-1] if steps else None
    last_eval = evals[-1] if evals else None
    if last_eval is not None and (last_step is None or last_eval.start() > last_step.start()):
        return f"eval {last_eval.group(1).decode()} {last_eval.group(2).decode()}/{last_eval.group(3).decode()}"
    if last_step is not None:
        return f"train {last_step.group(1).decode()}/{last_step.group(2).decode()}"
    return "starting"


class ProgressPrinter:
    """Prints a progress line every ``every_s`` seconds when it changed; call :meth:`tick` from a polling loop."""

    def __init__(self, trials: dict[str, Path], labels: dict[str, str], every_s: float = 20.0) -> None:
        self.trials, self.labels, self.every_s = trials, labels, every_s
        self._last_print = time.monotonic()
        self._last_line = ""

    def line(self) -> str:
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
