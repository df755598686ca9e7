"""Frozen, validated configuration of the Transformer language model (paper 004 §3.2) and of its training
(:class:`LMTrainConfig`, paper 004 §3.3; trained by :mod:`asr_core.lm.train`).

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

Lookup memory (paper 002, :mod:`asr_core.lm.memory`). ``memory`` (a :class:`~asr_core.lm.memory.MemoryConfig`, or
None: the plain LM, the default) adds the hashed dictionary the last layer reads; ``tie_embeddings`` makes the
output layer the transpose of the input embedding's first ``pieces`` rows, without a bias (False, the default: an
untied Linear with a bias, as every LM trained before these fields existed). Paper 002 ties the two (its memory
stores input embeddings that the output layer must score), so a memory requires ``tie_embeddings: true``. A config
written without these keys loads as ``memory=None, tie_embeddings=False``: old checkpoints load unchanged. In a
file or ``--set``: ``lm.memory: {buckets: 5000}`` (unset fields: the paper's) or ``lm.memory.buckets=5000``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Mapping

from asr_core.config.parse import ConfigError, build_dataclass, parse_override
from asr_core.lm.memory import MemoryConfig


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
    memory: MemoryConfig | None = None  # paper 002's lookup dictionary; None: none (see the module docstring)
    tie_embeddings: bool = False  # True: output layer = input embedding transposed, no bias (required by memory)

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory", memory_config(self.memory))
        for name in ("d_model", "layers", "heads", "ff_expansion", "dpb_width", "dpb_depth"):
            _positive_int(f"lm.{name}", getattr(self, name))
        _require(isinstance(self.vocab_size, int) and self.vocab_size >= 3, "lm.vocab_size", self.vocab_size,
                 "an integer >= 3: the tokenizer's vocab_size (pieces + 1; the last id starts a document)")
        _require(self.d_model % self.heads == 0, "lm.heads", self.heads,
                 f"a divisor of lm.d_model={self.d_model} (the head dimension must be whole)")
        _require(self.qk_scale > 0, "lm.qk_scale", self.qk_scale, "a positive number")
        _require(self.norm_eps > 0, "lm.norm_eps", self.norm_eps, "a positive number")
        _require(isinstance(self.tie_embeddings, bool), "lm.tie_embeddings", self.tie_embeddings, "true or false")
        _require(self.memory is None or self.tie_embeddings, "lm.tie_embeddings", self.tie_embeddings,
                 "true when lm.memory is set (the memory stores input embeddings that the output layer scores, "
                 "paper 002 §2.3): set lm.tie_embeddings: true, or lm.memory: null for no memory")

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


def memory_config(value: Any) -> MemoryConfig | None:
    """``lm.memory`` as written (None, a :class:`MemoryConfig`, or a mapping of its fields from YAML/JSON) -> the
    config; :class:`ConfigError` names an unknown field or a bad value."""
    if value is None or isinstance(value, MemoryConfig):
        return value
    if not isinstance(value, Mapping):
        names = ", ".join(f.name for f in dataclasses.fields(MemoryConfig))
        raise ConfigError(f"invalid value for 'lm.memory': {value!r}; valid: null (no memory) or a mapping of its "
                          f"fields ({names})")
    return build_dataclass(MemoryConfig, json.loads(json.dumps(dict(value))), "lm.memory.", "lm.memory")


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


# ---- training ---------------------------------------------------------------------------------------------------
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "bf16", "fp32")
EXECUTION = ("checkpoint_every", "log_every", "device")  # may differ between segments of one run


@dataclass(frozen=True)
class LMTrainConfig:
    """The LM and how it is trained. Defaults: the paper's run (paper 004 §3.3) and, where the paper is silent, the
    authors' LM training config (``robflynnyh/language_modelling``: ``projects/spotipile/exp/transformer/configs/
    512_1536.yaml``, ``train_ddp.py``)."""

    lm: LMConfig = field(default_factory=LMConfig)
    batch: int = 40  # code: 10 documents per GPU (batch_size) on 4 GPUs (paper §3.3: "4 A4500s")
    chunk_len: int = 512  # paper §3.3: "a sequence length of 512"
    # the memory kept after each chunk (the chunk's own keys included): 1280 tokens, paper 004 §3.3 ("a maximum cache
    # of 1280 tokens") and the LM the authors decoded with (eval/earnings22/tlm_beam.py loads the 512_1280 run);
    # cache_len=1536 is their 512_1536.yaml, another run's config
    cache_len: int = 1280
    lr: float = 3.8e-4  # code (paper §3.3: Madgrad, LR warmup then cosine annealing)
    warmup_steps: int = 2000  # code
    max_steps: int = 0  # 0: ``epochs`` passes over the text; > 0: this many steps, the text repeating as needed
    epochs: int = 1  # paper §3.3: "trained for one epoch only"
    seed: int = 0  # initial weights and the documents' order
    grad_clip: float = 1.0  # code: clip_grad_norm_(..., 1.0) (paper: "gradient clipping")
    momentum: float = 0.9  # code: Madgrad's default (the config gives only lr)
    weight_decay: float = 0.0  # paper §3.3: "no regularisation is used"
    eps: float = 1e-6  # Madgrad's default
    checkpoint_every: int = 750  # code: save_every_n_steps 750
    log_every: int = 10  # progress line and a push to MLflow every this many steps
    device: str = "auto"  # auto: CUDA when available
    precision: str = "auto"  # code: bf16 autocast; auto = bf16 on CUDA, fp32 on the CPU

    def __post_init__(self) -> None:
        for name in ("batch", "chunk_len", "epochs", "checkpoint_every", "log_every"):
            v = getattr(self, name)
            _require(isinstance(v, int) and not isinstance(v, bool) and v > 0, name, v, "a positive integer")
        for name in ("cache_len", "warmup_steps", "max_steps", "seed"):
            v = getattr(self, name)
            _require(isinstance(v, int) and not isinstance(v, bool) and v >= 0, name, v, "an integer >= 0")
        _require(self.lr > 0, "lr", self.lr, "a positive number")
        _require(self.grad_clip > 0, "grad_clip", self.grad_clip, "a positive number")
        _require(0 <= self.momentum < 1, "momentum", self.momentum, "a number in [0, 1)")
        _require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a number >= 0")
        _require(self.eps > 0, "eps", self.eps, "a positive number")
        _require(self.device in DEVICES, "device", self.device, ", ".join(DEVICES))
        _require(self.precision in PRECISIONS, "precision", self.precision, ", ".join(PRECISIONS))

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def flat(self) -> dict[str, Any]:
        """Every leaf field by dotted name (``lm.d_model``, ``lm.memory.buckets``, ``lr``): the MLflow params.
        No memory: ``lm.memory`` is None."""
        return _flatten(self.to_dict(), "")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "lm config") -> "LMTrainConfig":
        """Build and validate from a nested dict; an unknown key raises :class:`ConfigError` listing the valid ones."""
        return build_dataclass(cls, json.loads(json.dumps(dict(d))), "", source)


def _flatten(d: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# what each preset changes of LMTrainConfig's training fields (its LM is PRESETS[name])
TRAIN_PRESETS: dict[str, dict[str, Any]] = {
    "paper": {},
    # CPU tests and demos: a few seconds per hundred steps on two cores
    "tiny": {"batch": 8, "chunk_len": 64, "cache_len": 128, "lr": 3e-3, "warmup_steps": 20,
             "checkpoint_every": 50, "log_every": 10},
}


def resolve_config(preset: str, overrides: Sequence[str] = (), *, vocab_size: int | None = None,
                   source: str = "the LM's config") -> LMTrainConfig:
    """Preset < ``vocab_size`` (the tokenizer's) < ``--set key=value`` overrides (``lm.d_model=128``, ``lr=1e-3``),
    validated; :class:`ConfigError` names an unknown key or bad value and what is valid."""
    if preset not in PRESETS or preset not in TRAIN_PRESETS:
        raise ConfigError(f"unknown LM preset {preset!r}; valid: {', '.join(sorted(TRAIN_PRESETS))}")
    raw: dict[str, Any] = {"lm": PRESETS[preset].to_dict(), **TRAIN_PRESETS[preset]}
    if vocab_size is not None:
        raw["lm"]["vocab_size"] = vocab_size
    for item in overrides:
        key, value = parse_override(item)
        *parents, leaf = key.split(".")
        cur = raw
        for p in parents:
            if cur.get(p, "") is None:  # an unset optional section (lm.memory): setting a field of it creates it
                cur[p] = {}
            nxt = cur.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"{source}: unknown key {key!r}: {p!r} is a value, not a section; valid keys: "
                                  + ", ".join(LMTrainConfig().flat()))
            cur = nxt
        cur[leaf] = value
    cfg = LMTrainConfig.from_dict(raw, source=source)
    if vocab_size is not None and cfg.lm.vocab_size != vocab_size:
        raise ConfigError(f"{source}: lm.vocab_size={cfg.lm.vocab_size} but the tokenizer has {vocab_size} ids "
                          "(pieces + 1); leave lm.vocab_size unset: it is the tokenizer's")
    return cfg
