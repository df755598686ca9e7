"""Hostile or broken YAML through the real commands: an alias bomb, a list as a mapping key, a Python tag, a
self-referencing alias and an oversized file each end in seconds with exit 2 and one line ``FILE:LINE:COLUMN: ...``,
in a grid (``orchestrate plan``), a profile (``orchestrate submit --profile``), a config (``asr_core train``), a
``--set`` value and a decode file. Nothing in them runs: a Python tag is refused, never constructed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrate.plan.decode_file import DecodeFileError, load_decode_file

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 60  # a hang (the alias bomb on the old code) fails here instead of blocking the suite

# Nine levels of nine: 9**10 strings once every alias is expanded, from a few hundred bytes.
_LEVELS = ["&a0 [" + ", ".join(['"lol"'] * 9) + "]"]
for _i in range(1, 10):
    _LEVELS.append(f"&a{_i} [" + _LEVELS[-1] + "".join(f", *a{_i - 1}" for _ in range(8)) + "]")
BOMB = _LEVELS[-1]

GRID_HEAD = "seeds: [1]\nbase: {preset: tiny}\nsubgrids:\n  s:\n"
HOSTILE_GRIDS = {
    "alias_bomb": (GRID_HEAD + f"    section: {BOMB}\n    axes: {{train.lr: [0.001]}}\n", 5, "alias"),
    "list_key": (GRID_HEAD + "    ? [a, b]\n    : 1\n", 5, "mapping key"),
    "python_tag": (GRID_HEAD + "    section: !!python/object/apply:os.system ['echo ran']\n", 5, "tag"),
    "recursive_alias": (GRID_HEAD + "    section: &r [*r]\n", 5, "alias"),
}
HOSTILE_PROFILES = {
    "alias_bomb": (f"partition: {BOMB}\n", 1, "alias"),
    "list_key": ("partition: x\n? [a]\n: 1\n", 2, "mapping key"),
    "python_tag": ("partition: x\ntime_limit: !!python/object/apply:os.system ['echo ran']\n", 2, "tag"),
}
HOSTILE_CONFIGS = {
    "alias_bomb": (f"model:\n  posenc: {BOMB}\n", 2, "alias"),
    "list_key": ("model: {layers: 2}\n? [a]\n: 1\n", 2, "mapping key"),
    "python_tag": ("model:\n  layers: !!python/object/apply:os.system ['echo ran']\n", 2, "tag"),
}


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # subprocess.run kills (SIGKILL) at the timeout: the trainer records SIGTERM rather than dying of it
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S)


def _assert_one_line(r: subprocess.CompletedProcess[str], path: Path, line: int, word: str) -> None:
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2, f"exit {r.returncode}; stderr: {r.stderr[-2000:]}"
    assert len(err) == 1, f"expected one line, got {len(err)}: {r.stderr[-2000:]}"
    assert re.search(re.escape(str(path)) + rf":{line}:\d+: ", err[0]), err[0]
    assert word in err[0].lower(), err[0]
    assert "Traceback" not in r.stderr and "ran" not in r.stdout


@pytest.mark.parametrize("name", sorted(HOSTILE_GRIDS))
def test_plan_refuses_hostile_grid_in_one_line(tmp_path: Path, name: str) -> None:
    text, line, word = HOSTILE_GRIDS[name]
    grid = tmp_path / f"{name}.yaml"
    grid.write_text(text)
    _assert_one_line(_run(["-m", "orchestrate", "plan", str(grid)], tmp_path), grid, line, word)


@pytest.mark.parametrize("name", sorted(HOSTILE_PROFILES))
def test_submit_refuses_hostile_profile_in_one_line(tmp_path: Path, name: str) -> None:
    text, line, word = HOSTILE_PROFILES[name]
    profile = tmp_path / f"{name}.yaml"
    profile.write_text(text)
    r = _run(["-m", "orchestrate", "submit", str(ROOT / "grids" / "smoke.yaml"), "--backend", "slurm", "--profile",
              str(profile), "--sweep-root", str(tmp_path / "sweeps"), "--no-check-data",
              "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"], tmp_path)
    _assert_one_line(r, profile, line, word)
    assert not (tmp_path / "sweeps").exists() or not any((tmp_path / "sweeps").iterdir())


@pytest.mark.parametrize("name", sorted(HOSTILE_CONFIGS))
def test_train_refuses_hostile_config_in_one_line(tmp_path: Path, name: str) -> None:
    text, line, word = HOSTILE_CONFIGS[name]
    config = tmp_path / f"{name}.yaml"
    config.write_text(text)
    r = _run(["-m", "asr_core", "train", str(config), "--out", str(tmp_path / "run")], tmp_path)
    _assert_one_line(r, config, line, word)


def test_train_refuses_alias_bomb_in_set_value(tmp_path: Path) -> None:
    r = _run(["-m", "asr_core", "train", "tiny", "--set", f"model.posenc={BOMB}", "--out", str(tmp_path / "run")],
             tmp_path)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1, r.stderr[-2000:]
    assert "--set model.posenc:1:" in err[0] and "alias" in err[0], err[0]


def test_plan_refuses_oversized_grid_in_one_line(tmp_path: Path) -> None:
    grid = tmp_path / "big.yaml"
    grid.write_text(GRID_HEAD + "    description: '" + "x" * (2 << 20) + "'\n")  # 2 MiB: past the limit
    r = _run(["-m", "orchestrate", "plan", str(grid)], tmp_path)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1, r.stderr[-2000:]
    assert f"{grid}:" in err[0] and "bytes" in err[0], err[0]


def test_decode_file_refuses_python_tag_with_line_and_column(tmp_path: Path) -> None:
    spec = tmp_path / "decode.yaml"
    spec.write_text("name: x\nlm: !!python/object/apply:os.system ['echo ran']\nbeta: 0\n")
    with pytest.raises(DecodeFileError, match=re.escape(f"{spec}:2:5: ")):
        load_decode_file(spec)


def test_loader_bounds_expansion_and_keeps_ordinary_aliases(tmp_path: Path) -> None:
    from asr_core.config.yaml_input import MAX_NODES, YamlInputError, load_yaml_file, load_yaml_text

    # ordinary anchors and merge keys still read, duplicates refused
    assert load_yaml_text("a: &x {p: 1}\nb: {<<: *x, q: 2}\n", "t") == {"a": {"p": 1}, "b": {"p": 1, "q": 2}}
    with pytest.raises(YamlInputError, match=r"^t:2:1: duplicate key 'a'"):
        load_yaml_text("a: 1\na: 2\n", "t")
    wide = "[" + ", ".join(["*x"] * 100) + "]"
    big = "x: &x [" + ", ".join(["1"] * (MAX_NODES // 50)) + "]\ny: " + wide + "\n"
    with pytest.raises(YamlInputError, match=r"^t:2:5: .*alias"):
        load_yaml_text(big, "t")
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 50_000 + "]" * 50_000)
    with pytest.raises(YamlInputError, match=re.escape(str(deep)) + r":1:\d+: .*nest"):
        load_yaml_file(deep)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"a: \xff\xfe\n")
    with pytest.raises(YamlInputError, match=re.escape(str(binary)) + ":"):
        load_yaml_file(binary)
