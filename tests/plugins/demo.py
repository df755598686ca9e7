"""The quick demo, run once per test session exactly as the README says (``./scripts/demo.sh --quick``).

Set ``DEMO_TEST_OUT`` to keep its output between sessions (a rerun then reuses the finished trials)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# clean in-domain WER every quick-demo model must be under: it transcribes, off the CTC blank plateau, whatever the
# CPU's kernel level (scripts/capability_check.py measures the margin per level)
QUICK_DEMO_LEARNED_WER = 95.0


@dataclass
class DemoRun:
    returncode: int
    output: str
    seconds: float


@dataclass
class QuickDemo:
    out: Path  # DEMO_OUT given to the script
    first: DemoRun

    @property
    def root(self) -> Path:
        return self.out / "demo-quick"

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{(self.root / 'runs' / 'mlflow.db').resolve()}"

    def rerun(self) -> DemoRun:
        return run_demo(self.out)


def run_demo(out: Path) -> DemoRun:
    start = time.monotonic()
    env = {**os.environ, "DEMO_OUT": str(out), "PYTHONUNBUFFERED": "1"}
    log = out.with_suffix(".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:  # streamed to a file so a hung demo still leaves its progress behind
        proc = subprocess.run([str(REPO / "scripts" / "demo.sh"), "--quick"], cwd=REPO, env=env, stdout=f,
                              stderr=subprocess.STDOUT, timeout=2700)
    return DemoRun(proc.returncode, log.read_text(), time.monotonic() - start)


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuickDemo]:
    out = Path(os.environ["DEMO_TEST_OUT"]) if os.environ.get("DEMO_TEST_OUT") else \
        tmp_path_factory.mktemp("demo") / "out"
    yield QuickDemo(out, run_demo(out))
