"""The context-or-fragmentation grids: ``grids/demo-fragmentation.yaml`` (``./scripts/demo.sh --fragmentation``) and
``grids/controls.yaml`` (the paper's main model). Their dense models must be the demo's and the paper's own trials
(the same keys), and their banded models must see what their comments say (:mod:`asr_core.model.receptive`)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asr_core.config import Config
from asr_core.model.receptive import receptive_field
from asr_core.config.yaml_input import load_yaml_file
from orchestrate.plan.grid import load_grid

REPO = Path(__file__).resolve().parents[1]
FRAGMENTATION = REPO / "grids" / "demo-fragmentation.yaml"
CONTROLS = REPO / "grids" / "controls.yaml"


def _by(path: Path, sub: str) -> list:
    return [t for t in load_grid(path).trials if sub in t.subgrids]


def _with_span(cfg: Config, span: float | None) -> Config:
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention_span_s=span))


def _total_field_s(cfg: Config) -> float:
    return 2 * receptive_field(cfg).seconds


def _frame_s(cfg: Config) -> float:
    return cfg.model.subsampling_factor / cfg.data.features.frames_per_second


# ---- grids/demo-fragmentation.yaml ----------------------------------------------------------------------------------
def test_fragmentation_grid_plans_15_trials_in_three_subgrids() -> None:
    grid = load_grid(FRAGMENTATION)
    assert grid.name == "demo-fragmentation" and len(grid.trials) == 15
    assert {s: len(_by(FRAGMENTATION, s)) for s in ("dense", "banded", "pauses")} == {"dense": 6, "banded": 6,
                                                                                       "pauses": 3}
    assert {t.seed for t in grid.trials} == {1, 2, 3}
    assert all(t.config.eval.datasets and len(t.config.eval.datasets) == 1 and not t.config.eval.snrs
               for t in grid.trials)  # the in-domain test set, clean only
    done = subprocess.run([sys.executable, "-m", "orchestrate", "plan", str(FRAGMENTATION)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "demo-fragmentation: 15 unique trials" in done.stdout


def test_fragmentation_base_is_the_demos_in_science() -> None:
    demo = load_yaml_file(REPO / "grids" / "demo.yaml")["base"]
    frag = load_yaml_file(FRAGMENTATION)["base"]
    assert {k: v for k, v in frag.items() if k != "eval"} == {k: v for k, v in demo.items() if k != "eval"}


def test_dense_trials_are_the_demos_own_models() -> None:
    """The dense 5.12 and 81.92 s trials of seeds 1 and 2 have exactly the keys of grids/demo.yaml's."""
    demo = {(t.config.data.context_s, t.seed): t for t in load_grid(REPO / "grids" / "demo.yaml").trials}
    dense = _by(FRAGMENTATION, "dense")
    assert sorted({t.config.data.context_s for t in dense}) == [5.12, 81.92]
    shared = [t for t in dense if t.seed in (1, 2)]
    assert len(shared) == 4
    for t in shared:
        d = demo[(t.config.data.context_s, t.seed)]
        assert t.key == d.key, t.label
        assert t.config.key() == d.config.key()
    # seed 3 is new, and no control shares a key with a dense model
    assert not {t.key for t in load_grid(FRAGMENTATION).trials if t.seed == 3} & {t.key for t in demo.values()}


def test_banded_trials_see_what_the_comments_say() -> None:
    """81.92 s windows; the first band's field is +-2.5225 s (5.045 s in all): the widest inside a 5.12 s window and
    the nearest to it; the second band is 2.56 s a layer (+-5.4825 s)."""
    banded = _by(FRAGMENTATION, "banded")
    assert {t.config.data.context_s for t in banded} == {81.92}
    assert all(t.config.data.cut == "fixed" for t in banded)
    spans = sorted({t.config.model.attention_span_s for t in banded})
    assert spans == [1.08, 2.56]
    cfg = banded[0].config
    assert (cfg.model.layers, cfg.model.subsampling_factor, cfg.model.conv_kernel) == (2, 4, 9)
    narrow, wide = (_with_span(cfg, s) for s in spans)
    assert receptive_field(narrow).seconds == pytest.approx(2.5225)
    assert _total_field_s(narrow) == pytest.approx(5.045)
    step = _frame_s(cfg)  # one output frame more a layer
    above = _total_field_s(_with_span(cfg, spans[0] + step))
    assert _total_field_s(narrow) <= 5.12 < above
    assert abs(_total_field_s(narrow) - 5.12) <= abs(above - 5.12)
    field = receptive_field(wide)
    assert field.span_frames * field.frame_s == pytest.approx(2.56) and field.seconds == pytest.approx(5.4825)


