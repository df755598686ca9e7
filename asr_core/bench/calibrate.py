"""``python -m asr_core bench calibrate``: seconds per training step on the device at hand, written as a calibration
file that ``python -m orchestrate plan GRID --estimate --calibration FILE`` turns into GPU-hours.

Real training steps, not a model of them: the trainer's own :class:`~asr_core.data.chunking.WindowStream`,
:class:`~asr_core.data.batching.StepLoader`, model, optimiser, loss and gradient clipping, on ``train.device``
(``auto``: CUDA when there is one) in the trainer's precision, at each ``--contexts`` length with the sequence-length warmup
off (every step at that length) and ``data.batch_audio_s`` of audio per step (one hour unless ``--set``). After
``--warmup`` untimed steps, ``--steps`` steps are timed one by one: the step (data, forward/backward, clipping,
optimiser) and, apart, the clipping + optimiser part (the per-step overhead, independent of the audio).

What a step costs is fitted as ``t(L) = a + b * L`` for a step of ``batch_audio_s`` of padded audio in windows of
``L`` seconds: the linear part of the model runs once per frame whatever the window (``a``), attention runs over
every pair of frames of a window (~L^2 per window, ~1/L windows per step: ``b * L``). A measured step that holds less
audio (a small ``--data`` corpus, a group's last step) is scaled to ``batch_audio_s`` by its padded audio first.

Also measured: decoding speed (:func:`asr_core.decoding.decode.posteriors` over a recording at each context, at the
evaluation's stride: window-frames per second), feature extraction and music mixing per audio-second (evaluation
and the loader), the per-recording statistics the interleaved loader computes once per recording, the time to save
a checkpoint of this model with its optimiser state, and the start-up of a trial process (imports).

Without ``--data`` the corpus is synthesised in a temporary folder (espeak-ng, :mod:`asr_core.data.synth.generate`; about
a minute of speech), tiled into a recording as long as the longest context and listed as many times as the largest
group needs (every step full). The loader's per-recording statistics are computed before the timed steps (once per
audio file; a one-off cost per recording, reported on its own).

The file (JSON, :class:`asr_core.contract.calibration.CalibrationFile`): ``device``, ``torch``, ``threads``,
``precision``, ``attention`` (flash or sdpa), ``preset`` and ``overrides``, ``model`` (layers, d_model, heads, params,
multiply-accumulates per audio-second: :func:`model_macs`), ``data`` (batch_audio_s, batching, num_workers),
``train`` (``fit`` a, b, ``overhead_s``, per context: seconds per step median/min/max/IQR, audio and padded audio per
step, frames/s), ``eval``, ``checkpoint``, ``startup_s``. ``orchestrate/calibrations/a100-paper.json`` is the same
format, derived from paper 000 instead of measured. The measurements themselves: :mod:`asr_core.bench.measure`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from asr_core.bench.measure import (calibration_corpus, context_config, device_name, fit_line, spread,
                                    synth_recording, time_checkpoint, time_decode, time_features, time_startup,
                                    time_steps)
from asr_core.config import Config, PRESETS, preset
from asr_core.config.parse import ConfigError
from asr_core.contract.calibration import (VERSION, CalibrationFile, CheckpointTiming, ContextTiming, DataSettings,
                                           DecodeTiming, EvalTiming, StepFit, TrainTiming)
from asr_core.data.corpora.base import Recording
from asr_core.model.cost import model_macs, model_summary
from asr_core.contract.options import renamed

DEFAULT_CONTEXTS = "5.12,10.24,20.48,40.96,81.92"


# ---- the whole calibration -------------------------------------------------------------------------------------
def calibrate(cfg: Config, contexts: Sequence[float], steps: int = 5, warmup: int = 1, data: str | None = None,
              *, preset_name: str = "", overrides: Sequence[str] = (), eval_seconds: float = 60.0,
              speech: str | None = None, say: Callable[[str], None] = print) -> CalibrationFile:
    """Measure ``cfg``'s model on this device at each of ``contexts`` and return the calibration (see the module
    docstring). ``data``: a corpus spec to train on (default: a synthesised minute of speech, tiled). ``speech``: a
    corpus spec whose longest recording is tiled instead of synthesising one (for nodes without espeak-ng)."""
    import torch

    from asr_core.model.acoustic import build_model
    from asr_core.data.tokenizer import Tokenizer
    from asr_core.training.compile import prepare_model
    from asr_core.training.step import build_optimizer
    from asr_core.training.train import train_device

    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warm-up >= 0, got {steps} and {warmup}")
    contexts = sorted({float(c) for c in contexts})
    if not contexts or contexts[0] <= 0:
        raise ValueError(f"contexts must be positive seconds, got {contexts}")
    device, bf16 = train_device(cfg)
    from asr_core.model.attention import flash_available

    with tempfile.TemporaryDirectory(prefix="asr-calibrate-") as tmp:
        folder = Path(tmp)
        if data:
            from asr_core.data.corpora import load_corpus
            from asr_core.data.step_plan import trainer_order

            say(f"[calibrate] corpus {data}")
            recordings: Sequence[Recording] = trainer_order(load_corpus(data))
            base = max(recordings, key=lambda r: r.duration)
        else:
            if speech:
                from asr_core.data.corpora import load_corpus

                base = max(load_corpus(speech), key=lambda r: r.duration)
                say(f"[calibrate] speech: {base.id} ({base.duration:.0f} s) of {speech}")
            else:
                say(f"[calibrate] synthesising {eval_seconds:g} s of speech (espeak-ng) in {folder}")
                base = synth_recording(folder / "synth", eval_seconds)
            recordings = calibration_corpus(base, cfg, contexts, steps + warmup, folder)
            say(f"[calibrate] corpus: a {recordings[0].duration:.0f} s recording (the synthesised one tiled) listed "
                f"{len(recordings)} times")
        # the trainer learns its tokenizer from the training transcripts (here: up to 2,000 of them)
        tok = Tokenizer.train([r.text for r in recordings[:2000]] if data else [base.text], cfg.model.vocab_size)
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, cfg.data.features.n_mels, cfg.data.features.frames_per_second).to(device)
        opt = build_optimizer(model, cfg.train)
        prepare_model(model, cfg, device, say)  # train.compile, as the trainer does (recorded in the overrides)
        params = sum(p.numel() for p in model.parameters())
        say(f"[calibrate] {device_name(device)}, {'bf16' if bf16 else 'fp32'}, {torch.get_num_threads()} CPU "
            f"threads; {params / 1e6:.2f}M parameters; {steps} timed steps after {warmup} warm-up at "
            f"{', '.join(f'{c:g}' for c in contexts)} s; {cfg.data.batch_audio_s:g} s of audio a step")
        per_context, all_rows = [], []
        stats_s, stats_audio = 0.0, 0.0
        for ctx in contexts:
            ccfg = context_config(cfg, ctx)
            say(f"[calibrate] context {ctx:g} s")
            res = time_steps(ccfg, recordings, tok, model, opt, device, bf16, steps, warmup, cfg.train.seed, say)
            stats_s += res["stats_s"]
            stats_audio += res["stats_audio_s"]
            rows = res["rows"]
            all_rows += [(ctx, r) for r in rows]
            per_context.append({"context_s": ctx, "steps": len(rows),
                                "step_s": spread([r["step_s"] for r in rows]),
                                "data_s": statistics.median(r["data_s"] for r in rows),
                                "forward_backward_s": statistics.median(r["forward_backward_s"] for r in rows),
                                "overhead_s": statistics.median(r["overhead_s"] for r in rows),
                                "windows_per_step": statistics.median(r["windows"] for r in rows),
                                "audio_s_per_step": statistics.median(r["audio_s"] for r in rows),
                                "padded_s_per_step": statistics.median(r["padded_s"] for r in rows),
                                "frames_per_s": sum(r["audio_s"] for r in rows) * cfg.data.features.frames_per_second
                                / sum(r["step_s"] for r in rows)})
        from asr_core.bench.mfu import device_peak, mfu, step_flops

        peak, peak_source = device_peak(device, "bf16" if bf16 else "fp32")
        linear, attention = model_macs(cfg.model, cfg.data.features)
        for pc in per_context:
            mine = [r for c, r in all_rows if c == pc["context_s"]]
            flops = sum(step_flops(linear, attention, r["audio_s"], pc["context_s"]) for r in mine)
            pc["mfu"] = mfu(flops, sum(r["step_s"] for r in mine), peak)
            pc["outside_share"] = 1.0 - pc["forward_backward_s"] / max(pc["step_s"]["median"], 1e-12)
        overhead = statistics.median(r["overhead_s"] for _, r in all_rows)
        batch_s = cfg.data.batch_audio_s
        # each step's audio-dependent seconds scaled to a step of batch_audio_s padded audio, against its window
        xs = [r["padded_s2"] / r["padded_s"] for _, r in all_rows]
        ys = [(r["step_s"] - overhead) * batch_s / r["padded_s"] for _, r in all_rows]
        intercept, slope = fit_line(xs, ys)
        for pc in per_context:
            mine = [((r["step_s"] - overhead) * batch_s / r["padded_s"]) for c, r in all_rows if c == pc["context_s"]]
            pc["full_step_s"] = overhead + statistics.median(mine)
            pc["fit_step_s"] = overhead + intercept + slope * pc["context_s"]
        say("[calibrate] evaluation: decoding speed, features, music")
        from asr_core.data.audio import load_audio

        wave = load_audio(base.audio)
        feat = time_features(cfg, base)
        decode = []
        for ctx in contexts:
            need = max(eval_seconds, 2.5 * ctx)
            reps = max(1, math.ceil(need * 16000 / wave.numel()))
            decode.append(time_decode(model, context_config(cfg, ctx), wave.repeat(reps), ctx, device, bf16))
        say("[calibrate] checkpoint and start-up")
        ckpt = time_checkpoint(cfg, model, opt, folder)
        startup = time_startup()
    return CalibrationFile(
        version=VERSION, source="measured by python -m asr_core bench calibrate",
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        device=device_name(device), device_type=device.type, torch=torch.__version__,
        threads=torch.get_num_threads(), precision="bf16" if bf16 else "fp32",
        attention="flash" if (device.type == "cuda" and flash_available()
                              and cfg.model.attention_backend != "sdpa") else "sdpa",
        preset=preset_name, overrides=tuple(overrides), peak_flops_per_s=peak, peak_source=peak_source,
        model=model_summary(cfg, params),
        data=DataSettings(batch_audio_s=batch_s, batching=cfg.data.batching, num_workers=cfg.data.num_workers,
                          micro_batch_audio_s=cfg.data.micro_batch_audio_s,
                          corpus=data or (f"{speech}, longest recording tiled" if speech
                                          else "synthesised (espeak-ng), tiled"),
                          stats_s_per_audio_s=stats_s / stats_audio if stats_audio else 0.0),
        train=TrainTiming(fit=StepFit(a=overhead + intercept, b=slope,
                                      meaning=f"seconds per optimiser step of {batch_s:g} s padded audio in windows "
                                              "of L s: a + b * L (overhead_s included in a)"),
                          overhead_s=overhead, contexts=tuple(ContextTiming(**pc) for pc in per_context)),
        eval=EvalTiming(stride=cfg.eval.stride, decode=tuple(DecodeTiming(**d) for d in decode), **feat),
        checkpoint=CheckpointTiming(**ckpt), startup_s=startup,
    )


# ---- output ----------------------------------------------------------------------------------------------------
def table(cal: CalibrationFile) -> str:
    """The calibration as the table ``bench calibrate`` prints."""
    m, tr, ev, data = cal.model, cal.train, cal.eval, cal.data
    lines = [f"calibration: {cal.device} ({cal.precision}, {cal.attention} attention, torch {cal.torch}, "
             f"{cal.threads} threads)",
             f"model: {cal.preset or '?'} {m.layers}L d={m.d_model} {m.heads}H, "
             f"{m.params / 1e6:.2f}M parameters; {data.batch_audio_s:g} s of audio a step",
             "", f"{'context s':>10} {'steps':>5} {'s/step':>8} {'min':>8} {'max':>8} {'audio s':>8} "
                 f"{'frames/s':>10} {'MFU':>7} {'outside':>8} {'full step s':>11} {'fit s':>8} {'decode fr/s':>11}"]
    dec = {d.context_s: d.frames_per_s for d in ev.decode or ()}
    for pc in tr.contexts:
        s = pc.step_s or {}
        util = "n/a" if pc.mfu is None else f"{100 * pc.mfu:.1f}%"
        outside = "" if pc.outside_share is None else f"{100 * pc.outside_share:.0f}%"
        lines.append(f"{pc.context_s:>10g} {pc.steps:>5} {s['median']:>8.3f} {s['min']:>8.3f} {s['max']:>8.3f} "
                     f"{pc.audio_s_per_step:>8.1f} {pc.frames_per_s:>10,.0f} {util:>7} {outside:>8} "
                     f"{pc.full_step_s:>11.3f} "
                     f"{pc.fit_step_s:>8.3f} {dec.get(pc.context_s, float('nan')):>11,.0f}")
    fit = tr.fit
    lines += ["", f"fit: t(L) = {fit.a:.4g} + {fit.b:.4g} x L seconds per step of "
                  f"{data.batch_audio_s:g} s audio; per-step overhead (clip + optimiser) "
                  f"{tr.overhead_s:.4f} s",
              f"evaluation: features {ev.features_s_per_audio_s:.2e} s and music "
              f"{ev.music_s_per_audio_s:.2e} s per audio-second, music "
              f"{ev.music_s_per_call or 0.0:.2f} s per recording and SNR; loader statistics "
              f"{data.stats_s_per_audio_s:.2e} s per audio-second (once per recording)",
              f"MFU: model FLOPs of the timed steps (forward + backward, asr_core.bench.mfu) against "
              f"{cal.peak_source or 'no known peak'}; outside: the share of a step outside the forward and backward "
              "pass (data, clipping, optimiser, logging)",
              f"checkpoint: {cal.checkpoint.save_s:.3f} s ({cal.checkpoint.bytes / 2**20:.1f} MiB); "
              f"trial start-up (imports) {cal.startup_s:.1f} s"]
    return "\n".join(lines)


def cli(argv: list[str]) -> int:
    import torch

    ap = argparse.ArgumentParser(prog="python -m asr_core bench calibrate", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="main", help=f"model family (default main; one of {', '.join(PRESETS)})")
    ap.add_argument("--config", default=None, metavar="FILE",
                    help="a config file (YAML or JSON, e.g. a trial's config.json) instead of --preset")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config overrides, e.g. data.batch_audio_s=81.92 or model.vocab_size=48")
    renamed(ap, "--contexts", ap.add_argument("--contexts-s", dest="contexts", default=DEFAULT_CONTEXTS,
                                              help=f"seconds, comma-separated ({DEFAULT_CONTEXTS})"))
    ap.add_argument("--steps", type=int, default=5, help="timed steps per context (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps before them (default 1)")
    ap.add_argument("--data", default=None, help="train on this corpus (NAME=FORMAT:PATH) instead of a synthesised one")
    ap.add_argument("--speech", default=None, metavar="NAME=FORMAT:PATH",
                    help="tile the longest recording of this corpus instead of synthesising speech (for nodes "
                         "without espeak-ng); ignored with --data")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's)")
    ap.add_argument("--eval-seconds", type=float, default=60.0,
                    help="seconds of speech synthesised, and decoded for the evaluation speed (default 60)")
    ap.add_argument("--out", default=None, help="calibration file (default calibration-DEVICE-PRESET.json)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.config:
            from asr_core.model.size import load_config

            cfg, name = load_config(args.config, args.overrides), Path(args.config).stem
        elif args.preset in PRESETS:
            cfg, name = preset(args.preset).with_overrides(args.overrides), args.preset
        else:
            raise ConfigError(f"unknown preset {args.preset!r}; valid: {', '.join(PRESETS)}")
        contexts = [float(c) for c in args.contexts.split(",") if c.strip()]
    except (ConfigError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cal = calibrate(cfg, contexts, args.steps, args.warmup, args.data, preset_name=name,
                    overrides=args.overrides, eval_seconds=args.eval_seconds,
                    speech=args.speech, say=lambda s: print(s, file=sys.stderr, flush=True))
    out = Path(args.out or f"calibration-{cal.device_type}-{name}.json")
    out.write_text(json.dumps(cal.to_dict(), indent=1) + "\n")
    print(table(cal))
    print(f"written: {out}")
    return 0
