"""The one parser of configuration values, and the error it raises.

Every value of a frozen config dataclass, wherever it is written (a config file, a grid, ``--set``), is checked and
converted here against the field's type; unknown keys are refused with the valid ones named. The acoustic model's
:class:`~asr_core.config.Config` and the language model's training config are both built by
:func:`build_dataclass`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Mapping

from asr_core.config.yaml_input import YamlInputError, load_yaml_text


class ConfigError(ValueError):
    """A configuration key or value is invalid; the message names it and says what is valid."""


def parse_override(item: str) -> tuple[str, Any]:
    """``"model.layers=9"`` -> ``("model.layers", 9)``; the value is parsed as YAML (numbers, lists, bools) by
    :mod:`asr_core.config.yaml_input`, a value that is not YAML kept as its text; one past its bounds raises ConfigError."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.field=value, e.g. model.layers=9")
    key, text = item.split("=", 1)
    key = key.strip()
    if not key or key.startswith(".") or key.endswith("."):
        raise ConfigError(f"override {item!r}: the key must be a dotted path such as train.lr")
    try:
        value = load_yaml_text(text, f"--set {key}") if text.strip() else ""
    except YamlInputError as e:
        if e.bound:  # an alias bomb or an oversized value: refused, never expanded
            raise ConfigError(str(e)) from None
        value = text  # not YAML (e.g. "podcast:/data/[x"): the text itself
    return key, value


def set_path(d: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``d["a"]["b"] = value`` for ``dotted = "a.b"``, making sections as needed."""
    parts = dotted.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {dotted!r}: {p!r} is a value, not a section")
        cur = nxt
    cur[parts[-1]] = value


def merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``a`` with ``b`` laid over it, section by section (``b`` wins on a value both set)."""
    out = deep_copy(a)
    for k, v in b.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = deep_copy(v)
    return out


def deep_copy(x: Any) -> Any:
    """A copy of nested mappings and lists (the values themselves are plain YAML/JSON data, shared)."""
    if isinstance(x, Mapping):
        return {k: deep_copy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [deep_copy(v) for v in x]
    return x


def build_dataclass(cls: type, d: dict[str, Any], prefix: str, source: str) -> Any:
    """``cls(**d)`` with every value checked and converted to its field's type (nested sections built in turn);
    an unknown key or a bad value raises :class:`ConfigError` naming ``prefix`` + the key and ``source``."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        where = prefix.rstrip(".") or "top level"
        raise ConfigError(f"{source}: unknown key '{prefix}{unknown[0]}' in {where}; valid keys: "
                          + ", ".join(f"{prefix}{k}" for k in fields))
    kwargs: dict[str, Any] = {}
    for name, value in d.items():
        kwargs[name] = coerce_value(hints[name], value, f"{prefix}{name}", source)
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def field_types(cls: type, prefix: str = "") -> dict[str, Any]:
    """Every leaf field of the dataclass ``cls`` by dotted name (nested sections walked) -> its type."""
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.update(field_types(tp, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = tp
    return out


def coerce_value(tp: Any, value: Any, key: str, source: str) -> Any:
    """``value`` as the type ``tp`` of the field ``key`` (a YAML list as a tuple, 3e-3 read as a string as a
    float, ...); anything else raises :class:`ConfigError`."""
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{source}: '{key}' must be a mapping of its fields, got {value!r}")
        return build_dataclass(tp, dict(value), key + ".", source)
    origin = typing.get_origin(tp)
    if origin is tuple:
        (inner, *_rest) = typing.get_args(tp)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: invalid value for '{key}': {value!r}; valid: a list")
        return tuple(coerce_value(inner, v, key, source) for v in value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: invalid value for '{key}': {value!r}; valid: true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{source}: invalid value for '{key}': {value!r}; valid: an integer")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 3e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{source}: invalid value for '{key}': {value!r}; valid: a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: invalid value for '{key}': {value!r}; valid: a string")
        return value
    if isinstance(tp, types.UnionType):  # pragma: no cover - no union fields today
        return value
    return value
