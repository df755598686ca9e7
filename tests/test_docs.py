"""The documentation checked against the code: the README stays a short manual, docs/commands.md is what the
commands' ``--help`` print, docs/ARCHITECTURE.md names every module, every relative link resolves, and every command
output quoted as live is what the command prints now (the rest are marked as examples of a dated results page).

Fast and local: no SLURM, no GPU, no network; two subprocesses (the generator and one ``orchestrate plan``).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PACKAGES = ("asr_core", "orchestrate", "analysis", "asr_study")
README_MAX_LINES = 150
FIRST_LINES = 40
REGENERATE = ".venv/bin/python scripts/commands_doc.py > docs/commands.md"
LIVE = re.compile(r"<!-- live: (.+?) -->")
EXAMPLE = re.compile(r"<!-- example: (\S+) -->")
FIGURE = "<!-- figure -->"
FENCE_LANGUAGES = {"sh", "yaml", "text"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    """README.md and every page under docs/."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def _manual_pages() -> list[Path]:
    """The pages whose quoted outputs must be live or marked: README.md and docs/*.md but the generated one (the
    dated pages under docs/results/ are records of their run by name)."""
    return [README, *sorted(p for p in DOCS.glob("*.md") if p.name != "commands.md")]


# ---- (a) the README is a manual -------------------------------------------------------------------------------------
def test_readme_is_short_with_demo_and_tests_first() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move " \
                                           f"details to docs/"
    head = "\n".join(lines[:FIRST_LINES])
    for command in ("scripts/setup.sh", "./scripts/demo.sh", "./scripts/test.sh",
                    "./scripts/test.sh fast"):
        assert command in head, f"README.md: {command!r} is not in its first {FIRST_LINES} lines"


def _documented_commands() -> list[str]:
    """Each command of docs/commands.md as the README's table names it: the program and its first word."""
    out = []
    for heading in re.findall(r"^### `(.+?)`$", (DOCS / "commands.md").read_text(), re.M):
        words = heading.replace(" --help", "").replace(" (its header)", "").split()
        if words[:2] == ["python", "-m"]:
            words = words[2:]
        out.append(" ".join(words[:2]))
    return sorted(set(out))


def test_readme_table_names_every_command() -> None:
    readme = README.read_text()
    missing = [c for c in _documented_commands() if c not in readme]
    assert not missing, f"commands in docs/commands.md that README.md's table of commands lacks: {missing}"


# ---- (b) docs/commands.md is generated --------------------------------------------------------------------------------
def test_commands_page_is_generated_from_help() -> None:
    done = subprocess.run([sys.executable, "scripts/commands_doc.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"scripts/commands_doc.py failed:\n{done.stderr[-3000:]}"
    current = (DOCS / "commands.md").read_text()
    if current != done.stdout:
        diff = "".join(list(difflib.unified_diff(current.splitlines(True), done.stdout.splitlines(True),
                                                 "docs/commands.md", "generated"))[:60])
        pytest.fail(f"docs/commands.md differs from the commands' --help texts; regenerate it:\n    {REGENERATE}\n"
                    f"{diff}")



def test_grid_format_page_is_generated_from_the_reader() -> None:
    """docs/grid-format.md is what :mod:`orchestrate.plan.grid_reference` prints from the grid reader's own tables."""
    from orchestrate.plan.grid_reference import REGENERATE as REGENERATE_GRID, render

    current, generated = (DOCS / "grid-format.md").read_text(), render()
    if current != generated:
        diff = "".join(list(difflib.unified_diff(current.splitlines(True), generated.splitlines(True),
                                                 "docs/grid-format.md", "generated"))[:60])
        pytest.fail(f"docs/grid-format.md differs from the grid reader's tables; regenerate it:\n    "
                    f"{REGENERATE_GRID}\n{diff}")


def test_grid_format_page_lists_every_key_the_reader_accepts() -> None:
    from orchestrate.plan.grid_file import SUBGRID_KEYS, TOP_KEYS

    page = (DOCS / "grid-format.md").read_text()
    top, sub = page.split("## Sub-grid keys")
    assert all(f"| `{k}` |" in top for k in TOP_KEYS) and all(f"| `{k}` |" in sub for k in SUBGRID_KEYS)

# ---- (c) ARCHITECTURE.md names every module ----------------------------------------------------------------------
def test_architecture_names_every_module() -> None:
    text = (DOCS / "ARCHITECTURE.md").read_text()
    missing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            named = f"`{rel.parent.as_posix()}/`" if path.name == "__init__.py" else f"`{rel.as_posix()}`"
            if named not in text:
                missing.append(named)
    assert not missing, f"docs/ARCHITECTURE.md does not name these modules (one table row each): {missing}"


def test_architecture_keeps_the_headings_code_points_to() -> None:
    headings = re.findall(r"^#+ (.+)$", (DOCS / "ARCHITECTURE.md").read_text(), re.M)
    for wanted in ("MLflow ledger schema", "Trial contract", "Trial identity", "Evaluation contract", "Model contract",
                   "Planted cue", "Evaluations", "orchestrate"):
        assert any(h.startswith(wanted) for h in headings), f"heading {wanted!r} is gone"


def test_cluster_page_lists_every_profile_field() -> None:
    from orchestrate.plan.profile import Profile

    page = (DOCS / "cluster.md").read_text()
    fields = {f.name for f in dataclasses.fields(Profile)} - {"name"}
    shipped = set()
    for path in (ROOT / "slurm" / "profiles").glob("*.yaml"):
        shipped |= set(re.findall(r"^(\w+):", path.read_text(), re.M))
    missing = sorted(k for k in fields | shipped if f"| `{k}` |" not in page)
    assert not missing, f"docs/cluster.md's profiles reference lacks the fields {missing}"


# ---- (d) links ------------------------------------------------------------------------------------------------------
def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_resolve() -> None:
    broken = []
    for page in _pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md":
                anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), re.M)}
                if anchor not in anchors:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "links to files or headings that do not exist:\n" + "\n".join(broken)


