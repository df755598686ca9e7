"""Training: ``train(cfg, out_dir, ...)`` and ``python -m asr_core train CONFIG.yaml [--set k=v ...] [--out DIR]``.

One run = one model of the study (paper 000 §3.3): Madgrad, linear warmup then cosine to 0 over the run, gradient
clipping at 0.8, bf16 autocast on CUDA, windows of the (warming-up) sequence length, about ``batch_audio_s`` of
audio per optimiser step, one seed for both the initial weights and the data order.

A step that does not fit memory in one pass is split into micro-batches of at most ``data.micro_batch_audio_s``
padded audio whose gradients add up to the whole step's (:func:`accumulate_gradients`; batch renormalisation then
sees each micro-batch's statistics). ``data.num_workers`` threads prepare the features of upcoming steps while the
model trains (:class:`asr_core.data.batching.StepLoader`); neither setting changes the data order.

Stopping is always safe. ``OUT/checkpoint.pt`` is rewritten atomically every ``train.checkpoint_every`` steps, at
the end, and at the first step boundary after SIGUSR2 or SIGTERM (then :class:`Preempted` is raised and the command
exits 75). The signals are recorded by :mod:`asr_core.runtime.signals` (from the first line of the process when run as a
command): one that arrives while the trainer is still setting up (loading the corpus, learning the tokenizer,
building the model) raises :class:`Preempted` at once, with nothing new to checkpoint. Calling ``train`` again with
the same ``out_dir`` resumes exactly: weights, optimiser, batch-renorm statistics, RNG states and the data position
all come back, and the same MLflow run continues.

``train.head_diversity_weight`` > 0 adds paper 003's auxiliary loss (:class:`HeadDiversity`, :func:`step_gradients`),
logged as ``train/head_div_loss`` beside ``train/loss`` (which stays the CTC loss).

MLflow never slows training down: every step's metrics, the params (``cfg.flat()``), the tags and the run's status
are appended to the trial folder's outbox (:mod:`asr_core.runtime.outbox`) and shipped by a background thread; the trainer
asks it to ship every ``train.log_every`` steps (at most once a second; at least every few seconds anyway). The
trial job passes its own :class:`~asr_core.runtime.outbox.Outbox`; called without one but with a tracking URI or run id,
``train`` keeps one in ``OUT/outbox`` and, at the end, waits for it at most ``ASR_CORE_FINAL_FLUSH_S`` (60 s; 5 s
after a stop signal), leaving the rest in the folder. Only creating a new run (no ``run_id`` and none in the
checkpoint: the standalone command) talks to MLflow synchronously. Steps that a killed process logged after its
last checkpoint are recomputed but not logged twice (the outbox keeps the first value per step), so the run keeps
one value per step. The outbox is fsynced before every checkpoint, so no step up to a checkpoint can be lost.

The fence: ``held`` (the trial job passes its lease's ``held``) is asked before every checkpoint save; a trainer
that lost its lease to another stops without saving and raises :class:`Fenced`.

Fault injection (for tests of the orchestration; never set in production), environment ``ASR_CORE_FAULT``:

* ``raise-at-step:N``: raise ``RuntimeError("fault injected at step N")`` when the trainer is about to train step
  ``N`` (1-based; after step ``N-1`` and its checkpoint, if one is due), every time, also on resume;
* ``sleep-at-step:N:S``: sleep ``S`` seconds at that point (so a test can kill the trainer mid-training).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from madgrad import MADGRAD

from asr_core.runtime import signals
from asr_core.data.batching import BatchMaker, MicroBatch, StepLoader
from asr_core.model.batchrenorm import MaskedBatchRenorm
from asr_core.training.checkpoint import FORMAT_VERSION, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from asr_core.data.chunking import Position, WindowStream
from asr_core.config import Config, ConfigError, TrainConfig
from asr_core.data.corpora.base import Recording
from asr_core.training.loss import pass_loss, step_frames
from asr_core.data.features import FeatureExtractor
from asr_core.model.heads import HeadCapture, head_diversity_loss
from asr_core.model.acoustic import AcousticModel, build_model
from asr_core.schedules import learning_rate
from asr_core.identity import science
from asr_core.runtime.outbox import FINAL_FLUSH_S, PREEMPT_FLUSH_S, Outbox, fail_fast_http, outbox_dir
from asr_core.runtime.provenance import code_version
from asr_core.data.tokenizer import Tokenizer
from asr_core.contract.trial import (CHECKPOINT_FILE, EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE, FINISHED, RUNNING,
                             TAG_CHECKPOINT, TAG_DATA_FINGERPRINT, TAG_GIT_COMMIT, TOKENIZER_FILE, ProgressLog)

CHECKPOINT_NAME = CHECKPOINT_FILE  # the trial contract's name for it
DEFAULT_EXPERIMENT = "asr_core"


class Preempted(Exception):
    """SIGUSR2/SIGTERM arrived; the checkpoint is written (when training had begun) and the run should be requeued
    (exit code 75)."""


class Fenced(Exception):
    """Another trainer took this trial's lease: this one stopped without saving (exit code 73)."""