def test_pause_trials_are_short_windows_cut_at_pauses() -> None:
    pauses = _by(FRAGMENTATION, "pauses")
    assert {(t.config.data.context_s, t.config.data.cut, t.config.model.attention_span_s) for t in pauses} == {
        (5.12, "pauses", None)}
    dense = {(t.seed): t for t in _by(FRAGMENTATION, "dense") if t.config.data.context_s == 5.12}
    for t in pauses:  # the dense 5.12 s model but for the cut
        same = dataclasses.replace(t.config, data=dataclasses.replace(t.config.data, cut="fixed"))
        assert same.key() == dense[t.seed].key


# ---- grids/controls.yaml --------------------------------------------------------------------------------------------
def test_controls_grid_plans_the_papers_seeds() -> None:
    grid = load_grid(CONTROLS)
    assert grid.name == "controls" and len(grid.trials) == 9
    assert {t.seed for t in grid.trials} == {t.seed for t in load_grid(REPO / "grids" / "paper.yaml").trials}
    banded, pauses = _by(CONTROLS, "banded"), _by(CONTROLS, "pauses")
    assert sorted(t.config.data.context_s for t in banded) == [81.92] * 3 + [3600.0] * 3
    assert {(t.config.data.context_s, t.config.data.cut) for t in pauses} == {(10.24, "pauses")}


def test_controls_band_gives_a_10_24_s_field() -> None:
    """0.48 s a layer: +-4.8825 s (9.765 s in all), the widest band inside 10.24 s and the nearest to it."""
    banded = _by(CONTROLS, "banded")
    assert {t.config.model.attention_span_s for t in banded} == {0.48}
    cfg = banded[0].config
    assert (cfg.model.layers, cfg.model.subsampling_factor, cfg.model.conv_kernel) == (6, 8, 9)
    assert receptive_field(cfg).seconds == pytest.approx(4.8825)
    above = _total_field_s(_with_span(cfg, 0.48 + _frame_s(cfg)))
    assert _total_field_s(cfg) <= 10.24 < above
    assert abs(_total_field_s(cfg) - 10.24) <= abs(above - 10.24)


def test_controls_are_the_papers_main_model_but_for_the_control() -> None:
    """Without its band or its pause cuts, each control is the paper grid's trial of that context and seed."""
    paper = {(t.config.data.context_s, t.seed, t.config.model.d_model, t.config.model.layers, t.config.model.heads): t
             for t in load_grid(REPO / "grids" / "paper.yaml").trials if "context" in t.subgrids}
    paper_keys = {t.key for t in load_grid(REPO / "grids" / "paper.yaml").trials}
    for t in load_grid(CONTROLS).trials:
        assert t.key not in paper_keys
        c = _with_span(t.config, None)
        c = dataclasses.replace(c, data=dataclasses.replace(c.data, cut="fixed"))
        m = c.model
        assert c.key() == paper[(c.data.context_s, t.seed, m.d_model, m.layers, m.heads)].key, t.label


