"""scripts/capability_check.py, the check that the quick demo learns under every CPU kernel level: its pure parts
(the levels a CPU has, the table, the WERs read from a demo's ledger) and its refusal of a level the CPU lacks."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "capability_check.py"
_spec = importlib.util.spec_from_file_location("capability_check", SCRIPT)
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


@pytest.mark.parametrize(("best", "levels"), [
    ("avx512", ["default", "avx2", "avx512"]), ("avx2", ["default", "avx2"]), ("default", ["default"]),
    ("sve256", ["default", "sve256"])])
def test_every_level_up_to_the_cpus_own(best: str, levels: list[str]) -> None:
    assert check.available_levels(best) == levels


def test_the_table_gives_each_model_per_level_its_spread_and_margin() -> None:
    rows = check.table({"default": {"5s s1": 76.2, "10s s1": 80.1}, "avx2": {"5s s1": 76.7, "10s s1": 100.0}}, 95.0)
    assert rows[0] == "| model | default | avx2 | spread | margin to the bar |"
    assert rows[2] == "| 5s s1 | 76.2% | 76.7% | 0.5 | 18.3 |"  # the shorter context first
    assert rows[3] == "| 10s s1 | 80.1% | 100.0% | 19.9 | -5.0 |"  # the worst level decides the margin
    assert rows[4].startswith("| mean | 78.2% | 88.3% |") and rows[4].count("|") == rows[0].count("|")


def test_wers_are_read_from_the_demos_ledger(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    (tmp_path / "runs").mkdir()
    client = MlflowClient(uri)
    exp = client.create_experiment("demo-quick", artifact_location=(tmp_path / "art").as_uri())
    for name, wer, role in (("5s s1", 80.5, "trial"), ("10s s1", None, "trial"), ("demo-quick", 1.0, "sweep")):
        run = client.create_run(exp, run_name=name, tags={"sweep.role": role})
        if wer is not None:
            client.log_metric(run.info.run_id, "wer/test", wer)
    other = client.create_experiment("other", artifact_location=(tmp_path / "art2").as_uri())
    client.create_run(other, run_name="5s s9", tags={"sweep.role": "trial"})
    assert check.wers(tmp_path, "demo-quick") == {"5s s1": 80.5, "10s s1": 100.0}  # a run with no WER: not learned


def test_a_level_the_cpu_lacks_is_refused_with_exit_2() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--levels", "avx1024"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "avx1024 not available on this CPU; valid: default" in done.stderr
    assert "Traceback" not in done.stderr


def test_blas_caps_mkl_and_onednn_at_the_level_too() -> None:
    assert check.level_env("avx2", False) == {"ATEN_CPU_CAPABILITY": "avx2"}
    assert check.level_env("avx2", True) == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                                            "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert check.level_env("default", True)["MKL_ENABLE_INSTRUCTIONS"] == "SSE4_2"
    assert check.level_env("sve256", True) == {"ATEN_CPU_CAPABILITY": "sve256"}  # no caps known off x86
