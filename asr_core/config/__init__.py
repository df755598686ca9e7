"""Frozen, validated configuration for one training run (one trial of the study).

A run is fully described by a :class:`Config`: the model, the data it is trained on, the optimiser and the
evaluation that follows training. Configs load from YAML and take ``--set section.field=value`` overrides; every value,
wherever it is written (a config file, a grid, ``--set``), is checked by the one parser (:func:`parse_field`,
:mod:`asr_core.config.parse`). :meth:`Config.key` names the experiment (:mod:`asr_core.contract.identity`).

Defaults are the paper's main model (paper 000 §3, ``../shared/REFERENCE.md``): 6 layers, d=768, 6 heads, rotary
θ=1.5M, 4095 BPE pieces + blank, Madgrad at 3e-3, one hour of audio per step. Where the paper is silent or
contradicts itself, the default is what the authors' code ran (``robflynnyh/long-context-asr``: ``exp/train.py``,
``lcasr/``, ``exp/configs/paper_templates/``), and the paper's literal reading is a named option; each such field
says ``# code:`` or ``# paper:`` beside it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from asr_core.config.parse import (ConfigError, build_dataclass, coerce_value, deep_copy, field_types, merge,
                                   parse_override, set_path)
from asr_core.contract.specs import CORPUS_FORMATS, corpus_spec_problem, dataset_name
from asr_core.contract.identity import BASELINE, KEY_DIGITS, NAMED, field_defaults, trial_key
from asr_core.config.yaml_input import YamlInputError, load_yaml_file

POSITIONAL_ENCODINGS = ("rotary", "learnable-fourier", "sinusoidal", "fourier", "none")
ATTENTION_BACKENDS = ("auto", "sdpa", "flash")
FEATURE_VARIANTS = ("paper", "code")
BATCHINGS = ("interleaved", "consecutive")
CUTS = ("fixed", "pauses")  # data.cut: where training windows are cut (asr_core.data.chunking)
LR_DECAY_OVER = ("recordings", "steps")  # what the cosine learning-rate decay counts (train.lr_decay_over)
LOSS_NORMS = ("audio", "tokens")
BATCH_RENORM_SCHEDULES = ("code", "linear")
FF_ACTIVATIONS = ("gelu_tanh", "silu")
SEQLEN_WARMUPS = ("paper", "code", "none")
PRECISIONS = ("auto", "bf16", "fp32")
OPTIMIZERS = ("madgrad", "adamw")  # madgrad: the paper's; adamw: AdamW with (momentum, 0.98) betas
DEVICES = ("auto", "cpu", "cuda")
HEAD_REPRESENTATIONS = ("A", "Q", "K", "V", "Y")  # paper 003 Table 1; asr_core.model.heads.REPRESENTATIONS
FORMATS_TEXT = ", ".join(CORPUS_FORMATS)  # the corpus formats a spec may name, for messages


def _require(cond: bool, key: str, value: Any, valid: str) -> None:
    if not cond:
        raise ConfigError(f"invalid value for '{key}': {value!r}; valid: {valid}")


def _choice(key: str, value: Any, options: tuple[str, ...]) -> None:
    _require(value in options, key, value, "one of " + ", ".join(repr(o) for o in options))


@dataclass(frozen=True)
class ModelConfig:
    """The FastConformer-CTC acoustic model (paper 000 §3.2)."""

    d_model: int = 768  # hidden width of every Conformer layer
    layers: int = 6
    heads: int = 6  # d_model must split evenly; head dims below 32 hurt long context (paper 000 §4.3)
    ff_expansion: int = 4  # macaron feed-forward hidden = ff_expansion * d_model
    conv_kernel: int = 9  # depthwise kernel of the convolution module
    subsampling_factor: int = 8  # FastConformer: three stride-2 depthwise-separable convolutions
    subsampling_channels: int = 256
    posenc: str = "rotary"  # one of POSITIONAL_ENCODINGS
    rotary_theta: float = 1.5e6  # base period; 1.5M was the only setting gaining beyond 328 s
    vocab_size: int = 4096  # outputs = BPE pieces + 1 CTC blank (blank is the last id)
    self_conditioning: bool = True  # SC-CTC without intermediate losses
    batch_renorm_eps: float = 1e-3
    batch_renorm_momentum: float = 0.01
    # code (lcasr/components/batchrenorm.py): plain batch norm for the first 1/8 of the warmup, then r_max 1->3 up
    # to its end and d_max 0->5 up to 5/8 of it (5k, 40k and 25k forwards at 40k); linear: both ramps from 0 to
    # the end (the project's earlier reading of the paper)
    batch_renorm_schedule: str = "code"
    batch_renorm_warmup_steps: int = 40_000
    decoder_norm: bool = True  # code: a LayerNorm before the shared CTC head (decoder_norm: true); paper: silent
    ff_activation: str = "gelu_tanh"  # code: FusedMLP's gelu_approx; silu: the Conformer paper's Swish
    ff_bias: bool = False  # code: bias_in_ff false in every paper config
    activation_checkpointing: bool = False
    attention_backend: str = "auto"  # flash-attn varlen on CUDA when installed, else SDPA
    # paper and code: none (every frame attends to its whole window). This project's control for context against
    # fragmentation: self-attention banded to |i - j| <= span output frames (span = this many seconds, rounded down
    # to whole frames) in training and decoding, so a long window can hold a short receptive field
    # (asr_core.model.receptive); None: the whole window
    attention_span_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("d_model", "layers", "heads", "ff_expansion", "conv_kernel", "subsampling_channels"):
            v = getattr(self, name)
            _require(isinstance(v, int) and v > 0, f"model.{name}", v, "a positive integer")
        _require(self.d_model % self.heads == 0, "model.heads", self.heads,
                 f"a divisor of model.d_model={self.d_model} (head dimension must be whole)")
        _require((self.d_model // self.heads) % 2 == 0 or self.posenc != "rotary", "model.heads", self.heads,
                 "a head split with an even head dimension (rotary encodings rotate pairs of channels)")
        _require(self.conv_kernel % 2 == 1, "model.conv_kernel", self.conv_kernel, "an odd integer (same padding)")
        _require(self.subsampling_factor in (2, 4, 8, 16), "model.subsampling_factor", self.subsampling_factor,
                 "2, 4, 8 or 16")
        _choice("model.posenc", self.posenc, POSITIONAL_ENCODINGS)
        _require(self.rotary_theta > 0, "model.rotary_theta", self.rotary_theta, "a positive number")
        _require(isinstance(self.vocab_size, int) and self.vocab_size >= 3, "model.vocab_size", self.vocab_size,
                 "an integer >= 3 (pieces + blank)")
        _require(0 < self.batch_renorm_momentum <= 1, "model.batch_renorm_momentum", self.batch_renorm_momentum,
                 "a number in (0, 1]")
        _require(self.batch_renorm_eps > 0, "model.batch_renorm_eps", self.batch_renorm_eps, "a positive number")
        _require(self.batch_renorm_warmup_steps >= 0, "model.batch_renorm_warmup_steps",
                 self.batch_renorm_warmup_steps, "a non-negative integer")
        _choice("model.attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _require(self.attention_span_s is None or (isinstance(self.attention_span_s, (int, float))
                                                   and not isinstance(self.attention_span_s, bool)
                                                   and 0 < self.attention_span_s < math.inf),
                 "model.attention_span_s", self.attention_span_s,
                 "null (attention over the whole window) or a positive number of seconds")
        _choice("model.batch_renorm_schedule", self.batch_renorm_schedule, BATCH_RENORM_SCHEDULES)
        _choice("model.ff_activation", self.ff_activation, FF_ACTIVATIONS)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


@dataclass(frozen=True)
class FeatureConfig:
    """Mel features (paper 000 §3.1). ``variant='code'`` (the default) is what the authors' release computed
    (``lcasr/utils/audio_tools.py``: n_fft 512, window 400, no log); ``'paper'`` the log-mel the paper names."""

    sample_rate: int = 16_000
    n_mels: int = 80
    win_length: int = 400
    hop_length: int = 160  # 10 ms frames
    variant: str = "code"  # code: n_fft 512, no log; paper: log-mel, n_fft 400

    def __post_init__(self) -> None:
        for name in ("sample_rate", "n_mels", "win_length", "hop_length"):
            v = getattr(self, name)
            _require(isinstance(v, int) and v > 0, f"data.features.{name}", v, "a positive integer")
        _choice("data.features.variant", self.variant, FEATURE_VARIANTS)

    @property
    def frames_per_second(self) -> float:
        return self.sample_rate / self.hop_length


@dataclass(frozen=True)
class DataConfig:
    """Training data and how it is cut into windows and batches (paper 000 §2.3, §3.3)."""

    # corpus spec "[NAME=]FORMAT:PATH" (podcast, manifest, ...) read by asr_core.data.corpora; the trial key holds the
    # NAME (default: the path's last folder), never the path, so the corpus may move between submit and resume
    train: str = ""
    tokenizer: str = ""  # path of a SentencePiece model; empty = train one from the training transcripts
    context_s: float = 10.24  # window length the model trains and is evaluated at (1024 frames)
    batch_audio_s: float = 3600.0  # audio per optimiser step, whatever the context (batch = this / context)
    # gradient accumulation: the most (padded) audio per forward/backward; 0 = the whole step in one pass. Lets the
    # large models train at short contexts within GPU memory; the gradient is the whole step's either way.
    micro_batch_audio_s: float = 0.0
    # interleaved (code: exp/train.py with lcasr/utils/dataloading.py): a step holds window k of each of B = the
    # step's audio / window recordings of similar duration, B halving as the window doubles; consecutive: a step is
    # the stream's next windows, one or two recordings at a time (asr_core.data.chunking)
    batching: str = "interleaved"
    # code: s0*2^floor(r/n) from 512 frames (5.12 s); paper: s0 + s0*2^floor(r/n) ("from 5 s", i.e. 10 s at r=0);
    # none: start at context_s
    seqlen_warmup: str = "code"
    # fixed (paper and code): cuts every context_s seconds, words straddling a cut dropped from both windows (their
    # audio stays, unlabelled); pauses: each cut moved back to the start of the word it would split (at most
    # asr_core.data.chunking.CUT_BOUND_S), so windows are at most context_s and drop no word (needs word times)
    cut: str = "fixed"
    seqlen_warmup_start_s: float = 5.12
    seqlen_warmup_every: int = 5000  # recordings between doublings
    max_recordings: int = 0  # 0 = one pass over the whole corpus
    num_workers: int = 0  # threads preparing the features of upcoming steps; 0 = in the training loop itself
    features: FeatureConfig = field(default_factory=FeatureConfig)

    def __post_init__(self) -> None:
        _require(not self.train or corpus_spec_problem(self.train) is None, "data.train", self.train,
                 f"a corpus spec [NAME=]FORMAT:PATH, e.g. 'podcasts=podcast:data/train'; formats: {FORMATS_TEXT}")
        _require(self.context_s > 0, "data.context_s", self.context_s, "a positive number of seconds")
        _require(self.batch_audio_s >= self.context_s, "data.batch_audio_s", self.batch_audio_s,
                 f"at least data.context_s={self.context_s} (one window per step)")
        _require(self.micro_batch_audio_s == 0 or self.micro_batch_audio_s >= self.context_s,
                 "data.micro_batch_audio_s", self.micro_batch_audio_s,
                 f"0 (the whole step in one pass) or at least data.context_s={self.context_s} (one window)")
        _choice("data.seqlen_warmup", self.seqlen_warmup, SEQLEN_WARMUPS)
        _choice("data.batching", self.batching, BATCHINGS)
        _choice("data.cut", self.cut, CUTS)
        _require(self.seqlen_warmup_start_s > 0, "data.seqlen_warmup_start_s", self.seqlen_warmup_start_s,
                 "a positive number of seconds")
        _require(self.seqlen_warmup_every > 0, "data.seqlen_warmup_every", self.seqlen_warmup_every,
                 "a positive integer")
        _require(self.max_recordings >= 0, "data.max_recordings", self.max_recordings, "0 (all) or a positive integer")
        _require(self.num_workers >= 0, "data.num_workers", self.num_workers, "a non-negative integer")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation (paper 000 §3.3): Madgrad, linear warmup then cosine to 0, clipping at 0.8."""

    seed: int = 0  # sets the data order (and, with init_seed null, the initial weights)
    # code: the authors seed the initial weights with 12345 in every run, so seeds differ only in their data order
    # (exp/train.py); null: the weights from train.seed too, so that the seed spread covers initialisation
    init_seed: int | None = 12345
    # a curriculum (this project's option, not the papers'): the model key of a trial of the same sweep whose trained
    # weights and tokenizer this one starts from (the trial folder beside this one, trials/KEY, which must have
    # finished training); the optimiser, the step count, the schedule and the data order start afresh. null: the
    # random weights of init_seed
    init_from: str | None = None
    optimizer: str = "madgrad"  # one of OPTIMIZERS
    lr: float = 3e-3
    warmup_steps: int = 5000  # code: 5000 for the main, 9L-768, 12L-768, 18L-1024 and 3L-2048 families, 1500 else
    # audio (code): the step's summed CTC loss / (window frames x the configured B) x 100, about nats per second of
    # audio; tokens: the mean over windows of each window's loss per target token
    loss_norm: str = "audio"
    max_steps: int = 0  # 0 = one epoch, as in the paper; the cosine decays to 0 at the last step
    # code: after the warmup the cosine decays over recordings, the LR fixed for each group of recordings trained
    # together (lcasr CosineLRScheduler stepped once per data-loader batch in exp/train.py); steps: over optimiser
    # steps, as the paper's "cosine annealing" reads and this project did before (asr_core.schedules)
    lr_decay_over: str = "recordings"
    epochs: int = 1
    momentum: float = 0.9
    weight_decay: float = 0.0
    eps: float = 1e-6
    grad_clip: float = 0.8
    precision: str = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    device: str = "auto"
    checkpoint_every: int = 500  # optimiser steps between checkpoints (also on SIGUSR2/SIGTERM)
    log_every: int = 1
    # a step whose loss or gradient is not finite is skipped (no update); this many in a row end the trial as diverged
    # (exit 65). This project's choice, not the papers': one bad step is a fluke the skip survives; 5 in a row (minutes
    # of a paper run) is a model that will not come back, and stopping there saves the rest of its hours.
    max_nonfinite_steps: int = 5
    # compile the model's parts with torch.compile before training (asr_core.training.compile); an execution setting:
    # the same model and data order, floating-point sums in another order. Off by default until measured faster
    # where it runs (python -m asr_core bench calibrate --set train.compile=true)
    compile: bool = False
    # paper 003 eq. 7: the step's loss + head_diversity_weight x the diversity loss of head_diversity_repr (eq. 6
    # summed over layers, asr_core.model.heads); 0 = off, training exactly as without it. paper: 003 tuned lambda on its
    # dev sets for an RNNT loss (§4.5 names 0.001 and 1.0); this project's CTC normalisation has another scale.
    head_diversity_weight: float = 0.0
    head_diversity_repr: str = "Y"  # one of HEAD_REPRESENTATIONS; Y: 003 Table 7's choice on its stronger model
    head_diversity_rows: int = 64  # query rows of A sampled per window (A only; asr_core.model.heads.DEFAULT_SAMPLE_ROWS)

    def __post_init__(self) -> None:
        _require(isinstance(self.seed, int) and self.seed >= 0, "train.seed", self.seed, "a non-negative integer")
        _require(self.init_seed is None or (isinstance(self.init_seed, int) and not isinstance(self.init_seed, bool)
                                            and self.init_seed >= 0),
                 "train.init_seed", self.init_seed, "a non-negative integer, or null for train.seed")
        _require(self.init_from is None or (isinstance(self.init_from, str) and len(self.init_from) == KEY_DIGITS
                                            and all(c in "0123456789abcdef" for c in self.init_from)),
                 "train.init_from", self.init_from, f"the {KEY_DIGITS}-digit model key of a trial of the same sweep "
                 "(orchestrate plan and status print them), or null")
        _choice("train.optimizer", self.optimizer, OPTIMIZERS)
        _choice("train.loss_norm", self.loss_norm, LOSS_NORMS)
        _choice("train.lr_decay_over", self.lr_decay_over, LR_DECAY_OVER)
        _require(self.lr > 0, "train.lr", self.lr, "a positive number")
        for name in ("warmup_steps", "max_steps"):
            v = getattr(self, name)
            _require(isinstance(v, int) and v >= 0, f"train.{name}", v, "a non-negative integer")
        _require(self.epochs >= 1, "train.epochs", self.epochs, "a positive integer")
        _require(0 <= self.momentum < 1, "train.momentum", self.momentum, "a number in [0, 1)")
        _require(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, "a non-negative number")
        _require(self.eps > 0, "train.eps", self.eps, "a positive number")
        _require(self.grad_clip > 0, "train.grad_clip", self.grad_clip, "a positive number")
        _choice("train.precision", self.precision, PRECISIONS)
        _choice("train.device", self.device, DEVICES)
        _require(self.checkpoint_every >= 1, "train.checkpoint_every", self.checkpoint_every, "a positive integer")
        _require(self.log_every >= 1, "train.log_every", self.log_every, "a positive integer")
        _require(isinstance(self.max_nonfinite_steps, int) and self.max_nonfinite_steps >= 1,
                 "train.max_nonfinite_steps", self.max_nonfinite_steps, "a positive integer (steps in a row)")
        _require(isinstance(self.compile, bool), "train.compile", self.compile, "true or false")
        _require(self.head_diversity_weight >= 0, "train.head_diversity_weight", self.head_diversity_weight,
                 "a non-negative number (0 = no head-diversity loss)")
        _choice("train.head_diversity_repr", self.head_diversity_repr, HEAD_REPRESENTATIONS)
        _require(isinstance(self.head_diversity_rows, int) and self.head_diversity_rows >= 1,
                 "train.head_diversity_rows", self.head_diversity_rows, "a positive integer")


