"""Grid files → trials.

A grid file (its format and how it is read: :mod:`orchestrate.plan.grid_file`) is a base configuration plus named
sub-grids; each sub-grid is the product of its axes (dotted :class:`~asr_core.config.Config` field names, or
``preset``) times the list of seeds.

Precedence, lowest first: the preset (the base's, or the sub-grid's ``preset`` axis/set), the base's own values,
the sub-grid's ``set``, the axes. Values are checked by the config's own parser
(:func:`asr_core.config.parse_field`). A trial's key is :meth:`Config.key` of its resolved config (seed included:
the science only, see :mod:`asr_core.contract.identity`), so the same trial reached from two sub-grids is one trial listing
both. Everything is validated before anything is returned:
:class:`GridError` names the file, sub-grid, key and value, and says what is valid.

**One model, one trial, whatever each sub-grid evaluates.** Grid points whose configs are equal except for what they
evaluate on (``eval.datasets``, ``eval.snrs``, ``eval.noisy``) are one trial: its evaluation is the union of theirs
(:func:`merge_evaluations`) and its key that of the merged config. So the main model, which the context sub-grid
also evaluates with music on Rev16, is one trial in every sub-grid that shares it. Points that differ in any other
way are other trials as before (another ``eval.stride``, ``eval.precision`` or ``eval.noise`` is another key), and
points with one key but other execution settings are refused as before.

:func:`plan_table` also estimates each sub-grid's evaluation work: decoded audio-hours (test-set hours x conditions
x windows per frame) and GPU-hours at :data:`DECODE_FRAMES_PER_S`.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from asr_core.config import FIELD_TYPES, PRESETS, Config, EvalConfig, parse_field, resolve
from asr_core.config.parse import ConfigError
from asr_core.contract.specs import dataset_name
from orchestrate.plan.grid_file import SUBGRID_KEYS, GridError, where_in, parse_seeds, read_grid_yaml, subgrid_sources
from orchestrate.assets import grid_path
from orchestrate.sweep.trial import Trial

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


def _check_name(name: str, path: Path, sub: str, kind: str) -> None:
    if name in AXIS_NAMES:
        if name == "train.seed":
            raise GridError(f"{where_in(path, sub, name)}: the seed is not an axis; list seeds under 'seeds:'")
        return
    close = difflib.get_close_matches(name, AXIS_NAMES, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise GridError(f"{where_in(path, sub)}: unknown {kind} field {name!r}{hint}; valid: preset or a dotted Config "
                    f"field such as {', '.join(list(FIELD_TYPES)[:6])}, ... (all: {', '.join(FIELD_TYPES)})")


def load_grid(path: str | Path, overrides: Iterable[str] = ()) -> Grid:
    """Expand a grid file (a path, or a packaged grid's name: ``paper``) into its unique trials; ``overrides``
    (``section.field=value``) apply to every base."""
    path = grid_path(path)
    sources = subgrid_sources(path)
    if not sources:
        raise GridError(f"{path}: no sub-grids; add 'subgrids:' (or 'include:' files that have them)")
    names: dict[str, Path] = {}
    for file, _, name, _ in sources:
        if name in names:
            raise GridError(f"{file}: duplicate sub-grid {name!r} (also in {names[name]}); sub-grid names must be "
                            "unique across a grid and its includes")
        names[name] = file
    overrides = tuple(overrides)
    # Grid points grouped by the model they train (their model key; evaluation is not in it): one group is one
    # trial. Groups keep the order of their first point, points the grid's order.
    groups: dict[str, list[tuple[Path, str, Trial]]] = {}
    counts: list[tuple[Path, str, dict[str, Any], set[str], set[str]]] = []
    base_cache: dict[tuple[int, str | None], Config] = {}
    for file, base, name, body in sources:
        produced = list(_expand_subgrid(file, base, name, body, overrides, base_cache))
        mine: set[str] = set()
        new: set[str] = set()
        for t in produced:
            g = t.key
            if g not in groups:
                groups[g] = []
                new.add(g)
            groups[g].append((file, name, t))
            mine.add(g)
        counts.append((file, name, body, mine, new))
    trials = [_one_trial(points) for points in groups.values()]
    summaries = [SubGrid(name=name, file=str(file), section=str(body.get("section", "")), n_points=len(mine),
                         n_new=len(new)) for file, name, body, mine, new in counts]
    raw_name = read_grid_yaml(path).get("name")
    return Grid(name=str(raw_name or path.stem), path=str(path), subgrids=tuple(summaries),
                trials=_unique_labels(trials))


def _without_eval_sets(cfg: Config) -> Config:
    """``cfg`` without what it evaluates on (eval.datasets, eval.snrs, eval.noisy): merged across grid points."""
    return dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, datasets=(), snrs=(), noisy=()))


def _one_trial(points: list[tuple[Path, str, Trial]]) -> Trial:
    """The trial of grid points that train one model: their evaluations merged, keyed by the merged config, listing
    every sub-grid that asked for it (in grid order). Other execution settings are refused
    (:func:`_same_trial_other_settings`), as are two paths under one dataset name."""
    first = points[0][2]
    if len(points) == 1:
        return first
    subgrids: list[str] = []
    stripped = _without_eval_sets(first.config)
    for file, sub, t in points:
        if t.config != first.config and _without_eval_sets(t.config) != stripped:
            _same_trial_other_settings(file, sub, *(dataclasses.replace(x, config=_without_eval_sets(x.config))
                                                    for x in (first, t)))
        if sub not in subgrids:
            subgrids.append(sub)
    evals = [t.config.eval for _, _, t in points]
    if all(e == evals[0] for e in evals[1:]):
        return dataclasses.replace(first, subgrids=tuple(subgrids))
    try:
        merged_eval = merge_evaluations(evals)
    except ValueError as e:
        file, sub, t = next(p for p in points if p[2].config.eval != evals[0])
        raise GridError(f"{where_in(file, sub)}: trial {t.label} ({first.subgrids[0]!r} and {sub!r} evaluate "
                        f"it differently and cannot be merged): {e}") from None
    cfg = dataclasses.replace(first.config, eval=merged_eval)
    return dataclasses.replace(first, key=cfg.key(), subgrids=tuple(subgrids), config=cfg)


def merge_evaluations(evals: list[EvalConfig]) -> EvalConfig:
    """One evaluation doing everything each of ``evals`` does (all equal but for datasets, SNRs and noisy):
    the union of the datasets (first-seen order), of the SNRs (ascending) and of the noisy datasets, where an
    evaluation with SNRs and no noisy names makes every one of its datasets noisy. The result names its noisy
    datasets explicitly unless every merged dataset is noisy (then ``()``, every dataset). The union can do more
    than any one point asked for (a point's SNRs on another point's noisy datasets): it is one evaluation
    protocol, ``snrs`` x ``noisy``."""
    specs: dict[str, str] = {}
    for e in evals:
        for spec in e.datasets:
            name = dataset_name(spec)
            if specs.setdefault(name, spec) != spec:
                raise ValueError(f"eval dataset {name!r} is {specs[name]!r} in one and {spec!r} in another; "
                                 "give each its own name or one path")
    snrs = sorted({float(x) for e in evals for x in e.snrs})
    noisy: set[str] = set()
    for e in evals:
        if e.snrs:
            noisy |= set(e.noisy) if e.noisy else {dataset_name(d) for d in e.datasets}
    names = list(specs)
    noisy_t = () if not snrs or noisy >= set(names) else tuple(n for n in names if n in noisy)
    return dataclasses.replace(evals[0], datasets=tuple(specs.values()), snrs=tuple(snrs), noisy=noisy_t)


def _same_trial_other_settings(file: Path, sub: str, old: Trial, new: Trial) -> None:
    """Two grid points that are one experiment (one key) but would run differently: refuse rather than keep one."""
    a, b = old.config.flat(), new.config.flat()
    differ = [k for k in a if a[k] != b.get(k)]
    diff = ", ".join(f"{k}: {a[k]!r} vs {b[k]!r}" for k in differ)
    if all(k.startswith("eval.") for k in differ):
        raise GridError(f"{where_in(file, sub)}: model {new.label} ({new.key}) is evaluated two ways ({diff}; first "
                        f"from sub-grid {old.subgrids[0]!r}). A model has one default evaluation, the grid's eval "
                        "section (their datasets and SNRs are merged; nothing else is): set these once, e.g. in "
                        "base, and evaluate the trained models another way with `orchestrate evaluate SWEEP --spec "
                        "FILE`")
    raise GridError(f"{where_in(file, sub)}: trial {new.label} ({new.key}) comes out twice with other settings "
                    f"({diff}; first from sub-grid {old.subgrids[0]!r}). Those settings do not make another experiment "
                    "(asr_core/contract/identity.py): set them once, e.g. in base; to compare corpora, name each one "
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
        raise GridError(f"{where_in(file, name)}: unknown key {unknown[0]!r}; valid: {', '.join(SUBGRID_KEYS)}")
    seeds = parse_seeds(body["seeds"], where_in(file, name))
    fixed = body.get("set", {}) or {}
    axes = body.get("axes", {}) or {}
    for what, d in (("set", fixed), ("axes", axes)):
        if not isinstance(d, dict):
            raise GridError(f"{where_in(file, name)}: {what!r} must be a mapping of dotted field names, got {d!r}")
    for k in fixed:
        _check_name(k, file, name, "set")
    for k, vals in axes.items():
        _check_name(k, file, name, "axis")
        if k in fixed:
            raise GridError(f"{where_in(file, name, k)}: is both in 'set' and 'axes'; keep one")
        if not isinstance(vals, list):
            raise GridError(f"{where_in(file, name, k)}: an axis must be a list of values, got {vals!r}")
        if not vals:
            raise GridError(f"{where_in(file, name, k)}: the axis is empty; give at least one value")
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
                raise GridError(f"{where_in(file, name)}: the combination {shown or '(set values)'} is invalid: {e}")
            for s in seeds:
                yield Trial.make(cfg, s, name)


def _coerce_named(file: Path, sub: str, key: str, value: Any) -> Any:
    if key == "preset":
        if value not in PRESETS:
            raise GridError(f"{where_in(file, sub, key)}: unknown preset {value!r}; valid: "
                            f"{', '.join(sorted(PRESETS))}")
        return value
    try:
        return parse_field(key, value, source=where_in(file, sub))
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


# ---- evaluation work, for plan ------------------------------------------------------------------------------------
# Hours of the paper's test sets (paper 000 §3.1, ../shared/REFERENCE.md "The study"), by the dataset names of
# grids/paper.yaml: what plan counts for a set that is not on disk here.
KNOWN_TEST_HOURS: dict[str, float] = {"earnings22": 119.0, "tedlium": 2.6, "rev16": 16.2}

# Decoding throughput for the GPU-hour estimate, in input frames (10 ms) per second of one GPU. Paper 000 Table 1:
# the FastConformer TRAINS at 80,900 frames/s with flash attention on one 80 GB A100 (bf16). Assumption: decoding
# is forward only, and a training step costs about three forwards (the backward about two), so decoding runs at
# ~3x that, 242,700 frames/s (~2,400 s of audio a second). Real decoding also pays for padding, the last short
# windows, features and music mixing on the CPU, and fp32 (eval.precision) is about twice as slow: read the
# GPU-hours as a lower bound, and the ratios between grids as the point.
TRAIN_FRAMES_PER_S = 80_900
DECODE_FRAMES_PER_S = 3 * TRAIN_FRAMES_PER_S

# Recordings in the paper's test sets (paper 000 §3.1; the TED-LIUM 3 test set's 11 talks), by the dataset names of
# grids/paper.yaml, for the per-recording costs of sets that are not on disk here.
KNOWN_TEST_RECORDINGS: dict[str, int] = {"earnings22": 125, "tedlium": 11, "rev16": 16}

_durations_cache: dict[tuple[str, str], tuple[float, ...] | None] = {}


def eval_set_durations(spec: str) -> tuple[float, ...] | None:
    """Durations in seconds of the recordings of the dataset ``NAME=FORMAT:PATH`` when it is on disk here (its
    transcripts', read once per process: the one reading behind :func:`eval_set_hours` and the estimate's
    per-recording counts and windows), else None."""
    from asr_core.contract.specs import split_named_spec, split_spec
    from asr_core.data.corpora import CorpusError, load_corpus

    try:
        _, path = split_spec(split_named_spec(spec)[1])
    except CorpusError:
        return None
    ck = (spec, str(path.resolve()))
    if ck not in _durations_cache:
        durations = None
        if path.exists():
            try:
                durations = tuple(r.duration for r in load_corpus(spec, audio=False))
            except (CorpusError, OSError, ValueError):
                durations = None
        _durations_cache[ck] = durations
    return _durations_cache[ck]


def eval_set_hours(spec: str) -> float | None:
    """Hours of the dataset ``NAME=FORMAT:PATH``: its transcripts' durations when it is on disk here
    (:func:`eval_set_durations`), else :data:`KNOWN_TEST_HOURS` by name, else None."""
    durations = eval_set_durations(spec)
    if durations is not None:
        return sum(durations) / 3600.0
    return KNOWN_TEST_HOURS.get(dataset_name(spec))


def eval_set_recordings(spec: str) -> float | None:
    """Recordings in the dataset ``NAME=FORMAT:PATH``: counted when it is on disk (:func:`eval_set_durations`),
    else :data:`KNOWN_TEST_RECORDINGS` by name, else None. Passed to :func:`eval_work` as its ``hours_of``, it
    counts (recording, condition) pairs x ``1 / stride``."""
    durations = eval_set_durations(spec)
    if durations is not None:
        return len(durations)
    return KNOWN_TEST_RECORDINGS.get(dataset_name(spec))


def eval_work(cfg: Config, hours_of: Callable[[str], float | None] = eval_set_hours) -> tuple[float, float] | None:
    """(decoded audio-hours, estimated GPU-hours) of one trial's evaluation: for each dataset, its hours x its
    conditions (clean, plus one per SNR where it is noisy) x windows per frame (1 / eval.stride: every frame is
    decoded in that many overlapping windows; fewer where a recording is shorter than the window). GPU-hours at
    :data:`DECODE_FRAMES_PER_S`. None when a dataset's size is unknown."""
    ev = cfg.eval
    total = 0.0
    for spec in ev.datasets:
        hours = hours_of(spec)
        if hours is None:
            return None
        noisy = not ev.noisy or dataset_name(spec) in ev.noisy
        total += hours * (1 + (len(ev.snrs) if noisy else 0)) / ev.stride
    gpu_h = total * cfg.data.features.frames_per_second / DECODE_FRAMES_PER_S
    return total, gpu_h


def subgrid_eval_work(grid: Grid, hours_of: Callable[[str], float | None] = eval_set_hours
                      ) -> dict[str, tuple[float, float] | None]:
    """Evaluation work per sub-grid, of the trials it adds (first asks for), so that the sub-grids add up to the
    grid's; ``""`` holds the total. None where some dataset's size is unknown."""
    out: dict[str, tuple[float, float] | None] = {s.name: (0.0, 0.0) for s in grid.subgrids}
    out[""] = (0.0, 0.0)
    for t in grid.trials:
        w = eval_work(t.config, hours_of)
        for k in (t.subgrids[0], ""):
            cur = out[k]
            out[k] = None if w is None or cur is None else (cur[0] + w[0], cur[1] + w[1])
    return out


def _fmt_work(w: tuple[float, float] | None) -> tuple[str, str]:
    return ("?", "?") if w is None else (f"{w[0]:,.0f}", f"{w[1]:,.1f}")


def plan_table(grid: Grid, hours_of: Callable[[str], float | None] = eval_set_hours) -> str:
    """The per-sub-grid breakdown ``plan`` prints: trials, new unique trials, the new trials' evaluation work
    (decoded audio-hours, estimated GPU-hours; :func:`eval_work`), section."""
    work = subgrid_eval_work(grid, hours_of)
    rows = [("sub-grid", "section", "trials", "new", "eval audio-h", "eval GPU-h", "file")]
    for s in grid.subgrids:
        rows.append((s.name, s.section, str(s.n_points), str(s.n_new), *_fmt_work(work[s.name]), Path(s.file).name))
    rows.append(("total (unique)", "", str(sum(s.n_points for s in grid.subgrids)), str(len(grid.trials)),
                 *_fmt_work(work[""]), ""))
    right = (2, 3, 4, 5)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(c.rjust(w) if j in right else c.ljust(w)
                               for j, (c, w) in enumerate(zip(r, widths))).rstrip())
        if i == 0 or i == len(rows) - 2:
            lines.append("  ".join("-" * w for w in widths))
    by_section: dict[str, int] = {}
    for s in grid.subgrids:
        by_section[s.section or "(none)"] = by_section.get(s.section or "(none)", 0) + s.n_new
    lines.append("")
    lines.append("new trials by section: " + ", ".join(f"{k}: {v}" for k, v in by_section.items()))
    sizes = sorted({spec for t in grid.trials for spec in t.config.eval.datasets})
    shown = ", ".join(f"{dataset_name(spec) or spec} {_hours_txt(spec, hours_of(spec))}" for spec in sizes)
    lines.append(f"eval work of each sub-grid's new trials: test-set hours x conditions (clean + SNRs where noisy) x "
                 f"windows per frame (1/eval.stride); test sets: {shown or 'none'}")
    lines.append(f"eval GPU-h: decoding at {DECODE_FRAMES_PER_S:,} frames/s = 3x the 80,900 training frames/s of "
                 "paper 000 Table 1 (forward only ~1/3 of a training step; bf16, flash attention, A100): a lower bound")
    lines.append(f"{grid.name}: {len(grid.trials)} unique trials")
    return "\n".join(lines)


def _hours_txt(spec: str, h: float | None) -> str:
    where = "on disk" if Path(spec.partition("=")[2].partition(":")[2] or "/nonexistent").exists() else "not on disk"
    if h is None:
        return f"? h ({where}, size unknown)"
    return f"{h:,.1f} h ({'read' if where == 'on disk' else 'paper 000 §3.1'})"
