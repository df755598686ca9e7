"""Training the Transformer LM (paper 004 §3.3): :func:`train_lm` and ``python -m asr_core lm train``
(:mod:`asr_core.lm.cli`), of a :class:`~asr_core.lm.config.LMTrainConfig`, into a checkpoint that
:func:`asr_core.lm.checkpoint.load_lm` reads.

Transformer-XL training. ``batch`` lanes each read one document after another in chunks of ``chunk_len`` tokens
(:func:`asr_core.lm.data.chunk_batches`); one chunk of every lane is one optimiser step. A chunk attends to the lane's
memory: the keys and values of the lane's earlier tokens of the *same* document, computed at earlier steps, detached
(no gradient flows into them) and trimmed to the last ``cache_len`` tokens; a lane that starts a new document forgets
its memory first (:meth:`KVCache.forget`). The loss is the mean negative log-likelihood over the step's valid
targets. Documents are dealt to lanes in an order shuffled per epoch from the seed; the seed also sets the initial
weights. Madgrad, linear warmup then cosine to 0 over the run (:func:`asr_core.schedules.learning_rate`), gradient
clipping, bf16 autocast on CUDA, no regularisation.

Stopping is always safe, as in :mod:`asr_core.training.train`: ``OUT/checkpoint.pt`` is written atomically every
``checkpoint_every`` steps, at the end, and at the first step boundary after SIGUSR2 or SIGTERM (recorded by
:mod:`asr_core.runtime.signals`; then :class:`Preempted`, exit 75). Calling again with the same ``OUT`` resumes exactly: the
weights, optimiser, RNG states, data position (epoch, chunk) and the lanes' memories come back, so an interrupted
and resumed run equals an uninterrupted one bit for bit on the CPU.

MLflow through the outbox (:mod:`asr_core.runtime.outbox`, in ``OUT/outbox``), the acoustic trainer's standalone path: the
records go to the folder first and a background thread ships them, so a tracker that is down or slow never stops
or slows training, and steps re-trained after a resume are not logged twice. Creating the run is the one
synchronous call; when it fails, training goes on, the records wait in the folder and the next segment that reaches
the tracker creates the run and ships them. Params: :meth:`LMTrainConfig.flat`; metrics ``lm/train_loss``,
``lm/lr``, ``lm/grad_norm`` every step and ``lm/dev_ppl`` at each checkpoint when there is dev text.

Lookup memory (``lm.memory``, paper 002; :mod:`asr_core.lm.memory`). Its token counts (Eq. 4) are those of the
training text's next tokens, every token of every document once (the beginning-of-document id is never a target):
:func:`next_token_counts`, computed once, when a run starts from scratch (before its first step), and stored in the
checkpoint with the model (the memory's ``counts`` buffer, beside ``D`` and its ``step``), so a resumed run reads
them back rather than counting again. The memory's update draws come from its own generator, whose state the
checkpoint keeps (``memory_generator``); the lanes' token histories travel with their caches. Each step passes its
targets to the model, which reads the memory, then updates it with them (training mode).

The checkpoint's contents: :mod:`asr_core.lm.checkpoint`.
"""

from __future__ import annotations

import hashlib
import math
import random
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from asr_core.contract.metrics import LM_TAG
from asr_core.device import DeviceError, resolve_device, use_bf16
from asr_core.runtime import signals
from asr_core.training.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from asr_core.schedules import learning_rate
from asr_core.data.tokenizer import Tokenizer

from asr_core.lm.checkpoint import CHECKPOINT_FILE, FORMAT_VERSION, KIND, LMTrainError, check_resume
from asr_core.lm.config import LMTrainConfig
from asr_core.lm.data import Document, TextError, chunk_batches, count_chunks, read_documents
from asr_core.lm.model import KVCache, build_lm, lm_size

__all__ = ["LMTrainResult", "Preempted", "next_token_counts", "train_lm"]

DEFAULT_EXPERIMENT = "asr_core_lm"


class Preempted(Exception):
    """SIGUSR2/SIGTERM arrived; the checkpoint is written (when training had begun): run the command again."""


@dataclass(frozen=True)
class LMTrainResult:
    checkpoint: Path
    run_id: str | None
    steps: int
    final_loss: float
    dev_ppl: float | None


# ---- inputs -------------------------------------------------------------------------------------------------------
def read_text(specs: Sequence[str]) -> list[Document]:
    """Every document of ``specs`` in order; :class:`LMTrainError` naming a spec that holds no text."""
    if not specs:
        raise LMTrainError("no training text: give --text SPEC (text:FILE.jsonl, text:FILE.txt, text:FOLDER or a "
                           "corpus spec FORMAT:PATH)")
    docs: list[Document] = []
    for spec in specs:
        try:
            got = [d for d in read_documents(spec) if d.text.strip()]
        except TextError as e:
            raise LMTrainError(str(e)) from None
        if not got:
            raise LMTrainError(f"text source {spec!r} holds no text (no non-empty documents)")
        docs.extend(got)
    return docs


