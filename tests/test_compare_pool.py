"""analysis.significance.pool: the comparisons made over worker processes are the ones made in one process, in the same order."""

from __future__ import annotations

import logging
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.significance import pool
from analysis.significance import stats
from analysis.significance import werr
from analysis.ledger.collect import build_sweep

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "analysis"))
import synthetic_sweep as synth  # noqa: E402


def _tasks(n: int) -> list[pool.Task]:
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        r = int(rng.integers(5, 30))  # below and above the exact permutation bound
        words = rng.integers(20, 200, size=r).astype(float)
        ea = rng.binomial(words.astype(int), 0.2, size=(3, r)).astype(float)
        eb = rng.binomial(words.astype(int), 0.18, size=(2, r)).astype(float)
        pc = stats.PairedCounts(tuple(f"r{j}" for j in range(r)), words, ea, eb, (0, 1, 2), (0, 1))
        out.append((pc, {"level": 0.95, "bootstrap_resamples": 200, "seed": 1000 + i}))
    return out


def _plain(results: list[stats.Comparison]) -> list[str]:
    return [repr(asdict(r)) for r in results]


def test_workers_give_the_same_comparisons_in_the_same_order() -> None:
    tasks = _tasks(pool.MIN_PARALLEL + 5)
    alone = pool.compare_all(tasks, workers=1)
    assert _plain(pool.compare_all(tasks, workers=2)) == _plain(alone)
    assert _plain(alone) == _plain([stats.compare(pc, **kw) for pc, kw in tasks])


def test_significance_table_is_the_same_with_one_process_or_two(monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = build_sweep(synth.EXPERIMENT, synth.make_records())
    monkeypatch.setattr(pool, "MIN_PARALLEL", 1)  # the synthetic sweep has fewer comparisons than the bound
    monkeypatch.setenv(pool.WORKERS_ENV, "1")
    one = werr.significance_table(sweep, bootstrap_resamples=300)
    monkeypatch.setenv(pool.WORKERS_ENV, "2")
    two = werr.significance_table(sweep, bootstrap_resamples=300)
    assert one["p_permutation"].notna().sum() >= 4
    pd.testing.assert_frame_equal(one, two)
    assert one.to_csv(index=False) == two.to_csv(index=False)


def test_a_pool_that_cannot_start_falls_back_to_this_process(monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    class NoPool:
        def __init__(self, *a: object, **k: object) -> None:
            raise OSError("no more processes")

    tasks = _tasks(pool.MIN_PARALLEL)
    monkeypatch.setattr(pool, "ProcessPoolExecutor", NoPool)
    with caplog.at_level(logging.WARNING, logger="analysis.significance.pool"):
        got = pool.compare_all(tasks, workers=2)
    assert _plain(got) == _plain(pool.compare_all(tasks, workers=1))
    assert "no more processes" in caplog.text


@pytest.mark.parametrize("env, cores, want", [({"ANALYSIS_WORKERS": "3"}, 2, 3), ({}, 2, 2), ({}, 64, 8),
                                              ({"ANALYSIS_WORKERS": "0"}, 2, 2), ({"ANALYSIS_WORKERS": "x"}, 1, 1)])
def test_worker_count(env: dict[str, str], cores: int, want: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool.os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert pool.worker_count(env) == want
