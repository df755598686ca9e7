"""A full-size sweep folder made up on disk, for timing ``status`` and for its tests: :func:`make_fake_sweep`.

It holds what a real sweep of the paper grid holds half-way through: ``sweep.json``, ``trials.json`` (the trials of
``grids/paper.yaml`` as ``orchestrate plan --json`` lists them; beyond its 321 trials, copies under new keys), one
submission file, and one folder per trial with the files the trial job writes (``config.json``, ``trial.log``,
``segments.jsonl``, ``progress.jsonl`` with a record per logged step, ``attempts.jsonl``, ``lease/``, ``outbox/``,
``TRAINED``, ``DONE``, ``eval/`` tables, ``CANCELLED``), each written by the writer that owns its format
(:mod:`asr_core.contract.trial`, :mod:`asr_core.contract.folder.segments`, :mod:`asr_core.contract.folder.lease`,
:mod:`asr_core.runtime.outbox`), in a realistic mix: most finished, some running (a lease whose holder
heartbeats on a compute node), preempted, failed or killed by the system (some past the failure budget),
cancelled, lost (a segment that ended without a word), and not started yet. No job runs and no MLflow is involved:
``ledger-sync.json`` says the orchestrator-side facts are mirrored, so ``status`` reads only the folders.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import time
from pathlib import Path

from asr_core.contract.folder.segments import Segment, append_segment
from asr_core.contract.folder.trained import mark_trained
from asr_core.contract.trial import (OUTCOME_CANCELLED, OUTCOME_FAILED, OUTCOME_FINISHED, OUTCOME_KILLED,
                                     OUTCOME_PREEMPTED, Attempt, Progress, TrialFolder, mark_cancelled, mark_done,
                                     write_attempts, write_config, write_progress)
from asr_core.contract.folder.lease import LeaseInfo, write_lease
from orchestrate.assets import grids_dir
from orchestrate.sweep.folder import Manifest, SweepDir
from orchestrate.sweep.trial import Trial

PAPER_GRID = grids_dir() / "paper.yaml"
CODES = ("3f2a9c1d0b7e", "8d41e0c2a9f3", "8d41e0c2a9f3+dirty.1a2b3c4d")
# (state, share of the trials): what a sweep half-way through its compute budget holds
MIX = (("finished", 0.55), ("running", 0.10), ("waiting", 0.14), ("preempted", 0.06), ("failed", 0.05),
       ("gave_up", 0.02), ("cancelled", 0.04), ("lost", 0.04))
TOTAL_STEPS = 60000
PROGRESS_LINES = 200  # progress records per started trial (the trainer writes one per `log_every` steps)


def fake_trials(n: int) -> list[Trial]:
    """``n`` trials of the paper grid (its 321, then copies under new keys and labels: ``…-c1``, ``…-c2``, …)."""
    from orchestrate.plan.grid import load_grid

    base = list(load_grid(PAPER_GRID).trials)
    out = base[:n]
    i = 0
    while len(out) < n:
        t = base[i % len(base)]
        copy = i // len(base) + 1
        key = hashlib.sha256(f"{t.key}-{copy}".encode()).hexdigest()[:12]
        out.append(dataclasses.replace(t, key=key, label=f"{t.label}-c{copy}"))
        i += 1
    return out


def _states(n: int, rng: random.Random, mix: tuple[tuple[str, float], ...] = MIX) -> list[str]:
    out: list[str] = []
    for state, share in mix:
        out += [state] * round(share * n)
    out = (out + ["finished"] * n)[:n]
    rng.shuffle(out)
    return out


def _lease(folder: TrialFolder, job_id: str, host: str, *, heartbeat: float, released: bool, generation: int) -> None:
    """A lease generation held by ``job_id`` on ``host`` (the heartbeat is the file's mtime)."""
    write_lease(folder.path, LeaseInfo(generation=generation, job_id=job_id, host=host, pid=4000 + generation,
                                       token=hashlib.md5(f"{folder.path}{generation}".encode()).hexdigest(),
                                       acquired=heartbeat - 3600, heartbeat=heartbeat, released=released,
                                       took_over=None, pid_start=None))


def _outbox(folder: TrialFolder, state: str, segment: int, step: int, every: int, now: float) -> None:
    """What the job told MLflow through its outbox (:class:`asr_core.runtime.outbox.Outbox`): params, statuses and a point
    per logged step; all of it shipped (the watermark at the end of each file) except, for a running trial, the
    last few steps its job has not shipped yet."""
    from asr_core.runtime.outbox import Outbox
    from asr_core.contract.folder.outbox_files import write_watermark

    box = Outbox(folder.path, segment=segment, run_id=None)
    try:
        box.params({"model.d_model": 768, "model.layers": 6, "train.lr": 0.003})
        box.status("RUNNING", {"trial.segments": segment})
        ms = int((now - 7200) * 1000)
        for k in range(every, step + 1, every):
            box.metrics(k, {"train/loss": 4.0 / (1 + k / 1000), "train/lr": 0.003, "train/seq_len_s": 10.24,
                            "train/batch_size": 350.0, "train/grad_norm": 1.0, "train/micro_batches": 1.0},
                        time_ms=ms + k * 100)
        if state == "finished":
            box.metrics(step, {"wer/tedlium": 7.0}, time_ms=ms + step * 100, first_only=False)
            box.status("FINISHED")
        elif state in ("failed", "gave_up"):
            box.status("FAILED", {"trial.error": "RuntimeError: loss is nan at step 4711"})
        elif state == "preempted":
            box.status("SCHEDULED", {"trial.preemptions": 1})
        seq = box.seq
    finally:
        box.close()
    size = box.path.stat().st_size
    if state == "running":  # the records of the last few steps wait for the job's next shipment
        with open(box.path, "rb") as f:
            lines = f.read().splitlines(keepends=True)
        size, seq = size - sum(len(line) for line in lines[-5:]), seq - 5
    write_watermark(box.dir, {box.name: {"offset": size, "seq": seq}})


def _trial_folder(folder: TrialFolder, trial: Trial, state: str, rng: random.Random, job: str, now: float) -> None:
    write_config(folder.path, trial.config)
    if state == "waiting":
        return
    n_seg = 1 + (rng.random() < 0.3) + (rng.random() < 0.1)
    host = f"gpu-node-{rng.randrange(1, 65):02d}"
    segments: list[Segment] = []
    attempts: list[Attempt] = []
    t = now - 86400 * 2
    for s in range(1, n_seg + 1):
        code = CODES[0] if s == 1 or rng.random() < 0.7 else CODES[rng.randrange(1, len(CODES))]
        segments.append(Segment(number=s, time=t, code=code, commit=code[:12], dirty="+dirty" in code, host=host,
                                job_id=job))
        if s < n_seg:
            attempts.append(Attempt(OUTCOME_PREEMPTED, segment=s, job_id=job, time=t + 3600, by="job"))
        t += 7200
    last = n_seg
    n_fail = {"failed": rng.randrange(1, 3), "gave_up": 3}.get(state, 0)
    for i in range(n_fail):  # the failures happened in earlier segments' jobs, the last one in the last segment
        seg = last if i == n_fail - 1 else None
        outcome, reason, by = rng.choice(((OUTCOME_FAILED, "RuntimeError: loss is nan at step 4711", "job"),
                                          (OUTCOME_KILLED, "OUT_OF_MEMORY", "resume"),
                                          (OUTCOME_KILLED, "trainer killed by SIGKILL (out of memory or the system)",
                                           "task")))
        attempts.append(Attempt(outcome, reason, segment=seg, job_id=f"{job}.{i}" if seg is None else job,
                                time=t + i, by=by))
    if state == "finished":
        attempts.append(Attempt(OUTCOME_FINISHED, segment=last, job_id=job, time=t, by="job"))
    elif state == "preempted":
        attempts.append(Attempt(OUTCOME_PREEMPTED, segment=last, job_id=job, time=t, by="job"))
    elif state == "cancelled":
        attempts.append(Attempt(OUTCOME_CANCELLED, segment=last, job_id=job, time=t, by="job"))
        mark_cancelled(folder.path, "orchestrate cancel", at=t)
    for segment in segments:
        append_segment(folder.path, segment)
    if attempts:
        write_attempts(folder.path, attempts)
    step = TOTAL_STEPS if state == "finished" else rng.randrange(500, TOTAL_STEPS)
    every = max(1, step // PROGRESS_LINES)
    progress = [Progress("start", time=now - 7200)]
    progress += [Progress("train", k, TOTAL_STEPS, time=now - 7200 + k / 10) for k in range(every, step + 1, every)]
    tail = {"finished": "done", "preempted": "preempted", "failed": "failed", "gave_up": "failed"}.get(state)
    if tail:
        progress.append(Progress(tail, time=now - 60))
    write_progress(folder.path, progress)
    folder.log.write_text("".join(f"[train] step {k}/{TOTAL_STEPS} loss {4.0 / (1 + k / 1000):.3f}\n"
                                  for k in range(every, step + 1, every * 4)))
    folder.checkpoint.write_bytes(b"\0" * 4096)  # a stand-in: status never opens the checkpoint
    _outbox(folder, state, n_seg, step, every, now)
    if state == "running":
        _lease(folder, job, host, heartbeat=now - rng.uniform(0, 25), released=False, generation=n_seg)
    elif state == "lost":  # its job vanished: the heartbeat stopped an hour ago
        _lease(folder, job, host, heartbeat=now - 3600, released=False, generation=n_seg)
    else:
        _lease(folder, job, host, heartbeat=now - 600, released=True, generation=n_seg)
    if state == "finished":
        mark_trained(folder.path, folder.checkpoint, TOTAL_STEPS)
        folder.eval_dir.mkdir(exist_ok=True)
        for ds in ("earnings22", "tedlium", "rev16"):
            (folder.eval_dir / f"{ds}.csv").write_text(
                "dataset,condition,snr_db,recording,ref_words,substitutions,deletions,insertions,hyp_words,wer\n"
                + "".join(f"{ds},clean,,{ds}-{r:04d},1000,40,20,10,990,7.0\n" for r in range(20)))
        mark_done(folder.path)


def make_fake_sweep(root: Path | str, n_trials: int, *, name: str | None = None, backend: str = "slurm",
                    tracking_uri: str | None = None, seed: int = 0,
                    mix: tuple[tuple[str, float], ...] = MIX) -> SweepDir:
    """A sweep folder ``ROOT/NAME`` (default ``fake<N>``) of ``n_trials`` trials in the mix of :data:`MIX` (or of
    ``mix``: ``(("finished", 1.0),)`` is a finished sweep); ``tracking_uri`` defaults to a sqlite file under
    ``root`` that does not exist (no ledger is needed)."""
    from orchestrate.ledger.reconcile import ledger_targets, write_sync
    from orchestrate.sweep.trial_state import read_folder_states

    rng = random.Random(seed)
    sweep = SweepDir(root, name or f"fake{n_trials}")
    trials = fake_trials(n_trials)
    now = time.time()
    uri = tracking_uri or f"sqlite:///{Path(root).resolve() / 'mlflow.db'}"
    sweep.write_manifest(Manifest(name=sweep.name, grid=str(PAPER_GRID), backend=backend, profile="",
                                  tracking_uri=uri, created=now - 86400 * 3, workdir=str(Path.cwd()),
                                  sweep_id=hashlib.sha256(sweep.name.encode()).hexdigest()[:32], code=CODES))
    sweep.write_trials(trials)
    sub = sweep.new_submission(backend, [t.key for t in trials],
                               {t.key: hashlib.md5(t.key.encode()).hexdigest() for t in trials})
    array = str(9000 + seed)
    sub.record_job(array)
    for i, (t, state) in enumerate(zip(trials, _states(n_trials, rng, mix))):
        _trial_folder(TrialFolder(sweep.trial_dir(t.key)), t, state, rng, f"{array}_{i}", now)
    # the ledger mirrors every orchestrator-side fact already: status reads the folders only
    states = read_folder_states(sweep, [t.key for t in trials])
    write_sync(sweep, {k: v.fact for k, v in ledger_targets(states).items() if v.orchestrator})
    return sweep
