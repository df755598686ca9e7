"""Checkpoints: atomic, self-describing, loaded without unpickling code (``weights_only=True``).

Every reader of a checkpoint goes through here: :func:`load_checkpoint` (the whole dict, checked to be one of
ours), :func:`read_header` (the small entries without reading the weights), :func:`load_for_eval` (the model).

The dict (docs/ARCHITECTURE.md): ``config`` (``Config.to_dict()``), ``model``, ``optimizer`` (dropped once a trial's
training is finished: :func:`drop_optimizer_state`), ``step``,
``schedule``, ``rng``, ``data_position``, ``mlflow_run_id``, ``tracking_uri``, ``tokenizer`` (SentencePiece model
bytes), ``format_version``. Everything in it is a tensor, a number, a string, bytes or a container of those, so
the restricted unpickler accepts it.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asr_core.config import Config
from asr_core.contract.atomic import write_with
from asr_core.contract.folder.checkpoint_file import file_refusal, not_ours
from asr_core.model.acoustic import AcousticModel, build_model
from asr_core.data.tokenizer import Tokenizer

FORMAT_VERSION = 1
REQUIRED = ("config", "model", "tokenizer", "format_version")


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable or not one of ours; the message names the file."""


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically: a temporary file in the same folder (``.<name>.<random>.tmp``, with
    the mode the umask gives a new file, so teammates read it where they read the folder), fsync, ``os.replace``,
    fsync of the folder (:mod:`asr_core.contract.atomic`). A crash at any moment leaves either the old checkpoint or
    the new one, never half of one; the temporary file of a process killed while saving is removed by the trial
    job's next start (:func:`asr_core.contract.atomic.stale_temps`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_with(path, lambda f: torch.save(state, f))


def read_header(path: str | Path) -> dict[str, Any]:
    """A checkpoint's dict without reading its weights: the tensors are memory-mapped, so only what is looked at
    (``config``, ``tokenizer``, ``mlflow_run_id``, ...) is read from disk. Checked as :func:`load_checkpoint` checks
    (an LM's checkpoint passes too: it has the same keys); :class:`CheckpointError` otherwise."""
    return _load(Path(path), mmap=True)


def acoustic_header(path: str | Path) -> dict[str, Any]:
    """:func:`read_header` of an acoustic model's checkpoint: an LM's (``kind: lm``) is refused, naming where it
    goes, before its config is taken for a model's."""
    return acoustic_state(Path(path), read_header(path))


