"""Training: ``train(cfg, out_dir, ...)`` and ``python -m asr_core train CONFIG.yaml [--set k=v ...] [--out DIR]``.

One run = one model of the study (paper 000 §3.3): Madgrad, linear warmup then cosine to 0 over the run, gradient
clipping at 0.8, bf16 autocast on CUDA, windows of the (warming-up) sequence length, about ``batch_audio_s`` of
audio per optimiser step, one seed for both the initial weights and the data order.

A step that does not fit memory in one pass is split into micro-batches of at most ``data.micro_batch_audio_s``
padded audio whose gradients add up to the whole step's (:func:`accumulate_gradients`; batch renormalisation then
sees each micro-batch's statistics). ``data.num_workers`` threads prepare the features of upcoming steps while the
model trains (:class:`asr_core.batching.StepLoader`); neither setting changes the data order.

Stopping is always safe. ``OUT/checkpoint.pt`` is rewritten atomically every ``train.checkpoint_every`` steps, at
the end, and at the first step boundary after SIGUSR2 or SIGTERM (then :class:`Preempted` is raised and the command
exits 75). Calling ``train`` again with the same ``out_dir`` resumes exactly: weights, optimiser, batch-renorm
statistics, RNG states and the data position all come back, and the same MLflow run continues. Steps that a killed
process logged after its last checkpoint are recomputed but not logged twice, so the run keeps one value per step.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Sequence

import torch
from madgrad import MADGRAD

from .batching import BatchMaker, MicroBatch, StepLoader
from .batchrenorm import MaskedBatchRenorm
from .checkpoint import FORMAT_VERSION, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .chunking import Position, WindowStream
from .config import Config, ConfigError, TrainConfig
from .corpora.base import Recording
from .ctc import ctc_loss
from .features import FeatureExtractor
from .model import AcousticModel, build_model
from .schedules import learning_rate
from .identity import science
from .provenance import code_version
from .tokenizer import Tokenizer
from .trial_contract import (CHECKPOINT_FILE, EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE, FINISHED, RUNNING,
                             TAG_CHECKPOINT, TAG_DATA_FINGERPRINT, TAG_GIT_COMMIT, TOKENIZER_FILE, ProgressLog)

CHECKPOINT_NAME = CHECKPOINT_FILE  # the trial contract's name for it
DEFAULT_EXPERIMENT = "asr_core"


class Preempted(Exception):
    """SIGUSR2/SIGTERM arrived; the checkpoint is written and the run should be requeued (exit code 75)."""


class TrainError(RuntimeError):
    """Training cannot start or continue; the message says why and what to do."""


@dataclass(frozen=True)
class TrainResult:
    checkpoint: Path
    run_id: str | None
    steps: int
    final_loss: float


# ---- signals -------------------------------------------------------------------------------------------------
class _StopFlag:
    """Records SIGUSR2/SIGTERM; the loop checks it at step boundaries (a handler must not checkpoint mid-step)."""

    SIGNALS = (signal.SIGUSR2, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "_StopFlag":
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)


# ---- MLflow --------------------------------------------------------------------------------------------------
class _Tracker:
    """The run's MLflow side, through ``MlflowClient`` only (no global active-run state to leak into callers)."""

    def __init__(self, tracking_uri: str | None, run_id: str | None, experiment: str | None, cfg: Config) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri = tracking_uri
        if run_id is None:
            name = experiment or DEFAULT_EXPERIMENT
            exp = self.client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
            run_id = self.client.create_run(exp_id, run_name=f"train-{cfg.key()}").info.run_id
        else:
            self.client.update_run(run_id, status=RUNNING)
        self.run_id = run_id
        run = self.client.get_run(run_id)
        self._log_params(cfg, run.data.params)
        if TAG_GIT_COMMIT not in run.data.tags:  # the trial job has usually set it already: no second git call
            commit = code_version().commit
            if commit:
                self.client.set_tag(run_id, TAG_GIT_COMMIT, commit)
        self._tags = run.data.tags
        history = self.client.get_metric_history(run_id, "train/loss")
        self.last_logged = max((m.step for m in history), default=0)

    def _log_params(self, cfg: Config, existing: dict[str, str]) -> None:
        from mlflow.entities import Param

        new = [Param(k, str(v)) for k, v in cfg.flat().items() if k not in existing]
        clash = [k for k, v in cfg.flat().items() if k in existing and existing[k] != str(v)]
        if clash:  # execution settings or data locations changed since the run started (the key vouches for it)
            print(f"[train] MLflow run {self.run_id} started with other values of {', '.join(clash)} (execution "
                  "settings or data locations, the same trial); params keep the first values, config.json in the "
                  "trial folder has the current ones", file=sys.stderr)
        for i in range(0, len(new), 100):
            self.client.log_batch(self.run_id, params=new[i : i + 100])

    def record_data(self, data_id: str) -> None:
        """Record the training data's ``name=fingerprint`` on the run. The checkpoint holds the one that counts:
        a segment that fails before its first checkpoint leaves nothing trained on the data it read."""
        if self._tags.get(TAG_DATA_FINGERPRINT) != data_id:
            self.client.set_tag(self.run_id, TAG_DATA_FINGERPRINT, data_id)

    def log_step(self, step: int, values: dict[str, float]) -> None:
        if step <= self.last_logged:  # recomputed after a crash: already in the history
            return
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), ts, step) for k, v in values.items()])
        self.last_logged = step

    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)

    def end(self, status: str = FINISHED) -> None:
        self.client.set_terminated(self.run_id, status=status)


