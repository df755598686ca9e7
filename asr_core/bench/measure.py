"""What a calibration measures (:mod:`asr_core.bench.calibrate` puts it together): its corpus (a recording tiled to
the longest context and listed as often as every step needs), real training steps timed one by one, decoding speed,
features and music per audio-second, a checkpoint's save and a trial's start-up.
"""

from __future__ import annotations

import math
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from asr_core.config import Config
from asr_core.data.corpora.base import Recording, Word

if TYPE_CHECKING:
    import torch


# ---- the corpus ------------------------------------------------------------------------------------------------
def synth_recording(folder: Path, seconds: float = 60.0, seed: int = 0) -> Recording:
    """About ``seconds`` of espeak-ng speech with word times (:mod:`asr_core.data.synth.generate`), in ``folder``."""
    from asr_core.data.corpora import load_corpus
    from asr_core.data.synth import generate as synth

    plans = synth.make_plans("train", seconds / 3600.0, seed, min_minutes=seconds / 60.0,
                             max_minutes=seconds / 60.0, voices=3, meeting_fraction=0.0)
    synth.write_recording(plans[0], folder)
    return list(load_corpus(f"podcast:{folder / 'train'}"))[0]


def tiled(rec: Recording, seconds: float, out: Path) -> Recording:
    """``rec`` repeated (audio and words) and cut to a whole number of ``seconds`` (at least one), written to
    ``out``: windows of ``seconds`` (and of its divisors) are then all full."""
    import torch

    from asr_core.data.audio import load_audio, save_audio

    wave = load_audio(rec.audio)
    dur = wave.numel() / 16000.0
    copies = max(1, math.ceil(seconds / dur - 1e-9))
    keep = seconds * max(1, math.floor(copies * dur / seconds + 1e-9))
    words = tuple(Word(w.text, w.start + k * dur, w.end + k * dur) for k in range(copies) for w in rec.words
                  if w.start is not None and w.end is not None and w.end + k * dur <= keep)
    save_audio(out, torch.cat([wave] * copies)[: int(round(keep * 16000))])
    return Recording(f"{rec.id}-tiled", out, keep, words)