def encode(tok: Tokenizer, docs: Sequence[Document]) -> list[list[int]]:
    """Token ids of each document (documents that encode to nothing are left out)."""
    return [ids for ids in (tok.encode(d.text) for d in docs) if ids]


def fingerprint(ids: Sequence[Sequence[int]]) -> str:
    """16 hex digits of SHA-256 over the documents' token ids, in order: what the LM is trained on."""
    h = hashlib.sha256()
    for doc in ids:
        h.update(len(doc).to_bytes(8, "little"))
        h.update(array("i", doc).tobytes())
    return h.hexdigest()[:16]


def next_token_counts(ids: Sequence[Sequence[int]], vocab_size: int) -> torch.Tensor:
    """(V,) long: how often each id is a next token in the training text (every token of every document; the
    beginning-of-document id, never a target, counts 0): the memory's Eq. 4 counts."""
    flat = torch.tensor([i for doc in ids for i in doc], dtype=torch.long)
    return torch.bincount(flat, minlength=vocab_size)


def epoch_order(ids: Sequence[Sequence[int]], seed: int, epoch: int) -> list[Sequence[int]]:
    """The documents in epoch ``epoch``'s order: a shuffle that is a pure function of (seed, epoch)."""
    order = list(range(len(ids)))
    random.Random(f"lm/{seed}/epoch/{epoch}").shuffle(order)
    return [ids[i] for i in order]


# ---- the run -------------------------------------------------------------------------------------------------------
def _device(cfg: LMTrainConfig) -> tuple[torch.device, bool]:
    try:
        dev = resolve_device(cfg.device)
    except DeviceError as e:
        raise LMTrainError(str(e)) from None
    if cfg.precision == "bf16" and dev.type != "cuda":
        raise LMTrainError("precision='bf16' needs CUDA (bf16 autocast on the GPU only); use precision=auto or fp32")
    return dev, use_bf16(cfg.precision, dev)


def _create_run(tracking_uri: str | None, experiment: str, cfg: LMTrainConfig) -> str | None:
    """A new MLflow run (the one synchronous call); None, with a warning, when the tracker does not answer."""
    try:
        from mlflow.tracking import MlflowClient

        from asr_core.contract.ledger import experiment_id

        client = MlflowClient(tracking_uri=tracking_uri)
        exp_id = experiment_id(client, experiment)
        name = f"lm-{cfg.lm.d_model}d{cfg.lm.layers}L-{cfg.chunk_len}x{cfg.cache_len}"
        return client.create_run(exp_id, run_name=name).info.run_id
    except Exception as e:  # noqa: BLE001 - the tracker is a destination, not a dependency
        print(f"[lm] cannot create an MLflow run at {tracking_uri} ({type(e).__name__}: {str(e)[:200]}); training "
              "goes on, its records wait in OUT/outbox for the next segment that reaches the tracker",
              file=sys.stderr, flush=True)
        return None


def _open_outbox(out_dir: Path, tracking_uri: str | None, run_id: str | None, experiment: str,
                 cfg: LMTrainConfig, first: bool) -> tuple[Any, str | None]:
    from asr_core.runtime.outbox import Outbox
    from asr_core.contract.folder.outbox_files import outbox_dir
    from asr_core.contract.provenance import code_version
    from asr_core.contract.trial import RUNNING, TAG_GIT_COMMIT

    if run_id is None:
        run_id = _create_run(tracking_uri, experiment, cfg)
    segment = len(list(outbox_dir(out_dir).glob("*.jsonl"))) + 1
    box = Outbox(out_dir, segment=segment, tracking_uri=tracking_uri, run_id=run_id).start()
    box.status(RUNNING)
    box.params(cfg.flat())
    if first:
        commit = code_version().commit
        if commit:
            box.tags({TAG_GIT_COMMIT: commit})
    return box, run_id


def train_lm(cfg: LMTrainConfig, texts: Sequence[str], tokenizer: Tokenizer, out_dir: str | Path, *,
             dev_texts: Sequence[str] = (), tracking_uri: str | None = None, run_id: str | None = None,
             experiment: str = DEFAULT_EXPERIMENT,
             progress: Callable[[int, float], None] | None = None) -> LMTrainResult:
    """Train (or resume, from ``out_dir/checkpoint.pt``) the LM ``cfg`` on the documents of ``texts`` (specs for
    :func:`asr_core.lm.data.read_documents`) tokenised by ``tokenizer``; see the module docstring.
    ``dev_texts``: documents whose perplexity at context ``cache_len`` is measured at each checkpoint.
    ``progress(step, loss)`` is called after every step."""
    with signals.installed():
        return _train(cfg, list(texts), tokenizer, Path(out_dir), list(dev_texts), tracking_uri, run_id,
                      experiment, progress)