# ---- one optimiser step's gradient ----------------------------------------------------------------------------
def accumulate_gradients(model: AcousticModel, micro: Sequence[MicroBatch], device: torch.device, bf16: bool,
                         step: int) -> float:
    """Set ``.grad`` of every parameter to the gradient of the whole step's loss; return that loss.

    The step's loss is :func:`ctc_loss` over all ``B`` windows of the step (the mean over windows of each
    window's CTC loss per target token). Micro-batch ``m`` of ``B_m`` windows (features (B_m, T_m, F)) runs
    forward and backward on its own, its mean scaled by ``B_m / B``, so the gradients summed over the passes are
    the whole-step gradient up to float rounding while only one pass's activations are alive at a time. One
    micro-batch is exactly the unsplit step. What accumulation cannot keep: batch renormalisation normalises
    each pass with that pass's statistics and updates its running statistics once per pass. Its r/d warmup is
    kept on optimiser steps (each layer's ``num_batches_tracked`` is set to ``step`` before every pass).
    The model's train/eval modes are the caller's (:func:`train` sets train mode once).
    """
    total = sum(mb.size for mb in micro)
    renorms = [m for m in model.modules() if isinstance(m, MaskedBatchRenorm)]
    model.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for mb in micro:
        for m in renorms:
            m.num_batches_tracked.fill_(step)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits, out_lengths = model(mb.features.to(device), mb.lengths.to(device))
        loss = ctc_loss(logits, out_lengths, mb.targets, model.blank_id)
        if len(micro) > 1:
            loss = loss * (mb.size / total)
        loss.backward()
        loss_sum += float(loss.detach())
        del logits, out_lengths, loss  # free this pass's outputs before the next pass allocates its own
    return loss_sum


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


def _recordings(cfg: Config, recordings: Sequence[Recording] | None) -> list[Recording]:
    if recordings is None:
        if not cfg.data.train:
            raise TrainError("data.train is empty: name the training corpus, e.g. --set data.train=podcast:DIR")
        from .corpora import load_corpus

        recordings = load_corpus(cfg.data.train)
    recs = sorted(recordings, key=lambda r: r.id)  # data order must not depend on how a reader lists files
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
    print(f"[train] learning a {cfg.model.vocab_size - 1}-piece BPE tokenizer from {len(recs)} transcripts",
          flush=True)
    return Tokenizer.train([r.text for r in recs], cfg.model.vocab_size, out_dir / TOKENIZER_FILE)


