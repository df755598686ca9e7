"""Grid files → trials: the paper's 321, de-duplication across sub-grids (one trial per model, its evaluations
merged), labels, validation errors (exit 2), and the evaluation work plan shows."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from asr_core.config import EvalConfig
from orchestrate.cli.commands import main
from orchestrate.plan.grid import (DECODE_FRAMES_PER_S, KNOWN_TEST_HOURS, GridError, eval_set_hours, eval_work,
                                   load_grid, merge_evaluations, plan_table, subgrid_eval_work)

ROOT = Path(__file__).resolve().parents[1]
GRIDS = ROOT / "grids"
CONTEXTS = [10.24, 20.48, 40.96, 81.92, 163.84, 327.68, 655.36, 1310.72, 2621.44, 3600.0]
SNRS = (-7.5, -5.0, -2.5, 0.0, 2.5, 5.0, 7.5, 10.0)


def test_paper_grid_is_the_321_models() -> None:
    g = load_grid(GRIDS / "paper.yaml")
    assert len(g.trials) == 321
    assert len({t.key for t in g.trials}) == 321
    assert len({t.label for t in g.trials}) == 321
    new = {s.name: s.n_new for s in g.subgrids}
    assert new == {"context": 30, "posenc": 0, "posenc_other": 60, "posenc_rotary10k": 21, "sizes": 150, "heads": 60}
    # Ten families of 10 lengths x 3 seeds, plus rotary theta=10k at 7 lengths x 3 seeds.
    fam = Counter((t.config.model.layers, t.config.model.d_model, t.config.model.heads, t.config.model.posenc,
                   t.config.model.rotary_theta) for t in g.trials)
    assert sorted(fam.values()) == [21] + [30] * 10
    assert fam[(6, 768, 6, "rotary", 10000.0)] == 21
    for t in g.trials:
        assert t.config.train.seed == t.seed and t.seed in (1, 2, 3)
        assert t.config.data.context_s in CONTEXTS
    # The main model at 82 s, seed 2, is one trial shared by four sub-grids (heads: the main model is its 6-head one).
    main_model = [t for t in g.trials if t.label == "ctx82s-rope1.5M-6L768d6h-s2"]
    assert len(main_model) == 1 and main_model[0].subgrids == ("context", "posenc", "sizes", "heads")
    # Families keep their own learning rate from the presets.
    assert {t.config.train.lr for t in g.trials if t.config.model.layers == 9} == {2e-3}


def test_paper_grid_adds_music_to_rev16_for_the_main_family_only() -> None:
    """Paper 000 §4.1, Fig. 2: the 30 main models (every context, 3 seeds) on Rev16 at -7.5 .. 10 dB, one trial each
    whichever other sections share them; every trial evaluated clean on the three sets."""
    g = load_grid(GRIDS / "paper.yaml")
    noisy = [t for t in g.trials if t.config.eval.snrs]
    assert len(noisy) == 30 and all(t.subgrids[0] == "context" for t in noisy)
    assert sorted((t.config.data.context_s, t.seed) for t in noisy) == sorted(
        (c, s) for c in CONTEXTS for s in (1, 2, 3))
    assert {(t.config.eval.snrs, t.config.eval.noisy) for t in noisy} == {(SNRS, ("rev16",))}
    assert {t.config.model.layers for t in noisy} == {6} and {t.config.model.posenc for t in noisy} == {"rotary"}
    assert any(len(t.subgrids) > 1 for t in noisy)  # shared with other sections, still one trial
    for t in g.trials:
        assert sorted(d.partition("=")[0] for d in t.config.eval.datasets) == ["earnings22", "rev16", "tedlium"]
        assert t.key == t.config.key()


@pytest.mark.parametrize("name,count", [("context", 30), ("posenc", 111), ("sizes", 180), ("heads", 90)])
def test_section_files_stand_alone_and_agree_with_paper(name: str, count: int) -> None:
    """A section file alone has the paper's trials, except that the main models it shares with the context section
    are evaluated there without the music conditions the paper grid adds (other evaluation, so other keys)."""
    section = load_grid(GRIDS / f"{name}.yaml")
    assert len(section.trials) == count
    paper = {t.label: t for t in load_grid(GRIDS / "paper.yaml").trials}
    for t in section.trials:
        p = paper[t.label]
        if p.key != t.key:
            assert name != "context" and "context" in p.subgrids and not t.config.eval.snrs
            assert p.config.eval.snrs == SNRS and _no_eval(p.config) == _no_eval(t.config)


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
                  ["train.lr=1e-3"], ["data.features.variant=paper"]):
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


# ---- one model, one trial: the evaluations of its grid points merged ----------------------------------------------
def _no_eval(cfg):
    import dataclasses

    return dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, datasets=(), snrs=(), noisy=()))


MERGE = """
    base:
      preset: tiny
      eval: {datasets: ['a=podcast:/d/a', 'b=podcast:/d/b'], stride: 0.5}
    seeds: [0, 1]
    subgrids:
      plain: {axes: {data.context_s: [5.12, 10.24]}}
      music:
        set: {eval.snrs: [10, 0], eval.noisy: [b]}
        axes: {data.context_s: [10.24, 20.48]}
      extra:
        set: {eval.datasets: ['a=podcast:/d/a', 'c=podcast:/d/c'], eval.snrs: [5]}
        axes: {data.context_s: [10.24]}
