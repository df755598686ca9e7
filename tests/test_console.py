"""The one console command, ``asr-study``: its groups are the commands they name, ``--version`` everywhere, the
packaged grids and profiles found by name, the checkout's old paths linked to the package's files, and shell
completion answered by each group's own parser (argcomplete, as the shell hook asks it: ``_ARGCOMPLETE``,
``COMP_LINE``, ``COMP_POINT``; the answer read from ``_ARGCOMPLETE_STDOUT_FILENAME``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from asr_study.cli import GROUPS, main
from orchestrate import assets
from orchestrate.plan.profile import BackendError, load_profile
from orchestrate.plan.grid import GridError, load_grid

ROOT = Path(__file__).resolve().parents[1]
COMMIT = re.compile(r"\(commit [0-9a-f]{12}(\+dirty\.[0-9a-f]{8})?, ")


def test_version_names_the_package_version_and_the_checkout_commit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("asr-study 0.1.0 ") and COMMIT.search(out), out
    assert str(ROOT) in out


def test_a_checkout_never_installed_reads_its_version_from_pyproject(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an installed distribution the version comes from the checkout's ``pyproject.toml``, found from the
    module's own place in the checkout."""
    import tomllib
    from importlib import metadata

    from asr_core.contract import command

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(command.metadata, "version", missing)
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert command.package_version() == expected != command.UNKNOWN


@pytest.mark.parametrize("group, prog", [("core", "python -m asr_core"), ("orchestrate", "orchestrate"),
                                         ("analysis", "python -m analysis"),
                                         ("dashboard", "asr-study dashboard")])
