"""One read of a model's checkpoint for an evaluation job: its bytes read once, hashed, checked against the model's
``TRAINED`` record and key, and loaded from those same bytes.

Every use of the checkpoint in the job (the model, its config, its tokenizer, the LM's tokenizer check of a beam
decoder) takes the one :class:`CheckpointRead`, so a checkpoint replaced while the job runs cannot give it two files:
what the job records (``evaluation.json``, the run's tags :func:`asr_core.contract.evaluation.checkpoint_tags`, each
table row's :data:`~asr_core.contract.evaluation.CHECKPOINT_COLUMN`) names the bytes it decoded with.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from asr_core.contract.folder.checkpoint_file import not_ours
from asr_core.contract.folder.trained import read_trained
from asr_core.contract.trial import TrialFolder

if TYPE_CHECKING:
    import torch

    from asr_core.config import Config
    from asr_core.contract.evaluation import EvaluationSpec


class CheckpointRefused(ValueError):
    """The checkpoint an evaluation job found is not the one its model's training finished with (another step, another
    model's config, another file than an earlier evaluation of the model read); the message names both."""


@dataclass(frozen=True)
class CheckpointRead:
    """A checkpoint read once: ``sha256`` of its bytes, its training ``step`` and its checked ``state`` (loaded from
    those bytes)."""

    path: Path
    sha256: str
    step: int
    state: dict[str, Any] = field(repr=False, compare=False)

    @property
    def config(self) -> "Config":
        from asr_core.config import Config

        return Config.from_stored(self.state["config"], source=str(self.path))

    @property
    def tokenizer_bytes(self) -> bytes:
        return bytes(self.state["tokenizer"])

    def for_eval(self, device: "str | torch.device" = "cpu") -> tuple[Any, "Config", Any]:
        """(model in eval mode on ``device``, its config, its tokenizer), as
        :func:`asr_core.training.checkpoint.load_for_eval` makes them, from this read."""
        from asr_core.training.checkpoint import model_from_state

        return model_from_state(self.path, self.state, device)


def read_checkpoint(path: Path | str) -> CheckpointRead:
    """Read the acoustic checkpoint at ``path`` once (its whole bytes), hash them and load its state from them with
    the restricted unpickler, checked as :func:`asr_core.training.checkpoint.load_checkpoint` checks;
    :class:`~asr_core.training.checkpoint.CheckpointError` for anything else."""
    import torch

    from asr_core.training.checkpoint import CheckpointError, acoustic_state, checked_state

    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: {e.strerror or e}") from None
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise CheckpointError(not_ours(path, "an empty file" if not data else "not a file torch.save wrote"))
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a file that is not a checkpoint
        raise CheckpointError(not_ours(path, f"unreadable: {type(e).__name__}")) from None
    state = acoustic_state(path, checked_state(path, state))
    return CheckpointRead(path, hashlib.sha256(data).hexdigest(), int(state.get("step", 0)), state)


def verify(read: CheckpointRead, spec: "EvaluationSpec", model_key: str | None = None) -> None:
    """Refuse (:class:`CheckpointRefused`, naming both) a checkpoint that is not the one ``spec``'s model finished
    training with: its step or hash differs from the ``TRAINED`` record's, its config is another model's (its key is
    neither ``spec.model`` nor ``model_key``, the key the job's own config gives the model: a model recorded under an
    older key), or it is another file than ``spec`` records an earlier segment of the job read."""
    trained = read_trained(spec.model_dir)
    steps = trained.steps if trained is not None else None
    if steps is not None and steps != read.step:
        raise CheckpointRefused(
            f"evaluation {spec.key}: checkpoint {read.path} is at step {read.step} (sha256 {read.sha256}), but model "
            f"{spec.model}'s TRAINED record says its training finished at step {steps}: the checkpoint was replaced "
            "after training; nothing is evaluated (restore the model's checkpoint, or train the model again)")
    sealed = trained.sha256 if trained is not None else ""
    if sealed and sealed != read.sha256:
        raise CheckpointRefused(
            f"evaluation {spec.key}: checkpoint {read.path} has sha256 {read.sha256} (step {read.step}), but model "
            f"{spec.model}'s TRAINED record says its training left sha256 {sealed}: the checkpoint was replaced after "
            "training; nothing is evaluated (restore the model's checkpoint, or train the model again)")
    key = read.config.key()
    if key not in (spec.model, model_key):
        raise CheckpointRefused(
            f"evaluation {spec.key}: checkpoint {read.path} (sha256 {read.sha256}) holds model {key}, but the job "
            f"evaluates model {spec.model}: the checkpoint was replaced by another model's; nothing is evaluated")
    if spec.checkpoint_sha256 and spec.checkpoint_sha256 != read.sha256:
        raise CheckpointRefused(
            f"evaluation {spec.key}: checkpoint {read.path} has sha256 {read.sha256} (step {read.step}), but an "
            f"earlier segment of this job read sha256 {spec.checkpoint_sha256} (step {spec.checkpoint_step}); "
            "its results would mix two checkpoints: nothing is evaluated")


class ModelCheckpoint:
    """The model's checkpoint as an evaluation job uses it: read and verified (:func:`read_checkpoint`,
    :func:`verify`) at its first use, which the evaluation makes before it decodes anything; every later use gets
    that same read (:attr:`done`: it, or None while nothing was read)."""

    def __init__(self, spec: "EvaluationSpec", model_key: str | None = None,
                 on_read: "Callable[[CheckpointRead], None] | None" = None) -> None:
        self.spec, self.model_key, self.on_read = spec, model_key, on_read
        self.done: CheckpointRead | None = None

    @property
    def path(self) -> Path:
        return self.spec.checkpoint

    def read(self) -> CheckpointRead:
        if self.done is None:
            read = read_checkpoint(self.spec.checkpoint)
            verify(read, self.spec, self.model_key)
            self.done = read
            if self.on_read is not None:
                self.on_read(read)
            print(f"[eval] read {read.path}: step {read.step}, sha256 {read.sha256}", file=sys.stderr, flush=True)
        return self.done

    def for_eval(self, device: "str | torch.device" = "cpu") -> tuple[Any, "Config", Any]:
        return self.read().for_eval(device)
