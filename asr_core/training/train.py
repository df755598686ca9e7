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
all come back, and the same MLflow run continues. A checkpoint whose training is finished (its last step done, or
its optimizer state dropped: :func:`~asr_core.training.checkpoint.drop_optimizer_state`) is returned as it is,
untouched: the trial job relies on this when its ``TRAINED`` marker cannot be read.

A step whose loss or gradient is not finite is skipped (no update); ``train.max_nonfinite_steps`` in a row raise
:class:`~asr_core.training.loop.Diverged` (the command exits 65), leaving the last checkpoint as it was
(:mod:`asr_core.training.loop`).

``train.head_diversity_weight`` > 0 adds paper 003's auxiliary loss
(:class:`~asr_core.training.step.HeadDiversity`, :func:`~asr_core.training.step.step_gradients`), logged as
``train/head_div_loss`` beside ``train/loss`` (which stays the CTC loss).

This module sets a segment up (the checkpoint to resume, the data, tokenizer, device, model, the MLflow run) and
holds the command; the steps run in :mod:`asr_core.training.loop`, one optimiser step in :mod:`asr_core.training.step`.

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

A fault of another stage (:data:`OTHER_STAGES`: an evaluation job's ``sleep-in-eval:S``, a corpus preparation's
``kill-after-shards:N``) leaves training alone: one environment reaches every job of a submission.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Sequence

import torch

from asr_core.config import Config
from asr_core.config.parse import ConfigError
from asr_core.contract.metrics import SPEECH_LOST, WORDS_LOST
from asr_core.contract.trial import (CHECKPOINT_FILE, EXIT_DIVERGED, EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE,
                                     FINISHED, RUNNING, TAG_CHECKPOINT, TAG_DATA_FINGERPRINT, TAG_GIT_COMMIT,
                                     TAG_RECEPTIVE_FIELD, TOKENIZER_FILE, ProgressLog)
from asr_core.data.chunking import Position, duration_timed, lost_to_cuts
from asr_core.data.corpora.base import Recording
from asr_core.data.step_plan import trainer_order, training_stream
from asr_core.data.tokenizer import Tokenizer
from asr_core.device import DeviceError, resolve_device, use_bf16
from asr_core.contract.identity import science
from asr_core.model.acoustic import AcousticModel, build_model
from asr_core.model.receptive import receptive_field
from asr_core.runtime import signals
from asr_core.runtime.outbox import FINAL_FLUSH_S, PREEMPT_FLUSH_S, Outbox, fail_fast_http
from asr_core.contract.folder.outbox_files import outbox_dir
from asr_core.contract.provenance import code_version
from asr_core.contract.specs import CorpusError
from asr_core.training.checkpoint import CheckpointError, load_checkpoint, set_rng_state, training_finished
from asr_core.training.loop import Cursor, Diverged, Preempted, Reporting, Segment, TrainResult, run_loop
from asr_core.training.compile import prepare_model
from asr_core.training.step import LRSchedule, build_optimizer
from asr_core.contract.tracking import DEFAULT_EXPERIMENT
from asr_core.contract.tracking import tracking_uri as ledger_uri

CHECKPOINT_NAME = CHECKPOINT_FILE  # the trial contract's name for it


class TrainError(RuntimeError):
    """Training cannot start or continue; the message says why and what to do."""


# ---- fault injection (tests) ----------------------------------------------------------------------------------
FAULT_ENV = "ASR_CORE_FAULT"
# faults that other stages read from the same variable (asr_core.evaluation.job, asr_core.data.prepare)
OTHER_STAGES = ("sleep-in-eval:", "sleep-in-merge:", "kill-after-shards:")


def _fault() -> Callable[[int], None]:
    """The hook the loop calls before training each step (see the module docstring); a no-op unless set."""
    spec = os.environ.get(FAULT_ENV, "").strip()
    if not spec or spec.startswith(OTHER_STAGES):
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

    from asr_core.contract.ledger import experiment_id

    client = MlflowClient(tracking_uri=tracking_uri)
    exp_id = experiment_id(client, experiment or DEFAULT_EXPERIMENT)
    return client.create_run(exp_id, run_name=f"train-{cfg.key()}").info.run_id


def _next_file_number(out_dir: Path) -> int:
    """The outbox file of a standalone segment: one after the newest."""
    names = sorted(p.name for p in outbox_dir(out_dir).glob("*.jsonl") if p.name[:6].isdigit())
    return int(names[-1][:6]) + 1 if names else 1


# ---- setting a segment up ---------------------------------------------------------------------------------------
def train_device(cfg: Config) -> tuple[torch.device, bool]:
    """The device ``train.device`` names on this machine, and whether ``train.precision`` means bf16 autocast
    there (:mod:`asr_core.device`); a :class:`TrainError` says what would work instead."""
    try:
        device = resolve_device(cfg.train.device, setting="train.device")
        return device, use_bf16(cfg.train.precision, device, setting="train.precision")
    except DeviceError as e:
        raise TrainError(str(e)) from None


