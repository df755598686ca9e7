"""The training loop of one segment (one process's share of a run): optimiser steps from where the segment starts,
each logged, a checkpoint every ``train.checkpoint_every`` steps and at the end, and a safe stop.

:func:`run_loop` takes what :func:`asr_core.training.train.train` set up (:class:`Segment`), where training stands
(:class:`Cursor`: the step, the data position and the last loss, all of which go into every checkpoint) and where it
reports (:class:`Reporting`). A stop signal ends it at the next step boundary with a checkpoint and
:class:`Preempted`; a lost lease ends it before a save with :class:`Fenced`.

A step whose loss or gradient is not finite changes nothing (:func:`asr_core.training.step.optimizer_step` skips its
update) and no periodic checkpoint is written while the steps stay non-finite; ``train.max_nonfinite_steps`` of them in
a row end the segment with :class:`Diverged`, leaving the last checkpoint as it was. No checkpoint is ever written
with non-finite weights.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from asr_core.config import Config
from asr_core.contract.trial import ProgressLog
from asr_core.data.batching import BatchMaker, StepLoader
from asr_core.data.chunking import Position, WindowStream
from asr_core.data.corpora.base import Recording
from asr_core.data.features import FeatureExtractor
from asr_core.data.tokenizer import Tokenizer
from asr_core.model.acoustic import AcousticModel
from asr_core.runtime import signals
from asr_core.runtime.outbox import Outbox
from asr_core.training.checkpoint import FORMAT_VERSION, read_header, rng_state, save_checkpoint
from asr_core.training.step import HeadDiversity, LRSchedule, optimizer_step


class Preempted(Exception):
    """SIGUSR2/SIGTERM arrived; the checkpoint is written (when training had begun) and the run should be requeued
    (exit code 75)."""


class Fenced(Exception):
    """Another trainer took this trial's lease: this one stopped without saving (exit code 73)."""


class Diverged(Exception):
    """The loss stayed non-finite for ``train.max_nonfinite_steps`` steps in a row (or the weights became
    non-finite): the trial failed, its last checkpoint is kept as it was (exit code 65). The message starts with
    ``diverged:`` and names the steps, the loss and the checkpoint kept."""


@dataclass(frozen=True)
class TrainResult:
    checkpoint: Path
    run_id: str | None
    steps: int
    final_loss: float


@dataclass(frozen=True)
class Segment:
    """What a segment trains, as set up (and, on resume, restored) by :func:`asr_core.training.train.train`: the
    model and its optimiser on ``device``, the data (``recs`` in the order of ``stream``), and what every checkpoint
    records besides them (the config, tokenizer, the data's ``name=fingerprint``, the precision)."""

    cfg: Config
    out_dir: Path
    ckpt_path: Path
    model: AcousticModel
    opt: torch.optim.Optimizer
    stream: WindowStream
    recs: Sequence[Recording]
    tok: Tokenizer
    data_id: str
    device: torch.device
    precision: str  # "bf16" (autocast on CUDA) or "fp32"
    total_steps: int
    lr: LRSchedule | None = None  # None: the cosine over steps (asr_core.schedules.learning_rate)

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16"


@dataclass
class Cursor:
    """Where training stands: ``step`` optimiser steps done, the data ``pos`` after the last of them, that
    step's CTC loss, and how many steps in a row up to it had a non-finite loss or gradient (``nonfinite``).
    Advanced by :func:`run_loop` after each step; saved in every checkpoint."""

    step: int = 0
    pos: Position = field(default_factory=Position)
    last_loss: float = math.nan
    nonfinite: int = 0


@dataclass(frozen=True)
class Reporting:
    """Where a segment reports and who may stop it: the MLflow run (``run_id`` at ``tracking_uri``, recorded in
    the checkpoint so that a resumed segment continues it) fed through ``outbox``; ``progress``, the trial folder's
    progress log; ``held``, asked before every checkpoint save (the lease's fence); ``fault``, the fault-injection
    hook called before each step (:data:`asr_core.training.train.FAULT_ENV`)."""

    run_id: str | None = None
    tracking_uri: str | None = None
    progress: ProgressLog | None = None
    outbox: Outbox | None = None
    held: Callable[[], bool] | None = None
    fault: Callable[[int], None] = lambda step: None