@dataclass(frozen=True)
class EvalConfig:
    """What is evaluated after training (paper 000 §2.2, §4): moving-window greedy CTC, clean and with music."""

    datasets: tuple[str, ...] = ()  # "NAME=FORMAT:PATH" specs read by asr_core.data.corpora
    snrs: tuple[float, ...] = ()  # music SNRs in dB; clean audio is always evaluated too
    # names of the datasets that are also evaluated with music at eval.snrs; empty = every dataset. The paper added
    # music to Rev16 only, for the main (context) family.
    noisy: tuple[str, ...] = ()
    stride: float = 0.125  # window stride as a fraction of the context length
    batch_windows: int = 0  # windows decoded together; 0 = as many as the GPU's free memory holds (8 on the CPU)
    # auto: bf16 autocast on CUDA (this project's choice, for speed; the code ran the model in fp32 with fp16 flash
    # attention, closer to fp32), fp32 on the CPU
    precision: str = "auto"
    noise: str = "synthetic"  # "synthetic" (music made by asr_core.data.noise) or a path to an audio file
    # after evaluation, measure how alike the attention heads are (paper 003: A, Q, K, V, Y per layer) on the first
    # of eval.datasets (asr_core.probes.heads; none without one); adds metrics heads/..., changes no other result
    head_diversity: bool = False
    head_rows: int = 64  # query rows of A sampled per window (asr_core.model.heads.DEFAULT_SAMPLE_ROWS)
    # windows of the trained context measured (non-overlapping: the first of each recording, then the second, ...);
    # at 1 h context 32 windows are up to 32 h of audio, one forward pass each (paper.yaml decodes ~140 h there)
    head_windows: int = 32
    # a tail set's JSON file (python -m asr_core tailset): also measure the tail-word error rate (paper 002) against
    # it, metrics tail/..., table columns tail_words/tail_errors; "" = none. Changes no other result
    tail: str = ""

    def __post_init__(self) -> None:
        _require(0 < self.stride <= 1, "eval.stride", self.stride, "a fraction in (0, 1] of the window")
        _require(isinstance(self.tail, str), "eval.tail", self.tail,
                 "the path of a tail set's JSON file (python -m asr_core tailset), or '' for none")
        _require(isinstance(self.head_rows, int) and self.head_rows >= 1, "eval.head_rows", self.head_rows,
                 "a positive integer")
        _require(isinstance(self.head_windows, int) and self.head_windows >= 1, "eval.head_windows",
                 self.head_windows, "a positive integer")
        _require(self.batch_windows >= 0, "eval.batch_windows", self.batch_windows,
                 "0 (sized from free GPU memory) or a positive integer")
        _choice("eval.precision", self.precision, PRECISIONS)
        names = [dataset_name(spec) for spec in self.datasets]
        for name in self.noisy:
            _require(name in names, "eval.noisy", name,
                     "names of datasets in eval.datasets (" + (", ".join(names) or "none given") + ")")
        for spec in self.datasets:
            _require(isinstance(spec, str) and bool(dataset_name(spec)) and corpus_spec_problem(spec, named=True)
                     is None, "eval.datasets", spec,
                     f"strings of the form NAME=FORMAT:PATH, e.g. 'dev=podcast:data/dev'; formats: {FORMATS_TEXT}")