def _recordings(cfg: Config, recordings: Sequence[Recording] | None) -> Sequence[Recording]:
    if recordings is None:
        if not cfg.data.train:
            raise TrainError("data.train is empty: name the training corpus, e.g. --set data.train=podcast:DIR")
        from asr_core.data.corpora import load_corpus

        recordings = load_corpus(cfg.data.train)
    recs = trainer_order(recordings)  # the order must not depend on how a reader lists files
    if cfg.data.max_recordings:
        recs = recs[: cfg.data.max_recordings]
    if not recs:
        raise TrainError(f"no training recordings in {cfg.data.train or 'the given list'}")
    if cfg.data.cut == "pauses":  # the cuts move to word starts: every recording needs its word times
        untimed = next((i for i in range(len(recs)) if not duration_timed(recs, i)[1]), None)
        if untimed is not None:
            raise CorpusError(f"data.cut=pauses needs word times, and recording {recs[untimed].id!r} of "
                              f"{cfg.data.train or 'the training corpus'} has none; use data.cut=fixed, or a corpus "
                              "with word times")
    return recs


def _log_cut_losses(cfg: Config, recs: Sequence[Recording], outbox: Outbox) -> None:
    """What the training cuts drop at the context (``data.cut``), printed and logged at step 0 (metrics
    :data:`~asr_core.contract.metrics.WORDS_LOST`, :data:`~asr_core.contract.metrics.SPEECH_LOST`)."""
    lost = lost_to_cuts(recs, cfg.data.context_s, cfg.data.cut)
    if not lost["recordings"]:
        return
    print(f"[train] {cfg.data.cut} cuts every {cfg.data.context_s:g} s drop {lost['words_lost_pct']:.2f}% of the "
          f"words ({lost['speech_lost_pct']:.2f}% of their speech; {lost['recordings']:.0f} recordings counted)",
          flush=True)
    outbox.metrics(0, {WORDS_LOST: lost["words_lost_pct"], SPEECH_LOST: lost["speech_lost_pct"]})


def _initial_state(cfg: Config, out_dir: Path) -> dict[str, Any] | None:
    """The checkpoint of the trial ``train.init_from`` names (the folder beside ``out_dir`` with that key), which must
    have finished training; None without ``train.init_from``. Raises :class:`TrainError` saying what to do."""
    key = cfg.train.init_from
    if key is None:
        return None
    from asr_core.contract.folder.trained import read_trained

    source = out_dir.parent / key
    record = read_trained(source, warn=True)
    if record is None:
        raise TrainError(f"train.init_from={key}: the trial in {source} has not finished training (no TRAINED record "
                         "there); train that trial first, in the same sweep, then start this one")
    try:
        state = load_checkpoint(record.checkpoint)
    except CheckpointError as e:
        raise TrainError(f"train.init_from={key}: {e}") from None
    print(f"[train] initial weights and tokenizer from trial {key} ({record.checkpoint}, step {state['step']})",
          flush=True)
    return state


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
    from asr_core.data.synth.copy_plant import one_piece_words

    # a synthetic corpus with the copy plant: its identity tokens one piece each (none for any other corpus)
    symbols = one_piece_words(Path(str(recs[0].audio)).parent) if len(recs) else ()
    print(f"[train] learning a {cfg.model.vocab_size - 1}-piece BPE tokenizer from {len(recs)} transcripts"
          + (f" ({len(symbols)} words kept whole: the corpus's identity tokens)" if symbols else ""), flush=True)
    return Tokenizer.train([r.text for r in recs], cfg.model.vocab_size, out_dir / TOKENIZER_FILE, symbols=symbols)


def _data_identity(cfg: Config, recs: Sequence[Recording], state: dict[str, Any] | None) -> str:
    """``name=fingerprint`` of the training data; on resume it must equal the checkpoint's."""
    from asr_core.contract.specs import dataset_name
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


