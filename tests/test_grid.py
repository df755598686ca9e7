"""Grid files → trials: the paper's 321, de-duplication across sub-grids, labels, and validation errors (exit 2)."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from orchestrate.cli import main
from orchestrate.grid import GridError, load_grid

ROOT = Path(__file__).resolve().parents[1]
GRIDS = ROOT / "grids"
CONTEXTS = [10.24, 20.48, 40.96, 81.92, 163.84, 327.68, 655.36, 1310.72, 2621.44, 3600.0]


def test_paper_grid_is_the_321_models() -> None:
    g = load_grid(GRIDS / "paper.yaml")
    assert len(g.trials) == 321
    assert len({t.key for t in g.trials}) == 321
    assert len({t.label for t in g.trials}) == 321
    new = {s.name: s.n_new for s in g.subgrids}
    assert new == {"context": 30, "posenc": 60, "posenc_rotary10k": 21, "sizes": 150, "heads": 60}
    # Ten families of 10 lengths x 3 seeds, plus rotary theta=10k at 7 lengths x 3 seeds.
    fam = Counter((t.config.model.layers, t.config.model.d_model, t.config.model.heads, t.config.model.posenc,
                   t.config.model.rotary_theta) for t in g.trials)
    assert sorted(fam.values()) == [21] + [30] * 10
    assert fam[(6, 768, 6, "rotary", 10000.0)] == 21
    for t in g.trials:
        assert t.config.train.seed == t.seed and t.seed in (1, 2, 3)
        assert t.config.data.context_s in CONTEXTS
    # The main model at 82 s, seed 2, is one trial shared by three sections.
    main_model = [t for t in g.trials if t.label == "ctx82s-rope1.5M-6L768d6h-s2"]
    assert len(main_model) == 1 and main_model[0].subgrids == ("context", "posenc", "sizes")
    # Families keep their own learning rate from the presets.
    assert {t.config.train.lr for t in g.trials if t.config.model.layers == 9} == {2e-3}


@pytest.mark.parametrize("name,count", [("context", 30), ("posenc", 111), ("sizes", 180), ("heads", 90)])
def test_section_files_stand_alone_and_agree_with_paper(name: str, count: int) -> None:
    section = load_grid(GRIDS / f"{name}.yaml")
    assert len(section.trials) == count
    paper_keys = {t.key for t in load_grid(GRIDS / "paper.yaml").trials}
    assert {t.key for t in section.trials} <= paper_keys


def test_plan_cli_prints_breakdown_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(GRIDS / "paper.yaml")]) == 0
    out = capsys.readouterr().out
    assert "321 unique trials" in out and "4.2 positional encoding: 81" in out
    assert main(["plan", str(GRIDS / "paper.yaml"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["trials"]) == 321
    first = data["trials"][0]
    assert set(first) == {"key", "label", "subgrids", "seed", "config"}
    assert first["config"]["train"]["seed"] == first["seed"]


def _write(tmp_path: Path, text: str, name: str = "g.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_same_trial_in_two_subgrids_is_one_trial_and_key_ignores_spelling(tmp_path: Path) -> None:
    p = _write(tmp_path, """
        base: {preset: tiny}
        seeds: [0, 1]
        subgrids:
          a: {axes: {data.context_s: [5, 10.24]}}
          b: {axes: {data.context_s: [5.0]}, set: {model.layers: 2}}
    """)
    g = load_grid(p)
    assert len(g.trials) == 4  # b's two trials equal a's (tiny has 2 layers; 5 == 5.0)
    assert [s.n_new for s in g.subgrids] == [4, 0]
    assert sum(1 for t in g.trials if t.subgrids == ("a", "b")) == 2
    again = load_grid(p)
    assert [t.key for t in again.trials] == [t.key for t in g.trials]


def test_overrides_change_every_trial(tmp_path: Path) -> None:
    p = _write(tmp_path, "base: {preset: tiny}\nseeds: [0]\nsubgrids: {a: {axes: {model.layers: [1, 2]}}}\n")
    g = load_grid(p, ["data.train=podcast:/x/train", "model.vocab_size=64"])
    assert {t.config.data.train for t in g.trials} == {"podcast:/x/train"}
    assert {t.config.model.vocab_size for t in g.trials} == {64}
    assert {t.key for t in g.trials}.isdisjoint({t.key for t in load_grid(p).trials})


BAD = {
    "unknown field": ("subgrids: {a: {axes: {model.layer: [1, 2]}}}", ["model.layer", "did you mean model.layers"]),
    "wrong type": ("subgrids: {a: {axes: {model.layers: [2, six]}}}", ["model.layers", "'six'", "an integer"]),
    "empty axis": ("subgrids: {a: {axes: {data.context_s: []}}}", ["data.context_s", "empty"]),
    "duplicate sub-grid": ("subgrids:\n  a: {axes: {model.layers: [1]}}\n  a: {axes: {model.layers: [2]}}",
                           ["duplicate key 'a'", "line"]),
    "bad range": ("subgrids: {a: {axes: {model.heads: [5]}}}", ["model.heads", "divisor"]),
    "unknown preset": ("subgrids: {a: {axes: {preset: [huge]}}}", ["huge", "tiny"]),
    "seed as axis": ("subgrids: {a: {axes: {train.seed: [1]}}}", ["seeds:"]),
    "unknown subgrid key": ("subgrids: {a: {axis: {model.layers: [1]}}}", ["'axis'", "axes"]),
    "axis not a list": ("subgrids: {a: {axes: {model.layers: 3}}}", ["model.layers", "list"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_invalid_grids_exit_2_naming_the_problem(case: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    body, needles = BAD[case]
    p = _write(tmp_path, "base: {preset: tiny}\nseeds: [0]\n" + body + "\n")
    assert main(["plan", str(p)]) == 2
    err = capsys.readouterr().err
    assert str(p) in err
    for n in needles:
        assert n in err, (case, err)


def test_duplicate_subgrid_across_includes(tmp_path: Path) -> None:
    _write(tmp_path, "extends: top.yaml\nsubgrids: {a: {axes: {model.layers: [1]}}}\n", "part.yaml")
    top = _write(tmp_path, "include: [part.yaml]\nbase: {preset: tiny}\nseeds: [0]\n"
                           "subgrids: {a: {axes: {model.layers: [2]}}}\n", "top.yaml")
    with pytest.raises(GridError, match="duplicate sub-grid 'a'.*part.yaml"):
        load_grid(top)


def test_invalid_combination_names_the_values(tmp_path: Path) -> None:
    p = _write(tmp_path, "base: {preset: tiny}\nseeds: [0]\n"
                         "subgrids: {a: {axes: {model.d_model: [96, 100], model.heads: [4]}}}\n")
    with pytest.raises(GridError, match=r"model.d_model=100.*model.heads"):
        load_grid(p)


def test_smoke_grid_is_small_and_tiny() -> None:
    g = load_grid(GRIDS / "smoke.yaml")
    assert 3 <= len(g.trials) <= 6
    assert all(t.config.model.d_model <= 128 and t.config.train.max_steps <= 50 for t in g.trials)
    assert any(len(t.subgrids) > 1 for t in g.trials)


def test_exponent_values_plan_in_axes_set_and_base(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One value parser for grids, --set and config files: YAML reads 3e-3 (no dot) as a string everywhere."""
    p = _write(tmp_path, "base: {preset: tiny, train: {eps: 1e-6}}\nseeds: [0]\n"
                         "subgrids:\n  a: {axes: {train.lr: [3e-3, 1e-3]}}\n  b: {set: {train.lr: 2e-3}}\n")
    assert main(["plan", str(p), "--set", "train.momentum=9e-1"]) == 0
    g = load_grid(p, ["train.momentum=9e-1"])
    assert sorted(t.config.train.lr for t in g.trials) == [1e-3, 2e-3, 3e-3]
    assert {t.config.train.eps for t in g.trials} == {1e-6} and {t.config.train.momentum for t in g.trials} == {0.9}
    bad = _write(tmp_path, "base: {preset: tiny}\nseeds: [0]\nsubgrids: {a: {axes: {train.lr: [3e-3, fast]}}}\n",
                 "bad.yaml")
    assert main(["plan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "train.lr" in err and "'fast'" in err and "a finite number" in err and "sub-grid 'a'" in err


def test_execution_settings_and_data_locations_keep_every_key(tmp_path: Path) -> None:
    p = _write(tmp_path, "base: {preset: tiny, data: {train: 'podcast:/a/corpus/train'}}\nseeds: [0, 1]\n"
                         "subgrids: {a: {axes: {data.context_s: [5.12, 10.24]}}}\n")
    keys = [t.key for t in load_grid(p).trials]
    for same in (["data.num_workers=3"], ["data.micro_batch_audio_s=20"], ["train.checkpoint_every=7"],
                 ["train.log_every=3", "train.device=cpu", "eval.batch_windows=2"],
                 ["model.attention_backend=sdpa", "model.activation_checkpointing=true"],
                 ["data.train=podcast:/scratch/moved/train"], ["data.train=manifest:/prepared/train.jsonl"],
                 ["data.train=podcast:/b"]):
        assert [t.key for t in load_grid(p, same).trials] == keys, same
    for other in (["data.train=big=podcast:/a/corpus/train"],
                  ["train.lr=1e-3"], ["data.features.variant=code"]):
        assert set(t.key for t in load_grid(p, other).trials).isdisjoint(keys), other


def test_one_experiment_with_two_sets_of_settings_is_refused(tmp_path: Path) -> None:
    """Grid points that share a key but would run differently (loader workers, two unnamed corpora) are an error,
    not one silently kept."""
    p = _write(tmp_path, "base: {preset: tiny}\nseeds: [0]\nsubgrids: {a: {axes: {data.num_workers: [0, 4]}}}\n")
    with pytest.raises(GridError, match=r"comes out twice with other settings \(data.num_workers: 0 vs 4"):
        load_grid(p)
    corpora = _write(tmp_path, "base: {preset: tiny}\nseeds: [0]\nsubgrids: {a: {axes: {data.train: "
                               "['podcast:/d/spotify/train', 'tedlium:/d/tedlium/train']}}}\n", "corpora.yaml")
    with pytest.raises(GridError, match="name each one"):
        load_grid(corpora)
    named = _write(tmp_path, "base: {preset: tiny}\nseeds: [0]\nsubgrids: {a: {axes: {data.train: "
                             "['spotify=podcast:/d/spotify/train', 'ted=tedlium:/d/tedlium/train']}}}\n", "named.yaml")
    assert len({t.key for t in load_grid(named).trials}) == 2
