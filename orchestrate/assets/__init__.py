"""What the project ships beside its code, found the same way in a checkout and in an installed wheel.

The files live in this package (package data, so ``pip install`` carries them) and are found through
:mod:`importlib.resources`, never relative to a source tree:

* ``grids/*.yaml``: the grids (``paper.yaml``, one file per paper section, the demo's and the smoke grid);
* ``profiles/*.yaml``: the cluster profiles (``--profile NAME``);
* ``calibrations/*.json``: the built-in calibrations of ``plan --estimate`` (``--calibration NAME``);
* ``mlflow-server.sh``: the MLflow server a cluster sweep logs to (``asr-study mlflow-server``).

In a checkout the old places are links to these folders (``grids/``, ``slurm/profiles/``,
``slurm/mlflow-server.sh``, ``orchestrate/calibrations/``), so every command written with them keeps working.
A name without a folder finds the packaged file: ``orchestrate plan paper`` is ``grids/paper.yaml`` from anywhere.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

GRIDS = "grids"
PROFILES = "profiles"
CALIBRATIONS = "calibrations"
SERVER_SCRIPT = "mlflow-server.sh"
GRID_SUFFIXES = (".yaml", ".yml")


def asset_root() -> Path:
    """The folder of this package's files. An installed package is unpacked on disk (pip installs wheels so), and
    the paths handed out here outlive any context manager: a sweep records its grid's path, a server runs its
    script."""
    root = resources.files(__name__)
    if not isinstance(root, Path):  # a zip import: nothing this project supports installs it so
        raise RuntimeError(f"the package data of {__name__} is not on disk ({root}); install the project with pip")
    return root


def grids_dir() -> Path:
    """The packaged grids (``grids/`` of a checkout)."""
    return asset_root() / GRIDS


def profiles_dir() -> Path:
    """The packaged cluster profiles (``slurm/profiles/`` of a checkout)."""
    return asset_root() / PROFILES


def calibrations_dir() -> Path:
    """The built-in calibrations (``orchestrate/calibrations/`` of a checkout)."""
    return asset_root() / CALIBRATIONS


def server_script() -> Path:
    """The MLflow server script (``slurm/mlflow-server.sh`` of a checkout)."""
    return asset_root() / SERVER_SCRIPT


def names(folder: Path, suffix: str = ".yaml") -> list[str]:
    """The names (file stems) of the packaged files in ``folder`` with ``suffix``, sorted; for messages."""
    return sorted(p.stem for p in folder.glob(f"*{suffix}")) if folder.is_dir() else []


def grid_path(name_or_path: str | Path) -> Path:
    """The grid file a command was given: the path itself when it exists; else, for a bare name (``paper``,
    ``paper.yaml``) or the checkout's spelling ``grids/NAME.yaml``, the packaged grid of that name when there is
    one; else the path unchanged (its reader says it is missing, naming the packaged grids)."""
    p = Path(name_or_path)
    if p.exists():
        return p
    bare = p.parent == Path(".") or (p.parent == Path(GRIDS) and p.suffix in GRID_SUFFIXES)
    if bare:
        stem = p.stem if p.suffix in GRID_SUFFIXES else p.name
        for suffix in GRID_SUFFIXES:
            packaged = grids_dir() / f"{stem}{suffix}"
            if packaged.is_file():
                return packaged
    return p
