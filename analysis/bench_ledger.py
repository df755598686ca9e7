"""A fake ledger of the paper grid in a real MLflow server, for ``python -m analysis bench``: :func:`build_ledger`.

The trials are those of ``grids/paper.yaml`` as ``orchestrate plan grids/paper.yaml --json`` lists them (321;
beyond that, copies under new keys, :func:`orchestrate.tools.fake_sweep.fake_trials`), every one FINISHED, as the
ledger and the trial job leave it: a parent run, the trial tags (role, key, sub-grids, label, seed, backend, job),
the config's params (``cfg.flat()``), a WER metric per test set and condition, head-similarity metrics
(``heads/<set>/<R>/sum`` and ``.../similarity``), and per-recording tables ``eval/<set>.csv``
(:data:`asr_core.contract.metrics.TABLE_COLUMNS`) for 3 test sets of 125, 40 and 40 recordings, clean and music at
10, 0 and -5 dB. Error rates are drawn per recording and fall slowly with the context length, with seed noise, so the
report finds effects both ways. Everything is sent over HTTP (:class:`orchestrate.ledger.mlflow_rest.MlflowRest`, the
artifacts through MLflow's artifact repository), up to 8 runs at once.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from asr_core.contract.metrics import CLEAN, TABLE_COLUMNS, condition_name, heads_key, metric_name, table_file
from asr_core.contract.trial import (EVAL_DIR, FINISHED, ROLE_PARENT, ROLE_TRIAL, TAG_BACKEND, TAG_JOB_ID, TAG_KEY,
                                     TAG_LABEL, TAG_PARENT_RUN, TAG_ROLE, TAG_SEED, TAG_SUBGRIDS, TAG_SWEEP_BACKEND,
                                     TAG_SWEEP_GRID)

TEST_SETS = {"earnings22": 125, "tedlium": 40, "rev16": 40}  # recordings per test set
SNRS = (10.0, 0.0, -5.0)
NOISE_FACTOR = {None: 1.0, 10.0: 1.25, 0.0: 1.8, -5.0: 2.5}
REPRESENTATIONS = ("A", "Q", "K", "V", "Y")
WORKERS = 8  # runs written at once


def _recordings(seed: int) -> dict[str, tuple[list[str], np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = {}
    for ds, n in TEST_SETS.items():
        out[ds] = ([f"{ds}-{i:03d}" for i in range(n)], rng.integers(2000, 12000, size=n), rng.beta(8, 40, size=n))
    return out


def run_tables(rng: np.random.Generator, recordings: dict[str, tuple[list[str], np.ndarray, np.ndarray]],
               context_s: float) -> tuple[dict[str, str], dict[str, float]]:
    """One trial's tables ({file name: CSV text}) and WER metrics: error rates of each recording, lower for a longer
    context (4% per doubling from 10.24 s), times the condition's noise factor and a seed factor."""
    factor = (1.0 - 0.04 * math.log2(max(context_s, 1.0) / 10.24)) * rng.normal(1.0, 0.01)
    tables, metrics = {}, {}
    for ds, (names, words, rate) in recordings.items():
        parts = []
        for snr in (None, *SNRS):
            cond = CLEAN if snr is None else condition_name(snr)
            p = np.clip(rate * NOISE_FACTOR[snr] * factor, 0.0, 0.95)
            errors = rng.binomial(words, p)
            sub = rng.binomial(errors, 0.6)
            dele = rng.binomial(errors - sub, 0.6)
            ins = errors - sub - dele
            parts.append(pd.DataFrame({"dataset": ds, "condition": cond, "snr_db": "" if snr is None else snr,
                                       "recording": names, "ref_words": words, "substitutions": sub,
                                       "deletions": dele, "insertions": ins, "hyp_words": words - dele + ins,
                                       "wer": 100.0 * errors / words}))
            metrics[metric_name(ds, cond)] = 100.0 * float(errors.sum()) / float(words.sum())
        tables[table_file(ds)] = pd.concat(parts)[list(TABLE_COLUMNS)].to_csv(index=False)
    first = next(iter(recordings))
    for r in REPRESENTATIONS:
        metrics[heads_key(first, r, "sum")] = float(rng.uniform(2.0, 6.0))
        metrics[heads_key(first, r, "similarity")] = float(rng.uniform(0.2, 0.8))
    return tables, metrics


def build_ledger(uri: str, experiment: str, runs: int, *, seed: int = 0,
                 say: Callable[[str], None] | None = None) -> int:
    """Write a fake paper-grid sweep of ``runs`` finished trials (and its parent run) as experiment ``experiment``
    of the MLflow server at ``uri``; returns the number of trial runs. ``say`` gets a progress line now and then
    (default: stderr)."""
    # imported here, once: eight threads importing mlflow at the same time can deadlock on its module locks
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    from orchestrate.ledger.mlflow_rest import MlflowRest
    from orchestrate.tools.fake_sweep import PAPER_GRID, fake_trials

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    trials = fake_trials(runs)
    rest = MlflowRest(uri, workers=WORKERS)
    exp_id = rest.create_experiment(experiment) or rest.get_experiment_by_name(experiment).experiment_id
    parent = rest.create_run(exp_id, experiment, {TAG_ROLE: ROLE_PARENT, TAG_SWEEP_GRID: str(PAPER_GRID),
                                                  TAG_SWEEP_BACKEND: "slurm"}).run_id
    recordings = _recordings(seed)
    done = [0]
    t0 = time.monotonic()
    step = max(1, runs // 20)

    def one(item: tuple[int, Any]) -> None:
        i, trial = item
        rng = np.random.default_rng([seed, i])
        tags = {TAG_PARENT_RUN: parent, TAG_ROLE: ROLE_TRIAL, TAG_KEY: trial.key,
                TAG_SUBGRIDS: ",".join(trial.subgrids), TAG_LABEL: trial.label, TAG_SEED: str(trial.seed),
                TAG_BACKEND: "slurm", TAG_JOB_ID: str(100000 + i)}
        created = rest.call("runs/create", {"experiment_id": exp_id, "run_name": trial.label, "tags":
                                            [{"key": k, "value": v} for k, v in tags.items()],
                                            "start_time": int(time.time() * 1000), "user_id": "bench"},
                            idempotent=False)["run"]["info"]
        run_id, artifact_uri = created["run_id"], created["artifact_uri"]
        rest.log_batch(run_id, params={k: str(v) for k, v in trial.config.flat().items()})
        tables, metrics = run_tables(rng, recordings, float(trial.config.data.context_s))
        now = int(time.time() * 1000)
        rest.call("runs/log-batch", {"run_id": run_id, "metrics": [
            {"key": k, "value": v, "timestamp": now, "step": 0} for k, v in metrics.items()]})
        repo = get_artifact_repository(artifact_uri, tracking_uri=uri)
        with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
            for name, text in tables.items():
                (Path(tmp) / name).write_text(text, encoding="utf-8")
            repo.log_artifacts(tmp, EVAL_DIR)
        rest.set_terminated(run_id, FINISHED)
        done[0] += 1  # a race between threads costs at most a progress line
        if done[0] % step == 0 or done[0] == runs:
            took = time.monotonic() - t0
            say(f"bench: ledger {done[0]}/{runs} runs written ({took:.0f} s)")

    try:
        rest.map(one, list(enumerate(trials)))
        rest.set_terminated(parent, FINISHED)
    finally:
        rest.close()
    return len(trials)

