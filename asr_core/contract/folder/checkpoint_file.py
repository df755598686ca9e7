"""The check of a checkpoint's *file* that needs no torch: a command refuses a path that cannot be a checkpoint
(missing, a folder, empty, not a zip archive) before it imports torch, in a fraction of a second.

Every checkpoint this project writes is ``torch.save``'s zip format (:mod:`asr_core.training.checkpoint`), so a file
that is not a zip archive is refused unread. The checkpoint reader (:mod:`asr_core.training.checkpoint`) runs the same check and
raises its words as a ``CheckpointError`` (``not a checkpoint of this project: …``), so a command says the same
whichever refuses first. A zip archive passes here and is checked by torch's restricted
reader as before. :func:`file_sha256` is the hash sealed into a finished model's ``TRAINED`` record
(:func:`asr_core.contract.folder.trained.seal_trained`): what every evaluation of the model checks the file it reads
against.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

NOT_OURS = "not a checkpoint of this project"
VALID = ("valid: a checkpoint.pt written by `python -m asr_core train` or a grid trial (an LM's: by "
         "`python -m asr_core lm train`)")


def not_ours(path: Path, why: str) -> str:
    """The one line for a file that is not one of this project's checkpoints, ``why`` in a few words."""
    return f"{NOT_OURS}: {path} ({why}); {VALID}"


def file_refusal(path: str | Path) -> str | None:
    """Why ``path`` cannot be a checkpoint, as one line naming it (None: a zip archive, which torch reads next)."""
    path = Path(path)
    if path.is_dir():
        inside = path / "checkpoint.pt"
        hint = f"; did you mean {inside}?" if inside.is_file() else ""
        return f"{path} is a folder, not a checkpoint{hint}"
    if not path.is_file():
        return f"checkpoint not found: {path}"
    try:
        is_zip = zipfile.is_zipfile(path)
    except OSError as e:
        return f"checkpoint {path} cannot be read: {e.strerror or e}"
    if not is_zip:
        return not_ours(path, "an empty file" if path.stat().st_size == 0 else "not a file torch.save wrote")
    return None


def command_refusal(command: str, path: str | Path) -> str | None:
    """The one line ``command`` prints when it refuses ``path`` before importing torch (None: a zip archive, read
    next): ``COMMAND: checkpoint PATH not found`` where nothing is there, else :func:`file_refusal`'s words (a trial
    folder: the checkpoint inside it, by name)."""
    path = Path(path)
    if not path.is_file() and not path.is_dir():
        return f"{command}: checkpoint {path} not found"
    refused = file_refusal(path)
    return f"{command}: {refused}" if refused else None


def file_sha256(path: str | Path) -> str:
    """The sha256 of the file's bytes (read in 1 MiB pieces), as hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            h.update(piece)
    return h.hexdigest()
