"""Backends behind one interface (:class:`orchestrate.backends.base.Backend`): ``local`` (Ray Tune on this machine),
``slurm`` (submitit job arrays) and ``ray-slurm`` (a Ray cluster inside one SLURM allocation).

Imports are lazy so that ``plan`` and ``status`` never pay for Ray or submitit.
"""

from __future__ import annotations

import importlib

from orchestrate.backends.base import Backend, BackendError, Profile
from orchestrate.sweep import SweepDir

BACKENDS: dict[str, tuple[str, str]] = {
    "local": ("orchestrate.backends.local", "LocalBackend"),
    "slurm": ("orchestrate.backends.slurm", "SlurmBackend"),
    "ray-slurm": ("orchestrate.backends.ray_slurm", "RaySlurmBackend"),
}


def make_backend(name: str, sweep: SweepDir, tracking_uri: str, profile: Profile) -> Backend:
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name]
    return getattr(importlib.import_module(module), cls)(sweep, tracking_uri, profile)
