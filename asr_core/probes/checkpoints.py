"""What the probes that take several checkpoints (``reach``, ``recall``) share: the checks made before any model is
loaded, and where each checkpoint's tables go."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from asr_core.contract.folder.checkpoint_file import file_refusal


def refusal(prog: str, checkpoints: Sequence[Path], out: Path | None, several: str = "each gets a folder in it"
            ) -> str | None:
    """The one line a probe exits 2 with, or None: a checkpoint that is a folder or not there, or several checkpoints without
    ``--out`` (``several`` says what --out then holds)."""
    folder = next((c for c in checkpoints if c.is_dir()), None)
    if folder is not None:  # a trial folder: the checkpoint inside it, by name
        return f"{prog}: {file_refusal(folder)}"
    missing = [str(c) for c in checkpoints if not c.is_file()]
    if missing:
        return f"{prog}: checkpoint not found: {', '.join(missing)}"
    if len(checkpoints) > 1 and out is None:
        return f"{prog}: several checkpoints need --out DIR ({several})"
    return None


def out_for(out: Path | None, checkpoints: Sequence[Path], k: int) -> Path | None:
    """The folder of the ``k``-th (from 1) of ``checkpoints``: ``out`` itself for one checkpoint (None: the probe's
    default beside it), else ``out/<k>-<the checkpoint's folder name>``."""
    if len(checkpoints) == 1:
        return out
    assert out is not None, "refusal() asks for --out first"
    return out / f"{k}-{checkpoints[k - 1].parent.name}"