def save(seg: Segment, at: Cursor, to: Reporting) -> None:
    """Checkpoint ``seg`` at ``at`` (atomically, :func:`asr_core.training.checkpoint.save_checkpoint`) unless the
    lease is lost (:class:`Fenced`); the outbox is synced first, so no step up to the checkpoint can be lost."""
    t = seg.cfg.train
    if to.held is not None and not to.held():
        raise Fenced(f"another trainer took the lease of {seg.out_dir} before step {at.step} was saved; this one "
                     "stops without saving")
    if not all(bool(torch.isfinite(p).all()) for p in seg.model.parameters()):
        raise Diverged(f"diverged: the weights are not finite at step {at.step} (loss {at.last_loss:g}); "
                       f"{kept(seg)}")
    if to.outbox is not None:
        to.outbox.sync()  # every step up to this checkpoint's is on disk before the checkpoint is
    save_checkpoint(seg.ckpt_path, {
        "format_version": FORMAT_VERSION, "config": seg.cfg.to_dict(), "model": seg.model.state_dict(),
        "optimizer": seg.opt.state_dict(), "step": at.step,
        "schedule": {"total_steps": seg.total_steps, "warmup_steps": t.warmup_steps, "peak_lr": t.lr,
                     "last_loss": at.last_loss, "nonfinite_steps": at.nonfinite},
        "rng": rng_state(), "data_position": at.pos.to_dict(),
        "mlflow_run_id": to.run_id, "tracking_uri": to.tracking_uri,
        "tokenizer": seg.tok.to_bytes(), "data_fingerprint": seg.data_id, "precision": seg.precision,
    })


def kept(seg: Segment) -> str:
    """What a diverged segment leaves, in words: ``the checkpoint of step N (PATH) is left as it was``."""
    if not seg.ckpt_path.is_file():
        return "no checkpoint was written"
    try:
        return f"the checkpoint of step {int(read_header(seg.ckpt_path)['step'])} ({seg.ckpt_path}) is left as it was"
    except Exception:  # noqa: BLE001 - only words for the error message
        return f"the checkpoint {seg.ckpt_path} is left as it was"


def nonfinite_step(seg: Segment, at: Cursor, values: dict[str, float]) -> None:
    """Count a step whose update was skipped (its loss or gradient not finite); :class:`Diverged` at the
    ``train.max_nonfinite_steps``-th in a row."""
    limit = seg.cfg.train.max_nonfinite_steps
    loss, norm = values["train/loss"], values["train/grad_norm"]
    print(f"[train] step {at.step}: loss {loss:g}, gradient norm {norm:g}: update skipped ({at.nonfinite} such "
          f"steps in a row; train.max_nonfinite_steps={limit} ends the trial)", flush=True)
    if at.nonfinite >= limit:
        raise Diverged(f"diverged: the loss or its gradient was not finite for {at.nonfinite} steps in a row (steps "
                       f"{at.step - at.nonfinite + 1}-{at.step}, train.max_nonfinite_steps={limit}; at step "
                       f"{at.step} loss {loss:g}, gradient norm {norm:g}); {kept(seg)}; lower train.lr or lengthen "
                       "train.warmup_steps")