def train(cfg: Config, out_dir: str | Path, *, tracking_uri: str | None = None, run_id: str | None = None,
          experiment: str | None = None, end_run: bool = True,
          recordings: Sequence[Recording] | None = None, progress: ProgressLog | None = None,
          outbox: Outbox | None = None, held: Callable[[], bool] | None = None) -> TrainResult:
    """Train (or resume) the model of ``cfg`` in ``out_dir``; see the module docstring. ``progress`` receives a
    ``train`` record every ``train.log_every`` steps (the trial job passes the trial folder's); ``outbox`` receives
    params, tags and metrics (the trial job passes its own; it also writes the run's status); ``held`` is asked
    before each checkpoint save.

    The MLflow tracking URI reaches the trainer one way only: this ``tracking_uri`` argument. The command
    (:func:`cli`) fills it from ``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``; the trial job passes its own.
    A resumed segment given none continues with the one its checkpoint recorded (as it does with the run id), and
    that is the URI every later checkpoint records; the trainer reads no environment variable itself."""
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
            tracking_uri = tracking_uri or state.get("tracking_uri")  # the one rule: see train()

        recs = _recordings(cfg, recordings)
        data_id = _data_identity(cfg, recs, state)
        if state is not None and training_finished(state):  # after the data check: other content is refused
            step = int(state["step"])
            print(f"[train] {ckpt_path} is trained to the end (step {step}); nothing to train", flush=True)
            return TrainResult(ckpt_path, run_id, step, float(state["schedule"].get("last_loss", math.nan)))
        init = _initial_state(cfg, out_dir) if state is None else None  # a resume has weights of its own
        if init is not None:  # the tokenizer its weights were trained with
            tok = Tokenizer.from_bytes(init["tokenizer"])
            (out_dir / TOKENIZER_FILE).write_bytes(tok.to_bytes())
        else:
            tok = _tokenizer(cfg, recs, out_dir, state)
        device, bf16 = train_device(cfg)
        precision = "bf16" if bf16 else "fp32"
        if state is not None and state.get("precision", precision) != precision:
            raise TrainError(f"{ckpt_path} was trained in {state['precision']}, but this segment would train in "
                             f"{precision} on {device.type} (train.precision={cfg.train.precision}, train.device="
                             f"{cfg.train.device}); resume on a {('CUDA' if state['precision'] == 'bf16' else 'CPU')} "
                             "device, or set train.precision so that the whole trial trains in one precision")
        t = cfg.train

        # the initial weights: train.init_seed (the authors' 12345 in every run), or train.seed where it is null; the
        # data order (WindowStream) and any later draw from torch's generator: train.seed
        torch.manual_seed(t.seed if t.init_seed is None else t.init_seed)
        feats = cfg.data.features
        model: AcousticModel = build_model(cfg.model, feats.n_mels, feats.frames_per_second).to(device)
        if init is not None:
            try:
                model.load_state_dict(init["model"])
            except RuntimeError as e:
                raise TrainError(f"train.init_from={t.init_from}: that trial's weights do not fit this model "
                                 f"({str(e).splitlines()[0]}); start from a trial with the same model.* settings") \
                    from None
        torch.manual_seed(t.seed)
        opt = build_optimizer(model, t)
        # with train.max_steps the data repeats (a fresh order per epoch) until the steps are done
        stream = training_stream(recs, cfg)
        at = Cursor()
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            at = Cursor(int(state["step"]), Position.from_dict(state["data_position"]),
                        float(state["schedule"].get("last_loss", math.nan)),
                        int(state["schedule"].get("nonfinite_steps", 0)))
            total_steps = int(state["schedule"]["total_steps"])
            set_rng_state(state["rng"])
            print(f"[train] resuming {ckpt_path} at step {at.step}/{total_steps}", flush=True)
        else:
            total_steps = t.max_steps or stream.count_steps()
        prepare_model(model, cfg, device, lambda line: print(line, flush=True))

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
        field = receptive_field(cfg)
        outbox.tags({TAG_DATA_FINGERPRINT: data_id, TAG_CHECKPOINT: str(ckpt_path.resolve()),
                     TAG_RECEPTIVE_FIELD: f"{field.seconds:.3f}" if field.banded else "window"})
        if state is None:  # a resumed segment logged it at its first start (the corpus is checked to be the same)
            _log_cut_losses(cfg, recs, outbox)
    try:
        lr = LRSchedule.of(t, total_steps, stream, len(recs))  # over recordings: the stream's plan, durations only
        segment = Segment(cfg, out_dir, ckpt_path, model, opt, stream, recs, tok, data_id, device, precision,
                          total_steps, lr)
        result = run_loop(segment, at, Reporting(run_id, tracking_uri, progress, outbox, held, fault))
        if own_outbox is not None and end_run:
            own_outbox.status(FINISHED)
        return result
    finally:
        if own_outbox is not None:
            hurry = signals.received() is not None
            if not own_outbox.flush(PREEMPT_FLUSH_S if hurry else FINAL_FLUSH_S, signals.received):
                import shlex  # the command below is printed to be pasted into a shell

                why = own_outbox.last_error or "no answer in time"
                ship = f"python -m asr_core ship {shlex.quote(str(out_dir.resolve()))}"
                print(f"[train] MLflow at {tracking_uri} has not taken everything yet ({why}); the rest waits in "
                      f"{own_outbox.dir}: once the server answers, send it with\n  {ship}", file=sys.stderr,
                      flush=True)
            own_outbox.close()


# ---- command line --------------------------------------------------------------------------------------------
def run_cli(args: argparse.Namespace) -> int:
    """``python -m asr_core train ...`` as parsed by :func:`asr_core.training.train_args.parser`: the checkpoint's
    path printed, or one line and its exit status."""
    fail_fast_http()  # one MLflow call fails fast; the outbox retries
    from asr_core.model.size import load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.out or f"runs/{cfg.key()}")
    try:
        result = train(cfg, out, tracking_uri=ledger_uri(args.tracking_uri, local_default=False),
                       run_id=args.run_id, experiment=args.experiment)
    except Preempted as e:
        print(f"[train] preempted ({e}); resume with the same command", file=sys.stderr)
        return EXIT_PREEMPTED
    except Diverged as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_DIVERGED
    except (CorpusError, CheckpointError) as e:  # the data or checkpoint given: the user's to fix (exit 2)
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (TrainError, ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"checkpoint: {result.checkpoint}")
    return EXIT_OK