"""


def test_a_model_two_subgrids_evaluate_differently_is_one_trial_with_both_evaluations(tmp_path: Path) -> None:
    g = load_grid(_write(tmp_path, MERGE))
    assert len(g.trials) == 6  # contexts 5.12, 10.24, 20.48 x 2 seeds
    assert [(s.name, s.n_points, s.n_new) for s in g.subgrids] == [("plain", 4, 4), ("music", 4, 2), ("extra", 2, 0)]
    by_ctx = {(t.config.data.context_s, t.seed): t for t in g.trials}
    shared = by_ctx[(10.24, 0)]
    assert shared.subgrids == ("plain", "music", "extra")
    ev = shared.config.eval
    assert ev.datasets == ("a=podcast:/d/a", "b=podcast:/d/b", "c=podcast:/d/c")
    assert ev.snrs == (0.0, 5.0, 10.0)
    # music: b at its SNRs; extra: every one of its datasets (noisy empty), a and c: so all three are noisy
    assert ev.noisy == () and ev.stride == 0.5
    assert shared.key == shared.config.key()  # keyed by the merged config
    assert by_ctx[(5.12, 0)].config.eval.snrs == () and by_ctx[(5.12, 0)].subgrids == ("plain",)
    only_music = by_ctx[(20.48, 1)].config.eval  # one sub-grid's point: its evaluation as written
    assert only_music.noisy == ("b",) and only_music.snrs == (10.0, 0.0)
    # deterministic: the same trials, order and keys on every load
    again = load_grid(_write(tmp_path, MERGE))
    assert [(t.key, t.label, t.subgrids) for t in again.trials] == [(t.key, t.label, t.subgrids) for t in g.trials]
    assert len({t.key for t in g.trials}) == 6


def test_merge_evaluations_union_and_the_empty_noisy_meaning_every_dataset() -> None:
    a, b, c = "a=podcast:/d/a", "b=podcast:/d/b", "c=podcast:/d/c"
    clean = EvalConfig(datasets=(a, b))
    only_b = EvalConfig(datasets=(a, b), snrs=(0.0,), noisy=("b",))
    every = EvalConfig(datasets=(a, b), snrs=(5.0,))
    m = merge_evaluations([clean, only_b])
    assert (m.datasets, m.snrs, m.noisy) == ((a, b), (0.0,), ("b",))
    m = merge_evaluations([only_b, every])  # () = every dataset: the union is every dataset, written ()
    assert (m.snrs, m.noisy) == ((0.0, 5.0), ())
    m = merge_evaluations([clean, EvalConfig(datasets=(c,), snrs=(5.0,))])  # c's own () covers c only
    assert (m.datasets, m.noisy) == ((a, b, c), ("c",))
    m = merge_evaluations([clean, EvalConfig(datasets=(a, c))])  # no SNRs anywhere: nothing noisy
    assert (m.datasets, m.snrs, m.noisy) == ((a, b, c), (), ())
    m = merge_evaluations([EvalConfig(datasets=(a, b), snrs=(1.0,), noisy=("a",)),
                           EvalConfig(datasets=(a, b), snrs=(2.0,), noisy=("b",))])
    assert m.noisy == () and m.snrs == (1.0, 2.0)
    with pytest.raises(ValueError, match="'a' is 'a=podcast:/d/a' in one and 'a=podcast:/elsewhere'"):
        merge_evaluations([clean, EvalConfig(datasets=("a=podcast:/elsewhere",))])


def test_merged_trials_still_refuse_other_execution_settings_and_split_on_other_protocols(tmp_path: Path) -> None:
    """Only what a trial evaluates on is merged: another loader setting for one key stays an error, and another
    eval.stride, eval.precision or eval.noise for one model is refused: one model, one default evaluation."""
    base = ("base: {preset: tiny, eval: {datasets: ['a=podcast:/d/a', 'b=podcast:/d/b']}}\nseeds: [0]\n"
            "subgrids:\n  x: {axes: {data.context_s: [5.12]}}\n")
    bad = _write(tmp_path, base + "  y: {set: {data.context_s: 5.12, data.num_workers: 4, eval.snrs: [0]}}\n")
    with pytest.raises(GridError, match=r"sub-grid 'y'.*twice with other settings \(data.num_workers: 0 vs 4;"):
        load_grid(bad)
    paths = _write(tmp_path, base + "  y: {set: {data.context_s: 5.12, eval.datasets: ['a=podcast:/e/a']}}\n", "p.yaml")
    with pytest.raises(GridError, match=r"sub-grid 'y'.*cannot be merged.*'a'"):
        load_grid(paths)
    for other in ("eval.stride: 0.25", "eval.precision: fp32", "eval.noise: /m/music.wav"):
        two = _write(tmp_path, base + f"  y: {{set: {{data.context_s: 5.12, eval.snrs: [0], {other}}}}}\n", "o.yaml")
        # one model (evaluation is not in the model key) has one default evaluation: refused, naming the field
        with pytest.raises(GridError, match=r"sub-grid 'y'.*evaluated two ways \(" + other.split(":")[0]
                           + r".*orchestrate evaluate"):
            load_grid(two)


# ---- the evaluation work plan shows --------------------------------------------------------------------------------
def test_eval_work_counts_hours_conditions_and_windows_per_frame(tmp_path: Path) -> None:
    g = load_grid(_write(tmp_path, MERGE))
    hours = {"a=podcast:/d/a": 2.0, "b=podcast:/d/b": 3.0, "c=podcast:/d/c": 0.5}
    by_ctx = {(t.config.data.context_s, t.seed): t for t in g.trials}
    # clean only: (2 + 3) h x 1 condition x 2 windows per frame (stride 0.5)
    assert eval_work(by_ctx[(5.12, 0)].config, hours.get)[0] == pytest.approx(10.0)
    # b noisy at 2 SNRs: (2 + 3 x 3) x 2
    assert eval_work(by_ctx[(20.48, 0)].config, hours.get)[0] == pytest.approx(22.0)
    # all noisy at 3 SNRs: (2 + 3 + 0.5) x 4 x 2
    audio_h, gpu_h = eval_work(by_ctx[(10.24, 0)].config, hours.get)
    assert audio_h == pytest.approx(44.0) and gpu_h == pytest.approx(44.0 * 100 / DECODE_FRAMES_PER_S)
    assert eval_work(by_ctx[(10.24, 0)].config, lambda spec: None) is None
    work = subgrid_eval_work(g, hours.get)
    assert work["plain"][0] == pytest.approx(2 * 10.0 + 2 * 44.0)  # its new trials, merged evaluations included
    assert work["music"][0] == pytest.approx(2 * 22.0) and work["extra"] == (0.0, 0.0)
    assert work[""][0] == pytest.approx(sum(work[s.name][0] for s in g.subgrids))
    table = plan_table(g, hours.get)
    assert "eval audio-h" in table and "eval GPU-h" in table and f"{DECODE_FRAMES_PER_S:,} frames/s" in table
    total = next(line for line in table.splitlines() if line.startswith("total (unique)"))
    assert total.split()[-2:] == ["152", f"{152 * 100 / DECODE_FRAMES_PER_S:.1f}"]  # 20 + 88 + 44
    unknown = plan_table(g, lambda spec: None if "c=" in spec else 1.0)
    rows = {line.split()[0]: line.split() for line in unknown.splitlines()[2:5]}
    # plain's new trials include the merged 10.24 s ones, which evaluate c; music's: (1 h + 1 h x 3) x 2 x 2 trials
    assert rows["plain"][-3:-1] == ["?", "?"] and rows["music"][-3] == "16"
    assert "c ? h" in unknown


def test_eval_set_hours_read_from_disk_else_the_paper_else_unknown(tmp_path: Path) -> None:
    from asr_core.data.corpora import load_corpus
    from asr_core.data.synth.generate import synthesise

    corpus = tmp_path / "corpus"
    synthesise(corpus, 0.003, seed=3, eval_hours=0.004, min_minutes=0.1, max_minutes=0.15, jobs=1, splits=("test",))
    on_disk = f"mine=podcast:{corpus / 'test'}"
    expected = sum(r.duration for r in load_corpus(on_disk, audio=False)) / 3600
    assert expected > 0 and eval_set_hours(on_disk) == pytest.approx(expected)
    assert eval_set_hours("rev16=rev16:/nowhere/rev16") == KNOWN_TEST_HOURS["rev16"] == 16.2
    assert eval_set_hours("earnings22=earnings22:/nowhere/e22") == 119.0
    assert eval_set_hours("tedlium=tedlium:/nowhere/ted") == 2.6
    assert eval_set_hours("other=podcast:/nowhere/other") is None
    p = _write(tmp_path, f"base: {{preset: tiny, eval: {{datasets: ['{on_disk}', 'x=podcast:/nowhere/x']}}}}\n"
                         "seeds: [0]\nsubgrids: {a: {axes: {data.context_s: [5.12]}}}\n")
    out = plan_table(load_grid(p))
    assert "x ? h (not on disk, size unknown)" in out and f"mine {expected:,.1f} h (read)" in out


def test_paper_plan_evaluates_far_less_than_music_on_every_set_of_every_trial(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Music on Rev16 for the 30 main models only, against the earlier scoping (8 SNRs on all three sets of all 321
    trials): about 8x less decoding."""
    import dataclasses

    g = load_grid(GRIDS / "paper.yaml")
    hours = KNOWN_TEST_HOURS  # the paper's sizes, whatever is on disk here
    look = lambda spec: hours[spec.partition("=")[0]]  # noqa: E731
    new = subgrid_eval_work(g, look)[""]
    old = [eval_work(dataclasses.replace(t.config, eval=dataclasses.replace(t.config.eval, snrs=SNRS, noisy=())),
                     look) for t in g.trials]
    old_audio, old_gpu = sum(w[0] for w in old), sum(w[1] for w in old)
    clean = (119.0 + 2.6 + 16.2) * 8  # audio-hours decoded per trial clean at stride 1/8
    assert new[0] == pytest.approx(321 * clean + 30 * 16.2 * 8 * 8)  # 384,974 h
    assert old_audio == pytest.approx(321 * clean * 9)  # 3,184,834 h
    assert new[0] < old_audio / 8 and old_gpu - new[1] > 1000
    assert main(["plan", str(GRIDS / "paper.yaml")]) == 0
    out = capsys.readouterr().out
    total = next(line for line in out.splitlines() if line.startswith("total (unique)"))
    assert total.split()[-2:] == ["384,974", f"{new[1]:,.1f}"]
