"""Frozen, validated configuration of the Transformer language model (paper 004 §3.2).

The paper's LM: 6 layers, d=1024, QK-norm multi-query attention with 16 query heads, RMSNorm, dynamic position
bias, GEGLU feed-forward, 72M parameters, on the acoustic model's vocabulary. Where the paper is silent the default
is what the authors' LM code ran (``robflynnyh/language_modelling``: ``lming/models/transformer.py`` and
``projects/spotipile/exp/transformer/configs/512_1536.yaml``); each such field says ``# code:`` beside it.

Vocabulary. The LM shares the acoustic model's tokenizer (:class:`asr_core.data.tokenizer.Tokenizer`), whose last id,
``vocab_size - 1``, is the CTC blank. Text never encodes to the blank, so the LM reuses that id as its
*beginning-of-document* token: it **reads** ids ``0 .. vocab_size - 1`` (the last one only as the first token of a
document) and **predicts** the ``vocab_size - 1`` pieces, so its log-probabilities are normalised over real tokens
only and column ``i`` of its output is the acoustic model's id ``i``. ``vocab_size`` is therefore the tokenizer's
``vocab_size`` (pieces + 1), the same number as ``model.vocab_size`` of the acoustic model it decodes with.

Feed-forward width. The paper names GEGLU "with an expansion factor of 4" and 72M parameters; the authors' code ran
a plain 4x GELU MLP (flash-attn's ``FusedMLP``). A GEGLU whose hidden width is 4d would hold 97M parameters, so the
GEGLU here is the parameter-matched one (Shazeer 2020, "GLU variants"): hidden width ``2/3 * 4 * d``, the parameters
of a 4x MLP, giving the paper's 72M.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping

from asr_core.config import ConfigError


def _require(cond: bool, key: str, value: Any, valid: str) -> None:
    if not cond:
        raise ConfigError(f"invalid value for '{key}': {value!r}; valid: {valid}")


def _positive_int(key: str, value: Any) -> None:
    _require(isinstance(value, int) and not isinstance(value, bool) and value > 0, key, value, "a positive integer")


@dataclass(frozen=True)
class LMConfig:
    """The Transformer LM. ``LMConfig()`` is the paper's model on the paper's 4096-id vocabulary."""

    vocab_size: int = 4096  # the tokenizer's vocab_size (pieces + 1): reads all ids, predicts the pieces (see above)
    d_model: int = 1024
    layers: int = 6
    heads: int = 16  # query heads; every layer has ONE key/value head (multi-query attention)
    ff_expansion: int = 4  # GEGLU with the parameters of a ff_expansion x MLP: hidden = 2/3 * ff_expansion * d
    # code: QK-norm attention scores are cosine similarities times a learned per-layer scale starting here
    # (temperature: 18.0, shared_temperture: false in 512_1536.yaml)
    qk_scale: float = 18.0
    dpb_width: int = 256  # code: the dynamic position bias MLP is d/4 wide ...
    dpb_depth: int = 2  # code: ... with two hidden layers (SiLU), on raw (not log) distances
    norm_eps: float = 1e-5  # code: apex FusedRMSNorm's default

    def __post_init__(self) -> None:
        for name in ("d_model", "layers", "heads", "ff_expansion", "dpb_width", "dpb_depth"):
            _positive_int(f"lm.{name}", getattr(self, name))
        _require(isinstance(self.vocab_size, int) and self.vocab_size >= 3, "lm.vocab_size", self.vocab_size,
                 "an integer >= 3: the tokenizer's vocab_size (pieces + 1; the last id starts a document)")
        _require(self.d_model % self.heads == 0, "lm.heads", self.heads,
                 f"a divisor of lm.d_model={self.d_model} (the head dimension must be whole)")
        _require(self.qk_scale > 0, "lm.qk_scale", self.qk_scale, "a positive number")
        _require(self.norm_eps > 0, "lm.norm_eps", self.norm_eps, "a positive number")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def ff_width(self) -> int:
        """GEGLU hidden width: 2/3 of ``ff_expansion * d_model`` (2730 at d=1024)."""
        return 2 * self.ff_expansion * self.d_model // 3

    @property
    def pieces(self) -> int:
        """Output classes: every id but the last (the acoustic model's blank)."""
        return self.vocab_size - 1

    @property
    def bos_id(self) -> int:
        """The beginning-of-document token: the acoustic model's blank id, which no text encodes to."""
        return self.vocab_size - 1

    # ---- (de)serialisation, for checkpoints ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "lm config") -> "LMConfig":
        """Build from a plain dict; an unknown key raises :class:`ConfigError` listing the valid ones."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ConfigError(f"{source}: unknown LM config key(s) {', '.join(unknown)}; valid: {', '.join(names)}")
        return cls(**dict(d))


PRESETS: dict[str, LMConfig] = {
    "paper": LMConfig(),  # paper 004 §3.2: ~72M parameters at vocab_size 4096
    # CPU tests and demos: every component present (two layers so cached keys of layer 2 depend on context)
    "tiny": LMConfig(d_model=64, layers=2, heads=4, dpb_width=16, qk_scale=10.0),
}


def preset(name: str, **overrides: Any) -> LMConfig:
    """The named LM config with ``overrides`` (e.g. ``vocab_size=tokenizer.vocab_size``), validated."""
    if name not in PRESETS:
        raise ConfigError(f"unknown LM preset {name!r}; valid: {', '.join(sorted(PRESETS))}")
    try:
        return dataclasses.replace(PRESETS[name], **overrides)
    except TypeError:
        names = [f.name for f in dataclasses.fields(LMConfig)]
        bad = sorted(set(overrides) - set(names))
        raise ConfigError(f"unknown LM config key(s) {', '.join(bad)}; valid: {', '.join(names)}") from None
