"""Trial identity: which settings name the experiment, and the key that names it.

A sweep runs for weeks. Meanwhile its users move data, tune loader workers, pull new versions of the project and add
options; none of that may make a finished model look unfinished or a half-trained one look new. So a trial key is a
digest of the *science* only:

* **science** — the model, the training data's identity, the training hyperparameters and the seed: what a
  *trained model* is. Every field of :class:`~asr_core.config.Config` is science unless listed in
  :data:`EXECUTION` or it belongs to the evaluation (``eval.*``, :data:`EVALUATION_SECTION`).
* **evaluation** — how a trained model is decoded and scored (test sets, SNRs, noise, stride, precision). It never
  enters the model's key: a model is trained once and evaluated any number of ways afterwards, each evaluation
  named by the model's key and a digest of its setting (:func:`evaluation_key`), so no change of evaluation
  retrains a model.
* **execution** — how a trial runs (:data:`EXECUTION`, each with the reason). It never enters the key, and a later
  ``submit``/``resume`` may change it for trials that have not finished.
* **names, not paths** — a corpus is identified by its name (:data:`NAMED`): ``NAME`` of ``NAME=FORMAT:PATH``; an
  unnamed training corpus is "the" corpus of its trials, so ``podcast:/a`` and ``podcast:/b`` are one corpus that
  moved. Its content fingerprint (:mod:`asr_core.data.corpora.fingerprint`) is recorded on the checkpoint and run and
  checked on resume, so other content under the same name is refused rather than mixed. Corpora compared within one
  sweep need names (a grid that would give two corpora one key is an error).
* **departures from a frozen baseline** — a field enters the key only where it differs from :data:`BASELINE`, the
  values the fields had when keys were introduced. Adding an option (at any default) leaves every existing key as
  it was; changing a *default* in ``config.py`` moves exactly the keys of the trials that use it, as it should. A new
  science field is added to :data:`BASELINE` in the commit that adds it (a test insists), at the value that
  reproduces what the project did before the field existed: its default, unless the same commit changes the recipe.

The golden keys (``tests/golden/keys.json``) pin the keys of the checked-in grids: a commit that changes them says
why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Mapping

from asr_core.contract.specs import dataset_name

KEY_DIGITS = 12
EVAL_KEY_DIGITS = 8  # the digest of an evaluation's setting appended to its model's key
# The section of Config that says how a trained model is evaluated: never part of the model's key (see the docstring)
EVALUATION_SECTION = "eval."

# Settings that say how a trial runs, not what it is. Each keeps the experiment the same (same data order, same
# model, same loss); where one changes floating-point rounding the reason says so.
EXECUTION: dict[str, str] = {
    "model.activation_checkpointing": "recomputes activations in the backward pass: the same gradients, less memory",
    "model.attention_backend": "flash-attn or PyTorch SDPA: the same attention, another kernel",
    "data.micro_batch_audio_s": "gradient accumulation: the same step's gradient in several passes (batch renorm "
                                "sees each pass's statistics; chosen for the GPU's memory, not for the science)",
    "data.num_workers": "loader threads preparing upcoming steps; the data order does not depend on them",
    "train.device": "where it runs (auto, cpu, cuda)",
    "train.checkpoint_every": "how often the trainer checkpoints",
    "train.log_every": "how often the trainer prints progress",
    "train.max_nonfinite_steps": "when a trial whose loss stays non-finite is stopped as diverged; a trial that "
                                 "finishes skipped no more steps in a row than this, and each skip leaves the model "
                                 "as it was",
    "train.compile": "torch.compile of the model's parts: the same model, data and loss, its floating-point sums "
                     "in another order",
    "eval.batch_windows": "windows decoded together: the same posteriors, batched",
    # head similarity (paper 003) is measured after evaluation: more metrics, the same model and WERs, so switching
    # it on for a grid's trials keeps their keys (orchestrate.plan.grid refuses one model whose sub-grids set it unlike)
    "eval.head_diversity": "whether head similarity is measured after evaluation: extra metrics, the same model "
                           "and WERs",
    "eval.head_rows": "query rows of A sampled by that measurement (its precision, not the model's)",
    "eval.head_windows": "windows that measurement averages over (its precision, not the model's)",
    "eval.tail": "the tail set the tail-word error rate is measured against (paper 002): extra metrics and table "
                 "columns, the same model and WERs",
}

# Fields whose value is a location; the key holds the name of what is there (see :func:`identity_value`).
NAMED = ("data.train", "data.tokenizer", "eval.datasets", "eval.noise")

# The science fields as they were when keys were introduced (identity values: names for NAMED fields, sorted
# tuples for the unordered eval sets). Never edit a value here: a new default belongs in config.py, and keys of the
# trials that use it then change, as they must. A new science field is appended at the value that does what the
# project did before it existed (usually its default).
BASELINE: dict[str, Any] = {
    "model.d_model": 768,
    "model.layers": 6,
    "model.heads": 6,
    "model.ff_expansion": 4,
    "model.conv_kernel": 9,
    "model.subsampling_factor": 8,
    "model.subsampling_channels": 256,
    "model.posenc": "rotary",
    "model.rotary_theta": 1500000.0,
    "model.vocab_size": 4096,
    "model.self_conditioning": True,
    "model.batch_renorm_eps": 0.001,
    "model.batch_renorm_momentum": 0.01,
    "model.batch_renorm_warmup_steps": 25000,
    "data.train": "",
    "data.tokenizer": "",
    "data.context_s": 10.24,
    "data.batch_audio_s": 3600.0,
    "data.seqlen_warmup": "paper",
    "data.seqlen_warmup_start_s": 5.0,
    "data.seqlen_warmup_every": 5000,
    "data.max_recordings": 0,
    "data.features.sample_rate": 16000,
    "data.features.n_mels": 80,
    "data.features.win_length": 400,
    "data.features.hop_length": 160,
    "data.features.variant": "paper",
    "train.seed": 0,
    "train.init_seed": None,  # the weights came from train.seed before the field existed
    "train.init_from": None,  # every trial started from random weights before the field existed
    "train.lr_decay_over": "steps",  # the cosine decayed over optimiser steps before the field existed
    "train.optimizer": "madgrad",
    "train.lr": 0.003,
    "train.warmup_steps": 5000,
    "train.max_steps": 0,
    "train.epochs": 1,
    "train.momentum": 0.9,
    "train.weight_decay": 0.0,
    "train.eps": 1e-06,
    "train.grad_clip": 0.8,
    "train.precision": "auto",
    "eval.datasets": (),
    "eval.snrs": (),
    "eval.stride": 0.125,
    "eval.noise": "synthetic",
    # Added with the authors' recipe as the default (issue 14): each at the value that reproduces what the project
    # did before the field existed, so that every trial of the new recipe has a new key.
    "data.batching": "consecutive",
    "train.loss_norm": "tokens",
    "model.batch_renorm_schedule": "linear",
    "model.decoder_norm": False,
    "model.ff_activation": "silu",
    "model.ff_bias": True,
    "eval.noisy": (),
    "eval.precision": "fp32",
    # Paper 003's auxiliary loss (issue 17), at its defaults: off, as before it existed.
    "train.head_diversity_weight": 0.0,
    "train.head_diversity_repr": "Y",
    "train.head_diversity_rows": 64,
    # The banded-attention control (issue 44), at its default: the whole window, as before it existed.
    "model.attention_span_s": None,
    # Cuts at word starts (issue 44), at the default: fixed cuts, as before the field existed.
    "data.cut": "fixed",
}


def _flat_values(obj: Any, prefix: str = "") -> dict[str, Any]:
    """``{"model.layers": 6, ...}`` of a config dataclass, without copies (planning hashes thousands of configs)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            out.update(_flat_values(v, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = v
    return out


def field_defaults(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Dataclass defaults by dotted name, read from the types of ``obj``'s own sections (a field added after
    :data:`BASELINE` was frozen uses its own default as its baseline)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            out.update(field_defaults(v, f"{prefix}{f.name}."))
        elif f.default is not dataclasses.MISSING:
            out[f"{prefix}{f.name}"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f"{prefix}{f.name}"] = f.default_factory()
    return out


def _path_name(path: str) -> str:
    """The last component of a path (``/data/tok/bpe.model`` -> ``bpe.model``); keeps names, drops locations."""
    return path.rstrip("/").rsplit("/", 1)[-1] if path else ""


_REWRITTEN = frozenset((*NAMED, "eval.snrs", "eval.noisy"))


def identity_value(field: str, value: Any) -> Any:
    """What of ``value`` names the experiment: a corpus's name instead of its spec, sorted evaluation sets."""
    if field not in _REWRITTEN:
        return value
    if field == "data.train":
        return dataset_name(value)
    if field == "eval.datasets":
        return tuple(sorted(dataset_name(s) for s in value))
    if field == "eval.snrs":
        return tuple(sorted(float(x) for x in value))
    if field == "eval.noisy":
        return tuple(sorted(value))
    if field == "data.tokenizer":  # on resume the trainer uses the checkpoint's own copy of it
        return _path_name(value)
    if field == "eval.noise":
        return value if value == "synthetic" else "file:" + _path_name(value)
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal as the key sees them (a tuple and a list of the same numbers are the same; 3 and 3.0 too)."""
    if a == b:
        return True
    return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and list(a) == list(b)


def baseline(field: str, defaults: Mapping[str, Any]) -> Any:
    """The identity value of ``field`` that does not enter keys: :data:`BASELINE`'s, else (a field added since it
    was frozen) the field's own default, from ``defaults`` (:func:`field_defaults` of a config, e.g.
    :data:`asr_core.config.FIELD_DEFAULTS`); None for a name that is no field."""
    if field in BASELINE:
        return BASELINE[field]
    return identity_value(field, defaults[field]) if field in defaults else None


def science(cfg: Any) -> dict[str, Any]:
    """The fields of ``cfg`` that name its experiment and differ from the baseline: ``{"data.context_s": 81.92}``.

    ``cfg`` is a :class:`~asr_core.config.Config` (or any dataclass of the same shape with extra fields)."""
    defaults: dict[str, Any] = {}  # read from cfg's own section types, only when a field is newer than the baseline
    out: dict[str, Any] = {}
    for field, value in _flat_values(cfg).items():
        if field in EXECUTION or field.startswith(EVALUATION_SECTION):
            continue
        ident = identity_value(field, value)
        if field not in BASELINE and not defaults:
            defaults = field_defaults(cfg)
        if not _same(ident, baseline(field, defaults)):
            out[field] = list(ident) if isinstance(ident, tuple) else ident
    return out


def trial_key(cfg: Any) -> str:
    """12 hex digits naming the trained model of ``cfg`` (seed included, evaluation excluded): SHA-256 of
    :func:`science` as sorted JSON. Called the *model key*."""
    blob = json.dumps(science(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:KEY_DIGITS]


def evaluation_key(model_key: str, setting: Any) -> str:
    """The key of one evaluation of the model ``model_key``: ``<model key>-<8 hex digits>``, the digits SHA-256 of
    ``setting`` (a JSON-able mapping: the evaluation's name, fixed setting and the datasets and conditions it
    decodes, by name) as sorted JSON. Evaluations with equal settings of one model have one key."""
    blob = json.dumps(setting, sort_keys=True, separators=(",", ":"), default=str)
    return f"{model_key}-{hashlib.sha256(blob.encode()).hexdigest()[:EVAL_KEY_DIGITS]}"
