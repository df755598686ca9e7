"""``orchestrate logs SWEEP KEY [-f]``: a trial's log (``trials/KEY/trial.log``, the stdout and stderr of every
segment of its job), with each progress bar's carriage-return run shown as its last state; ``-f`` follows the log
as the job writes it until Ctrl-C (exit 130).

KEY is a trial's key, a unique prefix of one, or its label (:func:`orchestrate.cli.show.find_trial`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from asr_core.contract.trial import TrialFolder
from orchestrate.cli.show import find_trial
from orchestrate.sweep.folder import SweepDir
from orchestrate.sweep.trial_state import read_trial_refs

__all__ = ["EXIT_INTERRUPTED", "FOLLOW_EVERY_S", "LogFollower", "add_arguments", "collapse", "collapse_line",
           "show_log"]

EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as every other command
FOLLOW_EVERY_S = 0.5  # how often -f looks for more of the log
READ_BYTES = 1 << 20


def collapse_line(line: str) -> str:
    """A line as a terminal last showed it: the text after its last carriage return (a progress bar redrawn in
    place); a line ending in ``\\r`` (``\\r\\n``, or a bar's last redraw) keeps the text before it."""
    body = line.rstrip("\r")
    return body.rsplit("\r", 1)[-1]


def collapse(text: str) -> str:
    """``text`` with every line collapsed (:func:`collapse_line`); the newlines stay as they are."""
    return "\n".join(collapse_line(line) for line in text.split("\n"))


class LogFollower:
    """Reads a log from a byte offset on and hands back whole lines, collapsed; a line not ended yet waits for its
    newline (:meth:`partial` is its last state so far)."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path, self.offset = path, offset
        self._rest = b""

    def read(self) -> list[str]:
        """The whole lines written since the last call (none when the file does not exist yet)."""
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self.offset:  # the log was replaced: from its start again
                    self.offset, self._rest = 0, b""
                f.seek(self.offset)
                data = f.read(READ_BYTES)
        except OSError:
            return []
        self.offset += len(data)
        data = self._rest + data
        end = data.rfind(b"\n")
        if end < 0:
            self._rest = data
            return []
        self._rest = data[end + 1:]
        return [collapse_line(ln) for ln in data[:end].decode(errors="replace").split("\n")]

    def partial(self) -> str:
        """The last state of the line being written (a progress bar), or ""."""
        return collapse_line(self._rest.decode(errors="replace"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``logs``'s own arguments (after SWEEP and the common ones)."""
    p.add_argument("key", metavar="KEY", help="the trial: its key, a unique prefix of it, or its label")
    p.add_argument("-f", "--follow", action="store_true",
                   help="go on printing what the job writes until Ctrl-C (waits for a log not written yet)")


def _print_lines(lines: list[str], out: TextIO) -> None:
    if lines:
        out.write("\n".join(lines) + "\n")
        out.flush()


def _follow(reader: LogFollower, out: TextIO, every_s: float) -> None:
    """Print the log's new lines as they come, forever (Ctrl-C ends it); on a terminal the line being written is
    shown in place, as the job's own terminal would."""
    live = out.isatty()
    shown = ""
    while True:
        lines = reader.read()
        if live and shown and lines:
            out.write("\r\x1b[K")  # the in-place line gives way to the whole ones
            shown = ""
        _print_lines(lines, out)
        now = reader.partial() if live else ""
        if now != shown:
            out.write("\r\x1b[K" + now)
            out.flush()
            shown = now
        time.sleep(every_s)


def show_log(args: argparse.Namespace, sweep: SweepDir, out: TextIO | None = None,
             every_s: float = FOLLOW_EVERY_S) -> int:
    """Print the log of the trial ``args.key`` names (collapsed, :func:`collapse`); ``args.follow``: then follow
    it until Ctrl-C (exit 130). A trial without a log yet: one line saying so, exit 1 (``-f`` waits for it).
    Raises :class:`~orchestrate.cli.checks.UsageError` (exit 2) when KEY names no trial of the sweep."""
    out = out or sys.stdout
    trial = find_trial(read_trial_refs(sweep), args.key, sweep.name)  # type: ignore[arg-type]
    path = TrialFolder(sweep.trial_dir(trial.key)).log
    follow = bool(getattr(args, "follow", False))
    if not path.exists() and not follow:
        print(f"orchestrate logs: trial {trial.label} ({trial.key}) has no log yet: {path} does not exist (its job has "
              f"not started; `{sweep.command('status')}` shows its state, `logs -f` waits for it)", file=sys.stderr)
        return 1
    reader = LogFollower(path)
    if not follow:
        while lines := reader.read():
            _print_lines(lines, out)
        if reader.partial():
            out.write(reader.partial() + "\n")
        return 0
    if threading.current_thread() is threading.main_thread():  # Ctrl-C ends it even where SIGINT was ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not path.exists():
        print(f"orchestrate logs: waiting for {path} (trial {trial.label} has not started; Ctrl-C ends)",
              file=sys.stderr)
    try:
        _follow(reader, out, every_s)
    except KeyboardInterrupt:
        out.write("\n" if out.isatty() else "")
        out.flush()
        return EXIT_INTERRUPTED
    return 0  # (never: following ends by Ctrl-C)