class TrainError(RuntimeError):
    """Training cannot start or continue; the message says why and what to do."""


@dataclass(frozen=True)
class TrainResult:
    checkpoint: Path
    run_id: str | None
    steps: int
    final_loss: float


# ---- fault injection (tests) ----------------------------------------------------------------------------------
FAULT_ENV = "ASR_CORE_FAULT"


def _fault() -> Callable[[int], None]:
    """The hook the loop calls before training each step (see the module docstring); a no-op unless set."""
    spec = os.environ.get(FAULT_ENV, "").strip()
    if not spec:
        return lambda step: None
    kind, _, rest = spec.partition(":")
    try:
        if kind == "raise-at-step":
            at = int(rest)

            def hook(step: int) -> None:
                if step == at:
                    raise RuntimeError(f"fault injected at step {at}")

            return hook
        if kind == "sleep-at-step":
            n, _, secs = rest.partition(":")
            at, pause = int(n), float(secs)

            def hook(step: int) -> None:
                if step == at:
                    print(f"[train] {FAULT_ENV}: sleeping {pause:g} s at step {at}", flush=True)
                    time.sleep(pause)

            return hook
    except ValueError:
        pass
    raise TrainError(f"{FAULT_ENV}={spec!r} is not a fault: use raise-at-step:N or sleep-at-step:N:SECONDS "
                     f"(or unset {FAULT_ENV})")


