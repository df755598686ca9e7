"""``--where KEY=VALUE``: which models and evaluation jobs of a sweep a command acts on (``evaluate``, ``cancel``,
``resume``, ``retry``). A config field (``data.context_s=10.24``, parsed as grids and ``--set`` parse it),
``subgrid=NAME``, ``key=KEY`` (a model with its evaluation jobs, or one job) or ``evaluation=NAME`` (that
evaluation's jobs; ``none``: the models). Values of one key are alternatives; different keys must all hold.
"""

from __future__ import annotations

from typing import Any, Iterable

from orchestrate.sweep.trial import Trial

SELECTORS = ("subgrid", "key", "evaluation")  # --where keys that are not config fields


class WhereError(ValueError):
    """A ``--where`` item is invalid; the message names it and what is valid (exit 2)."""


def parse_where(items: Iterable[str]) -> dict[str, list[Any]]:
    """``["data.context_s=10.24", "model.heads=6"]`` → {field: [values]}, each value parsed as the grid and ``--set``
    parse it (:func:`asr_core.config.parse_field`); ``subgrid=NAME`` selects a sub-grid's trials, ``key=KEY`` a
    model (and its evaluation jobs) or one evaluation job by its key, ``evaluation=NAME`` the evaluation jobs of
    that name (``evaluation=none``: the models themselves). Values of one key are alternatives, different keys must
    all hold. Raises :class:`WhereError` naming the bad item."""
    from asr_core.config import parse_field
    from asr_core.config.parse import ConfigError, parse_override

    out: dict[str, list[Any]] = {}
    for item in items:
        if "=" not in item:
            raise WhereError(f"--where {item!r}: valid: KEY=VALUE, a config field (data.context_s=10.24), "
                              "subgrid=NAME, key=KEY or evaluation=NAME")
        try:
            key, value = parse_override(item)
            if key not in SELECTORS:
                value = parse_field(key, value, source=f"--where {item!r}")
        except ConfigError as e:
            raise WhereError(f"{e} (or subgrid=NAME, key=KEY, evaluation=NAME)") from None
        out.setdefault(key, []).append(str(value) if key in SELECTORS else value)
    return out


def matches(trial: Trial, where: dict[str, list[Any]]) -> bool:
    """Whether ``trial`` satisfies every ``--where`` key (one of its values each)."""
    from asr_core.config import parse_field

    flat = trial.config.flat()
    ev = getattr(trial, "evaluation", None)
    for key, values in where.items():
        if key == "subgrid":
            if not set(values) & set(trial.subgrids):
                return False
        elif key == "key":
            if not {trial.key, ev["model"] if ev else trial.key} & set(values):
                return False
        elif key == "evaluation":
            if (ev["name"] if ev else "none") not in values:
                return False
        elif parse_field(key, flat[key], source=f"trial {trial.key}") not in values:
            return False
    return True
