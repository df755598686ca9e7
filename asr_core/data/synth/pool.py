"""The worker pool that renders the synthetic corpus's recordings (:func:`render_all`), and what Ctrl-C leaves
(:class:`Interrupted`).

The workers ignore SIGINT (a Ctrl-C at the terminal reaches the whole process group): only the parent hears it, and
then ends the workers at once (``Pool.terminate``) instead of letting them finish every queued recording, which took
half a minute and more. A recording is complete when its transcript JSON exists (written last, atomically); what a
stopped worker left half-written (the audio, the metadata, a ``.json.tmp``) is removed, so nothing half-written looks
complete, and running the same command again renders exactly the recordings that are missing."""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while the recordings were rendered: the workers are stopped; ``written`` of ``total`` recordings are
    complete in ``out``, the corpus is not (its ``synth.json`` says ``"complete": false``)."""

    def __init__(self, out: Path, written: int, total: int) -> None:
        super().__init__(out, written, total)
        self.out, self.written, self.total = out, written, total

    def line(self) -> str:
        """The one line the command prints."""
        return (f"synth: interrupted; {self.written} of {self.total} recordings are complete in {self.out}, which "
                f"is not usable yet (synth.json: not complete): run the same command again to finish it (those "
                f"{self.written} are kept), or delete {self.out}")


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _call(job: tuple[Callable[..., dict], tuple[Any, ...]]) -> dict:
    fn, args = job
    return fn(*args)


def render_all(write: Callable[..., dict], jobs: Sequence[tuple[Any, ...]], workers: int, out: Path,
               done: Callable[[Any], Path]) -> Iterator[dict]:
    """``write(*args)`` for every ``args`` in ``jobs`` on ``workers`` processes, each result yielded as it comes.
    ``done(args)``: the file whose existence says that job is complete. Ctrl-C ends the workers at once, removes
    what the unfinished jobs half-wrote (:func:`clear_partial`) and raises :class:`Interrupted` (``out``: the
    corpus's folder it names)."""
    pool = multiprocessing.Pool(max(1, workers), initializer=_ignore_sigint)
    try:
        yield from pool.imap_unordered(_call, [(write, args) for args in jobs])
        pool.close()
    except KeyboardInterrupt:
        pool.terminate()
        pool.join()
        left = [args for args in jobs if not done(args).exists()]
        clear_partial([done(args) for args in left])
        raise Interrupted(out, len(jobs) - len(left), len(jobs)) from None
    except BaseException:
        pool.terminate()
        raise
    pool.join()


def clear_partial(transcripts: Sequence[Path]) -> None:
    """Remove what an unfinished recording left beside its (absent) transcript ``SPLIT/ID.json``: ``SPLIT/ID.wav``,
    ``SPLIT/ID.json.tmp`` and ``meta/ID.json``."""
    for t in transcripts:
        for p in (t.with_suffix(".wav"), t.with_suffix(".json.tmp"), t.parent.parent / "meta" / t.name):
            p.unlink(missing_ok=True)