# ---- MLflow ------------------------------------------------------------------------------------------------------
def _create_run(tracking_uri: str | None, experiment: str | None, cfg: Config) -> str:
    """A new run for the standalone command (no run id given, none in a checkpoint): the one synchronous MLflow
    call of the trainer. The trial job always has its run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    name = experiment or DEFAULT_EXPERIMENT
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
    return client.create_run(exp_id, run_name=f"train-{cfg.key()}").info.run_id


def _next_file_number(out_dir: Path) -> int:
    """The outbox file of a standalone segment: one after the newest."""
    names = sorted(p.name for p in outbox_dir(out_dir).glob("*.jsonl") if p.name[:6].isdigit())
    return int(names[-1][:6]) + 1 if names else 1


# ---- one optimiser step's gradient ----------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadDiversity:
    """Paper 003's auxiliary loss as the trainer adds it (``train.head_diversity_*``): ``weight`` x the diversity
    loss of ``representation`` (:func:`asr_core.model.heads.head_diversity_loss`: eq. 6 summed over layers, mean over
    windows), A over ``rows`` sampled query rows per window."""

    weight: float
    representation: str
    rows: int
    seed: int

    @classmethod
    def of(cls, t: TrainConfig) -> "HeadDiversity | None":
        """The loss of a training config; None when its weight is 0 (training exactly as without it)."""
        if t.head_diversity_weight <= 0:
            return None
        return cls(t.head_diversity_weight, t.head_diversity_repr, t.head_diversity_rows, t.seed)

    def generator(self, step: int) -> torch.Generator:
        """The CPU generator drawing the rows of A at ``step``: a function of (seed, step) only, so a resumed run
        draws what the uninterrupted one would have."""
        digest = hashlib.sha256(f"head-diversity:{self.seed}:{step}".encode()).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


@dataclass(frozen=True)
class StepLoss:
    """What one step's gradient pass logs: ``ctc`` (``train/loss``) and, with the auxiliary loss, ``head_div``
    (``train/head_div_loss``: the diversity loss before its weight, mean over the step's windows)."""

    ctc: float
    head_div: float | None = None


def step_gradients(model: AcousticModel, micro: Sequence[MicroBatch], device: torch.device, bf16: bool, step: int,
                   loss_norm: str = "audio", frames: float = 0.0, head_diversity: HeadDiversity | None = None
                   ) -> StepLoss:
    """Set ``.grad`` of every parameter to the gradient of the whole step's loss; return the losses to log.

    The step's objective is :mod:`asr_core.training.loss` over all ``B`` windows of the step: ``audio`` (the authors') the
    summed CTC loss x 100 / ``frames`` (:func:`asr_core.training.loss.step_frames`), ``tokens`` the mean over windows of
    each window's loss per token. Micro-batch ``m`` of ``B_m`` windows (features (B_m, T_m, F)) runs forward and
    backward on its own and adds its part, so the gradients summed over the passes are the whole-step gradient up
    to float rounding while only one pass's activations are alive at a time. One micro-batch is exactly the
    unsplit step. What accumulation cannot keep: batch renormalisation normalises each pass with that pass's
    statistics and updates its running statistics once per pass. Its r/d warmup is kept on optimiser steps (each
    layer's ``num_batches_tracked`` is set to ``step`` before every pass).
    The model's train/eval modes are the caller's (:func:`train` sets train mode once).

    ``head_diversity`` (paper 003 eq. 7) adds ``weight`` x the diversity loss of each pass's windows x the pass's
    share ``B_m / B`` of the step, so the term is the step's mean over windows however the step is split. The
    per-head tensors are collected by :class:`asr_core.model.heads.HeadCapture` during the forward pass and the backward
    pass runs after leaving it (activation checkpointing recomputes layers unobserved). A's rows are drawn with
    :meth:`HeadDiversity.generator` of ``step``. Without it nothing else runs: the gradient is bit for bit the one
    of the CTC loss alone.

    Logged: ``tokens`` its objective; ``audio`` the summed loss x 100 per input frame the windows really hold (what
    the authors logged: comparable between full and partial steps).
    """
    if loss_norm == "audio" and frames <= 0:
        raise ValueError("the audio loss normalisation needs the step's frames (asr_core.training.loss.step_frames)")
    total = sum(mb.size for mb in micro)
    renorms = [m for m in model.modules() if isinstance(m, MaskedBatchRenorm)]
    model.zero_grad(set_to_none=True)
    generator = head_diversity.generator(step) if head_diversity is not None else None
    loss_sum, head_sum = 0.0, 0.0
    for mb in micro:
        for m in renorms:
            m.num_batches_tracked.fill_(step)
        share = mb.size / total
        head: torch.Tensor | None = None
        with (HeadCapture(model, (head_diversity.representation,)) if head_diversity is not None
              else contextlib.nullcontext()) as capture:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits, out_lengths = model(mb.features.to(device), mb.lengths.to(device))
            if head_diversity is not None:
                head = head_diversity_loss(capture.layers, head_diversity.representation,
                                           sample_rows=head_diversity.rows, generator=generator)
        loss = pass_loss(logits, out_lengths, mb.targets, model.blank_id, loss_norm, share, frames)
        if head is None:
            loss.backward()
        else:  # after leaving the capture (see HeadCapture)
            (loss + (head_diversity.weight * share) * head).backward()  # type: ignore[union-attr]
            head_sum += float(head.detach()) * share
        loss_sum += float(loss.detach())
        del logits, out_lengths, loss, head, capture  # free this pass's outputs before the next pass allocates
    if loss_norm == "audio":
        real = sum(int(mb.lengths.sum()) for mb in micro)
        loss_sum = loss_sum * frames / max(real, 1)
    return StepLoss(loss_sum, head_sum if head_diversity is not None else None)


def accumulate_gradients(model: AcousticModel, micro: Sequence[MicroBatch], device: torch.device, bf16: bool,
                         step: int, loss_norm: str = "audio", frames: float = 0.0) -> float:
    """:func:`step_gradients` of the step's CTC loss alone; returns the loss to log (``train/loss``)."""
    return step_gradients(model, micro, device, bf16, step, loss_norm, frames).ctc


# ---- the run -------------------------------------------------------------------------------------------------
def _device(cfg: Config) -> torch.device:
    want = cfg.train.device
    if want == "cuda" and not torch.cuda.is_available():
        raise TrainError("train.device='cuda' but CUDA is not available here; use train.device=auto or cpu")
    return torch.device("cuda" if want == "cuda" or (want == "auto" and torch.cuda.is_available()) else "cpu")


def _use_bf16(cfg: Config, device: torch.device) -> bool:
    if cfg.train.precision == "bf16" and device.type != "cuda":
        raise TrainError("train.precision='bf16' needs CUDA (bf16 autocast is used on the GPU only); "
                         "use train.precision=auto or fp32 on the CPU")
    return device.type == "cuda" and cfg.train.precision in ("auto", "bf16")


def _recordings(cfg: Config, recordings: Sequence[Recording] | None) -> Sequence[Recording]:
    if recordings is None:
        if not cfg.data.train:
            raise TrainError("data.train is empty: name the training corpus, e.g. --set data.train=podcast:DIR")
        from asr_core.data.corpora import load_corpus

        recordings = load_corpus(cfg.data.train)
    from asr_core.data.corpora.prepared import PreparedCorpus

    # Data order must not depend on how a reader lists files; a prepared corpus is stored in id order (and is not
    # built, recording by recording, to sort it).
    recs = recordings if isinstance(recordings, PreparedCorpus) else sorted(recordings, key=lambda r: r.id)
    if cfg.data.max_recordings:
        recs = recs[: cfg.data.max_recordings]
    if not recs:
        raise TrainError(f"no training recordings in {cfg.data.train or 'the given list'}")
    return recs


def _tokenizer(cfg: Config, recs: Sequence[Recording], out_dir: Path, state: dict[str, Any] | None) -> Tokenizer:
    if state is not None:
        return Tokenizer.from_bytes(state["tokenizer"])
    if cfg.data.tokenizer:
        return Tokenizer.load(cfg.data.tokenizer, cfg.model.vocab_size)
    from asr_core.data.corpora.prepared import PreparedCorpus

    # a prepared corpus's, trained once on the same transcripts
    path = recs.tokenizer(cfg.model.vocab_size) if isinstance(recs, PreparedCorpus) else None
    if path is not None:
        print(f"[train] tokenizer of the prepared corpus: {path}", flush=True)
        tok = Tokenizer.load(path, cfg.model.vocab_size)
        (out_dir / TOKENIZER_FILE).write_bytes(tok.to_bytes())
        return tok
    print(f"[train] learning a {cfg.model.vocab_size - 1}-piece BPE tokenizer from {len(recs)} transcripts",
          flush=True)
    return Tokenizer.train([r.text for r in recs], cfg.model.vocab_size, out_dir / TOKENIZER_FILE)


def _data_identity(cfg: Config, recs: Sequence[Recording], state: dict[str, Any] | None) -> str:
    """``name=fingerprint`` of the training data; on resume it must equal the checkpoint's."""
    from asr_core.data.corpora import dataset_name
    from asr_core.data.corpora.fingerprint import fingerprint

    name = dataset_name(cfg.data.train) or ("unnamed" if cfg.data.train else "recordings")
    from asr_core.data.corpora.prepared import PreparedCorpus

    # a prepared corpus keeps its source's
    data_id = f"{name}={recs.fingerprint if isinstance(recs, PreparedCorpus) else fingerprint(recs)}"
    before = (state or {}).get("data_fingerprint")
    if before and before != data_id:
        raise TrainError(f"the training data named {name!r} has other content than when this trial started (the "
                         f"checkpoint recorded {before}, the corpus now gives {data_id}); a corpus may move but not "
                         "change under its name: point data.train back at the original data, or give the new data "
                         "another name (NAME=FORMAT:PATH), which makes these new trials")
    return data_id


def build_optimizer(model: torch.nn.Module, t: TrainConfig) -> torch.optim.Optimizer:
    """The paper's Madgrad, or AdamW (betas ``(momentum, 0.98)``) where ``train.optimizer`` asks for it."""
    if t.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=t.lr, betas=(t.momentum, 0.98), eps=t.eps,
                                 weight_decay=t.weight_decay)
    return MADGRAD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay, eps=t.eps)