def calibration_corpus(base: Recording, cfg: Config, contexts: Sequence[float], steps: int, folder: Path
                       ) -> list[Recording]:
    """One recording as long as the longest context (``base`` tiled), listed as often as needed for ``steps``
    full steps at every context (B = ``group_size`` windows a step; ``steps`` groups at the longest)."""
    from asr_core.data.chunking import group_size

    rec = tiled(base, max(contexts), folder / "tiled.wav")
    copies = 1
    for ctx in contexts:
        data = context_config(cfg, ctx).data
        b = group_size(ctx, data)
        per_recording = max(1, int(rec.duration // ctx))
        copies = max(copies, b * math.ceil(steps / per_recording))
    return [Recording(f"cal{i:05d}", rec.audio, rec.duration, rec.words) for i in range(copies)]


def context_config(cfg: Config, ctx: float) -> Config:
    """``cfg`` as a calibration trains it at context ``ctx``: every step at that window (no sequence-length
    warmup), at least one window of audio a step, the whole corpus."""
    return cfg.with_overrides([f"data.context_s={ctx}", "data.seqlen_warmup=none",
                               f"data.batch_audio_s={max(cfg.data.batch_audio_s, ctx)}", "data.max_recordings=0"])


# ---- measurements ------------------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def spread(xs: Sequence[float]) -> dict[str, float]:
    """Median, min, max and interquartile range of ``xs``."""
    xs = sorted(xs)
    q = np.percentile(xs, [25, 75]) if len(xs) > 1 else (xs[0], xs[0])
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "iqr": float(q[1] - q[0])}


def _prewarm_stats(maker: Any, recordings: Sequence[Recording], indices: set[int]) -> tuple[float, float]:
    """The loader's per-recording statistics for ``indices``, computed once per audio file and shared by every
    index that lists the same file (a tiled calibration corpus lists one file many times). Returns (seconds,
    audio-seconds computed)."""
    from asr_core.data.batching import RecordingStats

    by_file: dict[str, RecordingStats] = {}
    took, audio = 0.0, 0.0
    for i in sorted(indices):
        key = str(recordings[i].audio)
        if key not in by_file:
            t0 = time.perf_counter()
            by_file[key] = maker.recording_stats(i)
            took += time.perf_counter() - t0
            audio += recordings[i].duration
        maker.keep_recording_stats(i, by_file[key])
    return took, audio


def time_steps(cfg: Config, recordings: Sequence[Recording], tok: Any, model: torch.nn.Module, opt: Any,
               device: torch.device, bf16: bool, steps: int, warmup: int, seed: int = 0,
               say: Callable[[str], None] = print) -> dict[str, Any]:
    """``warmup`` + ``steps`` real optimiser steps of ``cfg`` (one context, no sequence-length warmup); the timed
    ones' seconds and sizes."""
    import torch

    from asr_core.data.batching import BatchMaker, StepLoader
    from asr_core.data.chunking import Position, WindowStream
    from asr_core.data.features import FeatureExtractor
    from asr_core.data.step_plan import REPEAT
    from asr_core.training.loss import step_frames
    from asr_core.training.step import accumulate_gradients

    t = cfg.train
    stream = WindowStream(recordings, cfg.data, seed, REPEAT)
    maker = BatchMaker(recordings, FeatureExtractor(cfg.data.features), tok,
                       windows=cfg.data.batching == "interleaved")
    planned = []
    for windows, _ in stream.batches():
        planned.append(windows)
        if len(planned) >= steps + warmup:
            break
    stats_s, stats_audio = 0.0, 0.0
    if maker.windows:
        stats_s, stats_audio = _prewarm_stats(maker, recordings, {w.recording for ws in planned for w in ws})
    rows = []
    model.train()
    with StepLoader(stream, Position(), maker, cfg.data.micro_batch_audio_s, cfg.data.num_workers) as loader:
        for i in range(steps + warmup):
            _sync(device)
            t0 = time.perf_counter()
            batch = next(loader)
            t1 = time.perf_counter()
            accumulate_gradients(model, batch.micro, device, bf16, i, t.loss_norm,
                                 step_frames(batch.windows, cfg.data))
            _sync(device)
            t2 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            opt.step()
            _sync(device)
            t3 = time.perf_counter()
            durs = [w.duration for w in batch.windows]
            longest = max(durs)
            row = {"step_s": t3 - t0, "data_s": t1 - t0, "forward_backward_s": t2 - t1, "overhead_s": t3 - t2,
                   "windows": len(durs), "audio_s": sum(durs), "padded_s": len(durs) * longest,
                   "padded_s2": len(durs) * longest * longest}
            if i >= warmup:
                rows.append(row)
            say(f"[calibrate]   {'warm-up' if i < warmup else 'step'} {i + 1 - warmup if i >= warmup else i + 1}: "
                f"{row['step_s']:.3f} s ({len(durs)} windows, {sum(durs):.0f} s audio; data {row['data_s']:.3f}, "
                f"fwd/bwd {row['forward_backward_s']:.3f}, clip+opt {row['overhead_s']:.3f})")
    return {"rows": rows, "stats_s": stats_s, "stats_audio_s": stats_audio}


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys on xs; one distinct x: (mean y, 0)."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    if len(set(xs)) < 2:
        return float(y.mean()), 0.0
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def time_decode(model: Any, cfg: Config, wave: torch.Tensor, ctx: float, device: torch.device, bf16: bool,
                repeats: int = 2) -> dict[str, float]:
    """Window-frames decoded per second by :func:`asr_core.decoding.decode.posteriors` at ``ctx`` over ``wave`` (at the
    evaluation's stride and window batch), the best of ``repeats`` after one warm-up."""
    from asr_core.decoding.decode import plan_windows, posteriors, window_frames
    from asr_core.data.features import FeatureExtractor

    fx = FeatureExtractor(cfg.data.features)
    feats = fx(wave)
    sub = cfg.model.subsampling_factor
    window = window_frames(ctx, cfg.data.features.frames_per_second, sub)
    plan = plan_windows(feats.shape[0], window, cfg.eval.stride, sub)
    frames = sum(e - s for s, e in plan.spans)
    batch = cfg.eval.batch_windows or 8
    if device.type == "cuda" and not cfg.eval.batch_windows:
        from asr_core.decoding.decode import auto_batch_windows

        m = cfg.model
        batch = auto_batch_windows(window, device, bf16=bf16, n_mels=cfg.data.features.n_mels,
                                   subsampling_channels=m.subsampling_channels, d_model=m.d_model,
                                   vocab_size=m.vocab_size, subsampling=sub)
    model.eval()
    best = math.inf
    for r in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        posteriors(model, feats, window, stride=cfg.eval.stride, batch_windows=batch, subsampling=sub,
                   device=device, precision="bf16" if bf16 else "fp32")
        _sync(device)
        if r:
            best = min(best, time.perf_counter() - t0)
    model.train()
    return {"context_s": ctx, "frames_per_s": frames / best, "window_frames": frames, "windows": len(plan.starts),
            "seconds": best, "batch_windows": batch}


def time_features(cfg: Config, rec: Recording) -> dict[str, float]:
    """Seconds per audio-second of reading + features (the evaluator's, per recording and condition), and of
    mixing synthetic music in (per noisy condition: composing the music loop is a fixed cost per call, measured
    apart from the per-second part on a 5 s and a whole recording)."""
    from asr_core.data.audio import load_audio
    from asr_core.data.features import FeatureExtractor
    from asr_core.data.noise import add_music

    fx = FeatureExtractor(cfg.data.features)
    t0 = time.perf_counter()
    wave = load_audio(rec.audio)
    fx(wave)
    t1 = time.perf_counter()
    sr = cfg.data.features.sample_rate
    dur = wave.numel() / sr
    short = wave[: int(5 * sr)]

    def music(w: torch.Tensor, tag: str) -> float:
        best = math.inf
        for i in range(2):
            m0 = time.perf_counter()
            add_music(w, f"{rec.id}-{tag}-{i}", 10.0, cfg.eval.noise)
            best = min(best, time.perf_counter() - m0)
        return best

    t_short, t_long = music(short, "short"), music(wave, "long")
    rate = max(0.0, (t_long - t_short) / max(dur - short.numel() / sr, 1e-9))
    per_call = max(0.0, t_short - rate * short.numel() / sr)
    return {"features_s_per_audio_s": (t1 - t0) / dur, "music_s_per_audio_s": rate, "music_s_per_call": per_call}


def time_checkpoint(cfg: Config, model: torch.nn.Module, opt: Any, folder: Path, repeats: int = 2
                    ) -> dict[str, float]:
    """Seconds to save the trainer's checkpoint (weights, optimiser state, config, RNG states), best of
    ``repeats``, and its size."""
    from asr_core.training.checkpoint import FORMAT_VERSION, rng_state, save_checkpoint

    path = folder / "checkpoint.pt"
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        save_checkpoint(path, {"format_version": FORMAT_VERSION, "config": cfg.to_dict(),
                               "model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1,
                               "schedule": {}, "rng": rng_state(), "data_position": {}, "tokenizer": b"",
                               "precision": "fp32"})
        best = min(best, time.perf_counter() - t0)
    return {"save_s": best, "bytes": path.stat().st_size}


def time_startup() -> float:
    """Wall seconds of a fresh interpreter importing what a trial job imports (``asr_core.trial``, training and
    evaluation): the start-up every trial segment pays before its first step."""
    code = "import asr_core.trial, asr_core.training.train, asr_core.evaluation.evaluate, asr_core.data.corpora"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - t0


def device_name(device: torch.device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {name}"
