#!/usr/bin/env python
"""Does the quick demo learn on every instruction set? Trains it under each CPU kernel level this machine has and
prints every model's WER per level.

    .venv/bin/python scripts/capability_check.py [--levels default,avx2,avx512] [--blas] [--out DIR] [--full]

PyTorch picks its CPU kernels by instruction set (``ATEN_CPU_CAPABILITY``: ``default``, ``avx2``, ``avx512`` on
x86; the best the CPU has unless set), and kernels of different levels sum in different orders: the same code, seed
and corpus give other weights from a few dozen steps on. A model that learns on one CPU and stays on the CTC blank
plateau on another makes the suite red there, so a change to the demo, the trainer or the model is judged here
before it lands: ``./scripts/demo.sh --quick`` runs once per level (``ATEN_CPU_CAPABILITY`` set for the demo and
every trial it starts), each in its own folder, and the table gives each model's clean in-domain WER per level, the
spread across levels and the margin to the bar ``tests/test_demo.py`` holds every quick-demo model to.

ATEN_CPU_CAPABILITY covers PyTorch's own kernels; its matrix products go to MKL and oneDNN, which pick their code
by the CPU whatever that variable says. ``--blas`` caps them at the level too (``MKL_ENABLE_INSTRUCTIONS``,
``ONEDNN_MAX_CPU_ISA``): nearer to what a CPU of that kind runs, a second family of summation orders to pass.

``--full`` runs the full demo (``./scripts/demo.sh``, 14-19 minutes a level on 2 cores) instead: the README's
table with a column per level. ``--levels`` picks levels (default: every level up to the machine's own). A level
is refused when this CPU lacks it (PyTorch would fall back to a lower one without saying so).

Exit 0 when every model of every level is under the bar, 1 when one is not, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from asr_core.contract.provenance import X86_LEVELS, cpu_model  # noqa: E402
from tests.plugins.demo import QUICK_DEMO_LEARNED_WER  # noqa: E402  the bar the suite holds the quick demo to

# --blas: the caps of MKL and oneDNN that match each x86 level (their own names for the instruction sets)
BLAS_CAPS = {"default": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
             "avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
             "avx512": {"MKL_ENABLE_INSTRUCTIONS": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}}


def machine_level(python: str) -> str:
    """The kernel level PyTorch picks on this CPU when ``ATEN_CPU_CAPABILITY`` is not set."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    out = subprocess.run([python, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().lower()


def available_levels(best: str) -> list[str]:
    """Every level at or below ``best`` (x86: default < avx2 < avx512); elsewhere ``default`` and ``best``."""
    if best in X86_LEVELS:
        return list(X86_LEVELS[: X86_LEVELS.index(best) + 1])
    return ["default"] if best == "default" else ["default", best]


def wers(root: Path, sweep: str) -> dict[str, float]:
    """{run name: clean in-domain WER} of the sweep's trial runs (100 where a run logged none)."""
    db = sqlite3.connect(root / "runs" / "mlflow.db")
    rows = db.execute(
        "SELECT r.name, (SELECT m.value FROM latest_metrics m WHERE m.run_uuid = r.run_uuid AND m.key = 'wer/test') "
        "FROM runs r JOIN experiments e ON r.experiment_id = e.experiment_id "
        "JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'sweep.role' AND t.value = 'trial' "
        "WHERE e.name = ? AND r.lifecycle_stage = 'active'", (sweep,)).fetchall()
    return {name: (100.0 if w is None else float(w)) for name, w in rows}


def level_env(level: str, blas: bool) -> dict[str, str]:
    """The variables that put PyTorch (and, with ``blas``, MKL and oneDNN) on ``level``."""
    return {"ATEN_CPU_CAPABILITY": level, **(BLAS_CAPS.get(level, {}) if blas else {})}


