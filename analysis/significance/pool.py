"""Many comparisons over every core: :func:`compare_all` runs :func:`analysis.significance.stats.compare` on a list of paired
counts, in worker processes when the list is long enough to pay for them.

Each comparison carries its own seed (:func:`analysis.significance.werr.stable_seed` of what is compared), so the results do not
depend on the order, the number of workers or which worker ran what: the report's tables are the same byte for byte
with one process or several (``tests/test_compare_pool.py``).

The workers are forked from this process on Linux: they compute with numpy and scipy
only, take no lock and log nothing, and a fork neither imports the caller's script again (which ``spawn`` and
``forkserver`` would, so a script without a ``__main__`` guard could not use them) nor pays the imports. Elsewhere
(macOS, where forking is unsafe, and Windows) they are spawned. They get the comparisons in chunks. The
number of workers is the cores this process may use (``os.sched_getaffinity``), capped by
:data:`MAX_WORKERS`; ``ANALYSIS_WORKERS=N`` in the environment sets it (1: everything in this process).
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import pickle
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Mapping, Sequence

from analysis.significance import stats

log = logging.getLogger(__name__)

MIN_PARALLEL = 96  # fewer comparisons than this take less time than starting the workers (about 1 s)
MAX_WORKERS = 8
CHUNKS_PER_WORKER = 4
WORKERS_ENV = "ANALYSIS_WORKERS"

Task = tuple[stats.PairedCounts, Mapping[str, Any]]  # (paired counts, keyword arguments of stats.compare)


def worker_count(env: Mapping[str, str] | None = None) -> int:
    """The number of processes for the comparisons: ``ANALYSIS_WORKERS`` when set to a positive integer, else the
    cores this process may run on, at most :data:`MAX_WORKERS`."""
    env = os.environ if env is None else env
    text = env.get(WORKERS_ENV, "").strip()
    if text:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value >= 1:
            return value
        log.warning("%s=%r is not a positive integer; using the cores", WORKERS_ENV, text)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores))


def _run(chunk: Sequence[Task]) -> list[stats.Comparison]:
    return [stats.compare(pc, **kwargs) for pc, kwargs in chunk]


def compare_all(tasks: Sequence[Task], *, workers: int | None = None,
                progress: bool = False) -> list[stats.Comparison]:
    """``[stats.compare(pc, **kwargs) for pc, kwargs in tasks]``, in that order, over ``workers`` processes
    (:func:`worker_count` unless given) when there are at least :data:`MIN_PARALLEL` tasks. Should the pool fail
    to start or lose a worker, the comparisons are made in this process instead (logged), with the same results.
    ``progress``: a bar of comparisons made, on stderr."""
    workers = worker_count() if workers is None else max(1, workers)
    parallel = workers > 1 and len(tasks) >= MIN_PARALLEL
    size = max(1, -(-len(tasks) // (workers * CHUNKS_PER_WORKER))) if parallel else 16
    chunks = [tasks[i:i + size] for i in range(0, len(tasks), size)]
    if parallel:
        try:
            return _in_workers(chunks, workers, progress, len(tasks))
        except (RuntimeError, OSError, pickle.PicklingError) as e:  # BrokenProcessPool is a RuntimeError
            log.warning("comparisons in worker processes failed (%s); making them in this process", e)
    out: list[stats.Comparison] = []
    bar = _bar(len(tasks), progress)
    for chunk in chunks:
        out.extend(_run(chunk))
        bar.update(len(chunk))
    bar.close()
    return out


def _in_workers(chunks: list[Sequence[Task]], workers: int, progress: bool, total: int) -> list[stats.Comparison]:
    """The chunks' comparisons in ``workers`` forked processes (spawned where the platform is not Linux). Objects
    the parent holds are frozen out of the garbage collector first, so the workers' collections do not copy every
    page they share with it; the progress bar (and its thread) starts once the workers are forked."""
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    out: list[stats.Comparison] = []
    gc.freeze()
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            parts = pool.map(_run, chunks)  # submits every chunk: the workers are forked by now
            bar = _bar(total, progress)
            try:
                for part in parts:
                    out.extend(part)
                    bar.update(len(part))
            finally:
                bar.close()
    finally:
        gc.unfreeze()
    return out


def _bar(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="significance", unit="comparison", leave=False, disable=not enabled or not total)
