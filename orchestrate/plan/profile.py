"""Cluster profiles (``--profile NAME``: the packaged ``NAME.yaml`` of :mod:`orchestrate.assets`, in a checkout also
``slurm/profiles/NAME.yaml``; or a path): what the SLURM backends (``slurm``, ``ray-slurm``) ask the
scheduler for. The ``local`` backend reads only ``cpus_per_task``.

A profile is a flat mapping; every key has a safe default, and :func:`load_profile` refuses unknown keys and
invalid values with a message that names the file, the key and what is valid, before anything is submitted.

Time limits are read and written here as SLURM spells them (:func:`parse_minutes`, :func:`format_minutes`), and the
``time_limit: estimate`` rule turns a trial's estimated hours into its limit (:func:`time_limit_minutes`). This module
is the bottom of the backends: :mod:`orchestrate.backends.base` and :mod:`orchestrate.budget` import it, it imports
neither (so :class:`BackendError`, which loading a profile raises first, is defined here).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asr_core.config.yaml_input import YamlInputError, load_yaml_file
from orchestrate import assets

if TYPE_CHECKING:
    from orchestrate.sweep.trial import Trial

ESTIMATE = "estimate"  # the rule value of time_limit and mem_gb (orchestrate.budget.resources applies the rules)


class BackendError(RuntimeError):
    """The backend cannot run the sweep as asked (bad profile, missing scheduler, failed submission)."""


class StoppedBySignal(BackendError):
    """A backend that runs the trials in the foreground was stopped by ``signum`` (Ctrl-C: SIGINT) and its trainers
    checkpointed; the command exits 128 + ``signum``, as a shell reports a process a signal ended."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


# ---- time limits as SLURM writes them, and the time_limit: estimate rule -------------------------------------
def parse_minutes(text: str | int | float) -> int:
    """Whole minutes (rounded up) of ``minutes``, ``HH:MM:SS``, ``MM:SS``-less ``HH:MM`` or ``D-HH:MM:SS``; ValueError
    on anything else."""
    t = str(text).strip()
    if ":" not in t and "-" not in t:
        v = float(t)
        if v < 0 or not math.isfinite(v):
            raise ValueError(t)
        return math.ceil(v)
    days = 0
    if "-" in t:
        d, t = t.split("-", 1)
        days = int(d)
    parts = [int(p) for p in t.split(":")]
    if not 1 <= len(parts) <= 3 or any(p < 0 for p in parts) or days < 0:
        raise ValueError(text)
    while len(parts) < 3:
        parts.append(0)
    h, m, s = parts
    return days * 1440 + h * 60 + m + (1 if s else 0)


