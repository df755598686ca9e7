"""``python -m analysis bench``: the report at the paper's scale, timed against a real MLflow server.

    python -m analysis bench [--runs 321 --runs 3000] [--out DIR] [--bootstrap N]

For each ``--runs N`` (default 321, then 3000): a fake ledger of the paper grid with N finished trials
(:mod:`analysis.bench_ledger`) is written to an ``mlflow server`` started on a free port of 127.0.0.1 by the
project's ``slurm/mlflow-server.sh`` (sqlite backend, served artifacts, its default workers), then
``python -m analysis report --no-log`` runs three times against it, each as its own process: cold (an empty cache,
every table downloaded), warm (the cache the first left: nothing changed, so the report is copied from its memo,
:mod:`analysis.memo`) and changed (one run given a new metric, as an evaluation would: that run's tables are
downloaded again and the report is computed from the cache). Printed: a table of runs, wall time of each, the peak memory of the largest (the report process and its comparison workers together), the share of the cold report's wall spent fetching from MLflow, and the goals of
issue 50 (321 runs: ≤ 60 s cold, ≤ 15 s warm; 3,000 runs: ≤ 300 s cold and ≤ 2 GiB) with met or not. Progress
lines go to stderr while the ledger is written. Everything lives in a temporary folder (``--out``: that folder,
kept) and the server is stopped at the end. Exit 0 when the benchmark ran (goals missed are said in the table), 1
when the server or a report failed (its output's tail is printed).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asr_core.runtime.signals import stop_group

GIB = 1024 ** 3
DEFAULT_RUNS = (321, 3000)
# runs -> (cold wall s, warm wall s, peak memory bytes): issue 50's goals; None where it sets none
GOALS: dict[int, tuple[float | None, float | None, int | None]] = {321: (60.0, 15.0, None),
                                                                    3000: (300.0, None, 2 * GIB)}
SERVER_START_S = 180.0
FETCHED = re.compile(r"fetched (\d+) runs from \S+ in ([0-9.]+) s")


class BenchError(RuntimeError):
    """The server did not start or a report failed; the message holds the tail of its output."""


@dataclass(frozen=True)
class Timing:
    """One report process: wall seconds, peak memory in bytes (the larger of the process's own peak RSS and the
    sampled peak of it and its workers together), seconds spent fetching (from its log), its output."""

    wall_s: float
    peak_rss: int
    fetch_s: float | None
    output: str


@dataclass(frozen=True)
class Row:
    """One size's figures."""

    runs: int
    build_s: float
    cold: Timing
    warm: Timing
    changed: Timing

    def verdict(self) -> str:
        """The goals for this size and whether each was met (``-`` where the issue sets none)."""
        cold, warm, rss = GOALS.get(self.runs, (None, None, None))
        parts = []
        if cold is not None:
            parts.append(f"cold ≤ {cold:.0f} s {'met' if self.cold.wall_s <= cold else 'NOT met'}")
        if warm is not None:
            parts.append(f"warm ≤ {warm:.0f} s {'met' if self.warm.wall_s <= warm else 'NOT met'}")
        if rss is not None:
            peak = max(self.cold.peak_rss, self.warm.peak_rss, self.changed.peak_rss)
            parts.append(f"≤ {rss / GIB:.0f} GiB {'met' if peak <= rss else 'NOT met'}")
        return ", ".join(parts) or "-"