# ---- ./scripts/demo.sh --fragmentation --------------------------------------------------------------------------------
def test_demo_fragmentation_is_exclusive_and_in_the_help() -> None:
    for args in (["--fragmentation", "--quick"], ["--quick", "--fragmentation"], ["--fragmentation", "--cued"]):
        done = subprocess.run(["bash", "scripts/demo.sh", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2, done.stderr
        assert "--fragmentation" in done.stderr and "give one of them" in done.stderr
    bad = subprocess.run(["bash", "scripts/demo.sh", "--fragmentaton"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--fragmentation" in bad.stderr
    helped = subprocess.run(["bash", "scripts/demo.sh", "--help"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert helped.returncode == 0 and "./scripts/demo.sh --fragmentation" in helped.stdout
    assert "set -euo" not in helped.stdout and not helped.stdout.startswith("!")


def _run_copy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``demo.sh ARGS`` from a copy of the script whose setup step and Python are stand-ins that record their
    arguments in ``python.log`` (the script stops at the report, whose sweep folder the stand-in never makes)."""
    (tmp_path / "scripts").mkdir(parents=True, exist_ok=True)
    text = (REPO / "scripts" / "demo.sh").read_text().replace("\nbash scripts/setup.sh\n", "\ntrue\n")
    (tmp_path / "scripts" / "demo.sh").write_text(text)
    py = tmp_path / ".venv" / "bin" / "python"
    py.parent.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "python.log"
    py.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    py.chmod(0o755)
    return subprocess.run(["bash", "scripts/demo.sh", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "DEMO_OUT": "out"})


def _commands(tmp_path: Path, *args: str) -> list[str]:
    _run_copy(tmp_path, *args)
    return (tmp_path / "python.log").read_text().splitlines()


def test_demo_fragmentation_runs_on_the_full_demos_corpus(tmp_path: Path) -> None:
    for d in ("full", "frag"):  # the sweep folder, which the stand-in never makes, so the script reaches its report
        (tmp_path / d / "out" / "demo" / "runs").mkdir(parents=True)
    full = _commands(tmp_path / "full")
    frag = _commands(tmp_path / "frag", "--fragmentation")
    synth = [c for c in full if c.startswith("-m asr_core synth")]
    assert synth == [c for c in frag if c.startswith("-m asr_core synth")]  # the same corpus, made alike
    assert synth == ["-m asr_core synth --out out/demo/corpus --hours 1.0 --eval-hours 0.5 --eval-max-minutes 4 "
                     "--eval-min-minutes 3 --voices 3 --shift near --splits train,test,test-shifted --seed 0 --cue 0"]
    submit = [c for c in frag if c.startswith("-m orchestrate submit")]
    assert submit == ["-m orchestrate submit grids/demo-fragmentation.yaml --backend local --sweep demo "
                      "--sweep-root out/demo/runs --set data.train=podcast:out/demo/corpus/train "
                      "--set eval.datasets=[test=podcast:out/demo/corpus/test]"]
    windows = ("-m orchestrate evaluate demo --spec grids/decode-windows.yaml --where subgrid=dense "
               "--where data.context_s=81.92 --sweep-root out/demo/runs")
    assert frag.index(windows) > frag.index(submit[0])  # the trained models decoded at shorter windows
    assert not any(c.startswith("-m orchestrate evaluate") for c in full)
    # one sweep for both: the full demo's dense models are the fragmentation's (reused by key, not trained twice)
    full_submit = next(c for c in full if c.startswith("-m orchestrate submit"))
    assert "--sweep demo --sweep-root out/demo/runs " in full_submit
    reports = [c.split(" --out ")[1].split()[0] for c in full + frag if c.startswith("-m analysis report demo ")]
    assert reports == ["out/demo/report", "out/demo/report-fragmentation"]  # neither report overwrites the other


@pytest.mark.parametrize("args", [(), ("--fragmentation",)])
def test_a_corpus_of_the_earlier_demo_is_refused(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Test sets of recordings under a minute, and runs evaluated on them under the same names: delete, then run."""
    stamp = tmp_path / "out" / "demo" / "corpus" / "synth.json"
    stamp.parent.mkdir(parents=True)
    stamp.write_text('{"args": {"hours": 1.0, "eval_hours": 0.15, "eval_max_minutes": 0.75}, "complete": true}')
    done = _run_copy(tmp_path, *args)
    assert done.returncode == 2 and "delete out/demo " in done.stderr, done.stderr
    assert not (tmp_path / "python.log").exists()  # nothing ran


def test_labels_say_which_control_a_model_is() -> None:
    """A banded or pause-cut model is told from the dense one of its context by its label, not by a key suffix; a
    dense model's label is the one it always had."""
    labels = sorted(t.label for t in load_grid(REPO / "grids/demo-fragmentation.yaml").trials)
    assert len(set(labels)) == len(labels) == 15
    assert "ctx82s-band1.08s-rope1.5M-2L96d4h-s1" in labels and "ctx82s-band2.56s-rope1.5M-2L96d4h-s3" in labels
    assert "ctx5s-pausescut-rope1.5M-2L96d4h-s2" in labels
    assert "ctx82s-rope1.5M-2L96d4h-s1" in labels  # the demo's own model, labelled as in grids/demo.yaml
    demo = {t.key: t.label for t in load_grid(REPO / "grids/demo.yaml").trials}
    for t in load_grid(REPO / "grids/demo-fragmentation.yaml").trials:
        if t.key in demo:
            assert t.label == demo[t.key]
