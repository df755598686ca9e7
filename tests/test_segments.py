"""A trial segment's record says which CPU kernels trained it: written, read back, and read from older files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asr_core.contract.folder.segments import Segment, append_segment, kernel_levels, read_segments
from asr_core.contract.provenance import cpu_kernels, cpu_model


def test_a_segment_keeps_its_kernel_level_and_cpu(tmp_path: Path) -> None:
    seg = Segment(number=1, time=1.5, code="abc", host="node", kernels="avx2", cpu="AMD EPYC 7763")
    append_segment(tmp_path, seg)
    (back,) = read_segments(tmp_path)
    assert back == seg and json.loads((tmp_path / "segments.jsonl").read_text())["kernels"] == "avx2"


def test_a_record_written_before_the_fields_existed_reads_as_unknown(tmp_path: Path) -> None:
    (tmp_path / "segments.jsonl").write_text(json.dumps({"segment": 1, "time": 1.0, "code": "abc", "host": "n"}) + "\n")
    (old,) = read_segments(tmp_path)
    assert (old.kernels, old.cpu) == ("", "")
    assert kernel_levels([old]) == ()


def test_kernel_levels_are_distinct_in_first_use_order() -> None:
    segs = [Segment(number=i, kernels=k) for i, k in enumerate(["avx512", "", "avx2", "avx512"], 1)]
    assert kernel_levels(segs) == ("avx512", "avx2")


@pytest.mark.parametrize("level", ["default", "avx2"])
def test_the_recorded_level_is_the_one_torch_runs_with(level: str) -> None:
    """ATEN_CPU_CAPABILITY lowers the kernels torch picks; the record names the level that ran, not the CPU's best."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the x86 kernel levels")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": level}
    out = subprocess.run([sys.executable, "-c", "from asr_core.contract.provenance import cpu_kernels; "
                          "print(cpu_kernels())"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == level


def test_this_process_names_a_level_and_a_cpu() -> None:
    assert cpu_kernels() and cpu_model()
