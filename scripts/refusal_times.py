#!/usr/bin/env python
"""How long each bad-input refusal takes (issue 31: every one in under 3 s): the cases of the table that
``tests/test_bad_inputs.py`` checks (``tests/plugins/bad_inputs.py``), each run as the real command in a scratch folder,
timed by the CPU time of the child process (user + system) and by the wall clock.

    .venv/bin/python scripts/refusal_times.py [--baseline DIR] [--code DIR] [--only ID ...] [--repeat N] [--limit-s 3]

Prints a markdown table (case, command, exit status, CPU s, wall s, under the limit, whether the refusal is still
right: exit 2, no traceback, the bad file/key/value named) and a summary line naming the slowest case. The test
checks the answers; this script owns the speed target (a timed test on a shared machine would be flaky).

``--baseline DIR`` also runs every case with ``DIR`` on ``PYTHONPATH`` instead of this checkout (a copy of the
packages as they were, e.g. ``git archive COMMIT asr_core orchestrate analysis asr_study | tar -x -C DIR``) and shows
its figures beside ("before" and "after" columns); the two runs of a case follow each other, so load on a shared
machine falls on both alike. ``--code DIR`` times a copy in place of this checkout (e.g. the baseline with only
some files changed, where others change the checkout meanwhile). ``--repeat N`` runs each case N times and keeps the least CPU time (and the wall time of
that run). Exit status 0 when every case refuses rightly under the limit, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.plugins.bad_inputs import CASES, Case, Ran, case_args, make_scratch, problems, run_tool  # noqa: E402

LIMIT_S = 3.0  # issue 31: "in under 3 s each"
COMMAND_WIDTH = 72


def timed(case: Case, scratch: Path, repo: Path, tag: str, repeat: int) -> Ran:
    """The case's run with the least CPU time of ``repeat`` runs, each in a fresh folder, ``repo`` on the path."""
    runs = []
    for i in range(repeat):
        work = scratch / "work" / f"{case.id}-{tag}-{i}"
        work.mkdir(parents=True)
        runs.append(run_tool(case.tool, case_args(case, scratch), work, repo=repo))
    return min(runs, key=lambda r: r.cpu_s)


def command(case: Case) -> str:
    """``tool args`` as the table shows it: ``{d}`` is the scratch folder, long lines cut."""
    text = " ".join((case.tool,) + case.args).replace("|", "\\|")
    return text if len(text) <= COMMAND_WIDTH else text[:COMMAND_WIDTH - 1] + "…"


def cells(ran: Ran, case: Case, scratch: Path, limit: float) -> list[str]:
    """exit, CPU s, wall s, under the limit, right refusal."""
    wrong = problems(case, scratch, ran)
    return [str(ran.returncode), f"{ran.cpu_s:.2f}", f"{ran.wall_s:.2f}", "yes" if ran.cpu_s < limit else "**no**",
            "yes" if not wrong else "**no**: " + "; ".join(wrong).replace("|", "\\|").replace(str(scratch), "{d}")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, metavar="DIR", help="a copy of the packages to time beside this checkout ('before')")
    ap.add_argument("--code", type=Path, default=REPO, metavar="DIR",
                    help="the packages timed as 'after' (default: this checkout)")
    ap.add_argument("--only", nargs="+", metavar="ID", help="only these cases (ids of the table)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N", help="runs per case, the least CPU time kept (default 1)")
    ap.add_argument("--limit-s", type=float, default=LIMIT_S, metavar="S", help=f"the target, CPU s (default {LIMIT_S:g})")
    args = ap.parse_args(argv)
    ids = {c.id for c in CASES}
    unknown = sorted(set(args.only or ()) - ids)
    if unknown:
        print(f"refusal_times: unknown case {', '.join(unknown)}; valid: {', '.join(sorted(ids))}", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print(f"refusal_times: --repeat {args.repeat} must be at least 1", file=sys.stderr)
        return 2
    for flag, folder in (("--baseline", args.baseline), ("--code", args.code)):
        if folder is not None and not (folder / "asr_core" / "__main__.py").is_file():
            print(f"refusal_times: {flag} {folder}: no asr_core/__main__.py there (a copy of the packages)",
                  file=sys.stderr)
            return 2
    cases = [c for c in CASES if not args.only or c.id in args.only]
    columns = ["exit", "CPU s", "wall s", f"< {args.limit_s:g} s", "right refusal"]
    header = ["case", "command"] + ([f"before {c}" for c in columns[:4]] if args.baseline else []) + columns
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    after: list[tuple[Case, Ran, bool]] = []
    before: list[Ran] = []
    # the checkpoints of the scratch folder are written by the code timed as 'after', so that it reads them
    sys.path.insert(0, str(args.code.resolve()))
    with tempfile.TemporaryDirectory(prefix="refusal-times-") as tmp:
        scratch = make_scratch(Path(tmp))
        for case in cases:
            row = [case.id, f"`{command(case)}`"]
            if args.baseline is not None:
                old = timed(case, scratch, args.baseline.resolve(), "before", args.repeat)
                before.append(old)
                row += cells(old, case, scratch, args.limit_s)[:4]
            ran = timed(case, scratch, args.code.resolve(), "after", args.repeat)
            row += cells(ran, case, scratch, args.limit_s)
            after.append((case, ran, not problems(case, scratch, ran)))
            print("| " + " | ".join(row) + " |", flush=True)
    slow = [(c, r) for c, r, _ in after if r.cpu_s >= args.limit_s]
    wrong = [c.id for c, _, right in after if not right]
    worst_case, worst = max(((c, r) for c, r, _ in after), key=lambda cr: cr[1].cpu_s)
    print()
    if before:
        old_worst = max(before, key=lambda r: r.cpu_s)
        old_over = sum(r.cpu_s >= args.limit_s for r in before)
        print(f"before: slowest {old_worst.cpu_s:.2f} s of CPU; {old_over} of {len(before)} at or over "
              f"{args.limit_s:g} s; total {sum(r.cpu_s for r in before):.1f} s of CPU")
    print(f"{len(after)} cases: slowest {worst_case.id} ({worst.cpu_s:.2f} s of CPU, {worst.wall_s:.2f} s wall); "
          f"{len(slow)} at or over {args.limit_s:g} s{': ' + ', '.join(c.id for c, _ in slow) if slow else ''}; "
          f"total {sum(r.cpu_s for _, r, _ in after):.1f} s of CPU; "
          f"{'every refusal right' if not wrong else 'wrong refusals: ' + ', '.join(wrong)}")
    return 0 if not slow and not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
