"""A cluster profile's CPUs become the trial's data-loader threads, as an execution setting: same key, same model."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrate.plan.profile import Profile, load_profile
from orchestrate.plan.grid import load_grid
from orchestrate.sweep.folder import SweepDir

REPO = Path(__file__).resolve().parents[1]


def test_the_cpus_a_profile_grants_become_loader_workers_unless_the_grid_sets_them(tmp_path: Path) -> None:
    paper = load_profile(str(REPO / "slurm" / "profiles" / "a100.yaml"))
    assert paper.cpus_per_task == 8 and paper.loader_workers() == 7
    trial = load_grid(REPO / "grids" / "paper.yaml").trials[0]
    assert trial.config.data.num_workers == 0  # the grid leaves it to the profile
    fitted = paper.fit(trial)
    assert fitted.config.data.num_workers == 7 and fitted.key == trial.key == fitted.config.key()
    assert Profile(cpus_per_task=1).fit(trial) is trial  # one CPU: the training loop prepares its own steps
    chosen = load_grid(REPO / "grids" / "paper.yaml", ["data.num_workers=3"]).trials[0]
    assert paper.fit(chosen).config.data.num_workers == 3 and chosen.key == trial.key
    folder = SweepDir(tmp_path, "s").prepare_trial(fitted)  # what the job reads
    assert json.loads((folder / "config.json").read_text())["data"]["num_workers"] == 7
