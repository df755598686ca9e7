"""Golden trial keys: the keys of the checked-in grids must not move by accident.

A key names an experiment; a user's finished models are found by it. ``tests/golden/keys.json`` holds every key (and
its label) of the grids below. This test fails when any key appears, disappears or changes. A deliberate change of
the science (a new default, a grid edit) rewrites the file in the same commit, and the commit says why::

    python tests/test_golden_keys.py --update
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "keys.json"
GRIDS = ("grids/paper.yaml", "grids/demo.yaml", "grids/demo-quick.yaml", "grids/demo-cued.yaml", "grids/smoke.yaml",
         "grids/demo-fragmentation.yaml", "grids/controls.yaml", "grids/demo-copy.yaml")


def current_keys() -> dict[str, dict[str, str]]:
    from orchestrate.plan.grid import load_grid

    return {g: {t.key: t.label for t in load_grid(REPO / g).trials} for g in GRIDS}


@pytest.mark.parametrize("grid", GRIDS)
def test_grid_keys_match_the_golden_file(grid: str) -> None:
    golden = json.loads(GOLDEN.read_text())[grid]
    now = current_keys()[grid]
    gone = sorted(set(golden) - set(now))
    new = sorted(set(now) - set(golden))
    assert not gone and not new, (
        f"{grid}: trial keys changed ({len(gone)} gone, e.g. {[golden[k] + ' ' + k for k in gone[:3]]}; {len(new)} "
        f"new, e.g. {[now[k] + ' ' + k for k in new[:3]]}). Keys name users' finished models: if the science "
        "really changed, run `python tests/test_golden_keys.py --update` and say why in the commit")
    assert now == golden  # labels too


def test_paper_grid_has_the_papers_321_models() -> None:
    assert len(json.loads(GOLDEN.read_text())["grids/paper.yaml"]) == 321


def test_a_new_option_at_its_default_leaves_every_paper_key() -> None:
    """A copy of Config whose model, data, train and eval sections each gain a field with a default gives the same
    keys for the paper grid: adding an option never renames trials."""
    from asr_core import config as config_mod
    from asr_core.config import Config
    from asr_core.contract.identity import trial_key
    from orchestrate.plan.grid import load_grid

    def grown(cls: type, extra: str) -> type:
        return dataclasses.make_dataclass(cls.__name__ + "Grown", [(extra, float, dataclasses.field(default=0.5))],
                                          bases=(cls,), frozen=True)

    sections = {"model": grown(config_mod.ModelConfig, "new_knob"), "data": grown(config_mod.DataConfig, "new_knob"),
                "train": grown(config_mod.TrainConfig, "new_knob"), "eval": grown(config_mod.EvalConfig, "new_knob")}
    GrownConfig = dataclasses.make_dataclass("GrownConfig", [("extra_section_knob", int, dataclasses.field(default=3))],
                                             bases=(Config,), frozen=True)
    golden = json.loads(GOLDEN.read_text())["grids/paper.yaml"]
    trials = load_grid(REPO / "grids/paper.yaml").trials
    for t in trials:
        c = t.config
        parts = {name: cls(**{f.name: getattr(getattr(c, name), f.name)
                              for f in dataclasses.fields(getattr(c, name))}) for name, cls in sections.items()}
        copy = GrownConfig(**parts)
        assert trial_key(copy) == t.key
        # and the field, once set away from its default, does make another trial
        moved = dataclasses.replace(copy, train=dataclasses.replace(copy.train, new_knob=0.25))
        assert trial_key(moved) != t.key
    assert {t.key for t in trials} == set(golden)


def test_every_science_field_is_in_the_frozen_baseline() -> None:
    """A new science field must be added to identity.BASELINE (at the value that does what the project did before
    it existed: usually its default), or listed as execution."""
    from asr_core.config import FIELD_TYPES
    from asr_core.contract.identity import BASELINE, EXECUTION

    missing = [f for f in FIELD_TYPES if f not in BASELINE and f not in EXECUTION]
    assert not missing, (f"classify {missing} in asr_core/contract/identity.py: BASELINE (science, at the value that "
                         "reproduces the behaviour before it) or EXECUTION")
    stale = [f for f in list(BASELINE) + list(EXECUTION) if f not in FIELD_TYPES]
    assert not stale, f"{stale} are in asr_core/contract/identity.py but not Config fields"
    assert not set(BASELINE) & set(EXECUTION)


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_golden_keys.py --update   (rewrites tests/golden/keys.json)")
    sys.path.insert(0, str(REPO))
    keys = current_keys()
    old = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    for g, k in keys.items():
        before = old.get(g, {})
        print(f"{g}: {len(k)} keys, {len(set(k) - set(before))} new, {len(set(before) - set(k))} gone")
    GOLDEN.write_text(json.dumps(keys, indent=1, sort_keys=True) + "\n")
