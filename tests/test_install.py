"""The project as a user installs it: the wheel built from this checkout, installed into a fresh virtual environment
outside the checkout, runs ``asr-study --version``, ``plan`` of the packaged paper grid with ``--profile a100``, and
``status`` of a sweep the checkout made; the profiles, grids, calibrations and the server script come with it.

The wheel is built by the environment's own setuptools from a copy of the checkout (a build writes ``build/`` and
``*.egg-info`` where it runs: never into the checkout). The fresh environment borrows the heavy dependencies (torch,
MLflow, Ray) of the running one through a ``.pth`` file written after the wheel is installed; the project itself
comes from the wheel only (``asr_core.__file__`` is checked to lie in the new environment).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path

import pytest

from tests.plugins.mlflow_server import free_port

ROOT = Path(__file__).resolve().parents[1]
# what a copy of the checkout leaves out: the environment, outputs, caches (the .gitignore's entries)
NOT_SOURCES = (".git", ".venv", "runs", "demo-out", "artifacts", "build", "dist", "__pycache__", ".pytest_cache",
               "mlruns", "*.egg-info", "*.db", "*.pyc")
TIMEOUT_S = 600

pytestmark = pytest.mark.slow


def run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``args`` run to the end; stdout and stderr as text."""
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def build_wheel(source: Path, work: Path) -> Path:
    """The project's wheel, built from a copy of ``source`` under ``work`` by this environment's setuptools."""
    copy = work / "src"
    shutil.copytree(source, copy, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    dist = work / "dist"
    r = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w",
             str(dist), str(copy)], cwd=work)
    assert r.returncode == 0, f"pip wheel failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    wheels = sorted(dist.glob("long_context_asr_study-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {dist}: {os.listdir(dist)}"
    return wheels[0]


def fresh_venv(wheel: Path, work: Path) -> Path:
    """A new virtual environment under ``work`` holding the wheel; the running environment's packages (the
    project's dependencies) reachable through a ``.pth`` file, added after the install so pip sees none of them."""
    venv = work / "venv"
    r = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=work)
    assert r.returncode == 0, r.stderr
    python = venv / "bin" / "python"
    r = run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
             str(wheel)], cwd=work)
    assert r.returncode == 0, f"pip install of the wheel failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=work)
    (Path(site.stdout.strip()) / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def clean_env(venv: Path) -> dict[str, str]:
    """The environment of a user of ``venv``: its bin first on PATH, no PYTHONPATH into the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MLFLOW_TRACKING_URI")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the fresh environment with the wheel installed, a folder outside the checkout to run commands in)."""
    work = tmp_path_factory.mktemp("install")
    venv = fresh_venv(build_wheel(ROOT, work), work)
    outside = work / "user"
    outside.mkdir()
    return venv, outside


def test_the_project_comes_from_the_wheel_only(installed: tuple[Path, Path]) -> None:
    venv, outside = installed
    r = run([str(venv / "bin" / "python"), "-c", "import asr_core, orchestrate.assets, analysis, asr_study, "
             "importlib.metadata as m; print(asr_core.__file__); print(orchestrate.assets.grids_dir()); "
             "print(m.version('long-context-asr-study'))"], cwd=outside, env=clean_env(venv))
    assert r.returncode == 0, r.stderr
    core, grids, version = r.stdout.split()
    assert Path(core).is_relative_to(venv) and Path(grids).is_relative_to(venv), r.stdout
    assert not Path(core).is_relative_to(ROOT)
    assert {p.name for p in Path(grids).glob("*.yaml")} >= {"paper.yaml", "smoke.yaml", "demo.yaml"}
    assert version == "0.1.0"


def test_version_of_an_installed_package(installed: tuple[Path, Path]) -> None:
    venv, outside = installed
    env = clean_env(venv)
    r = run(["asr-study", "--version"], cwd=outside, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "asr-study 0.1.0 (installed package)", r.stdout + r.stderr
    r = run(["asr-study", "orchestrate", "--version"], cwd=outside, env=env)
    assert r.returncode == 0 and r.stdout.startswith("orchestrate 0.1.0 (installed package)"), r.stdout + r.stderr


def test_plan_of_the_packaged_paper_grid_with_a_packaged_profile(installed: tuple[Path, Path]) -> None:
    venv, outside = installed
    env = clean_env(venv)
    for args in (["asr-study", "orchestrate", "plan", "paper", "--estimate", "--profile", "a100"],
                 ["orchestrate", "plan", "grids/paper.yaml", "--estimate", "--profile", "a100"]):  # the README's
        r = run(args, cwd=outside, env=env)
        assert r.returncode == 0, f"{' '.join(args)}: {r.stderr[-2000:]}"
        assert "321" in r.stdout and "GPU-h" in r.stdout, r.stdout[-2000:]
        assert "calibrations/a100-paper.json" in r.stdout, r.stdout[-2000:]  # the built-in calibration came too
    r = run(["asr-study", "orchestrate", "plan", "no-such-grid"], cwd=outside, env=env)
    assert r.returncode == 2 and "paper" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_status_of_a_sweep_the_checkout_made(installed: tuple[Path, Path], tmp_path: Path) -> None:
    venv, outside = installed
    made = run([sys.executable, "-c", "import sys; from orchestrate.tools.fake_sweep import make_fake_sweep; "
                "make_fake_sweep(sys.argv[1], 12, name='made-here', backend='local', "
                "mix=(('finished', 0.5), ('failed', 0.25), ('waiting', 0.25)))", str(tmp_path)], cwd=ROOT)
    assert made.returncode == 0, made.stderr
    r = run(["asr-study", "orchestrate", "status", "made-here", "--sweep-root", str(tmp_path)], cwd=outside,
            env=clean_env(venv))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "made-here" in r.stdout and "FINISHED" in r.stdout and "FAILED" in r.stdout, r.stdout[-2000:]


def test_the_server_script_runs_from_the_wheel(installed: tuple[Path, Path], tmp_path: Path) -> None:
    venv, outside = installed
    env = clean_env(venv)
    r = run(["asr-study", "mlflow-server", "--path"], cwd=outside, env=env)
    assert r.returncode == 0 and Path(r.stdout.strip()).is_relative_to(venv), r.stdout + r.stderr
    r = run(["asr-study", "mlflow-server", "--port", "nope"], cwd=outside, env=env)
    assert r.returncode == 2 and "--port 'nope' is not a port number" in r.stderr, r.stderr
    # a real server: the installation's mlflow (here borrowed, as the other dependencies are) is the one it runs
    mlflow = venv / "bin" / "mlflow"
    if not mlflow.exists():
        mlflow.symlink_to(Path(sys.executable).parent / "mlflow")
    folder = tmp_path / "server"
    r = run(["asr-study", "mlflow-server", "--dir", str(folder), "--port", str(free_port()), "--workers", "1",
             "--detach"], cwd=outside, env=env)
    try:
        assert r.returncode == 0, r.stderr[-2000:]
        uri = r.stdout.splitlines()[0].split("=", 1)[1]
        with urllib.request.urlopen(f"{uri}/health", timeout=10) as answer:
            assert answer.status == 200
    finally:
        run(["asr-study", "mlflow-server", "--dir", str(folder), "--stop"], cwd=outside, env=env)
