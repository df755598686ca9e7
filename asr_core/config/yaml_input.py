"""The one reader of YAML input: config files, grids, cluster profiles, decode files and ``--set`` values.

YAML is read with PyYAML's safe loader (no tag builds a Python object, nothing runs) and bounded, so that no input
hangs or exhausts a command: a file of at most :data:`MAX_BYTES`, a document of at most :data:`MAX_NODES` values
once every alias is expanded (an alias bomb, nine levels of nine aliases, is a billion), no alias inside its own
anchor, nesting no deeper than Python's recursion allows. A key given twice in one mapping is refused (PyYAML keeps
the last one silently), and so is a key that is a list or a mapping. Every such problem, and every syntax error, is a
:class:`YamlInputError` whose message is one line, ``SOURCE:LINE:COLUMN: what is wrong; what to do``; each command
turns it into its own error (exit 2).

``durations=True`` (the cluster profiles) keeps a scalar such as ``4:00:00`` the text it looks like, where YAML 1.1
reads base-60 integers (14400).
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20  # 1 MiB: the paper's grid is 3 kB; a larger file is a mistake or an attack
MAX_NODES = 100_000  # values after alias expansion; the paper's 321-model grid is a few hundred

_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlInputError(ValueError):
    """YAML that cannot be read; ``str()`` is one line ``SOURCE:LINE:COLUMN: problem; what to do``. ``bound``: the
    input is past a bound of this module (size, alias expansion, a loop, depth), not merely invalid YAML."""

    def __init__(self, source: str, line: int, column: int, problem: str, *, bound: bool = False) -> None:
        self.source, self.line, self.column, self.problem, self.bound = source, line, column, problem, bound
        super().__init__(f"{source}:{line}:{column}: {problem}")


def _at(source: str, mark: Any, problem: str, bound: bool = False) -> YamlInputError:
    line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
    return YamlInputError(source, line, column, " ".join(problem.split()), bound=bound)


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader that records each alias where it is used, and checks keys while building mappings."""

    def __init__(self, text: str, source: str) -> None:
        super().__init__(text)
        self.source = source
        self.alias_uses: list[tuple[yaml.Node, Any]] = []

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102 - PyYAML's hook
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            self.alias_uses.append((node, mark))
            return node
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:  # noqa: D102
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                raise _at(self.source, key_node.start_mark, f"a mapping key must be a name or a number, not a "
                          f"{type(key).__name__}; write the key as plain text")
            if key in seen:
                raise _at(self.source, key_node.start_mark, f"duplicate key {key!r} (first at line "
                          f"{seen[key].line + 1}); every key in a mapping must be unique")
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


class _DurationLoader(_BoundedLoader):
    pass


def _int_or_duration(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    text = loader.construct_scalar(node)
    return str(text) if ":" in str(text) else yaml.SafeLoader.construct_yaml_int(loader, node)


_DurationLoader.add_constructor("tag:yaml.org,2002:int", _int_or_duration)


def _expanded_sizes(root: yaml.Node, source: str, uses: list[tuple[yaml.Node, Any]]) -> dict[int, int]:
    """Values under each collection node once aliases are expanded (by ``id``); an alias inside its own anchor is
    refused. Iterative, so a deep document does not exhaust the stack here."""
    size: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in size and not done:
            continue
        children = ([c for kv in node.value for c in kv] if isinstance(node, yaml.MappingNode)
                    else list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        if done:
            active.discard(id(node))
            size[id(node)] = min(1 + sum(size[id(c)] for c in children), MAX_NODES + 1)
            continue
        if id(node) in active:
            mark = next((m for n, m in uses if n is node), node.start_mark)
            raise _at(source, mark, "this alias refers to the value it is inside of (a loop); write the values out",
                      bound=True)
        active.add(id(node))
        stack.append((node, True))
        for c in children:
            if id(c) in active:
                mark = next((m for n, m in uses if n is c), c.start_mark)
                raise _at(source, mark, "this alias refers to the value it is inside of (a loop); write the values "
                          "out", bound=True)
            if id(c) not in size:
                stack.append((c, False))
    return size


def load_yaml_text(text: str, source: str, *, durations: bool = False) -> Any:
    """The data of the YAML document ``text`` (``None`` when empty); ``source`` names it in errors (a file's path,
    ``--set KEY``). Raises :class:`YamlInputError` (one line with line and column) for anything that cannot be read
    within the bounds of this module."""
    if len(text) > MAX_BYTES:
        raise YamlInputError(source, 1, 1, f"{len(text)} bytes, more than the {MAX_BYTES} read; "
                             "is this the right file?", bound=True)
    loader = (_DurationLoader if durations else _BoundedLoader)(text, source)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        sizes = _expanded_sizes(node, source, loader.alias_uses)
        if sizes[id(node)] > MAX_NODES:
            if not loader.alias_uses:
                raise _at(source, node.start_mark, f"more than {MAX_NODES:,} values, the most read; is this the "
                          "right file?", bound=True)
            used, mark = max(loader.alias_uses, key=lambda u: sizes.get(id(u[0]), 1))
            n = sizes.get(id(used), 1)
            raise _at(source, mark, (f"this alias expands to more than {MAX_NODES:,} values" if n > MAX_NODES else
                                     f"this alias expands to {n:,} values and the document to more than "
                                     f"{MAX_NODES:,}") + " (the most read); write the values out or use fewer aliases",
                      bound=True)
        return loader.construct_document(node)
    except YamlInputError:
        raise
    except yaml.MarkedYAMLError as e:
        what = e.problem or e.context or "not valid YAML"
        if "could not determine a constructor" in what:
            what += "; tags that build Python objects are not read: write plain values"
        raise _at(source, e.problem_mark or e.context_mark, what) from None
    except yaml.YAMLError as e:  # a ReaderError: a character YAML does not allow
        raise YamlInputError(source, 1, 1, " ".join(str(e).split())) from None
    except RecursionError:
        raise _at(source, None, "nested too deep to read; flatten the document", bound=True) from None
    finally:
        loader.dispose()


def load_yaml_file(path: str | Path, *, durations: bool = False) -> Any:
    """The data of the YAML file at ``path`` (see :func:`load_yaml_text`); ``FileNotFoundError`` and other
    ``OSError`` pass through for the caller to name what it looked for."""
    path = Path(path)
    with open(path, "rb") as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise YamlInputError(str(path), 1, 1, f"larger than {MAX_BYTES} bytes, the most read; is this the right "
                             "file?", bound=True)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise YamlInputError(str(path), line, column, "not UTF-8 text; save the file as UTF-8") from None
    return load_yaml_text(text, str(path), durations=durations)