def _train(cfg: LMTrainConfig, texts: list[str], tok: Tokenizer, out_dir: Path, dev_texts: list[str],
           tracking_uri: str | None, run_id: str | None, experiment: str,
           progress: Callable[[int, float], None] | None) -> LMTrainResult:
    from asr_core.runtime import outbox as ob
    from asr_core.contract.trial import FAILED, FINISHED
    from madgrad import MADGRAD

    ckpt_path = out_dir / CHECKPOINT_FILE
    with signals.raising(Preempted):  # nothing to checkpoint yet: a stop signal ends the setup at once
        if tok.vocab_size != cfg.lm.vocab_size:
            raise LMTrainError(f"the tokenizer has {tok.vocab_size} ids but lm.vocab_size is {cfg.lm.vocab_size}")
        ids = encode(tok, read_text(texts))
        if not ids:
            raise LMTrainError(f"the training text ({', '.join(texts)}) encodes to no tokens")
        dev_ids = encode(tok, read_text(dev_texts)) if dev_texts else []
        data_id = fingerprint(ids)
        device, bf16 = _device(cfg)
        precision = "bf16" if bf16 else "fp32"
        state = load_checkpoint(ckpt_path) if ckpt_path.exists() else None
        if state is not None:
            check_resume(ckpt_path, state, cfg, tok, data_id, precision)
            run_id = run_id or state.get("mlflow_run_id")
            tracking_uri = tracking_uri or state.get("tracking_uri")
        out_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(cfg.seed)  # the initial weights
        model = build_lm(cfg.lm).to(device)
        if model.memory is not None and state is None:  # once per run; a resumed run reads them back
            model.memory.set_counts(next_token_counts(ids, cfg.lm.vocab_size))
        opt = MADGRAD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                      eps=cfg.eps)
        step, epoch, chunk, last_loss = 0, 0, 0, math.nan
        cache: KVCache | None = None
        if cfg.max_steps:
            total_steps = cfg.max_steps
        else:
            total_steps = sum(count_chunks(epoch_order(ids, cfg.seed, e), cfg.batch, cfg.chunk_len)
                              for e in range(cfg.epochs))
        if state is not None:
            model.load_state_dict(state["model"])
            if model.memory is not None:
                model.memory.load_generator_state(state["memory_generator"])
            opt.load_state_dict(state["optimizer"])
            step, total_steps = int(state["step"]), int(state["schedule"]["total_steps"])
            last_loss = float(state["schedule"]["last_loss"])
            epoch, chunk = int(state["data_position"]["epoch"]), int(state["data_position"]["chunk"])
            if state["cache"] is not None:
                c = state["cache"]
                cache = KVCache(c["keys"], c["values"], c["lengths"], c.get("history"), c.get("bos_id")).to(device)
            set_rng_state(state["rng"])
            print(f"[lm] resuming {ckpt_path} at step {step}/{total_steps}", file=sys.stderr, flush=True)

    box = None
    if tracking_uri or run_id:
        box, run_id = _open_outbox(out_dir, tracking_uri, run_id, experiment, cfg, first=state is None)
        box.tags({LM_TAG: data_id, "lm.text": " ".join(texts)[:500]})
    else:
        print("[lm] no MLflow tracking URI given: metrics go to this log only", file=sys.stderr, flush=True)

    def dev_ppl() -> float | None:
        if not dev_ids:
            return None
        from asr_core.lm.ppl import score_documents

        return score_documents(model, dev_ids, cfg.cache_len, chunk=cfg.chunk_len, batch=cfg.batch, bf16=bf16).ppl

    def checkpoint(with_dev: bool) -> float | None:
        ppl = dev_ppl() if with_dev else None
        if ppl is not None:
            print(f"[lm] step {step}: dev ppl {ppl:.3f} (context {cfg.cache_len})", file=sys.stderr, flush=True)
            if box is not None:
                box.metrics(step, {"lm/dev_ppl": ppl})
        if box is not None:
            box.sync()  # every step up to this checkpoint's is on disk before the checkpoint is
        save_checkpoint(ckpt_path, {
            "format_version": FORMAT_VERSION, "kind": KIND, "config": cfg.to_dict(), "model": model.state_dict(),
            "optimizer": opt.state_dict(), "step": step,
            "schedule": {"total_steps": total_steps, "warmup_steps": cfg.warmup_steps, "peak_lr": cfg.lr,
                         "last_loss": last_loss},
            "rng": rng_state(), "data_position": {"epoch": epoch, "chunk": chunk},
            "cache": None if cache is None else {"keys": cache.keys.cpu(), "values": cache.values.cpu(),
                                                 "lengths": cache.lengths.cpu(), "bos_id": cache.bos_id,
                                                 "history": None if cache.history is None else cache.history.cpu()},
            "memory_generator": None if model.memory is None else model.memory.generator_state(),
            "tokenizer": tok.to_bytes(), "data_fingerprint": data_id, "text": list(texts),
            "mlflow_run_id": run_id, "tracking_uri": tracking_uri, "precision": precision,
        })
        return ppl

    size = lm_size(cfg.lm)
    memory = "" if model.memory is None else (f" + a lookup memory of {size.memory / 1e6:.2f}M numbers "
                                              f"({size.memory_bytes / 2**20:.1f} MiB)")
    print(f"[lm] {size.parameters / 1e6:.2f}M parameters{memory} on {device}{' (bf16)' if bf16 else ''}; "
          f"{len(ids)} documents, "
          f"{sum(map(len, ids))} tokens (fingerprint {data_id}); {total_steps} steps of {cfg.batch} x "
          f"{cfg.chunk_len} tokens, memory {cfg.cache_len}; out {out_dir}", file=sys.stderr, flush=True)
    last_ppl: float | None = None
    try:
        chunks = chunk_batches(epoch_order(ids, cfg.seed, epoch), cfg.batch, cfg.chunk_len, bos=cfg.lm.bos_id,
                               start=chunk)
        model.train()
        window: list[float] = []
        t0 = time.monotonic()
        while step < total_steps:
            if signals.received() is not None:
                checkpoint(with_dev=False)
                print(f"[lm] {signals.name()} received: checkpointed at step {step} to {ckpt_path}",
                      file=sys.stderr, flush=True)
                raise Preempted(f"{signals.name()} at step {step}")
            ch = next(chunks, None)
            if ch is None:  # the epoch is over: a fresh order, every lane starts afresh
                if not cfg.max_steps and epoch + 1 >= cfg.epochs:
                    break
                epoch, chunk, cache = epoch + 1, 0, None
                chunks = chunk_batches(epoch_order(ids, cfg.seed, epoch), cfg.batch, cfg.chunk_len,
                                       bos=cfg.lm.bos_id)
                continue
            lr = learning_rate(step, cfg.lr, cfg.warmup_steps, total_steps)
            for g in opt.param_groups:
                g["lr"] = lr
            tokens, lengths = ch.tokens.to(device), ch.lengths.to(device)
            if cache is not None:
                cache = cache.forget(ch.reset)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits, new_cache = model(tokens[:, :-1], lengths, cache, targets=tokens[:, 1:])
            valid = torch.arange(cfg.chunk_len, device=device)[None, :] < lengths[:, None]  # (B, T)
            loss = F.cross_entropy(logits[valid].float(), tokens[:, 1:][valid])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            cache = new_cache.detach().trim(cfg.cache_len)  # Transformer-XL memory: no gradient into the past
            step, chunk, last_loss = step + 1, chunk + 1, float(loss.detach())
            window.append(last_loss)
            if box is not None:
                box.metrics(step, {"lm/train_loss": last_loss, "lm/lr": lr, "lm/grad_norm": float(grad_norm)})
            if progress is not None:
                progress(step, last_loss)
            if step % cfg.log_every == 0 or step == total_steps:
                mean = sum(window) / len(window)
                rate = len(window) * cfg.batch * cfg.chunk_len / max(time.monotonic() - t0, 1e-9)
                print(f"[lm] step {step}/{total_steps} loss {mean:.4f} ppl {math.exp(min(mean, 50)):.2f} "
                      f"lr {lr:.3g} ({rate:.0f} tok/s)", file=sys.stderr, flush=True)
                window, t0 = [], time.monotonic()
                if box is not None:
                    box.kick()
            if step % cfg.checkpoint_every == 0 and step < total_steps:
                last_ppl = checkpoint(with_dev=True)
        last_ppl = checkpoint(with_dev=True)
        if box is not None:
            box.status(FINISHED)
        print(f"[lm] done: {step} steps, final loss {last_loss:.4f}, checkpoint {ckpt_path}", file=sys.stderr,
              flush=True)
        return LMTrainResult(ckpt_path, run_id, step, last_loss, last_ppl)
    except (Preempted, KeyboardInterrupt):
        raise
    except BaseException:
        if box is not None:
            box.status(FAILED)
        raise
    finally:
        if box is not None:
            hurry = signals.received() is not None
            if not box.flush(ob.PREEMPT_FLUSH_S if hurry else ob.FINAL_FLUSH_S, signals.received):
                print(f"[lm] MLflow at {tracking_uri} has not taken everything yet ({box.last_error or 'no answer'});"
                      f" the rest waits in {box.dir} and is shipped by the next segment", file=sys.stderr, flush=True)
            box.close()