def acoustic_state(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` if it is an acoustic model's checkpoint, else :class:`CheckpointError` (an LM's, given where a
    model's is wanted)."""
    if state.get("kind") is not None:
        raise CheckpointError(f"{path} is an LM checkpoint (kind {state['kind']!r}), not an acoustic model's; an LM "
                              "goes to --lm of evaluate or lm tune, a model's checkpoint.pt here")
    return state


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint on the CPU with the restricted (``weights_only``) unpickler; :class:`CheckpointError`
    (one line naming the file and what is wrong) for anything that is not a checkpoint of this project."""
    return _load(Path(path), mmap=False)


def _load(path: Path, mmap: bool) -> dict[str, Any]:
    """The checked dict of the checkpoint at ``path`` (:func:`_check_file` before torch reads it, :func:`checked_state`
    after); ``mmap``: tensors memory-mapped, where the file's format allows it."""
    _check_file(path)
    try:
        try:
            state = _read(path, mmap=mmap)
        except RuntimeError:  # mmap needs the zip format of torch >= 1.6; an older zip still loads plainly
            if not mmap:
                raise
            state = _read(path, mmap=False)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a file that is not a checkpoint
        raise _not_ours(path, _why_unreadable(e)) from None
    return checked_state(path, state)


def _check_file(path: Path) -> None:
    """A checkpoint path names a file of ``torch.save``'s format (a zip archive: every checkpoint this project
    writes is one), else :class:`CheckpointError`. Checked before torch reads it, so torch's advice on how to load
    other files (some of which would run code from the file) never reaches the user. The check and its words are
    :func:`asr_core.contract.folder.checkpoint_file.file_refusal`'s, which commands also run before importing torch."""
    problem = file_refusal(path)
    if problem is not None:
        raise CheckpointError(problem)


def _why_unreadable(e: Exception) -> str:
    """What is wrong with a file torch could not read, in a few words, without torch's advice."""
    if isinstance(e, pickle.UnpicklingError) and "Weights only load failed" in str(e):
        return "it holds Python objects no checkpoint of this project holds; refused unread"
    if isinstance(e, OSError):
        return f"cannot be read: {e.strerror or e}"
    first = (str(e).strip().splitlines() or [""])[0][:160]
    return f"unreadable: {type(e).__name__}" + (f": {first}" if first else "")


def _not_ours(path: Path, why: str) -> CheckpointError:
    return CheckpointError(not_ours(path, why))


def checked_state(path: Path, state: Any) -> dict[str, Any]:
    """``state`` if it is a checkpoint's dict this code can read, else :class:`CheckpointError`."""
    if not isinstance(state, dict):
        raise _not_ours(path, f"it holds a {type(state).__name__}, not a checkpoint's dict")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise _not_ours(path, f"a dict without {', '.join(repr(k) for k in missing)}; a checkpoint has "
                              f"{', '.join(REQUIRED)}")
    version = state["format_version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise _not_ours(path, f"format_version {version!r} is not an integer")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{path}: format_version {version} is newer than this code ({FORMAT_VERSION}); "
                              "update asr_core")
    return state


def _read(path: str | Path, *, mmap: bool) -> Any:
    """The one ``torch.load`` of this project's checkpoints: on the CPU, with the restricted unpickler."""
    return torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)


def training_finished(state: dict[str, Any]) -> bool:
    """Whether a training checkpoint's run is over: its last step done, or its optimizer state dropped (which only
    :func:`drop_optimizer_state` does, once training finished)."""
    schedule = state.get("schedule") or {}
    return state.get("optimizer") is None or int(state.get("step", 0)) >= int(schedule.get("total_steps", 1 << 62))


def drop_optimizer_state(path: str | Path) -> int:
    """Rewrite the checkpoint at ``path`` without its optimizer state, atomically; the bytes saved (0 when it has
    none). For a model whose training is finished: the optimizer state is 2-3x the weights (Madgrad keeps three
    tensors per parameter), 1.4-5 GB a checkpoint for the paper's models, and only a resumed training reads it."""
    path = Path(path)
    state = load_checkpoint(path)
    if state.get("optimizer") is None:
        return 0
    before = path.stat().st_size
    del state["optimizer"]
    save_checkpoint(path, state)
    return before - path.stat().st_size


def load_for_eval(path: str | Path, device: str | torch.device = "cpu") -> tuple[AcousticModel, Config, Tokenizer]:
    """(model in eval mode on ``device``, its config, its tokenizer) from a training checkpoint."""
    return model_from_state(Path(path), acoustic_state(Path(path), load_checkpoint(path)), device)


def model_from_state(path: Path, state: dict[str, Any],
                     device: str | torch.device = "cpu") -> tuple[AcousticModel, Config, Tokenizer]:
    """(model in eval mode on ``device``, its config, its tokenizer) from the checked ``state`` of the checkpoint at
    ``path`` (:func:`acoustic_state`); :class:`CheckpointError` naming ``path`` where they do not fit together."""
    cfg = Config.from_stored(state["config"], source=str(path))
    model = build_model(cfg.model, cfg.data.features.n_mels, cfg.data.features.frames_per_second)
    try:
        model.load_state_dict(state["model"])
        tok = Tokenizer.from_bytes(state["tokenizer"])
    except (RuntimeError, TypeError, ValueError) as e:  # weights of another shape, a broken tokenizer
        said = " ".join(str(e).split())[:240]
        raise CheckpointError(f"{path}: its weights or tokenizer do not fit its config ({type(e).__name__}: "
                              f"{said}); the file is damaged or was edited") from None
    if tok.vocab_size != cfg.model.vocab_size:
        raise CheckpointError(f"{path}: tokenizer has {tok.vocab_size} outputs, model {cfg.model.vocab_size}")
    return model.to(device).eval(), cfg, tok


# ---- random number generator state ----------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Python, numpy, torch (and CUDA) generator states in weights_only-safe types."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