def test_every_group_has_version(group: str, prog: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        rc = main([group, "--version"])
    except SystemExit as e:  # argparse's groups end --version so
        rc = e.code
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith(f"{prog} 0.1.0 ") and COMMIT.search(out), out


def test_a_group_is_the_command_it_names(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrate.cli.commands import main as orchestrate_main

    assert main(["orchestrate", "plan", str(ROOT / "grids" / "smoke.yaml")]) == 0
    via_console = capsys.readouterr().out
    assert orchestrate_main(["plan", str(ROOT / "grids" / "smoke.yaml")]) == 0
    assert capsys.readouterr().out == via_console and "smoke" in via_console
    assert main(["core"]) == 2 and "train" in capsys.readouterr().out  # python -m asr_core's own list


def test_debug_before_the_group_goes_to_the_group(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``asr-study --debug GROUP ...``, as the crash message and the README say: the group runs with tracebacks
    let through (was: unrecognized arguments, exit 2)."""
    import orchestrate.cli.commands

    def boom(argv: list[str]) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(orchestrate.cli.commands, "_main", boom)
    with pytest.raises(RuntimeError, match="a bug"):  # the traceback goes through
        main(["--debug", "orchestrate", "plan", "x"])
    assert main(["orchestrate", "plan", "x"]) == 1  # without it: one line and a crash log
    assert "a bug" in capsys.readouterr().err


def test_the_long_forms_and_the_installed_command_agree() -> None:
    env = {k: v for k, v in os.environ.items() if k != "_ARGCOMPLETE"}
    for args in (["-m", "asr_study", "core", "--help"], ["-m", "asr_core", "--help"]):
        r = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "evaluate" in r.stdout, r.stderr
    script = Path(sys.executable).parent / "asr-study"
    assert script.is_file(), "asr-study is not installed in this environment: run scripts/setup.sh"


def test_a_group_that_does_not_exist_exits_2_naming_the_groups(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["orchestrat", "plan"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "'orchestrat'" in err and all(g in err for g in GROUPS), err
    with pytest.raises(SystemExit) as done:
        main([])
    assert done.value.code == 2 and "GROUP" in capsys.readouterr().err


# ---- package data ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("link, target", [("grids", assets.grids_dir), ("slurm/profiles", assets.profiles_dir),
                                          ("slurm/mlflow-server.sh", assets.server_script),
                                          ("orchestrate/calibrations", assets.calibrations_dir)])
def test_the_checkouts_old_paths_are_links_to_the_package_data(link: str, target) -> None:  # noqa: ANN001
    path = ROOT / link
    assert path.is_symlink(), f"{link} should be a link into orchestrate/assets/ (the package data)"
    assert path.resolve() == target().resolve() and target().exists()


def test_a_packaged_grid_is_found_by_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no grids/ here: the names come from the package
    by_name = load_grid("smoke")
    assert Path(by_name.path) == assets.grids_dir() / "smoke.yaml"
    assert [t.key for t in load_grid("grids/smoke.yaml").trials] == [t.key for t in by_name.trials]
    (tmp_path / "smoke").write_text((assets.grids_dir() / "smoke.yaml").read_text())  # a file of the name wins
    assert Path(load_grid("smoke").path) == Path("smoke")
    with pytest.raises(GridError, match=r"grid file not found: nope; valid: .*paper, posenc, sizes, smoke"):
        load_grid("nope")


def test_a_packaged_profile_is_found_by_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_profile("a100").name == "a100" and load_profile("a100").gpus_per_node
    with pytest.raises(BackendError, match=r"unknown profile 'a10'.*packaged profiles: a100, a100-backfill"):
        load_profile("a10")


def test_the_server_subcommand_runs_the_packaged_script() -> None:
    r = subprocess.run([sys.executable, "-m", "asr_study", "mlflow-server", "--workers", "0"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--workers '0' is not a positive integer" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "asr_study", "mlflow-server", "--path"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and Path(r.stdout.strip()) == assets.server_script(), r.stdout


# ---- completion -----------------------------------------------------------------------------------------------------
def completions(line: str, tmp_path: Path) -> set[str]:
    """What ``asr-study`` offers for ``line`` with the cursor at its end, asked as bash's hook asks."""
    answer = tmp_path / "completions"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_STDOUT_FILENAME": str(answer), "_ARGCOMPLETE_IFS": "\n", "_ARGCOMPLETE_SUPPRESS_SPACE": "1"}
    r = subprocess.run([sys.executable, "-m", "asr_study"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return set(answer.read_text().split("\n")) - {""} if answer.exists() else set()


@pytest.mark.parametrize("line, expected", [
    ("asr-study ", {"core", "orchestrate", "analysis", "mlflow-server"}),
    ("asr-study --ver", {"--version"}),
    ("asr-study orchestrate pl", {"plan"}),
    ("asr-study orchestrate plan smoke --est", {"--estimate"}),
    ("asr-study core ", {"train", "evaluate", "score", "lm", "bench", "--version"}),
    ("asr-study core lm ", {"text", "train", "ppl", "tune"}),
    ("asr-study core lm train --toke", {"--tokenizer"}),
    ("asr-study analysis report --heads-repr ", {"A", "Q", "K", "V", "Y"}),
    ("asr-study mlflow-server --det", {"--detach"}),
])
def test_completion_is_answered_by_the_groups_own_parser(line: str, expected: set[str], tmp_path: Path) -> None:
    got = completions(line, tmp_path)
    assert expected <= got, f"{line!r}: offered {sorted(got)}"


def test_the_orchestrate_script_completes_by_itself(tmp_path: Path) -> None:
    """``orchestrate`` (the second console script) answers the shell's hook with its own parser, as
    ``eval "$(register-python-argcomplete orchestrate)"`` asks it."""
    answer = tmp_path / "completions"
    line = "orchestrate sta"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_STDOUT_FILENAME": str(answer), "_ARGCOMPLETE_IFS": "\n", "_ARGCOMPLETE_SUPPRESS_SPACE": "1"}
    r = subprocess.run([sys.executable, "-m", "orchestrate"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert {"status"} <= set(answer.read_text().split("\n")), answer.read_text() if answer.exists() else "no answer"