def train(cfg: Config, out_dir: str | Path, *, tracking_uri: str | None = None, run_id: str | None = None,
          experiment: str | None = None, end_run: bool = True,
          recordings: Sequence[Recording] | None = None, progress: ProgressLog | None = None,
          outbox: Outbox | None = None, held: Callable[[], bool] | None = None) -> TrainResult:
    """Train (or resume) the model of ``cfg`` in ``out_dir``; see the module docstring. ``progress`` receives a
    ``train`` record every ``train.log_every`` steps (the trial job passes the trial folder's); ``outbox`` receives
    params, tags and metrics (the trial job passes its own; it also writes the run's status); ``held`` is asked
    before each checkpoint save."""
    with signals.installed():
        return _train(cfg, Path(out_dir), tracking_uri, run_id, experiment, end_run, recordings, progress, outbox,
                      held)


def _train(cfg: Config, out_dir: Path, tracking_uri: str | None, run_id: str | None, experiment: str | None,
           end_run: bool, recordings: Sequence[Recording] | None, progress: ProgressLog | None,
           outbox: Outbox | None, held: Callable[[], bool] | None) -> TrainResult:
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = out_dir / CHECKPOINT_NAME
    fault = _fault()
    with signals.raising(Preempted):  # nothing to checkpoint yet: a stop signal ends the setup at once
        state = load_checkpoint(ckpt_path) if ckpt_path.exists() else None
        if state is not None:
            saved = Config.from_stored(state["config"], source=str(ckpt_path))
            if saved.key() != cfg.key():
                was, now = science(saved), science(cfg)
                flat_was, flat_now = saved.flat(), cfg.flat()
                diff = ", ".join(f"{k}: {flat_was.get(k)!r} -> {flat_now.get(k)!r}"
                                 for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k))
                raise TrainError(f"{ckpt_path} was written for trial {saved.key()}, not {cfg.key()} (science "
                                 f"differs: {diff}); resume with that trial's config, or train this one in another "
                                 "--out folder")
            run_id = run_id or state.get("mlflow_run_id")
            tracking_uri = tracking_uri or state.get("tracking_uri")

        recs = _recordings(cfg, recordings)
        data_id = _data_identity(cfg, recs, state)
        tok = _tokenizer(cfg, recs, out_dir, state)
        device = _device(cfg)
        bf16 = _use_bf16(cfg, device)
        precision = "bf16" if bf16 else "fp32"
        if state is not None and state.get("precision", precision) != precision:
            raise TrainError(f"{ckpt_path} was trained in {state['precision']}, but this segment would train in "
                             f"{precision} on {device.type} (train.precision={cfg.train.precision}, train.device="
                             f"{cfg.train.device}); resume on a {('CUDA' if state['precision'] == 'bf16' else 'CPU')} "
                             "device, or set train.precision so that the whole trial trains in one precision")
        t = cfg.train

        torch.manual_seed(t.seed)  # the seed sets the initial weights (and, in WindowStream, the data order)
        model: AcousticModel = build_model(cfg.model, cfg.data.features.n_mels).to(device)
        opt = build_optimizer(model, t)
        # with train.max_steps the data repeats (a fresh order per epoch) until the steps are done
        stream = WindowStream(recs, cfg.data, t.seed, t.epochs if not t.max_steps else 1 << 30)
        step, pos, last_loss = 0, Position(), math.nan
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            step = int(state["step"])
            pos = Position.from_dict(state["data_position"])
            total_steps = int(state["schedule"]["total_steps"])
            last_loss = float(state["schedule"].get("last_loss", math.nan))
            set_rng_state(state["rng"])
            print(f"[train] resuming {ckpt_path} at step {step}/{total_steps}", flush=True)
        else:
            total_steps = t.max_steps or stream.count_steps()

    own_outbox: Outbox | None = None
    if outbox is None and (tracking_uri or run_id):  # the standalone command: its own outbox in OUT/outbox
        if run_id is None:
            run_id = _create_run(tracking_uri, experiment, cfg)
        own_outbox = outbox = Outbox(out_dir, segment=_next_file_number(out_dir), tracking_uri=tracking_uri,
                                     run_id=run_id).start()
        outbox.status(RUNNING)
        commit = code_version().commit if state is None else None  # the first segment's commit names the run's
        if commit:
            outbox.tags({TAG_GIT_COMMIT: commit})
    elif outbox is not None and run_id is None and tracking_uri:  # the trial job without --run-id: a new run
        run_id = _create_run(tracking_uri, experiment, cfg)
    if outbox is None:
        print("[train] no MLflow tracking URI given: metrics go to this log only", file=sys.stderr)
    else:
        if run_id and outbox.run_id != run_id:
            outbox.set_run(run_id, tracking_uri)
        outbox.params(cfg.flat())
        # the training data's name=fingerprint on the run is a record; the checkpoint holds the one that counts (a
        # segment that fails before its first checkpoint leaves nothing trained on the data it read)
        outbox.tags({TAG_DATA_FINGERPRINT: data_id, TAG_CHECKPOINT: str(ckpt_path.resolve())})
    try:
        result = _loop(cfg, out_dir, ckpt_path, model, opt, stream, step, pos, last_loss, total_steps, tok, data_id,
                       precision, device, bf16, recs, run_id, tracking_uri, progress, outbox, held, fault)
        if own_outbox is not None and end_run:
            own_outbox.status(FINISHED)
        return result
    finally:
        if own_outbox is not None:
            hurry = signals.received() is not None
            if not own_outbox.flush(PREEMPT_FLUSH_S if hurry else FINAL_FLUSH_S, signals.received):
                why = own_outbox.last_error or "no answer in time"
                print(f"[train] MLflow at {tracking_uri} has not taken everything yet ({why}); the rest waits in "
                      f"{own_outbox.dir} and is shipped by the next segment", file=sys.stderr, flush=True)
            own_outbox.close()


