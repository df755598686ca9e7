"""The GPU-hour estimate a cluster submission records in its sweep folder (``<sweep>/estimate.json``), so that
``orchestrate status`` can set the hours spent against it.

``submit`` with the ``slurm`` or ``ray-slurm`` backend estimates every trial of the grid as ``plan --estimate``
does (:func:`orchestrate.budget.estimate.estimate_grid`, the profile's calibration or the built-in one) and writes
``{"calibration": NAME, "total_gpu_hours": H, "trials": {key: hours}}``; a later submit of the same sweep adds its
trials to it. An estimate that cannot be made (no calibration, a corpus the estimate cannot replay) records nothing
and says why in one line: the submission goes on. The local backend records none (its trials run on CPUs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterable

from asr_core.contract.atomic import write_atomic

FILE = "estimate.json"
CLUSTER_BACKENDS = ("slurm", "ray-slurm")  # whose trials take one GPU each, as the calibrations measure


def estimate_path(sweep_path: Path) -> Path:
    return sweep_path / FILE


def read_estimate(sweep_path: Path) -> dict[str, float]:
    """{trial key: estimated GPU-hours} recorded for the sweep; {} when none was (or the file cannot be read)."""
    try:
        data = json.loads(estimate_path(sweep_path).read_text())
        return {str(k): float(v) for k, v in dict(data.get("trials", {})).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def record_estimate(sweep_path: Path, grid: Any, profile: Any, backend: str) -> float | None:
    """Estimate ``grid``'s trials under ``profile`` and record them (merged with what the sweep holds); the total
    GPU-hours of the grid, or None when nothing was recorded (a local backend, or an estimate that cannot be
    made: one line on stderr says why)."""
    if backend not in CLUSTER_BACKENDS:
        return None
    from orchestrate.budget.calibration import EstimateError, load_calibration
    from orchestrate.budget.estimate import estimate_grid

    try:
        cal = load_calibration(getattr(profile, "calibration", "") or None)
        est = estimate_grid(grid, cal, profile)
    except (EstimateError, OSError, ValueError) as e:
        print(f"[orchestrate] no GPU-hour estimate recorded for status ({e}); `orchestrate plan GRID --estimate` "
              "says what it needs", file=sys.stderr, flush=True)
        return None
    hours = read_estimate(sweep_path)
    hours.update({t.key: t.hours for t in est.trials})
    write_atomic(estimate_path(sweep_path), json.dumps(
        {"calibration": Path(cal.path).stem, "total_gpu_hours": sum(hours.values()), "trials": hours},
        indent=1) + "\n")
    return sum(t.hours for t in est.trials)


def estimated_hours(sweep_path: Path, keys: Iterable[str]) -> float | None:
    """The recorded estimate of the trials ``keys`` (those not recorded count 0); None when the sweep has none."""
    hours = read_estimate(sweep_path)
    return sum(hours.get(k, 0.0) for k in keys) if hours else None
