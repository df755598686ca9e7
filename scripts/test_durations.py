"""Seconds each test took in a run of the suite, from its JUnit report, for ``tests/durations.json``.

The fast tier (``./scripts/test.sh fast``) leaves out every test that took ``FAST_LIMIT_S`` (tests/conftest.py) or
more there. Refresh it after a change that makes tests much slower or faster:

    ./scripts/test.sh --junitxml=artifacts/junit.xml
    .venv/bin/python scripts/test_durations.py artifacts/junit.xml > tests/durations.json
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

KEEP_S = 1.0  # tests faster than this are left out of the file


def node_id(classname: str, name: str) -> str:
    """pytest's node id of a JUnit test case: ``tests.test_a.TestB``, ``test_c[x]@group`` ->
    ``tests/test_a.py::TestB::test_c[x]`` (the xdist group suffix dropped)."""
    parts = classname.split(".")
    module = [p for p in parts if not p[:1].isupper()]
    classes = [p for p in parts if p[:1].isupper()]
    return "::".join(["/".join(module) + ".py", *classes, name.split("@", 1)[0]])


def durations(report: Path) -> dict[str, float]:
    """{test node id: seconds} of the tests that took :data:`KEEP_S` or more, slowest first, from a JUnit XML
    ``report``."""
    tests: Counter[str] = Counter()
    for case in ET.parse(report).iter("testcase"):
        tests[node_id(case.get("classname") or "", case.get("name") or "")] += float(case.get("time") or 0.0)
    return {t: round(s, 1) for t, s in tests.most_common() if s >= KEEP_S}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="scripts/test_durations.py", description=__doc__.split("\n\n")[0])
    p.add_argument("junit_xml", help="a report pytest wrote with --junitxml")
    args = p.parse_args(argv)
    try:
        table = durations(Path(args.junit_xml))
    except (OSError, ET.ParseError) as e:
        print(f"scripts/test_durations.py: {args.junit_xml} is not a readable JUnit XML report ({e})", file=sys.stderr)
        return 2
    print(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
