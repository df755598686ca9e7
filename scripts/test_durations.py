"""Seconds each test module took in a run of the suite, from its JUnit report, for ``tests/durations.json``.

The suite starts its slowest modules first (tests/conftest.py), so that two workers end together instead of one
finishing a long test alone at the end. Refresh the file after a change that makes a module much slower or faster:

    ./scripts/test.sh --junitxml=artifacts/junit.xml
    .venv/bin/python scripts/test_durations.py artifacts/junit.xml > tests/durations.json
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def module_seconds(report: Path) -> dict[str, float]:
    """{test module's path: seconds its tests took}, slowest first, from a JUnit XML ``report``."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(report).iter("testcase"):
        module = (case.get("classname") or "").split(".")
        name = "/".join(m for m in module if not m[:1].isupper())  # a class inside the module is not a folder
        seconds[f"{name}.py"] += float(case.get("time") or 0.0)
    return {m: round(s, 1) for m, s in seconds.most_common()}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: scripts/test_durations.py JUNIT_XML (a report pytest wrote with --junitxml)", file=sys.stderr)
        return 2
    try:
        table = module_seconds(Path(argv[0]))
    except ET.ParseError as e:
        print(f"scripts/test_durations.py: {argv[0]} is not JUnit XML ({e})", file=sys.stderr)
        return 2
    print(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