def table(rows: list[Row]) -> str:
    """The benchmark's figures as a Markdown table."""
    lines = ["| runs | ledger built | wall cold | wall warm | wall, one run changed | peak memory "
             "| fetch share cold (warm) | goals |",
             "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        peak = max(r.cold.peak_rss, r.warm.peak_rss, r.changed.peak_rss) / 2 ** 20
        share = " ".join(f"{t.fetch_s / t.wall_s:.0%}" if t.fetch_s is not None else "?" for t in (r.cold, r.warm))
        cold, warm = share.split()
        lines.append(f"| {r.runs} | {r.build_s:.0f} s | {r.cold.wall_s:.1f} s | {r.warm.wall_s:.1f} s | "
                     f"{r.changed.wall_s:.1f} s | "
                     f"{peak:.0f} MiB | {cold} ({warm}) | {r.verdict()} |")
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``slurm/mlflow-server.sh`` on a free port of 127.0.0.1 with its store under ``folder``; (process, URI) once
    it answers ``/health``."""
    from orchestrate.assets import server_script

    port = _free_port()
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "server.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen(["bash", str(server_script()), "--dir", str(folder), "--host", "127.0.0.1",
                                 "--port", str(port)], stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=5) as resp:  # noqa: S310 - our own server
                if resp.status == 200:
                    return proc, uri
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    stop_group(proc)
    raise BenchError(f"the mlflow server did not start: {log.read_text(errors='replace')[-2000:]}")


def time_report(uri: str, experiment: str, out: Path, cache: Path, bootstrap: int) -> Timing:
    """One ``python -m analysis report --no-log`` in its own process: its wall time, its peak memory (:class:`TreeMemory`, and ``wait4``'s RSS) and
    the fetch time it logs."""
    cmd = [sys.executable, "-m", "analysis", "report", experiment, "--tracking-uri", uri, "--out", str(out),
           "--no-log", "--cache", str(cache), "--bootstrap", str(bootstrap)]
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "TQDM_DISABLE": "1"})
        tree = TreeMemory(proc.pid)
        tree.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
        tree.stop()
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        output = log.read().decode(errors="replace")
    if proc.returncode != 0:
        raise BenchError(f"`{' '.join(cmd)}` exited {proc.returncode}:\n{output[-3000:]}")
    m = FETCHED.search(output)
    return Timing(wall, max(usage.ru_maxrss * 1024, tree.peak), float(m.group(2)) if m else None, output)


class TreeMemory(threading.Thread):
    """The peak, over samples 4 times a second, of the memory of process ``pid`` and its descendants (the report
    and its comparison workers) together: each process's proportional set size (``Pss`` of
    ``/proc/PID/smaps_rollup``, pages shared by forked workers counted once in all), its RSS where that is not
    readable. 0 where ``/proc`` is not there."""

    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s, self.peak = pid, every_s, 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.every_s):
            self.peak = max(self.peak, sum(_memory(p) for p in _tree(self.pid)))

    def stop(self) -> None:
        self._done.set()
        self.join()


def _tree(root: int) -> list[int]:
    """``root`` and every process below it, from ``/proc/*/stat``."""
    parent: dict[int, int] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    out, frontier = [root], [root]
    while frontier:
        frontier = [p for p, pp in parent.items() if pp in frontier]
        out.extend(frontier)
    return out


def _memory(pid: int) -> int:
    """Bytes: the process's Pss, else its RSS, else 0 (it ended)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def touch_one_run(uri: str, experiment: str) -> None:
    """Log a new metric to the first finished trial run of ``experiment``, as an evaluation of a new condition
    would: that run's cached tables and the report's memo no longer match."""
    from mlflow.tracking import MlflowClient

    from asr_core.contract.trial import FINISHED, ROLE_TRIAL, TAG_ROLE

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], f"attributes.status = '{FINISHED}' and tags.`{TAG_ROLE}` = "
                              f"'{ROLE_TRIAL}'", max_results=1)
    if not runs:
        raise BenchError(f"no finished trial run in {experiment!r} to change")
    client.log_metric(runs[0].info.run_id, "bench/changed", 1.0)


def bench(sizes: list[int], folder: Path, bootstrap: int, rows: list[Row] | None = None) -> list[Row]:
    """The benchmark of each size in ``sizes`` with its files under ``folder``; one server for all. Each size's
    row is appended to ``rows`` as soon as it is measured (so a later failure keeps it)."""
    from analysis.bench_ledger import build_ledger

    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    say(f"bench: starting an mlflow server under {folder}")
    proc, uri = start_server(folder / "server")
    rows = [] if rows is None else rows
    try:
        for n in sizes:
            name = f"bench-{n}-{int(time.time())}"
            t0 = time.monotonic()
            build_ledger(uri, name, n, say=say)
            built = time.monotonic() - t0
            cache = folder / f"cache-{n}"
            say(f"bench: {n} runs: report, cold cache")
            cold = time_report(uri, name, folder / f"report-{n}-cold", cache, bootstrap)
            say(f"bench: {n} runs: cold {cold.wall_s:.1f} s; report, warm cache")
            warm = time_report(uri, name, folder / f"report-{n}-warm", cache, bootstrap)
            say(f"bench: {n} runs: warm {warm.wall_s:.1f} s; one run given a new metric, report again")
            touch_one_run(uri, name)
            changed = time_report(uri, name, folder / f"report-{n}-changed", cache, bootstrap)
            say(f"bench: {n} runs: one run changed {changed.wall_s:.1f} s")
            rows.append(Row(n, built, cold, warm, changed))
    finally:
        stop_group(proc)
    return rows


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``bench`` subcommand of ``python -m analysis`` (``sub``: its parser's subparsers)."""
    from analysis.ledger.defaults import BOOTSTRAP_RESAMPLES

    b = sub.add_parser("bench", help="time the report on a fake paper-grid ledger in a real MLflow server",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--runs", type=int, action="append", default=None, metavar="N",
                   help="trial runs in the fake ledger (repeatable; default: 321, then 3000)")
    b.add_argument("--out", default=None, help="keep the server, ledger, reports and caches in this folder "
                                               "(default: a temporary folder, removed)")
    b.add_argument("--bootstrap", type=int, default=BOOTSTRAP_RESAMPLES,
                   help=f"bootstrap resamples of the reports (default {BOOTSTRAP_RESAMPLES})")
    return b


def run_bench(args: argparse.Namespace) -> int:
    """``python -m analysis bench``: 2 on a bad option (one line), 1 when the bench failed, else 0."""
    sizes = args.runs or list(DEFAULT_RUNS)
    bad = [n for n in sizes if n < 2]
    if bad:
        print(f"error: --runs {bad[0]}: give a number of trial runs of at least 2", file=sys.stderr)
        return 2
    if args.bootstrap < 100:
        print(f"error: --bootstrap {args.bootstrap}: give at least 100 resamples", file=sys.stderr)
        return 2
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"error: --out {args.out} is a file; give a folder (made if missing)", file=sys.stderr)
        return 2
    rows: list[Row] = []
    try:
        if args.out is not None:
            bench(sizes, Path(args.out).resolve(), args.bootstrap, rows)
        else:
            with tempfile.TemporaryDirectory(prefix="analysis-bench-") as tmp:
                bench(sizes, Path(tmp), args.bootstrap, rows)
    except BenchError as e:
        if rows:
            print(table(rows))
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(table(rows))
    return 0
