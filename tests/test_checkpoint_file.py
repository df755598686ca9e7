"""The torch-free check of a checkpoint's file (``asr_core.contract.folder.checkpoint_file``) says what the checkpoint
reader says for the same file, and it is what the commands run before they import torch."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from asr_core.contract.folder.checkpoint_file import NOT_OURS, file_refusal

REPO = Path(__file__).resolve().parents[1]


def _bad_files(d: Path) -> dict[str, Path]:
    (d / "text.pt").write_text("hello, I am not a checkpoint\n")
    (d / "pickle.pt").write_bytes(pickle.dumps({"config": {}, "model": [1.5]}))
    (d / "empty.pt").write_bytes(b"")
    (d / "folder").mkdir()
    (d / "trial").mkdir()
    (d / "trial" / "checkpoint.pt").write_text("x")
    return {"text": d / "text.pt", "pickle": d / "pickle.pt", "empty": d / "empty.pt", "folder": d / "folder",
            "folder-with-checkpoint": d / "trial", "missing": d / "missing.pt"}


@pytest.mark.parametrize("kind", ["text", "pickle", "empty", "folder", "folder-with-checkpoint", "missing"])
def test_the_refusal_is_the_readers_message(kind: str, tmp_path: Path) -> None:
    from asr_core.training.checkpoint import CheckpointError, read_header

    path = _bad_files(tmp_path)[kind]
    with pytest.raises(CheckpointError) as raised:
        read_header(path)
    assert file_refusal(path) == str(raised.value)
    assert str(path) in str(raised.value)
    if kind in ("text", "pickle", "empty"):
        assert str(raised.value).startswith(f"{NOT_OURS}: {path} (")


def test_a_zip_archive_passes_to_torch(tmp_path: Path) -> None:
    import torch

    torch.save({"model": {}}, tmp_path / "noconfig.pt")
    assert file_refusal(tmp_path / "noconfig.pt") is None


@pytest.mark.parametrize("argv", [["evaluate", "{d}/text.pt"], ["heads", "{d}/empty.pt"], ["reach", "{d}/pickle.pt"]],
                         ids=["evaluate", "heads", "reach"])
def test_the_commands_refuse_a_bad_file_before_importing_torch(argv: list[str], tmp_path: Path) -> None:
    """(``lm ppl`` checks the file before its LM reader is imported, but the ``asr_core.lm`` package imports torch.)"""
    _bad_files(tmp_path)
    args = [a.replace("{d}", str(tmp_path)) for a in argv]
    # torch made unimportable: a refusal that reached for it would fail with ModuleNotFoundError, not exit 2
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "torch.py").write_text("raise ModuleNotFoundError('torch is not to be imported here')\n")
    env = {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{REPO}", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "asr_core", *args], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
    refused = file_refusal(Path(args[1]))
    assert r.returncode == 2 and refused is not None and refused in r.stderr, r.stderr