def _loop(cfg: Config, out_dir: Path, ckpt_path: Path, model: AcousticModel, opt: torch.optim.Optimizer,
          stream: WindowStream, step: int, pos: Position, last_loss: float, total_steps: int, tok: Tokenizer,
          data_id: str, precision: str, device: torch.device, bf16: bool, recs: Sequence[Recording],
          run_id: str | None, tracking_uri: str | None, progress: ProgressLog | None, outbox: Outbox | None,
          held: Callable[[], bool] | None, fault: Callable[[int], None]) -> TrainResult:
    t = cfg.train

    def checkpoint() -> None:
        if held is not None and not held():
            raise Fenced(f"another trainer took the lease of {out_dir} before step {step} was saved; this one "
                         "stops without saving")
        if outbox is not None:
            outbox.sync()  # every step up to this checkpoint's is on disk before the checkpoint is
        save_checkpoint(ckpt_path, {
            "format_version": FORMAT_VERSION, "config": cfg.to_dict(), "model": model.state_dict(),
            "optimizer": opt.state_dict(), "step": step,
            "schedule": {"total_steps": total_steps, "warmup_steps": t.warmup_steps, "peak_lr": t.lr,
                         "last_loss": last_loss},
            "rng": rng_state(), "data_position": pos.to_dict(),
            "mlflow_run_id": run_id, "tracking_uri": tracking_uri,
            "tokenizer": tok.to_bytes(), "data_fingerprint": data_id, "precision": precision,
        })

    maker = BatchMaker(recs, FeatureExtractor(cfg.data.features), tok, windows=cfg.data.batching == "interleaved")
    n_params = sum(p.numel() for p in model.parameters())
    accum = (f", at most {cfg.data.micro_batch_audio_s:g} s per forward/backward" if cfg.data.micro_batch_audio_s
             else "")
    print(f"[train] {n_params / 1e6:.1f}M parameters on {device}{' (bf16)' if bf16 else ''}; {len(recs)} "
          f"recordings; {total_steps} steps of ~{cfg.data.batch_audio_s:g} s audio{accum}; "
          f"{cfg.data.num_workers} data workers; out {out_dir}", flush=True)
    head_diversity = HeadDiversity.of(t)
    if head_diversity is not None:
        print(f"[train] paper 003's head-diversity loss on {head_diversity.representation}, weight "
              f"{head_diversity.weight:g}" + (f", {head_diversity.rows} rows of A per window"
                                              if head_diversity.representation == "A" else ""), flush=True)
    bar = _progress(total_steps, step)
    if progress is not None:  # where this segment starts: 0, or the checkpoint's step when it resumes
        progress.write("train", step, total_steps)
    model.train()  # for the whole run: nothing in the loop evaluates
    try:
        with StepLoader(stream, pos, maker, cfg.data.micro_batch_audio_s, cfg.data.num_workers) as steps:
            while step < total_steps:
                if signals.received() is not None:
                    break
                fault(step + 1)
                batch = next(steps, None)
                if batch is None:  # data used up before max_steps: the run is one pass (or train.epochs passes)
                    break
                lr = learning_rate(step, t.lr, t.warmup_steps, total_steps)
                for g in opt.param_groups:
                    g["lr"] = lr
                losses = step_gradients(model, batch.micro, device, bf16, step, t.loss_norm,
                                        step_frames(batch.windows, cfg.data), head_diversity)
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
                opt.step()
                # the position after the step just trained on, never after steps the loader prefetched
                step, pos, last_loss = step + 1, batch.next_pos, losses.ctc
                seq = max((w.seq or w.duration) for w in batch.windows)
                values = {"train/loss": last_loss, "train/lr": lr, "train/seq_len_s": seq,
                          "train/batch_size": float(batch.size), "train/grad_norm": float(grad_norm),
                          "train/micro_batches": float(len(batch.micro))}
                if losses.head_div is not None:
                    values["train/head_div_loss"] = losses.head_div
                if outbox is not None:
                    outbox.metrics(step, values)  # local and cheap; the shipper sends them in the background
                if step % t.log_every == 0 or step == total_steps:
                    _report(bar, step, total_steps, values)
                    if progress is not None:
                        progress.write("train", step, total_steps)
                    if outbox is not None:
                        outbox.kick()
                if step % t.checkpoint_every == 0:
                    checkpoint()
            if signals.received() is not None:
                checkpoint()
                print(f"[train] {signals.name()} received: checkpointed at step {step} to {ckpt_path}", flush=True)
                raise Preempted(f"{signals.name()} at step {step}")
    finally:
        if bar is not None:
            bar.close()
    checkpoint()
    print(f"[train] done: {step} steps, final loss {last_loss:.4f}, checkpoint {ckpt_path}", flush=True)
    return TrainResult(ckpt_path, run_id, step, last_loss)


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


# ---- command line --------------------------------------------------------------------------------------------
def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m asr_core train", description="Train (or resume) one model.")
    ap.add_argument("config", help="YAML config (may start from 'preset: NAME') or a preset name")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", default=None, help="run folder (default runs/<trial key>)")
    ap.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default $MLFLOW_TRACKING_URI)")
    ap.add_argument("--run-id", default=None, help="continue this MLflow run")
    ap.add_argument("--experiment", default=None, help=f"MLflow experiment for a new run ({DEFAULT_EXPERIMENT})")
    args = ap.parse_args(argv)
    fail_fast_http()  # one MLflow call fails fast; the outbox retries
    from asr_core.model.size import load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.out or f"runs/{cfg.key()}")
    try:
        result = train(cfg, out, tracking_uri=args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"),
                       run_id=args.run_id, experiment=args.experiment)
    except Preempted as e:
        print(f"[train] preempted ({e}); resume with the same command", file=sys.stderr)
        return EXIT_PREEMPTED
    except (TrainError, ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"checkpoint: {result.checkpoint}")
    return EXIT_OK
