"""The Transformer language model of paper 004 (§3.2): configuration, model and key-value cache; with paper 002's
lookup memory as an option (:mod:`asr_core.lm.memory`).

``LMConfig`` / ``PRESETS`` / ``preset`` (:mod:`asr_core.lm.config`); ``TransformerLM``, ``KVCache``, ``build_lm``,
``parameter_count``, ``lm_size`` (:mod:`asr_core.lm.model`). Beam search with it lives in
:mod:`asr_core.decoding.beam`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asr_core.lm.config import PRESETS, LMConfig, preset
    from asr_core.lm.model import KVCache, LMSize, TransformerLM, build_lm, lm_size, parameter_count

# each name from the submodule that defines it, imported on first use: the command line (asr_core.lm.cli) and shell
# completion reach this package without torch
_HOME = {"PRESETS": "config", "LMConfig": "config", "preset": "config", "KVCache": "model", "LMSize": "model",
         "TransformerLM": "model", "build_lm": "model", "lm_size": "model", "parameter_count": "model"}


def __getattr__(name: str) -> Any:
    """``asr_core.lm.NAME`` for the names of ``__all__``, from their submodule."""
    if name not in _HOME:
        raise AttributeError(f"module 'asr_core.lm' has no attribute {name!r}")
    return getattr(importlib.import_module(f"asr_core.lm.{_HOME[name]}"), name)

__all__ = ["PRESETS", "KVCache", "LMConfig", "LMSize", "TransformerLM", "build_lm", "lm_size", "parameter_count",
           "preset"]