def run_level(level: str, out: Path, full: bool, blas: bool = False) -> tuple[dict[str, float], float, str]:
    """Run the demo under ``level`` into ``out``; returns the WERs, the seconds and the demo's corpus line."""
    env = {**os.environ, **level_env(level, blas), "DEMO_OUT": str(out), "PYTHONUNBUFFERED": "1"}
    log = out.with_suffix(".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    args = [str(REPO / "scripts" / "demo.sh")] + ([] if full else ["--quick"])
    with log.open("w") as f:
        proc = subprocess.run(args, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - start
    text = log.read_text()
    if proc.returncode != 0:
        raise SystemExit(f"[check] the demo failed under ATEN_CPU_CAPABILITY={level} (exit {proc.returncode}); "
                         f"its output: {log}")
    said = re.search(r"^kernels: .*$", text, re.M)
    if said is None or f"kernels: {level} " not in said.group(0) + " ":
        raise SystemExit(f"[check] the demo under ATEN_CPU_CAPABILITY={level} did not run on that level "
                         f"({said.group(0) if said else 'no kernels line'}); its output: {log}")
    corpus = re.search(r"corpus audio sha256[^:]*: (\w+)", text)
    sweep = "demo" if full else "demo-quick"
    return wers(out / sweep, sweep), seconds, corpus.group(1) if corpus else "?"


def table(results: dict[str, dict[str, float]], bar: float | None) -> list[str]:
    """Markdown rows: one per model, one column per level, then the spread and (quick demo) the margin."""
    levels = list(results)
    models = sorted({m for r in results.values() for m in r}, key=lambda n: (float(n.split("s")[0]), n))
    head = ["model"] + [f"{lv}" for lv in levels] + ["spread"] + (["margin to the bar"] if bar else [])
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in models:
        vals = [results[lv].get(m) for lv in levels]
        known = [v for v in vals if v is not None]
        cells = [m] + [("—" if v is None else f"{v:.1f}%") for v in vals]
        cells.append(f"{max(known) - min(known):.1f}" if known else "—")
        if bar:
            cells.append(f"{bar - max(known):.1f}" if known else "—")
        rows.append("| " + " | ".join(cells) + " |")
    means = []
    for lv in levels:
        vals = list(results[lv].values())
        means.append(f"{sum(vals) / len(vals):.1f}%" if vals else "—")
    rows.append("| mean | " + " | ".join(means) + " | " + " | ".join([""] * (2 if bar else 1)) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", help="comma-separated kernel levels (default: every level this CPU has)")
    ap.add_argument("--out", type=Path, help="where the demos are written (default: a temporary folder)")
    ap.add_argument("--full", action="store_true", help="the full demo (14-19 min a level) instead of --quick")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    ap.add_argument("--blas", action="store_true", help="cap MKL and oneDNN at each level too")
    args = ap.parse_args(argv)
    python = str(REPO / ".venv" / "bin" / "python")
    if not Path(python).exists():
        python = sys.executable
    best = machine_level(python)
    have = available_levels(best)
    levels = have if not args.levels else [s.strip().lower() for s in args.levels.split(",") if s.strip()]
    bad = [lv for lv in levels if lv not in have]
    if bad or not levels:
        print(f"capability_check: --levels {args.levels!r}: {', '.join(bad) or 'none given'} not available on this "
              f"CPU; valid: {', '.join(have)}", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="capability-check-"))
    bar = None if args.full else QUICK_DEMO_LEARNED_WER
    print(f"[check] CPU: {cpu_model()}; its own level: {best}; levels: {', '.join(levels)}; output: {out}",
          flush=True)
    results: dict[str, dict[str, float]] = {}
    for lv in levels:
        name = f"{lv}+blas" if args.blas else lv
        said = " ".join(f"{k}={v}" for k, v in level_env(lv, args.blas).items())
        print(f"[check] {'full' if args.full else 'quick'} demo under {said} ...", flush=True)
        results[name], seconds, audio = run_level(lv, out / name, args.full, args.blas)
        shown = ", ".join(f"{m} {w:.1f}%" for m, w in sorted(results[name].items()))
        print(f"[check]   {seconds:.0f} s, corpus audio {audio}: {shown}", flush=True)
    print()
    print("\n".join(table(results, bar)))
    if bar is None:
        return 0
    over = [(lv, m, w) for lv, r in results.items() for m, w in r.items() if w >= bar]
    if over:
        print(f"\n[check] NOT LEARNED (WER >= {bar:g}%): " + ", ".join(f"{m} under {lv} ({w:.1f}%)"
                                                                     for lv, m, w in over))
        return 1
    worst = max(w for r in results.values() for w in r.values())
    print(f"\n[check] every model learned under every level: worst {worst:.1f}%, bar {bar:g}%, "
          f"margin {bar - worst:.1f} points")
    if not args.out and not args.keep:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