@dataclass(frozen=True)
class Config:
    """Everything one training run needs. ``Config()`` is the paper's main model."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        span = self.model.attention_span_s
        _require(span is None or span <= self.data.context_s, "model.attention_span_s", span,
                 f"null or at most data.context_s={self.data.context_s:g} s (a band wider than the window bands "
                 "nothing)")

    # ---- (de)serialisation -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Nested plain-Python dict (tuples become lists), suitable for YAML/JSON and checkpoints."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def flat(self) -> dict[str, Any]:
        """``{"model.layers": 6, "data.features.n_mels": 80, ...}``: the form logged as MLflow params."""
        out: dict[str, Any] = {}

        def walk(prefix: str, d: Mapping[str, Any]) -> None:
            for k, v in d.items():
                if isinstance(v, dict):
                    walk(f"{prefix}{k}.", v)
                else:
                    out[f"{prefix}{k}"] = v

        walk("", self.to_dict())
        return out

    def key(self) -> str:
        """The trial key: 12 hex digits naming this experiment (science only; see :mod:`asr_core.contract.identity`).

        Equal for configs that differ only in how they run (workers, intervals, device), in where their data lies,
        or in options left at their defaults."""
        return trial_key(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, *, source: str = "config") -> "Config":
        """Build from a nested dict; unknown keys and bad types raise :class:`ConfigError` naming them."""
        return build_dataclass(cls, dict(d or {}), "", source)

    @classmethod
    def from_stored(cls, d: Mapping[str, Any], *, source: str = "config") -> "Config":
        """A config written by the project (a checkpoint's, a trial's ``config.json``, a sweep's ``trials.json``),
        possibly by an older version: a science field it lacks did not exist then, so it takes the value that does
        what the project did before the field existed (:data:`asr_core.contract.identity.BASELINE`), not today's default.
        A half-trained model so continues, and a finished one is evaluated, as it began; its key stays its own."""
        return build_dataclass(cls, _with_baseline(d), "", source)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | tuple[str, ...] = (), *, stored: bool = False
                  ) -> "Config":
        """Load ``path`` (optionally starting from ``preset: NAME``) and apply ``section.field=value`` overrides;
        ``stored``: the file was written by the project (a trial's ``config.json``), read as :meth:`from_stored`."""
        path = Path(path)
        try:
            raw = (json.loads(path.read_text()) if path.suffix == ".json" else load_yaml_file(path)) or {}
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON: {e}") from None
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except IsADirectoryError:
            raise ConfigError(f"config file {path} is a folder; valid: a YAML config file or a preset name") from None
        except OSError as e:
            raise ConfigError(f"config file {path} cannot be read: {e.strerror or e}") from None
        except YamlInputError as e:  # bounded (asr_core.config.yaml_input): one line with line and column
            raise ConfigError(str(e)) from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections (model, data, train, eval)")
        return resolve(_with_baseline(raw) if stored else raw, overrides, source=str(path))

    def with_overrides(self, overrides: list[str] | tuple[str, ...]) -> "Config":
        return resolve(self.to_dict(), overrides)


# ---- presets: the paper's model families (REFERENCE.md "The study") ------------------------------------------
PRESETS: dict[str, dict[str, Any]] = {
    # Peak LR and LR warmup as in the authors' configs (exp/configs/paper_templates/): 5000 warmup steps for the
    # main, 9L-768, 12L-768, 18L-1024 and 3L-2048 families, 1500 for the others (and for the sinusoidal, Fourier,
    # no-encoding and rotary theta=10k models, which the posenc grid sets).
    "main": {"model": {"layers": 6, "d_model": 768, "heads": 6}, "train": {"lr": 3e-3, "warmup_steps": 5000}},
    "3L-768": {"model": {"layers": 3, "d_model": 768, "heads": 6}, "train": {"lr": 3e-3, "warmup_steps": 1500}},
    "6L-256-8H": {"model": {"layers": 6, "d_model": 256, "heads": 8}, "train": {"lr": 3e-3, "warmup_steps": 1500}},
    "12L-256-8H": {"model": {"layers": 12, "d_model": 256, "heads": 8}, "train": {"lr": 3e-3, "warmup_steps": 1500}},
    "9L-768": {"model": {"layers": 9, "d_model": 768, "heads": 6}, "train": {"lr": 2e-3, "warmup_steps": 5000}},
    "12L-768": {"model": {"layers": 12, "d_model": 768, "heads": 6}, "train": {"lr": 2e-3, "warmup_steps": 5000}},
    # exp_set_seq_rotary_base_3l_2048.yaml: the only family with 512 subsampling channels
    "3L-2048-16H": {"model": {"layers": 3, "d_model": 2048, "heads": 16, "subsampling_channels": 512},
                    "train": {"lr": 2e-3, "warmup_steps": 5000}},
    "18L-1024": {"model": {"layers": 18, "d_model": 1024, "heads": 8}, "train": {"lr": 1e-3, "warmup_steps": 5000}},
    # The heads study as the authors ran it (exp_set_rot_{3,12,24}h.yaml): the main model's 6 layers, d=768, with
    # 3, 12 or 24 heads (6 heads is the main model itself), LR 3e-3, warmup 1500.
    **{f"6L-768-{h}H": {"model": {"layers": 6, "d_model": 768, "heads": h},
                        "train": {"lr": 3e-3, "warmup_steps": 1500}} for h in (3, 12, 24)},
    # The heads study as paper 000 §4.3 describes it (9 layers, d=768): a named alternative, not in grids/paper.yaml.
    **{f"9L-768-{h}H": {"model": {"layers": 9, "d_model": 768, "heads": h},
                        "train": {"lr": 2e-3, "warmup_steps": 5000}} for h in (3, 6, 12, 24)},
    # a CPU-sized model for tests and the demo study
    "tiny": {"model": {"layers": 2, "d_model": 96, "heads": 4, "subsampling_channels": 64, "vocab_size": 128,
                       "batch_renorm_warmup_steps": 100},
             "train": {"lr": 3e-3, "warmup_steps": 50, "checkpoint_every": 50}},
}


def preset(name: str) -> Config:
    """The named family's config (see :data:`PRESETS`)."""
    return resolve({"preset": name})


def resolve(raw: Mapping[str, Any], overrides: list[str] | tuple[str, ...] = (), *, source: str = "config") -> Config:
    """Merge ``preset`` (if named) < ``raw`` < ``overrides`` and validate."""
    raw = dict(raw)
    base: dict[str, Any] = {}
    name = raw.pop("preset", None)
    if name is not None:
        if name not in PRESETS:
            raise ConfigError(f"{source}: unknown preset {name!r}; valid: {', '.join(sorted(PRESETS))}")
        base = deep_copy(PRESETS[name])
    merged = merge(base, raw)
    for item in overrides:
        key, value = parse_override(item)
        set_path(merged, key, value)
    return Config.from_dict(merged, source=source)


def _with_baseline(d: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the nested dict ``d`` with every science field it lacks set to its
    :data:`asr_core.contract.identity.BASELINE` value (what the project did before the field existed)."""
    raw = deep_copy(dict(d))
    for dotted, value in BASELINE.items():
        if dotted in NAMED:
            continue
        *parts, leaf = dotted.split(".")
        cur: Any = raw
        for p in parts:
            cur = cur.get(p) if isinstance(cur, dict) else None
        if isinstance(cur, dict) and leaf not in cur:
            cur[leaf] = list(value) if isinstance(value, tuple) else value
    return raw


# Every leaf field of Config by dotted name ("data.features.n_mels") -> its type.
FIELD_TYPES: dict[str, Any] = field_types(Config)
# Every leaf field of Config by dotted name -> its default: the baseline of a science field added after
# asr_core.contract.identity.BASELINE was frozen (asr_core.contract.identity.baseline).
FIELD_DEFAULTS: dict[str, Any] = field_defaults(Config())


def parse_field(dotted: str, value: Any, *, source: str = "config") -> Any:
    """Check and convert one value for the field ``dotted`` exactly as a config file would (the only value parser:
    grids, ``--set`` and config files all use it). Raises :class:`ConfigError` naming the key and what is valid."""
    if dotted not in FIELD_TYPES:
        raise ConfigError(f"{source}: unknown key {dotted!r}; valid keys: {', '.join(FIELD_TYPES)}")
    return coerce_value(FIELD_TYPES[dotted], value, dotted, source)


