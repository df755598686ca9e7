"""Grid files → trials.

A grid file is a base configuration plus named sub-grids; each sub-grid is the product of its axes (dotted
:class:`~asr_core.config.Config` field names, or ``preset``) times the list of seeds::

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

Precedence, lowest first: the preset (the base's, or the sub-grid's ``preset`` axis/set), the base's own values,
the sub-grid's ``set``, the axes. Values are checked by the config's own parser
(:func:`asr_core.config.parse_field`). A trial's key is :meth:`Config.key` of its resolved config (seed included:
the science only, see :mod:`asr_core.identity`), so the same trial reached from two sub-grids is one trial listing
both. Everything is validated before anything is returned:
:class:`GridError` names the file, sub-grid, key and value, and says what is valid.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from asr_core.config import FIELD_TYPES, PRESETS, Config, ConfigError, parse_field, resolve
from orchestrate.trial import Trial


class GridError(ValueError):
    """The grid file is invalid; the message names the file, sub-grid, key and value, and what is valid."""


TOP_KEYS = ("name", "description", "extends", "include", "base", "seeds", "subgrids")
SUBGRID_KEYS = ("section", "description", "set", "axes", "seeds")


# ---- YAML that refuses duplicate keys (PyYAML silently keeps the last one) ----------------------------------------
class _StrictLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise GridError(f"{loader.name}: line {key_node.start_mark.line + 1}: duplicate key {key!r} "
                            f"(first at line {seen[key] + 1}); every key, sub-grid names included, must be unique")
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise GridError(f"grid file not found: {path}") from None
    loader = _StrictLoader(text)
    loader.name = str(path)
    try:
        raw = loader.get_single_data()
    except yaml.YAMLError as e:
        raise GridError(f"{path}: not valid YAML: {e}") from None
    finally:
        loader.dispose()
    if not isinstance(raw, dict):
        raise GridError(f"{path}: the top level must be a mapping with keys {', '.join(TOP_KEYS)}")
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise GridError(f"{path}: unknown top-level key {unknown[0]!r}; valid: {', '.join(TOP_KEYS)}")
    return raw


AXIS_NAMES: tuple[str, ...] = ("preset", *FIELD_TYPES)


def apply_values(cfg: Config, values: Mapping[str, Any]) -> Config:
    """``cfg`` with dotted fields replaced (values already coerced); sections re-run their validation."""
    groups: dict[str, dict[str, Any]] = {}
    direct: dict[str, Any] = {}
    for dotted, v in values.items():
        head, _, rest = dotted.partition(".")
        if rest:
            groups.setdefault(head, {})[rest] = v
        else:
            direct[head] = v
    for head, sub in groups.items():
        direct[head] = apply_values(getattr(cfg, head), sub)
    return dataclasses.replace(cfg, **direct)


# ---- the grid ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SubGrid:
    name: str
    file: str
    section: str
    n_points: int  # trials this sub-grid produces (before de-duplication with earlier sub-grids)
    n_new: int  # of which were not already produced by an earlier sub-grid


@dataclass(frozen=True)
class Grid:
    name: str
    path: str
    subgrids: tuple[SubGrid, ...]
    trials: tuple[Trial, ...]


def _where(path: Path, sub: str | None, key: str | None = None) -> str:
    out = str(path)
    if sub is not None:
        out += f": sub-grid {sub!r}"
    if key is not None:
        out += f", key {key!r}"
    return out


def _check_name(name: str, path: Path, sub: str, kind: str) -> None:
    if name in AXIS_NAMES:
        if name == "train.seed":
            raise GridError(f"{_where(path, sub, name)}: the seed is not an axis; list seeds under 'seeds:'")
        return
    close = difflib.get_close_matches(name, AXIS_NAMES, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise GridError(f"{_where(path, sub)}: unknown {kind} field {name!r}{hint}; valid: preset or a dotted Config "
                    f"field such as {', '.join(list(FIELD_TYPES)[:6])}, ... (all: {', '.join(FIELD_TYPES)})")


def _seeds(value: Any, where: str) -> tuple[int, ...]:
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
        pbase, seeds = _base_of(parent, _read_yaml(parent), chain + (path.resolve(),))
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


def _subgrid_sources(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[Path, dict[str, Any], str, Any]]:
    """(file, base, sub-grid name, sub-grid body) for the file and its includes, in order."""
    rp = path.resolve()
    if rp in seen:
        raise GridError(f"{path}: included twice or in a cycle ({' -> '.join(str(s) for s in seen + (rp,))})")
    raw = _read_yaml(path)
    base, seeds = _base_of(path, raw)
    out: list[tuple[Path, dict[str, Any], str, Any]] = []
    includes = raw.get("include", [])
    if not isinstance(includes, list):
        raise GridError(f"{path}: 'include' must be a list of grid files, got {includes!r}")
    for inc in includes:
        out += _subgrid_sources(path.parent / str(inc), seen + (rp,))
    subs = raw.get("subgrids", {})
    if not isinstance(subs, dict):
        raise GridError(f"{path}: 'subgrids' must be a mapping of sub-grid name to its axes, got {subs!r}")
    for name, body in subs.items():
        if not isinstance(body, dict):
            raise GridError(f"{_where(path, name)}: must be a mapping with keys {', '.join(SUBGRID_KEYS)}")
        body = dict(body)
        if "seeds" not in body:
            if seeds is None:
                raise GridError(f"{_where(path, name)}: no seeds; add 'seeds: [1, 2, 3]' to the file or sub-grid")
            body["seeds"] = seeds
        out.append((path, base, str(name), body))
    return out


def load_grid(path: str | Path, overrides: Iterable[str] = ()) -> Grid:
    """Expand a grid file into its unique trials; ``overrides`` (``section.field=value``) apply to every base."""
    path = Path(path)
    sources = _subgrid_sources(path)
    if not sources:
        raise GridError(f"{path}: no sub-grids; add 'subgrids:' (or 'include:' files that have them)")
    names: dict[str, Path] = {}
    for file, _, name, _ in sources:
        if name in names:
            raise GridError(f"{file}: duplicate sub-grid {name!r} (also in {names[name]}); sub-grid names must be "
                            "unique across a grid and its includes")
        names[name] = file
    overrides = tuple(overrides)
    trials: dict[str, Trial] = {}
    summaries: list[SubGrid] = []
    base_cache: dict[tuple[int, str | None], Config] = {}
    for file, base, name, body in sources:
        produced = list(_expand_subgrid(file, base, name, body, overrides, base_cache))
        new = 0
        for t in produced:
            old = trials.get(t.key)
            if old is None:
                trials[t.key] = t
                new += 1
                continue
            if old.config != t.config:
                _same_trial_other_settings(file, name, old, t)
            if name not in old.subgrids:
                trials[t.key] = dataclasses.replace(old, subgrids=old.subgrids + (name,))
        keys = {t.key for t in produced}
        summaries.append(SubGrid(name=name, file=str(file), section=str(body.get("section", "")),
                                 n_points=len(keys), n_new=new))
    raw_name = _read_yaml(path).get("name")
    return Grid(name=str(raw_name or path.stem), path=str(path), subgrids=tuple(summaries),
                trials=_unique_labels(list(trials.values())))


def _same_trial_other_settings(file: Path, sub: str, old: Trial, new: Trial) -> None:
    """Two grid points that are one experiment (one key) but would run differently: refuse rather than keep one."""
    a, b = old.config.flat(), new.config.flat()
    diff = ", ".join(f"{k}: {a[k]!r} vs {b[k]!r}" for k in a if a[k] != b.get(k))
    raise GridError(f"{_where(file, sub)}: trial {new.label} ({new.key}) comes out twice with other settings ({diff}; "
                    f"first from sub-grid {old.subgrids[0]!r}). Those settings do not make another experiment "
                    "(asr_core/identity.py): set them once, e.g. in base; to compare corpora, name each one "
                    "(NAME=FORMAT:PATH)")


def _unique_labels(trials: list[Trial]) -> tuple[Trial, ...]:
    """Labels must name one run each: where two trials share one, both get their key appended."""
    count: dict[str, int] = {}
    for t in trials:
        count[t.label] = count.get(t.label, 0) + 1
    return tuple(dataclasses.replace(t, label=f"{t.label}-{t.key[:6]}") if count[t.label] > 1 else t for t in trials)


def _expand_subgrid(file: Path, base: dict[str, Any], name: str, body: dict[str, Any], overrides: tuple[str, ...],
                    base_cache: dict[tuple[int, str | None], Config]) -> Iterable[Trial]:
    unknown = sorted(set(body) - set(SUBGRID_KEYS))
    if unknown:
        raise GridError(f"{_where(file, name)}: unknown key {unknown[0]!r}; valid: {', '.join(SUBGRID_KEYS)}")
    seeds = _seeds(body["seeds"], _where(file, name))
    fixed = body.get("set", {}) or {}
    axes = body.get("axes", {}) or {}
    for what, d in (("set", fixed), ("axes", axes)):
        if not isinstance(d, dict):
            raise GridError(f"{_where(file, name)}: {what!r} must be a mapping of dotted field names, got {d!r}")
    for k in fixed:
        _check_name(k, file, name, "set")
    for k, vals in axes.items():
        _check_name(k, file, name, "axis")
        if k in fixed:
            raise GridError(f"{_where(file, name, k)}: is both in 'set' and 'axes'; keep one")
        if not isinstance(vals, list):
            raise GridError(f"{_where(file, name, k)}: an axis must be a list of values, got {vals!r}")
        if not vals:
            raise GridError(f"{_where(file, name, k)}: the axis is empty; give at least one value")
    # Coerce every value once (not once per combination): wrong types are reported here, naming the value.
    fixed_c = {k: _coerce_named(file, name, k, v) for k, v in fixed.items() if k != "preset"}
    axes_c = {k: [_coerce_named(file, name, k, v) for v in vals] for k, vals in axes.items()}
    presets = axes_c.pop("preset", None) or [fixed.get("preset", base.get("preset"))]
    axis_names = list(axes_c)
    for p in presets:
        cfg0 = _resolve_base(file, name, base, p, overrides, base_cache)
        for combo in itertools.product(*(axes_c[k] for k in axis_names)):
            values = {**fixed_c, **dict(zip(axis_names, combo))}
            try:
                cfg = apply_values(cfg0, values) if values else cfg0
            except ConfigError as e:
                shown = ", ".join(f"{k}={v!r}" for k, v in dict(zip(axis_names, combo)).items())
                raise GridError(f"{_where(file, name)}: the combination {shown or '(set values)'} is invalid: {e}")
            for s in seeds:
                yield Trial.make(cfg, s, name)


def _coerce_named(file: Path, sub: str, key: str, value: Any) -> Any:
    if key == "preset":
        if value not in PRESETS:
            raise GridError(f"{_where(file, sub, key)}: unknown preset {value!r}; valid: {', '.join(sorted(PRESETS))}")
        return value
    try:
        return parse_field(key, value, source=_where(file, sub))
    except ConfigError as e:
        raise GridError(str(e)) from None


def _resolve_base(file: Path, sub: str, base: dict[str, Any], preset: str | None, overrides: tuple[str, ...],
                  cache: dict[tuple[int, str | None], Config]) -> Config:
    ck = (id(base), preset)
    if ck not in cache:
        raw = dict(base)
        raw.pop("preset", None)
        if preset is not None:
            raw["preset"] = preset
        try:
            cache[ck] = resolve(raw, overrides, source=f"{file}: base")
        except ConfigError as e:
            raise GridError(f"{e}" + (f" (sub-grid {sub!r}, preset {preset!r})" if preset else "")) from None
    return cache[ck]


def plan_table(grid: Grid) -> str:
    """The per-sub-grid breakdown ``plan`` prints: trials, new unique trials, section."""
    rows = [("sub-grid", "section", "trials", "new", "file")]
    for s in grid.subgrids:
        rows.append((s.name, s.section, str(s.n_points), str(s.n_new), Path(s.file).name))
    rows.append(("total (unique)", "", str(sum(s.n_points for s in grid.subgrids)), str(len(grid.trials)), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(c.rjust(w) if j in (2, 3) else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0 or i == len(rows) - 2:
            lines.append("  ".join("-" * w for w in widths))
    by_section: dict[str, int] = {}
    for s in grid.subgrids:
        by_section[s.section or "(none)"] = by_section.get(s.section or "(none)", 0) + s.n_new
    lines.append("")
    lines.append("new trials by section: " + ", ".join(f"{k}: {v}" for k, v in by_section.items()))
    lines.append(f"{grid.name}: {len(grid.trials)} unique trials")
    return "\n".join(lines)
