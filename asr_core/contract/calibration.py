"""The calibration file: what one device takes for a model's training steps, decoding, features, checkpoints and
start-up, as ``python -m asr_core bench calibrate`` writes it (:mod:`asr_core.bench.calibrate`) and ``python -m
orchestrate plan GRID --estimate --calibration FILE`` reads it (:mod:`orchestrate.budget.calibration`). Both sides
import this module; neither spells the file's keys itself.

The file is JSON (``"format": "asr-calibration"``, ``"version": 1``): the device and software it was measured on,
``model`` (shape, parameters, multiply-accumulates per audio-second), ``data`` (audio a step, loader), ``train``
(the fit ``a + b * L`` seconds a step of ``batch_audio_s`` padded audio in windows of ``L`` seconds, the per-step
overhead, and per measured context its timings), ``eval`` (decoding speed per context, or one speed for every
context; features and music per audio-second), ``checkpoint`` and ``startup_s``. ``orchestrate/calibrations/
a100-paper.json`` is the same format, derived from paper 000 instead of measured: it adds notes (``description``,
``derivation``, ``*_note``), which are kept as each section's ``extra`` and written back as they were.

Reading names the file and the field that is missing or wrong (:class:`CalibrationError`). Optional fields are None
when absent and left out when written. This module imports neither torch nor numpy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

FORMAT = "asr-calibration"
VERSION = 1
HELP = "a calibration is the JSON file `python -m asr_core bench calibrate` writes (see orchestrate/calibrations/)"


class CalibrationError(ValueError):
    """A calibration file that cannot be read or used; the message names the file and the field."""


class CalibrationNotFound(CalibrationError):
    """The calibration file does not exist."""


def _need(raw: Any, path: str, dotted: str, kind: type | tuple[type, ...] = (int, float)) -> Any:
    """The value at ``dotted`` in ``raw``, of ``kind`` (a number unless told); CalibrationError otherwise."""
    cur: Any = raw
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise CalibrationError(f"calibration {path}: missing {dotted!r}; {HELP}")
        cur = cur[part]
    if not isinstance(cur, kind) or isinstance(cur, bool):
        raise CalibrationError(f"calibration {path}: {dotted!r} is {cur!r}, not a "
                               f"{getattr(kind, '__name__', 'number')}")
    return cur


class _Section:
    """A part of the file: its known fields in the order they are written, and ``extra``, every other key."""

    extra: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The section as the file holds it: known fields in order (None ones left out), then ``extra``."""
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if f.name == "extra" or v is None:
                continue
            if isinstance(v, _Section):
                v = v.to_dict()
            elif isinstance(v, tuple):
                v = [x.to_dict() if isinstance(x, _Section) else x for x in v]
            elif isinstance(v, Mapping):
                v = dict(v)
            out[f.name] = v
        out.update(self.extra)
        return out

    @classmethod
    def _known(cls, raw: Mapping[str, Any], **parsed: Any) -> Any:
        """The section from ``raw``: ``parsed`` values as given, every other known field as the file has it (None
        when absent), unknown keys into ``extra``, and so are known ones the file sets to null (written back so)."""
        names = {f.name for f in fields(cls)} - {"extra"}  # type: ignore[arg-type]
        kw = {k: raw.get(k) for k in names if k not in parsed}
        extra = {k: v for k, v in raw.items() if k not in names or (v is None and k not in parsed)}
        return cls(**kw, **parsed, extra=extra)


@dataclass(frozen=True, kw_only=True)
class ModelSummary(_Section):
    """The calibrated model: shape, parameters and arithmetic (:func:`asr_core.model.cost.model_macs`)."""

    layers: int | None = None
    d_model: int | None = None
    heads: int | None = None
    vocab_size: int | None = None
    subsampling_factor: int | None = None
    subsampling_channels: int | None = None
    params: int
    macs_linear_per_s: float  # multiply-accumulates per audio-second outside attention
    macs_attention_per_s2: float  # attention's, per audio-second and second of window
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, kw_only=True)
class DataSettings(_Section):
    """The data side of a step: audio a step, batching, loader threads and the loader's per-recording cost."""

    batch_audio_s: float
    batching: str | None = None
    num_workers: int | None = None
    micro_batch_audio_s: float | None = None
    corpus: str | None = None
    stats_s_per_audio_s: float | None = None  # the interleaved loader's statistics, once per recording
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, kw_only=True)
class StepFit(_Section):
    """Seconds per optimiser step of ``batch_audio_s`` padded audio in windows of ``L`` s: ``a + b * L``."""

    a: float
    b: float
    meaning: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, kw_only=True)
class ContextTiming(_Section):
    """The timed steps at one context: ``full_step_s`` is a step of ``batch_audio_s`` padded audio (what the
    estimate compares with the fit), ``fit_step_s`` the fit's value there; the rest as measured."""

    context_s: float
    steps: int | None = None
    step_s: Mapping[str, float] | None = None  # median, min, max, iqr
    data_s: float | None = None
    forward_backward_s: float | None = None
    overhead_s: float | None = None
    windows_per_step: float | None = None
    audio_s_per_step: float | None = None
    padded_s_per_step: float | None = None
    frames_per_s: float | None = None
    full_step_s: float
    fit_step_s: float | None = None
    mfu: float | None = None  # model FLOPs per second of the timed steps / the device's peak (asr_core.bench.mfu)
    outside_share: float | None = None  # share of a step outside the forward and backward pass (data, optimiser, ...)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, kw_only=True)
class TrainTiming(_Section):
    fit: StepFit
    overhead_s: float  # per step: gradient clipping and the optimiser, whatever the audio
    contexts: tuple[ContextTiming, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, kw_only=True)
