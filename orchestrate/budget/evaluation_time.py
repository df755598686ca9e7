"""The seconds of a trial's evaluation: the windows the moving-window decoder runs through (counted in closed form,
without torch), at the calibration's decoding speed for the trial's context and model, plus reading, features and
music per condition.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

from asr_core.config import Config
from orchestrate.budget.calibration import Calibration
from orchestrate.plan.grid import (KNOWN_TEST_RECORDINGS, eval_set_durations, eval_set_hours, eval_set_recordings,
                                   eval_work)

_window_hours: dict[tuple[Any, ...], float | None] = {}


def decoded_frames(frames: int, window: int, stride_fraction: float, subsampling: int) -> int:
    """Input frames the moving-window decoder runs through for a recording of ``frames``: the windows of
    :func:`asr_core.decoding.decode.plan_windows` (stride ``stride_fraction`` of the window, in whole output frames; the
    last windows cut at the end), summed in closed form and without importing torch (the tests hold the two
    equal)."""
    stride = min(max(subsampling, int(round(stride_fraction * window / subsampling)) * subsampling), window)
    n = 1 if frames <= window else 1 + math.ceil((frames - window) / stride)
    full = min(n, max(0, (frames - window) // stride + 1))  # windows that end inside the recording
    return full * window + sum(frames - i * stride for i in range(full, n))


def decoded_hours_of(cfg: Config, hours_of: Callable[[str], float | None] = eval_set_hours
                     ) -> Callable[[str], float | None]:
    """``hours_of`` for :func:`orchestrate.plan.grid.eval_work` that makes its decoded audio exact for test sets on
    disk: ``eval_work`` counts ``1 / stride`` windows over every frame, but a recording shorter than the window is
    decoded once (and one a few windows long a little less than ``1 / stride`` times), so a set on disk answers
    with the hours that, times ``1 / stride``, are the windows :func:`asr_core.decoding.decode.plan_windows` will
    decode. A set not on disk whose recordings are counted in :data:`KNOWN_TEST_RECORDINGS` is taken as that many
    recordings of equal length; any other keeps ``hours_of``'s answer (an upper bound at long contexts)."""
    from asr_core.contract.specs import CorpusError, dataset_name, split_named_spec, split_spec

    fps = cfg.data.features.frames_per_second
    sub = cfg.model.subsampling_factor
    window = max(sub, int(round(cfg.data.context_s * fps / sub)) * sub)  # asr_core.decoding.decode.window_frames

    def hours(spec: str) -> float | None:
        try:
            _, path = split_spec(split_named_spec(spec)[1])
        except CorpusError:
            return hours_of(spec)
        key = (spec, str(path.resolve()), window, cfg.eval.stride, sub, hours_of)
        if key in _window_hours:
            return _window_hours[key]
        durations: Sequence[float] | None = eval_set_durations(spec)
        if durations is None:
            total, count = hours_of(spec), KNOWN_TEST_RECORDINGS.get(dataset_name(spec))
            if total is not None and count:
                durations = [total * 3600.0 / count] * count
        if durations is None:
            _window_hours[key] = hours_of(spec)
        else:
            frames = sum(decoded_frames(max(1, int(d * fps) + 1), window, cfg.eval.stride, sub) for d in durations)
            _window_hours[key] = frames * cfg.eval.stride / fps / 3600.0
        return _window_hours[key]

    return hours


_evals: dict[tuple[Any, ...], float | None] = {}


def eval_seconds(cfg: Config, cal: Calibration, hours_of: Callable[[str], float | None] = eval_set_hours
                 ) -> float | None:
    """:func:`_eval_seconds`, once per evaluation, model, context and calibration (seeds share it)."""
    key = (cfg.eval, cfg.model, cfg.data.context_s, cfg.data.features, cal, hours_of)
    if key not in _evals:
        _evals[key] = _eval_seconds(cfg, cal, hours_of)
    return _evals[key]


def _eval_seconds(cfg: Config, cal: Calibration, hours_of: Callable[[str], float | None] = eval_set_hours
                  ) -> float | None:
    """Seconds of the trial's evaluation: :func:`orchestrate.plan.grid.eval_work`'s decoded audio (windows as
    :func:`decoded_hours_of` counts them) at the calibration's decoding speed for this context and model, plus
    reading + features per audio-second and condition, and music per noisy condition (per audio-second and per
    recording). None when a test set's size is unknown."""
    from asr_core.model.cost import model_macs

    work = eval_work(cfg, hours_of)
    if work is None:
        return None
    decoded = eval_work(cfg, decoded_hours_of(cfg, hours_of))
    clean_cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, snrs=()))
    clean = eval_work(clean_cfg, hours_of)
    stride = cfg.eval.stride
    audio_conditions_s = work[0] * stride * 3600.0
    noisy_s = audio_conditions_s - (clean[0] if clean else 0.0) * stride * 3600.0
    # the same function counting recordings instead of hours: (recording, condition) pairs / stride
    pairs, clean_pairs = eval_work(cfg, eval_set_recordings), eval_work(clean_cfg, eval_set_recordings)
    noisy_calls = (pairs[0] - clean_pairs[0]) * stride if pairs and clean_pairs else 0.0
    ctx = cfg.data.context_s
    lin, att = model_macs(cfg.model, cfg.data.features)
    ratio = (lin + att * ctx) / (cal.macs_linear + cal.macs_attention * ctx)
    frames = (decoded or work)[0] * 3600.0 * cfg.data.features.frames_per_second
    return (frames / cal.decode_fps(ctx) * ratio + audio_conditions_s * cal.features_s_per_audio_s
            + noisy_s * cal.music_s_per_audio_s + noisy_calls * cal.music_s_per_call)
