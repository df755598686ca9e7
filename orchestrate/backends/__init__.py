"""Backends behind one interface (:class:`orchestrate.backends.base.Backend`): ``local`` (Ray Tune on this machine),
``slurm`` (submitit job arrays) and ``ray-slurm`` (a Ray cluster inside one SLURM allocation).

The backends are siblings: what more than one of them needs lives in a module of its own, never as a private
function one backend borrows from another:

* :mod:`~orchestrate.backends.runner`: one trial's trainer as a child process, its signals forwarded, how it ended;
* :mod:`~orchestrate.backends.slurm_commands`: ``sbatch``, ``squeue`` (settled), ``scancel``, ``scontrol``;
* :mod:`~orchestrate.backends.tune_driver`: the Ray Tune driver (``local`` runs it as a process of its own,
  ``ray-slurm`` inside its allocation).

The cluster profile they run under (``slurm/profiles/NAME.yaml``) is part of the plan
(:mod:`orchestrate.plan.profile`): the budget reads it too, and the backends stand above the budget.

Imports are lazy so that ``plan`` and ``status`` never pay for Ray or submitit.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from orchestrate.backends.base import Backend, BackendError
from orchestrate.sweep.folder import SweepDir

if TYPE_CHECKING:
    from orchestrate.plan.profile import Profile

BACKENDS: dict[str, tuple[str, str]] = {
    "local": ("orchestrate.backends.local", "LocalBackend"),
    "slurm": ("orchestrate.backends.slurm", "SlurmBackend"),
    "ray-slurm": ("orchestrate.backends.ray_slurm", "RaySlurmBackend"),
}


def make_backend(name: str, sweep: SweepDir, tracking_uri: str, profile: Profile) -> Backend:
    """The backend called ``name`` for ``sweep``; BackendError listing the valid names if there is none."""
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name]
    return getattr(importlib.import_module(module), cls)(sweep, tracking_uri, profile)
