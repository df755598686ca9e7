"""Files replaced whole: a crash or a full disk at any moment leaves the old file or the new one, never an empty or
cut one. Torch-free, so the trial job, the trainer and ``orchestrate`` share it.

The recipe: write a temporary file beside the target (:func:`temp_beside`, named ``.<name>.<random>.tmp`` so that
:func:`stale_temps` can find what a killed writer left), ``fsync`` it, ``os.replace`` it over the target, ``fsync``
the folder (:func:`replace_durably`) so the rename itself survives a power cut. The temporary file is created with
mode 0666 and the umask applied by the kernel, as ``open()`` would (``tempfile.mkstemp``'s 0600 would keep a
teammate from reading a checkpoint on a shared sweep).
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

TEMP_SUFFIX = ".tmp"


def temp_beside(path: Path) -> tuple[int, Path]:
    """(an open write-only descriptor, its path): a new temporary file in ``path``'s folder, named
    ``.<name>.<random>.tmp``, with the mode a new file gets from the umask."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}{TEMP_SUFFIX}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path} after 100 tries")


def stale_temps(path: Path) -> list[Path]:
    """The temporary files of :func:`temp_beside` for ``path`` that are still on disk (a writer killed mid-write,
    or one writing now: remove them only where no other writer can be alive)."""
    return sorted(path.parent.glob(f".{path.name}.*{TEMP_SUFFIX}"))


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable; a filesystem that cannot sync a folder is left as it is."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_durably(tmp: Path, path: Path) -> None:
    """``os.replace(tmp, path)``, then fsync the folder."""
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_with(path: Path | str, write: Callable[[BinaryIO], object], *, keep: bool = False) -> Path:
    """Replace ``path`` with what ``write(f)`` writes to a binary file, atomically and durably; on any error the
    temporary file is removed, ``path`` is as it was, and the error passes through. ``keep``: the version before
    stays as :func:`backup_of` (a hard link to it: no copy; a copy where links are not possible)."""
    path = Path(path)
    fd, tmp = temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if keep and path.exists():
            _keep_previous(path)
        replace_durably(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_atomic(path: Path | str, data: str | bytes, *, keep: bool = False) -> Path:
    """:func:`write_with` of ``data`` (text is UTF-8)."""
    return write_with(path, lambda f: f.write(data.encode() if isinstance(data, str) else data), keep=keep)


def backup_of(path: Path) -> Path:
    """Where ``write_atomic(..., keep=True)`` keeps the version before (``sweep.json.bak``)."""
    return path.with_name(path.name + ".bak")


def _keep_previous(path: Path) -> None:
    bak = backup_of(path)
    fd, bak_tmp = temp_beside(bak)
    os.close(fd)
    bak_tmp.unlink()
    try:
        try:
            os.link(path, bak_tmp)
        except OSError:  # a filesystem without hard links: a copy
            shutil.copy2(path, bak_tmp)
        os.replace(bak_tmp, bak)
    except BaseException:
        bak_tmp.unlink(missing_ok=True)
        raise