def run_loop(seg: Segment, at: Cursor, to: Reporting) -> TrainResult:
    """Train ``seg`` from ``at`` to ``seg.total_steps`` (or until the data is used up), then checkpoint; see the
    module docstring."""
    cfg, t, model, total_steps = seg.cfg, seg.cfg.train, seg.model, seg.total_steps
    maker = BatchMaker(seg.recs, FeatureExtractor(cfg.data.features), seg.tok,
                       windows=cfg.data.batching == "interleaved")
    n_params = sum(p.numel() for p in model.parameters())
    accum = (f", at most {cfg.data.micro_batch_audio_s:g} s per forward/backward" if cfg.data.micro_batch_audio_s
             else "")
    print(f"[train] {n_params / 1e6:.1f}M parameters on {seg.device}{' (bf16)' if seg.bf16 else ''}; "
          f"{len(seg.recs)} recordings; {total_steps} steps of ~{cfg.data.batch_audio_s:g} s audio{accum}; "
          f"{cfg.data.num_workers} data workers; out {seg.out_dir}", flush=True)
    head_diversity = HeadDiversity.of(t)
    if head_diversity is not None:
        print(f"[train] paper 003's head-diversity loss on {head_diversity.representation}, weight "
              f"{head_diversity.weight:g}" + (f", {head_diversity.rows} rows of A per window"
                                              if head_diversity.representation == "A" else ""), flush=True)
    bar = _progress(total_steps, at.step)
    if to.progress is not None:  # where this segment starts: 0, or the checkpoint's step when it resumes
        to.progress.write("train", at.step, total_steps)
    model.train()  # for the whole run: nothing in the loop evaluates
    try:
        with StepLoader(seg.stream, at.pos, maker, cfg.data.micro_batch_audio_s, cfg.data.num_workers) as steps:
            while at.step < total_steps:
                if signals.received() is not None:
                    break
                to.fault(at.step + 1)
                batch = next(steps, None)
                if batch is None:  # data used up before max_steps: the run is one pass (or train.epochs passes)
                    break
                values = optimizer_step(model, seg.opt, batch, at.step, total_steps, t, cfg.data, seg.device,
                                        seg.bf16, head_diversity, lr=seg.lr(at.step) if seg.lr is not None else None)
                # the position after the step just trained on, never after steps the loader prefetched
                at.step, at.pos, at.last_loss = at.step + 1, batch.next_pos, values["train/loss"]
                at.nonfinite = at.nonfinite + 1 if "train/update_skipped" in values else 0
                step = at.step
                if to.outbox is not None:
                    to.outbox.metrics(step, values)  # local and cheap; the shipper sends them in the background
                if at.nonfinite:
                    nonfinite_step(seg, at, values)
                if step % t.log_every == 0 or step == total_steps:
                    _report(bar, step, total_steps, values)
                    if to.progress is not None:
                        to.progress.write("train", step, total_steps)
                    if to.outbox is not None:
                        to.outbox.kick()
                if step % t.checkpoint_every == 0 and not at.nonfinite:  # the last finite step's checkpoint stays
                    save(seg, at, to)
            if signals.received() is not None:
                save(seg, at, to)
                print(f"[train] {signals.name()} received: checkpointed at step {at.step} to {seg.ckpt_path}",
                      flush=True)
                raise Preempted(f"{signals.name()} at step {at.step}")
    finally:
        if bar is not None:
            bar.close()
    save(seg, at, to)
    print(f"[train] done: {at.step} steps, final loss {at.last_loss:.4f}, checkpoint {seg.ckpt_path}", flush=True)
    return TrainResult(seg.ckpt_path, to.run_id, at.step, at.last_loss)


def _progress(total: int, initial: int) -> Any:
    """A tqdm bar on an interactive terminal; batch logs (SLURM) get plain log lines instead."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)


def _report(bar: Any, step: int, total: int, v: dict[str, float]) -> None:
    line = (f"step {step}/{total} loss {v['train/loss']:.4f} lr {v['train/lr']:.3g} "
            f"seq {v['train/seq_len_s']:.1f}s batch {int(v['train/batch_size'])}")
    if v.get("train/micro_batches", 1) > 1:
        line += f" in {int(v['train/micro_batches'])} passes"
    if "train/head_div_loss" in v:
        line += f" head-div {v['train/head_div_loss']:.4f}"
    if bar is not None:
        bar.n = step
        bar.set_postfix_str(line.split(" ", 2)[2])
    else:
        print(f"[train] {line}", flush=True)
