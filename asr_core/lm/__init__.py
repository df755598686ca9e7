"""The Transformer language model of paper 004 (§3.2): configuration, model and key-value cache.

``LMConfig`` / ``PRESETS`` / ``preset`` (:mod:`asr_core.lm.config`); ``TransformerLM``, ``KVCache``, ``build_lm``,
``parameter_count`` (:mod:`asr_core.lm.model`). Beam search with it lives in :mod:`asr_core.decoding.beam`.
"""

from asr_core.lm.config import PRESETS, LMConfig, preset
from asr_core.lm.model import KVCache, TransformerLM, build_lm, parameter_count

__all__ = ["PRESETS", "KVCache", "LMConfig", "TransformerLM", "build_lm", "parameter_count", "preset"]
