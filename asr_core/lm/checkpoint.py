"""The LM's checkpoint: what :mod:`asr_core.lm.train` writes, the checks before it resumes one, and
:func:`load_lm`, a trained LM ready for perplexity (:mod:`asr_core.lm.ppl`), tuning and beam search.

The checkpoint (a dict, loaded with ``weights_only=True``): ``format_version``, ``kind`` (``"lm"``), ``config``
(:meth:`LMTrainConfig.to_dict`), ``model``, ``optimizer``, ``step``, ``schedule`` (``total_steps``,
``warmup_steps``, ``peak_lr``, ``last_loss``), ``rng``, ``data_position`` (``epoch``, ``chunk``: chunks of that
epoch trained), ``cache`` (the lanes' memories: ``keys``, ``values`` (L, B, S, D), ``lengths`` (B,), ``history``
(B, N - 1) and ``bos_id`` with a lookup memory, else None; None before the first step), ``memory_generator`` (the
lookup memory's update generator state; None without one, absent in checkpoints older than the memory), ``tokenizer`` (SentencePiece bytes), ``data_fingerprint`` (of the token ids), ``text`` (the specs read),
``mlflow_run_id``, ``tracking_uri``, ``precision``.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from asr_core.data.tokenizer import Tokenizer, TokenizerError
from asr_core.lm.model import TransformerLM, build_lm
from asr_core.lm.config import EXECUTION, LMTrainConfig
from asr_core.training.checkpoint import CheckpointError, load_checkpoint

FORMAT_VERSION = 1
KIND = "lm"
CHECKPOINT_FILE = "checkpoint.pt"


class LMTrainError(RuntimeError):
    """LM training cannot start or continue; the message says why and what to do."""


@dataclass(frozen=True)
class LMCheckpoint:
    """A trained LM ready to use: the model in eval mode, its config and tokenizer, and where it came from."""

    model: TransformerLM
    config: LMTrainConfig
    tokenizer: Tokenizer
    step: int
    mlflow_run_id: str | None
    tracking_uri: str | None


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The acoustic model's tokenizer: from an acoustic checkpoint (its ``tokenizer`` bytes) or a SentencePiece
    ``.model`` file."""
    p = Path(path)
    if not p.is_file():
        raise LMTrainError(f"tokenizer file not found: {p}; give an acoustic checkpoint (checkpoint.pt) or a "
                           "SentencePiece .model file")
    if zipfile.is_zipfile(p):  # torch.save's format: a checkpoint
        return Tokenizer.from_bytes(load_checkpoint(p)["tokenizer"])
    valid = "give an acoustic checkpoint (checkpoint.pt) or the SentencePiece .model file of its tokenizer"
    if p.stat().st_size == 0:  # SentencePiece would load it as a model with no pieces
        raise LMTrainError(f"tokenizer file {p} is empty; {valid}")
    try:
        tok = Tokenizer.load(p)
    except TokenizerError:
        raise LMTrainError(f"{p}: neither a checkpoint nor a SentencePiece model; {valid}") from None
    if tok.vocab_size < 3:
        raise LMTrainError(f"tokenizer file {p} holds no usable SentencePiece model ({tok.vocab_size - 1} pieces); "
                           f"{valid}")
    return tok


def check_resume(path: Path, state: dict[str, Any], cfg: LMTrainConfig, tok: Tokenizer, data_id: str,
                 precision: str) -> None:
    """Refuse to resume the checkpoint ``state`` (read from ``path``) with another config (execution settings
    aside), tokenizer, text or precision: :class:`LMTrainError` says which and what to do."""
    if state.get("kind") != KIND:
        raise LMTrainError(f"{path} is not an LM checkpoint (kind {state.get('kind')!r}); train in another --out")
    saved = LMTrainConfig.from_dict(state["config"], source=str(path))
    was, now = saved.flat(), cfg.flat()
    keys = list(was) + [k for k in now if k not in was]  # lm.memory.* exist only where a memory is set
    diff = [f"{k}: {was.get(k)!r} -> {now.get(k)!r}" for k in keys
            if k not in EXECUTION and was.get(k) != now.get(k)]
    if diff:
        raise LMTrainError(f"{path} was trained with another config ({', '.join(diff)}); resume with the same "
                           "preset and --set values (only " + ", ".join(EXECUTION) + " may change), or train in "
                           "another --out folder")
    if bytes(state["tokenizer"]) != tok.to_bytes():
        raise LMTrainError(f"{path} was trained with another tokenizer than the one given now; give the same file")
    if state["data_fingerprint"] != data_id:
        raise LMTrainError(f"the training text has other content than when {path} was written (token fingerprint "
                           f"{state['data_fingerprint']} then, {data_id} now; text then: {state.get('text')}); "
                           "give the same text, or train in another --out folder")
    if state["precision"] != precision:
        raise LMTrainError(f"{path} was trained in {state['precision']}, this segment would train in {precision}; "
                           "resume on the same kind of device, or set precision so the whole run uses one")


def load_lm(path: str | Path, device: str | torch.device = "cpu") -> LMCheckpoint:
    """The LM of an ``lm train`` checkpoint (``weights_only`` load), in eval mode on ``device``. A lookup memory
    comes back with its dictionary and counts (eval mode never updates it, so its generator is not restored)."""
    path = Path(path)
    state = load_checkpoint(path)
    if state.get("kind") != KIND:
        what = "an acoustic model's" if state.get("kind") is None else f"of kind {state.get('kind')!r}"
        raise CheckpointError(f"{path}: not an LM checkpoint ({what}); an acoustic checkpoint goes to evaluate, an "
                              "LM one comes from python -m asr_core lm train")
    if state["format_version"] > FORMAT_VERSION:
        raise CheckpointError(f"{path}: LM format_version {state['format_version']} is newer than this code "
                              f"({FORMAT_VERSION}); update asr_core")
    cfg = LMTrainConfig.from_dict(state["config"], source=str(path))
    model = build_lm(cfg.lm)
    model.load_state_dict(state["model"])
    tok = Tokenizer.from_bytes(state["tokenizer"])
    if tok.vocab_size != cfg.lm.vocab_size:
        raise CheckpointError(f"{path}: tokenizer has {tok.vocab_size} ids, the LM {cfg.lm.vocab_size}")
    return LMCheckpoint(model.to(device).eval(), cfg, tok, int(state["step"]), state.get("mlflow_run_id"),
                        state.get("tracking_uri"))