def _data_identity(cfg: Config, recs: Sequence[Recording], state: dict[str, Any] | None) -> str:
    """``name=fingerprint`` of the training data; on resume it must equal the checkpoint's."""
    from .corpora import dataset_name
    from .corpora.fingerprint import fingerprint

    name = dataset_name(cfg.data.train) or ("unnamed" if cfg.data.train else "recordings")
    data_id = f"{name}={fingerprint(recs)}"
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
          recordings: Sequence[Recording] | None = None, progress: ProgressLog | None = None) -> TrainResult:
    """Train (or resume) the model of ``cfg`` in ``out_dir``; see the module docstring. ``progress`` receives a
    ``train`` record every ``train.log_every`` steps (the trial job passes the trial folder's)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = out_dir / CHECKPOINT_NAME
    state = load_checkpoint(ckpt_path) if ckpt_path.exists() else None
    if state is not None:
        saved = Config.from_dict(state["config"], source=str(ckpt_path))
        if saved.key() != cfg.key():
            was, now = science(saved), science(cfg)
            flat_was, flat_now = saved.flat(), cfg.flat()
            diff = ", ".join(f"{k}: {flat_was.get(k)!r} -> {flat_now.get(k)!r}"
                             for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k))
            raise TrainError(f"{ckpt_path} was written for trial {saved.key()}, not {cfg.key()} (science differs: "
                             f"{diff}); resume with that trial's config, or train this one in another --out folder")
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

    tracker = _Tracker(tracking_uri, run_id, experiment, cfg) if tracking_uri or run_id else None
    if tracker is None:
        print("[train] no MLflow tracking URI given: metrics go to this log only", file=sys.stderr)
    else:
        tracker.record_data(data_id)
        tracker.set_tag(TAG_CHECKPOINT, str(ckpt_path.resolve()))

    def checkpoint() -> None:
        save_checkpoint(ckpt_path, {
            "format_version": FORMAT_VERSION, "config": cfg.to_dict(), "model": model.state_dict(),
            "optimizer": opt.state_dict(), "step": step,
            "schedule": {"total_steps": total_steps, "warmup_steps": t.warmup_steps, "peak_lr": t.lr,
                         "last_loss": last_loss},
            "rng": rng_state(), "data_position": pos.to_dict(),
            "mlflow_run_id": tracker.run_id if tracker else None, "tracking_uri": tracking_uri,
            "tokenizer": tok.to_bytes(), "data_fingerprint": data_id, "precision": precision,
        })

    maker = BatchMaker(recs, FeatureExtractor(cfg.data.features), tok)
    n_params = sum(p.numel() for p in model.parameters())
    accum = (f", at most {cfg.data.micro_batch_audio_s:g} s per forward/backward" if cfg.data.micro_batch_audio_s
             else "")
    print(f"[train] {n_params / 1e6:.1f}M parameters on {device}{' (bf16)' if bf16 else ''}; {len(recs)} "
          f"recordings; {total_steps} steps of ~{cfg.data.batch_audio_s:g} s audio{accum}; "
          f"{cfg.data.num_workers} data workers; out {out_dir}", flush=True)
    bar = _progress(total_steps, step)
    if progress is not None:  # where this segment starts: 0, or the checkpoint's step when it resumes
        progress.write("train", step, total_steps)
    model.train()  # for the whole run: nothing in the loop evaluates
    try:
        with _StopFlag() as stop, StepLoader(stream, pos, maker, cfg.data.micro_batch_audio_s,
                                             cfg.data.num_workers) as steps:
            while step < total_steps:
                if stop.signum is not None:
                    break
                batch = next(steps, None)
                if batch is None:  # data used up before max_steps: the run is one pass (or train.epochs passes)
                    break
                lr = learning_rate(step, t.lr, t.warmup_steps, total_steps)
                for g in opt.param_groups:
                    g["lr"] = lr
                loss = accumulate_gradients(model, batch.micro, device, bf16, step)
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
                opt.step()
                # the position after the step just trained on, never after steps the loader prefetched
                step, pos, last_loss = step + 1, batch.next_pos, loss
                seq = max(w.duration for w in batch.windows)
                values = {"train/loss": last_loss, "train/lr": lr, "train/seq_len_s": seq,
                          "train/batch_size": float(batch.size), "train/grad_norm": float(grad_norm),
                          "train/micro_batches": float(len(batch.micro))}
                if tracker is not None:
                    tracker.log_step(step, values)
                if step % t.log_every == 0 or step == total_steps:
                    _report(bar, step, total_steps, values)
                    if progress is not None:
                        progress.write("train", step, total_steps)
                if step % t.checkpoint_every == 0:
                    checkpoint()
            if stop.signum is not None:
                checkpoint()
                name = signal.Signals(stop.signum).name
                print(f"[train] {name} received: checkpointed at step {step} to {ckpt_path}", flush=True)
                raise Preempted(f"{name} at step {step}")
    finally:
        if bar is not None:
            bar.close()
    checkpoint()
    if tracker is not None and end_run:
        tracker.end(FINISHED)
    print(f"[train] done: {step} steps, final loss {last_loss:.4f}, checkpoint {ckpt_path}", flush=True)
    return TrainResult(ckpt_path, tracker.run_id if tracker else None, step, last_loss)


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
    import os

    from .params import load_config

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
