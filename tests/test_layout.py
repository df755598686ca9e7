"""The house rules of the layout, read from the source: no file over 500 lines, no import cycle (imports inside
functions and under ``TYPE_CHECKING`` included), no private name taken from another module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("asr_core", "orchestrate", "analysis", "asr_study")
MAX_LINES = 500


def _sources(*, tests: bool = False) -> list[Path]:
    roots = [ROOT / p for p in PACKAGES] + [ROOT / "scripts"] + ([ROOT / "tests"] if tests else [])
    return sorted(p for r in roots for p in r.rglob("*.py") if "__pycache__" not in p.parts)


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in _sources()}


def _imports(path: Path) -> list[tuple[str, str | None, int]]:
    """Every import in the file, wherever it stands: ``(module, name or None, line)``, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    me = _module(path).split(".")
    package = me if path.name == "__init__.py" else me[:-1]
    out: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            out += [(base, a.name, node.lineno) for a in node.names]
    return out


def _targets(module: str, name: str | None) -> list[str]:
    """The project modules an import statement loads: ``from pkg import mod`` loads ``pkg.mod``."""
    if name is not None and f"{module}.{name}" in MODULES:
        return [f"{module}.{name}"]
    return [module] if module in MODULES else []


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod, path in MODULES.items():
        for target, name, _ in _imports(path):
            graph[mod].update(t for t in _targets(target, name) if t != mod)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_file_is_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in _sources(tests=True)
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these files (at most {MAX_LINES} lines each): {long}"


def test_no_import_cycle_not_even_a_deferred_one():
    cycles = _cycles(_graph())
    assert not cycles, f"import cycles (each module of a group reaches the others): {cycles}"


def test_no_private_name_is_taken_from_another_module():
    taken = []
    for path in _sources(tests=True):
        me = _module(path) if path.parts[-2] != "tests" else None
        aliases: dict[str, str] = {}
        for module, name, line in _imports(path):
            for target in _targets(module, name):
                if name is None or target == f"{module}.{name}":
                    aliases[(name or module).split(".")[0] if name else module] = target
            if name and name.startswith("_") and not name.startswith("__") and _targets(module, None) \
                    and f"{module}.{name}" not in MODULES and module != me:
                taken.append(f"{path.relative_to(ROOT)}:{line} imports {module}.{name}")
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and aliases[node.value.id] != me):
                taken.append(f"{path.relative_to(ROOT)}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert not taken, "make these public (or move them to the module that uses them):\n" + "\n".join(taken)


@pytest.mark.parametrize("module", ["asr_core.outbox", "orchestrate.loadtest", "orchestrate.estimate",
                                    "orchestrate.grid_reference"])
def test_an_alias_kept_for_a_command_of_earlier_versions_still_runs(module):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr


def test_a_decode_job_queued_by_an_earlier_version_unpickles_and_says_what_to_do():
    import pickle

    from orchestrate.decode_jobs import DecodeTask

    task = pickle.loads(pickle.dumps(DecodeTask("/sweeps/s1", "beam-lm", "sub1")))
    with pytest.raises(RuntimeError, match=r"orchestrate evaluate /sweeps/s1 --spec"):
        task()