def test_results_pages_are_dated_and_say_where_they_come_from() -> None:
    pages = sorted((DOCS / "results").glob("*.md"))
    assert pages, "docs/results/ has no page"
    for page in pages:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md", page.name), f"{page.name}: not YYYY-MM-DD-topic.md"
        text = page.read_text()
        for field in ("**Recorded in:**", "**Machine:**", "**CPU kernels:**", "**Command:**"):
            assert field in text, f"{page.relative_to(ROOT)} does not say {field}"


def test_readme_results_come_from_their_dated_page() -> None:
    """Every percentage in a README table is on the dated results page the paragraph above it links."""
    lines = README.read_text().splitlines()
    source = None
    for line in lines:
        if not line.startswith("|"):
            found = re.findall(r"\((docs/results/[^)]+\.md)\)", line)
            source = found[-1] if found else (source if line.strip() else source)
            continue
        figures = re.findall(r"\d+\.\d+%", line)
        if figures:
            assert source, f"README.md: a table of results with no dated page linked above it: {line}"
            page = (ROOT / source).read_text()
            assert all(f in page for f in figures), f"README.md: {line} is not what {source} says"


# ---- (e) quoted outputs are live, or marked as examples of a dated page -------------------------------------------
def _blocks(page: Path) -> list[tuple[str, str, list[str]]]:
    """Every fenced block of ``page``: (language, the marker line above it, its lines)."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            language = lines[i][3:].strip()
            above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            out.append((language, above.strip(), lines[i + 1:j]))
            i = j
        i += 1
    return out


def _live_blocks() -> list[tuple[Path, str, list[str]]]:
    found = []
    for page in _manual_pages():
        for language, above, body in _blocks(page):
            match = LIVE.fullmatch(above)
            if match:
                found.append((page, match.group(1), body))
    return found


def test_every_quoted_output_is_live_or_marked() -> None:
    problems = []
    for page in _manual_pages():
        for language, above, body in _blocks(page):
            where = f"{page.relative_to(ROOT)}: block after {above[:60]!r}"
            if language not in FENCE_LANGUAGES:
                problems.append(f"{where}: language {language!r}; use sh (commands), yaml or text (outputs)")
            elif language == "text":
                example = EXAMPLE.fullmatch(above)
                if example:
                    if not re.fullmatch(r"(\.\./)?(docs/)?results/\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md", example.group(1)):
                        problems.append(f"{where}: an example must name its dated page under docs/results/")
                elif not (LIVE.fullmatch(above) or above == FIGURE):
                    problems.append(f"{where}: a quoted output needs <!-- live: COMMAND --> (checked here) or "
                                    f"<!-- example: docs/results/DATE-TOPIC.md --> above it")
    assert not problems, "\n".join(problems)


def _argv(command: str) -> list[str]:
    words = shlex.split(command)
    if words[0] == "orchestrate":
        return [sys.executable, "-m", "orchestrate", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    return words


def _matches(quoted: list[str], output: list[str]) -> bool:
    """``quoted`` is ``output``, where a line ``...`` stands for any number of lines (trailing blanks ignored)."""
    quoted = [line.rstrip() for line in quoted]
    output = [line.rstrip() for line in output]
    chunks: list[list[str]] = [[]]
    for line in quoted:
        if line == "...":
            chunks.append([])
        else:
            chunks[-1].append(line)
    if len(chunks) == 1:
        return quoted == output
    first, *middle, last = chunks
    if output[:len(first)] != first or (last and output[len(output) - len(last):] != last):
        return False
    at, end = len(first), len(output) - len(last)
    for chunk in middle:
        while at + len(chunk) <= end and output[at:at + len(chunk)] != chunk:
            at += 1
        if at + len(chunk) > end:
            return False
        at += len(chunk)
    return at <= end


@pytest.mark.parametrize("page,command,quoted", _live_blocks(),
                         ids=[f"{p.name}:{c}" for p, c, _ in _live_blocks()])
def test_live_output_is_what_the_command_prints(page: Path, command: str, quoted: list[str]) -> None:
    done = subprocess.run(_argv(command), cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "100"})
    assert done.returncode == 0, f"{command} failed:\n{done.stderr[-2000:]}"
    output = done.stdout.rstrip("\n").splitlines()
    assert _matches(quoted, output), (f"{page.relative_to(ROOT)} quotes the output of `{command}`, which now "
                                      f"prints:\n{done.stdout}")


def test_live_blocks_are_few() -> None:
    """Each live command runs in this test: keep them few and fast."""
    assert 1 <= len(_live_blocks()) <= 5