class DecodeTiming(_Section):
    """Window-frames decoded per second at one context (at the evaluation's stride)."""

    context_s: float
    frames_per_s: float
    window_frames: int | None = None
    windows: int | None = None
    seconds: float | None = None
    batch_windows: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, kw_only=True)
class EvalTiming(_Section):
    """Evaluation costs: decoding per context (``decode``) or one speed at every context (``decode_frames_per_s``),
    reading + features and music per audio-second, music per recording and noisy condition."""

    stride: float | None = None
    decode: tuple[DecodeTiming, ...] | None = None
    decode_frames_per_s: float | None = None
    features_s_per_audio_s: float | None = None
    music_s_per_audio_s: float | None = None
    music_s_per_call: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def decode_speeds(self) -> tuple[tuple[float, float], ...]:
        """(context seconds, window-frames per second), shortest context first; one speed at every context is
        given at 1 s."""
        if self.decode_frames_per_s is not None:
            return ((1.0, float(self.decode_frames_per_s)),)
        return tuple(sorted((float(d.context_s), float(d.frames_per_s)) for d in self.decode or ()))


@dataclass(frozen=True, kw_only=True)
class CheckpointTiming(_Section):
    save_s: float
    bytes: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, kw_only=True)
class CalibrationFile(_Section):
    """A calibration file's fields (``format`` is :data:`FORMAT`, written first)."""

    version: int | None = VERSION
    source: str | None = None
    created: str | None = None
    device: str | None = None
    device_type: str | None = None
    torch: str | None = None
    threads: int | None = None
    precision: str | None = None
    attention: str | None = None  # flash: attention over unpadded windows; sdpa: padded
    preset: str | None = None
    overrides: tuple[str, ...] | None = None
    peak_flops_per_s: float | None = None  # the device's dense peak the MFU figures are against (None: unknown)
    peak_source: str | None = None  # where that peak comes from
    model: ModelSummary
    data: DataSettings
    train: TrainTiming
    eval: EvalTiming
    checkpoint: CheckpointTiming
    startup_s: float  # a trial process's imports and set-up, once per job segment
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **super().to_dict()}

    @classmethod
    def from_dict(cls, raw: Any, path: str = "calibration") -> CalibrationFile:
        """The file's JSON as a :class:`CalibrationFile`; :class:`CalibrationError` naming ``path`` and the field
        when something is missing or wrong. Values are kept as the file has them."""
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise CalibrationError(f"calibration {path}: not a calibration file (no \"format\": \"{FORMAT}\"); "
                                   "write one with `python -m asr_core bench calibrate --out FILE`, or leave out "
                                   "--calibration for the built-in A100 one")
        for dotted in ("train.fit.a", "train.fit.b", "train.overhead_s", "data.batch_audio_s"):
            _need(raw, path, dotted)
        train, data = raw["train"], raw["data"]
        batch, overhead = float(data["batch_audio_s"]), float(train["overhead_s"])
        if batch <= 0 or overhead < 0:
            raise CalibrationError(f"calibration {path}: data.batch_audio_s must be positive and train.overhead_s "
                                   f"not negative (got {batch}, {overhead})")
        contexts = []
        for c in train.get("contexts") or []:
            try:
                float(c["context_s"]), float(c["full_step_s"])
            except (KeyError, TypeError, ValueError):
                raise CalibrationError(f"calibration {path}: train.contexts entry {c!r} lacks "
                                       "context_s/full_step_s") from None
            contexts.append(ContextTiming._known(c))
        ev = _need(raw, path, "eval", dict)
        if isinstance(ev.get("decode_frames_per_s"), (int, float)):  # one speed at every context
            evaluation = EvalTiming._known(ev, decode=None)
            if "decode" in ev:  # beside it, kept as it is and not read
                evaluation = replace(evaluation, extra={**evaluation.extra, "decode": ev["decode"]})
        else:
            decode = []
            for d in ev.get("decode") or []:
                try:
                    float(d["context_s"]), float(d["frames_per_s"])
                except (KeyError, TypeError, ValueError):
                    raise CalibrationError(f"calibration {path}: eval.decode entries need context_s and "
                                           "frames_per_s") from None
                decode.append(DecodeTiming._known(d))
            evaluation = EvalTiming._known(ev, decode=tuple(decode))
        speeds = evaluation.decode_speeds()
        if not speeds or any(f <= 0 for _, f in speeds):
            raise CalibrationError(f"calibration {path}: no decoding speed (eval.decode or eval.decode_frames_per_s)")
        model = _need(raw, path, "model", dict)
        for dotted in ("model.macs_linear_per_s", "model.macs_attention_per_s2", "model.params", "checkpoint.save_s",
                       "startup_s"):
            _need(raw, path, dotted)
        fit = StepFit._known(train["fit"])
        overrides = raw.get("overrides")
        return cls._known(
            {k: v for k, v in raw.items() if k != "format"}, model=ModelSummary._known(model),
            data=DataSettings._known(data), train=TrainTiming._known(train, fit=fit, contexts=tuple(contexts)), eval=evaluation,
            checkpoint=CheckpointTiming._known(raw["checkpoint"]),
            overrides=tuple(overrides) if isinstance(overrides, list) else overrides)


def read_calibration(path: str | Path) -> CalibrationFile:
    """The calibration file at ``path``; :class:`CalibrationNotFound` when there is none, :class:`CalibrationError`
    naming the file when it cannot be read, is not JSON or is not a calibration."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise CalibrationNotFound(f"calibration {p}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CalibrationError(f"calibration {p}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise CalibrationError(f"calibration {p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    return CalibrationFile.from_dict(raw, str(p))
