"""The Transformer language model of paper 004 (§3.2): configuration, model and key-value cache; with paper 002's
lookup memory as an option (:mod:`asr_core.lm.memory`).

``LMConfig`` / ``PRESETS`` / ``preset`` (:mod:`asr_core.lm.config`); ``TransformerLM``, ``KVCache``, ``build_lm``,
``parameter_count``, ``lm_size`` (:mod:`asr_core.lm.model`). Beam search with it lives in
:mod:`asr_core.decoding.beam`.
"""

from asr_core.lm.config import PRESETS, LMConfig, preset
from asr_core.lm.model import KVCache, LMSize, TransformerLM, build_lm, lm_size, parameter_count

__all__ = ["PRESETS", "KVCache", "LMConfig", "LMSize", "TransformerLM", "build_lm", "lm_size", "parameter_count",
           "preset"]
