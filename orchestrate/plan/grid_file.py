"""Grid files read (YAML by :mod:`asr_core.config.yaml_input`: bounded, duplicate keys refused), ``extends`` and
``include`` followed, each sub-grid with its file, base and seeds (:func:`subgrid_sources`); what a sub-grid's axes
expand to is :mod:`orchestrate.plan.grid`'s.

A grid file is a base configuration plus named sub-grids::

    name: paper                      # default sweep name (else the file's stem)
    extends: other.yaml              # optional: take base and seeds from that file (its sub-grids are not taken)
    include: [context.yaml]          # optional: add the sub-grids of these files (each keeps its own base)
    base: {preset: main, data: {train: "podcast:data/train"}}
    seeds: [1, 2, 3]
    subgrids:
      context:
        section: "4.1 context length"
        set: {model.posenc: rotary}              # fixed values for this sub-grid
        axes: {data.context_s: [10.24, 20.48]}   # every combination
        seeds: [1]                               # optional, replaces the file's seeds

Every error is a :class:`GridError` naming the file (and sub-grid, key and value where there is one) and what is
valid. The keys and their meanings are the tables :data:`TOP_LEVEL` and :data:`SUBGRID`, which the reader checks
against and docs/grid-format.md is printed from (``python -m orchestrate.plan.grid_reference``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from asr_core.config.yaml_input import YamlInputError, load_yaml_file
from orchestrate.assets import grids_dir, names


class GridError(ValueError):
    """The grid file is invalid; the message names the file, sub-grid, key and value, and what is valid."""


@dataclass(frozen=True)
class GridKey:
    """One key of a grid file: its name, the value it takes, and what it means (one line each; the reference page
    docs/grid-format.md is printed from these tables by :mod:`orchestrate.plan.grid_reference`)."""

    name: str
    value: str
    meaning: str


# The keys a grid file may have at its top level, in the order the reference lists them; nothing else is accepted.
TOP_LEVEL: tuple[GridKey, ...] = (
    GridKey("name", "a sweep name", "the sweep's default name (`submit --sweep NAME` overrides it); else the file's "
            "stem"),
    GridKey("description", "text", "what the grid is for; shown to readers of the file only"),
    GridKey("extends", "a grid file, relative to this one", "take that file's `base` (merged under this file's, "
            "mapping by mapping) and `seeds`; its sub-grids are not taken"),
    GridKey("include", "a list of grid files, relative to this one", "add the sub-grids of these files, each with "
            "its own file's base and seeds"),
    GridKey("base", "a mapping of config sections (`preset`, `model`, `data`, `train`, `eval`)", "the "
            "configuration every sub-grid starts from: a preset and the fields it changes"),
    GridKey("seeds", "a non-empty list of distinct non-negative integers", "every grid point is trained once per "
            "seed; required here or in each sub-grid"),
    GridKey("subgrids", "a mapping of sub-grid name to sub-grid", "the experiments: each sub-grid is the product of "
            "its axes times its seeds (keys below); names are unique across a grid and its includes"),
)
# The keys of one sub-grid.
SUBGRID: tuple[GridKey, ...] = (
    GridKey("section", "text", "the paper section or question the sub-grid answers; `plan` counts new trials by it"),
    GridKey("description", "text", "what the sub-grid is for; shown to readers of the file only"),
    GridKey("set", "a mapping of dotted field name (or `preset`) to one value", "fixed values for every point of "
            "this sub-grid, over the base"),
    GridKey("axes", "a mapping of dotted field name (or `preset`) to a non-empty list of values", "every "
            "combination of the values is a grid point; a field is in `set` or `axes`, not both"),
    GridKey("seeds", "a non-empty list of distinct non-negative integers", "replaces the file's seeds for this "
            "sub-grid"),
)
TOP_KEYS = tuple(k.name for k in TOP_LEVEL)
SUBGRID_KEYS = tuple(k.name for k in SUBGRID)


def read_grid_yaml(path: Path) -> dict[str, Any]:
    """The top-level mapping of one grid file, its keys checked (duplicate keys refused while reading)."""
    if path.is_dir():
        grids = sorted(f.name for f in path.glob("*.yaml"))[:8]
        raise GridError(f"grid file {path} is a folder; valid: one grid file"
                        + (f", e.g. {path / grids[0]} (the folder holds {', '.join(grids)})" if grids else
                           ", e.g. grids/paper.yaml"))
    try:
        raw = load_yaml_file(path)
    except FileNotFoundError:
        raise GridError(f"grid file not found: {path}; valid: a path, or a packaged grid by name "
                        f"({', '.join(names(grids_dir()))})") from None
    except OSError as e:
        raise GridError(f"grid file {path} cannot be read: {e.strerror or e}") from None
    except YamlInputError as e:  # bounded, duplicate keys refused: one line with line and column
        raise GridError(str(e)) from None
    if not isinstance(raw, dict):
        raise GridError(f"{path}: the top level must be a mapping with keys {', '.join(TOP_KEYS)}")
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise GridError(f"{path}: unknown top-level key {unknown[0]!r}; valid: {', '.join(TOP_KEYS)}")
    return raw


def where_in(path: Path, sub: str | None, key: str | None = None) -> str:
    """Where in the grid an error is, for its message: ``FILE: sub-grid 'NAME', key 'KEY'``."""
    out = str(path)
    if sub is not None:
        out += f": sub-grid {sub!r}"
    if key is not None:
        out += f", key {key!r}"
    return out


def parse_seeds(value: Any, where: str) -> tuple[int, ...]:
    """The seeds of a file or sub-grid: a non-empty list of distinct non-negative integers (``where``: for the
    message)."""
    if not isinstance(value, list) or not value:
        raise GridError(f"{where}: 'seeds' must be a non-empty list of non-negative integers, got {value!r}")
    for s in value:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise GridError(f"{where}: seed {s!r} is invalid; valid: a non-negative integer")
    if len(set(value)) != len(value):
        raise GridError(f"{where}: 'seeds' lists a seed twice: {value!r}")
    return tuple(value)


def _base_of(path: Path, raw: dict[str, Any], chain: tuple[Path, ...] = ()) -> tuple[dict[str, Any], Any]:
    """(base dict, seeds) of a file, following ``extends``."""
    base: dict[str, Any] = {}
    seeds: Any = None
    if "extends" in raw:
        parent = (path.parent / str(raw["extends"])).resolve()
        if parent in chain or parent == path.resolve():
            raise GridError(f"{path}: 'extends: {raw['extends']}' makes a cycle")
        pbase, seeds = _base_of(parent, read_grid_yaml(parent), chain + (path.resolve(),))
        base = pbase
    if "base" in raw:
        if not isinstance(raw["base"], dict):
            raise GridError(f"{path}: 'base' must be a mapping of config sections, got {raw['base']!r}")
        base = _merge(base, raw["base"])
    if "seeds" in raw:
        seeds = raw["seeds"]
    return base, seeds


def _merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def subgrid_sources(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[Path, dict[str, Any], str, Any]]:
    """(file, base, sub-grid name, sub-grid body) for the file and its includes, in order."""
    rp = path.resolve()
    if rp in seen:
        raise GridError(f"{path}: included twice or in a cycle ({' -> '.join(str(s) for s in seen + (rp,))})")
    raw = read_grid_yaml(path)
    base, seeds = _base_of(path, raw)
    out: list[tuple[Path, dict[str, Any], str, Any]] = []
    includes = raw.get("include", [])
    if not isinstance(includes, list):
        raise GridError(f"{path}: 'include' must be a list of grid files, got {includes!r}")
    for inc in includes:
        out += subgrid_sources(path.parent / str(inc), seen + (rp,))
    subs = raw.get("subgrids", {})
    if not isinstance(subs, dict):
        raise GridError(f"{path}: 'subgrids' must be a mapping of sub-grid name to its axes, got {subs!r}")
    for name, body in subs.items():
        if not isinstance(body, dict):
            raise GridError(f"{where_in(path, name)}: must be a mapping with keys {', '.join(SUBGRID_KEYS)}")
        body = dict(body)
        if "seeds" not in body:
            if seeds is None:
                raise GridError(f"{where_in(path, name)}: no seeds; add 'seeds: [1, 2, 3]' to the file or sub-grid")
            body["seeds"] = seeds
        out.append((path, base, str(name), body))
    return out
