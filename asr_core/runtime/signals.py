"""The scheduler's stop signals (SIGUSR2, SIGTERM), recorded from the first line of the process.

SLURM sends SIGUSR2 (``--signal``) or SIGTERM (preemption, ``scancel``, the time limit) and waits ``signal_delay_s``
before SIGKILL. A job that dies of the default handler in that window is never requeued, so the trial job and
``python -m asr_core train`` install :func:`install` before importing anything heavy (``asr_core.__main__``): from
then on a stop signal is only *recorded*, whatever the job is doing (loading the corpus, learning the tokenizer,
training, evaluating, shipping to MLflow). Each phase honours it at its next safe point:

* the training loop polls :func:`received` at every step boundary: checkpoint, then
  :class:`asr_core.training.loop.Preempted`;
* phases with nothing to checkpoint (the trainer's setup, evaluation) run inside :func:`raising`: a signal, also
  one that arrived before the phase began, raises the given exception at once;
* the trial job's last flush to MLflow shortens its deadline once a signal has arrived.

This module imports nothing but the standard library, so installing it costs microseconds.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)


class _State:
    def __init__(self) -> None:
        self.signum: int | None = None  # the first stop signal received (later ones are counted, not recorded)
        self.time: float = 0.0
        self.count = 0
        self.installed = False
        self.previous: dict[int, Any] = {}
        self.raise_with: Callable[[str], BaseException] | None = None


_state = _State()


def _handle(signum: int, frame: FrameType | None) -> None:
    _state.count += 1
    if _state.signum is None:
        _state.signum, _state.time = signum, time.time()
        factory, _state.raise_with = _state.raise_with, None  # raise once: a second signal must not interrupt
        if factory is not None:                                 # the handling of the first
            raise factory(signal.Signals(signum).name)


def install() -> bool:
    """Record SIGUSR2/SIGTERM from now on instead of dying of them. Idempotent; returns whether this call installed
    the handlers (False when they already were, or when not called from the main thread, where Python cannot)."""
    if _state.installed or threading.current_thread() is not threading.main_thread():
        return False
    _state.previous = {s: signal.signal(s, _handle) for s in STOP_SIGNALS}
    _state.installed = True
    return True


def uninstall() -> None:
    """Restore the handlers :func:`install` replaced and forget any recorded signal."""
    if not _state.installed or threading.current_thread() is not threading.main_thread():
        return
    for s, old in _state.previous.items():
        signal.signal(s, old)
    _state.previous, _state.installed = {}, False
    clear()


@contextmanager
def installed() -> Iterator[None]:
    """Handlers installed for the duration of the block; restored afterwards only if this block installed them
    (a library caller of :func:`asr_core.training.train.train` gets its own handlers back, the command keeps them)."""
    mine = install()
    try:
        yield
    finally:
        if mine:
            uninstall()


def is_installed() -> bool:
    return _state.installed


def received() -> int | None:
    """The first stop signal received since :func:`install` (or :func:`clear`), or None."""
    return _state.signum


def name() -> str:
    """``SIGUSR2``, ``SIGTERM`` or "" when none arrived."""
    return signal.Signals(_state.signum).name if _state.signum is not None else ""


def age() -> float:
    """Seconds since the first stop signal arrived (0 when none did)."""
    return time.time() - _state.time if _state.signum is not None else 0.0


def clear() -> None:
    """Forget a recorded signal (a process that handled it and goes on, e.g. tests calling the trainer twice)."""
    _state.signum, _state.time, _state.count = None, 0.0, 0


@contextmanager
def raising(factory: Callable[[str], BaseException]) -> Iterator[None]:
    """Within the block a stop signal raises ``factory(SIGNAL_NAME)`` in the main thread at once; one that arrived
    before the block raises on entry. For phases that have nothing to checkpoint. Nests (the inner factory wins
    while it is active)."""
    if _state.signum is not None:
        raise factory(name())
    outer, _state.raise_with = _state.raise_with, factory
    try:
        yield
    finally:
        # restore the outer factory unless a signal consumed ours (then nothing more may raise)
        if _state.signum is None:
            _state.raise_with = outer
        else:
            _state.raise_with = None


# ---- stopping a child's process group --------------------------------------------------------------------------

def stop_group(process: Any, timeout: float = 5.0) -> None:
    """Stop ``process`` (a :class:`subprocess.Popen` started with ``start_new_session=True``) and everything in its
    process group, as a server with workers needs: SIGTERM, then SIGKILL if the group's leader has not ended within
    ``timeout`` s. A process that has ended already, or whose group is gone, is left alone."""
    import os
    import subprocess

    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=timeout)
    except ProcessLookupError:
        pass