def format_minutes(minutes: int) -> str:
    """``D-HH:MM:00`` (days only when there are any), as sbatch and squeue write a limit."""
    d, rest = divmod(int(minutes), 1440)
    h, m = divmod(rest, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:00"


def time_limit_minutes(hours: float, margin: float, cap_min: int | None, signal_delay_s: int) -> int:
    """A trial's ``--time`` from its estimated ``hours``: ``hours × margin`` rounded up to the hour (at least one
    hour, and longer than the USR2 delay), at most ``cap_min`` (None: no cap)."""
    want = max(60, math.ceil(hours * margin) * 60, math.ceil((signal_delay_s + 600) / 3600) * 60)
    return min(want, cap_min) if cap_min else want


# ---- the profile ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Profile:
    """A cluster profile (``slurm/profiles/NAME.yaml``): flat keys, each with a safe default."""

    name: str = "default"
    partition: str = ""
    account: str = ""
    qos: str = ""
    gpus_per_node: str | int = 0  # "a100:1" or a count; 0 = no GPU request
    cpus_per_task: int = 1  # a trial needs one CPU by default; dataloader workers need more
    mem_gb: float | str = 0  # 0 = the partition's default; "estimate": from model size and loader (resources.py)
    time_limit: str = "48:00:00"  # HH:MM:SS or minutes; a 65-hour run survives it by checkpoint + requeue;
    # "estimate": each trial's own, from its estimated hours (orchestrate/budget/resources.py)
    time_margin: float = 1.25  # time_limit estimate: the estimate times this
    time_max: str = ""  # time_limit estimate: the cap ("" = the partition's MaxTime)
    time_min: str = ""  # --time-min: a trial may start with this much less time (backfill); "" = none
    calibration: str = ""  # time_limit estimate: a `bench calibrate` file ("" = the built-in A100 one)
    signal_delay_s: int = 120  # USR2 this long before the limit: time to finish a step and write a checkpoint
    max_parallel: int = 0  # trials of one sweep running at once, across its arrays and resumes; 0 = no limit
    nodes: int = 1  # ray-slurm: nodes of one allocation (Ray head on the first, a worker on each other)
    setup: tuple[str, ...] = ()  # shell lines run before the trial (module load, source venv)
    additional: tuple[tuple[str, Any], ...] = ()  # extra sbatch options, e.g. {constraint: a100_80}

    def loader_workers(self) -> int:
        """Data-loader threads a trial gets on this profile: the CPUs it is granted, less the training loop's."""
        return max(0, self.cpus_per_task - 1)

    def fit(self, trial: "Trial") -> "Trial":
        """``trial`` as its job runs it on this profile: ``data.num_workers`` left at 0 (the default) becomes
        :meth:`loader_workers` (``python -m asr_core bench data``: a worker reads and featurises about 400-600 audio
        seconds a second of 44.1 kHz podcasts, the paper's GPU consumes 809); a value the grid sets is kept. An
        execution setting: the key does not change."""
        workers = self.loader_workers()
        data = trial.config.data
        if data.num_workers or not workers:
            return trial
        config = dataclasses.replace(trial.config, data=dataclasses.replace(data, num_workers=workers))
        return dataclasses.replace(trial, config=config)

    def gpu_count(self) -> int:
        """GPUs per node as a number (``"a100:2"`` → 2); raises ValueError on a malformed value."""
        g = self.gpus_per_node
        if isinstance(g, int):
            return g
        return int(str(g).rsplit(":", 1)[-1]) if str(g) else 0

    @property
    def time_rule(self) -> bool:
        """Each trial's time limit comes from its estimate (``time_limit: estimate``)."""
        return str(self.time_limit).strip() == ESTIMATE

    def time_limit_min(self) -> int:
        """The time limit in whole minutes (rounded up), from ``minutes``, ``HH:MM:SS`` or ``D-HH:MM:SS``; with
        ``time_limit: estimate``, the cap ``time_max`` (what one allocation of ``ray-slurm`` asks). ValueError
        when the limit is malformed or a rule without ``time_max``."""
        if self.time_rule:
            if not self.time_max:
                raise ValueError("time_limit 'estimate' without time_max")
            return parse_minutes(self.time_max)
        return parse_minutes(self.time_limit)


PROFILE_KEYS = ("partition", "account", "qos", "gpus_per_node", "cpus_per_task", "mem_gb", "time_limit",
                "time_margin", "time_max", "time_min", "calibration", "signal_delay_s", "max_parallel", "nodes",
                "setup", "additional")


def load_profile(name_or_path: str | None) -> Profile:
    """``NAME`` (a packaged profile, ``slurm/profiles/NAME.yaml`` in a checkout) or a path; ``None`` gives the
    defaults. Errors name the key and value."""
    if not name_or_path:
        return Profile()
    p = Path(name_or_path)
    if not p.suffix:
        p = assets.profiles_dir() / f"{name_or_path}.yaml"
    if not p.exists():
        known = assets.names(assets.profiles_dir())
        raise BackendError(f"unknown profile {name_or_path!r} (no {p}); valid: a path to a YAML file, or one of "
                           f"the packaged profiles: {', '.join(known) or 'none'}")
    try:
        raw = load_yaml_file(p, durations=True) or {}  # 4:00:00 stays a duration, not base-60 14400
    except YamlInputError as e:
        raise BackendError(str(e)) from None
    except OSError as e:
        raise BackendError(f"profile {p} cannot be read: {e.strerror or e}") from None
    if not isinstance(raw, dict):
        raise BackendError(f"{p}: a profile is a mapping of {', '.join(PROFILE_KEYS)}")
    unknown = sorted(set(raw) - set(PROFILE_KEYS) - {"name", "description"})
    if unknown:
        raise BackendError(f"{p}: unknown key {unknown[0]!r}; valid: {', '.join(PROFILE_KEYS)}")
    kw: dict[str, Any] = {"name": p.stem}
    for k in PROFILE_KEYS:
        if k not in raw or raw[k] is None:
            continue
        kw[k] = _checked(p, k, raw[k])
    prof = Profile(**kw)
    for k in ("time_limit", "time_max", "time_min"):
        v = getattr(prof, k)
        if (k == "time_limit" and prof.time_rule) or (k != "time_limit" and not v):
            continue
        try:
            parse_minutes(v)
        except ValueError:
            raise BackendError(f"{p}: invalid {k} {v!r}; valid: 'HH:MM:SS', 'D-HH:MM:SS' or minutes"
                               + (", or 'estimate'" if k == "time_limit" else "")) from None
    try:
        prof.gpu_count()
    except ValueError:
        raise BackendError(f"{p}: invalid gpus_per_node {prof.gpus_per_node!r}; valid: a count or 'TYPE:COUNT'"
                           ) from None
    return prof


def _checked(p: Path, k: str, v: Any) -> Any:
    """The value of key ``k`` as :class:`Profile` holds it; BackendError naming file, key and value if invalid."""
    if k in ("cpus_per_task", "signal_delay_s", "max_parallel"):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise BackendError(f"{p}: invalid value for {k!r}: {v!r}; valid: a non-negative integer")
        return v
    if k == "nodes":
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise BackendError(f"{p}: invalid value for 'nodes': {v!r}; valid: a positive integer")
        return v
    if k == "mem_gb":
        if v == ESTIMATE:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise BackendError(f"{p}: invalid value for 'mem_gb': {v!r}; valid: a non-negative number or 'estimate'")
        return v
    if k == "time_margin":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 1 <= v <= 10:
            raise BackendError(f"{p}: invalid value for 'time_margin': {v!r}; valid: a number from 1 to 10")
        return float(v)
    if k == "calibration":
        if not isinstance(v, str):
            raise BackendError(f"{p}: invalid value for 'calibration': {v!r}; valid: a calibration file's path")
        path = Path(v).expanduser()
        if v and not path.is_absolute():
            path = p.parent / path
        if v and not path.exists():
            raise BackendError(f"{p}: calibration {v!r} not found ({path}); valid: a file from `python -m asr_core "
                               "bench calibrate --out FILE`, or leave it out for the built-in A100 one")
        return str(path) if v else ""
    if k == "setup":
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise BackendError(f"{p}: invalid value for 'setup': {v!r}; valid: a list of shell lines")
        return tuple(v)
    if k == "additional":
        if not isinstance(v, dict):
            raise BackendError(f"{p}: invalid value for 'additional': {v!r}; valid: a mapping of sbatch options")
        return tuple(sorted(v.items()))
    if k == "gpus_per_node":
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise BackendError(f"{p}: invalid value for 'gpus_per_node': {v!r}; valid: a count or 'TYPE:COUNT'")
        return v
    return str(v)
