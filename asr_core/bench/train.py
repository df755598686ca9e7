"""``python -m asr_core bench train``: training speed and memory, printed as tables in one run.

1. Throughput: forward+backward frames/s of our Conformer stack against ``torchaudio.models.Conformer`` of the same
   width, depth, heads, kernel and input (subsampled frames, one padded batch); the ratio's goal is >= 1.0 on CPU.
2. Memory: peak memory of one forward+backward of the whole model (narrowed) at batch 1 against context length,
   and the exponent of a power-law fit (goal <= 1.1: no quadratic attention memory). On the CPU each length runs
   in a fresh process and the peak is the growth of its resident set; on CUDA it is ``max_memory_allocated``.
3. GPU only (skipped without CUDA): the main model's bf16 training frames/s and the longest context that trains at
   batch 1, beside paper 000 Table 1 (FastConformer + flash attention on an 80 GB A100: 80,900 frames/s, 70 min).

Each speed comes with its model FLOP utilisation (MFU, :mod:`asr_core.bench.mfu`): the model's FLOPs (forward +
backward, from its own arithmetic) per second against the device's dense peak, bf16 for the GPU rows from a table
of known GPUs ("n/a" for others), and on the CPU against one measured float32 matrix product, so that the CPU
figure is the share of what this CPU's matmul does.

``--profile DIR`` instead profiles one whole training step (forward, CTC loss, backward, clipping, the optimiser)
with ``torch.profiler``: a Chrome trace and the operators by their own time, so that the time that is not matrix
products (batch renormalisation, the depthwise convolution, layer norms, casts, host synchronisation) can be seen.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from asr_core.config import PRESETS, ModelConfig, preset
from asr_core.model.acoustic import build_model
from asr_core.model.subsampling import time_mask
from asr_core.contract.options import renamed

PAPER_FRAMES_PER_S = 80_900
PAPER_MAX_CONTEXT_MIN = 70


def _timed(fn: Callable[[], None], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def throughput(d_model: int, layers: int, heads: int, batch: int, frames: int, repeats: int,
               device: str = "cpu") -> dict[str, float]:
    """Frames/s (subsampled frames through the layer stack, forward+backward) for ours and torchaudio's."""
    from torchaudio.models import Conformer

    torch.manual_seed(0)
    cfg = ModelConfig(d_model=d_model, layers=layers, heads=heads, vocab_size=128)
    ours = build_model(cfg).to(device).train()
    theirs = Conformer(input_dim=d_model, num_heads=heads, ffn_dim=4 * d_model, num_layers=layers,
                       depthwise_conv_kernel_size=cfg.conv_kernel).to(device).train()
    x = torch.randn(batch, frames, d_model, device=device)
    lengths = torch.tensor([frames - (i * frames) // (4 * batch) for i in range(batch)], device=device)
    mask = time_mask(lengths, frames)

    def run_ours() -> None:
        h = x
        for layer in ours.layers:
            h = layer(h, mask, lengths)
        h.square().mean().backward()

    def run_theirs() -> None:
        h, _ = theirs(x, lengths)
        h.square().mean().backward()

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    # alternate the two so that load from other processes hits both alike; keep each one's best time
    t_ours, t_theirs = math.inf, math.inf
    for _ in range(repeats):
        t_ours = min(t_ours, _timed(lambda: (run_ours(), sync()), 1, warmup=0 if t_ours < math.inf else 1))
        t_theirs = min(t_theirs, _timed(lambda: (run_theirs(), sync()), 1, warmup=0 if t_theirs < math.inf else 1))
    n = float(lengths.sum())
    from asr_core.bench.mfu import device_peak, mfu, stack_flops

    flops = stack_flops(d_model, layers, cfg.ff_expansion, cfg.conv_kernel, int(n), frames)
    peak, source = device_peak(device, "fp32")
    return {"ours": n / t_ours, "torchaudio": n / t_theirs, "ratio": t_theirs / t_ours,
            "mfu_ours": mfu(flops, t_ours, peak), "mfu_torchaudio": mfu(flops, t_theirs, peak), "peak": source,
            "params_ours": sum(p.numel() for l in ours.layers for p in l.parameters()),
            "params_torchaudio": sum(p.numel() for p in theirs.parameters())}


def _narrow_cfg() -> ModelConfig:
    return ModelConfig(d_model=144, layers=2, heads=4, subsampling_channels=32, vocab_size=128)


def peak_memory_cuda(seconds: float) -> float:
    """Peak extra CUDA memory (MiB) of one forward+backward at batch 1 of ``seconds`` of features, narrowed model."""
    torch.manual_seed(0)
    model = build_model(_narrow_cfg()).cuda().train()
    frames = int(seconds * 100)
    x = torch.randn(1, frames, 80, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    logits, _ = model(x, torch.tensor([frames], device="cuda"))
    logits.float().log_softmax(-1).mean().backward()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _peak_memory_subprocess(seconds: float) -> float:
    """CPU peaks need a fresh process each: ru_maxrss never goes down."""
    code = (f"import torch; torch.set_num_threads({torch.get_num_threads()}); "
            f"from asr_core.bench.train import _cpu_peak; print(_cpu_peak({seconds}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _cpu_peak(seconds: float) -> float:
    """Peak resident-set growth (MiB) during one forward+backward, sampled every millisecond by a thread
    (``ru_maxrss`` cannot be used: start-up already set it above what short contexts need)."""
    import threading

    torch.manual_seed(0)
    model = build_model(_narrow_cfg()).train()
    frames = int(seconds * 100)
    x = torch.randn(1, frames, 80)
    lengths = torch.tensor([frames])
    with torch.no_grad():  # warm the allocator and kernels on a short input
        model(x[:, :800], torch.tensor([800]))
    base = _rss_bytes()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.001)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    logits, _ = model(x, lengths)
    logits.log_softmax(-1).mean().backward()
    peak[0] = max(peak[0], _rss_bytes())
    done.set()
    th.join()
    return (peak[0] - base) / 2**20


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def fit_exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x."""
    lx, ly = [math.log(v) for v in xs], [math.log(max(v, 1e-9)) for v in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def gpu_rows(max_minutes: int, preset_name: str = "main") -> dict[str, float]:
    """A preset's model, bf16: frames/s (10 ms input frames) at 10.24 s x 32 and the longest batch-1 context in
    minutes (doubling, then bisection to the minute)."""
    cfg = preset(preset_name).model
    torch.manual_seed(0)
    model = build_model(cfg).cuda().train()
    params = sum(p.numel() for p in model.parameters())

    def step(batch: int, frames: int) -> None:
        x = torch.randn(batch, frames, 80, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, _ = model(x, torch.full((batch,), frames, device="cuda"))
        logits.float().log_softmax(-1).mean().backward()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    t = _timed(lambda: step(32, 1024), repeats=3)
    fps = 32 * 1024 / t
    from asr_core.model.cost import model_macs
    from asr_core.bench.mfu import device_peak, mfu, step_flops

    peak, _ = device_peak("cuda", "bf16")
    util = mfu(step_flops(*model_macs(cfg), 32 * 10.24, 10.24), t, peak)

    def fits(minutes: float) -> bool:
        try:
            step(1, int(minutes * 6000))
            return True
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            return False

    lo, hi = 0.0, 1.0
    while hi <= max_minutes and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, max_minutes + 1)
    while hi - lo > 1:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return {"frames_per_s": fps, "max_context_min": lo, "flash": float(_flash_on()), "params": float(params),
            "mfu": util if util is not None else float("nan")}


def profile_step(out: Path, preset_name: str = "tiny", seconds: float = 20.48, batch: int = 4, top: int = 25,
                 device: str = "cpu") -> list[tuple[str, float, float, int]]:
    """One training step of ``preset_name``'s whole model (forward, CTC loss, backward, clipping, the optimiser) on
    ``batch`` windows of ``seconds``, under ``torch.profiler``, after one warm-up step: writes the Chrome trace
    ``out/trace.json`` (open it in Perfetto or chrome://tracing) and ``out/operators.txt``, and returns the ``top``
    operators by their own time: (name, own ms, share of the step's own time, calls)."""
    from torch.profiler import ProfilerActivity, profile

    from asr_core.data.batching import MicroBatch, Step
    from asr_core.data.chunking import Position, Window
    from asr_core.training.step import build_optimizer, optimizer_step

    cfg = preset(preset_name)
    torch.manual_seed(0)
    dev = torch.device(device)
    model = build_model(cfg.model, cfg.data.features.n_mels, cfg.data.features.frames_per_second).to(dev).train()
    opt = build_optimizer(model, cfg.train)
    frames = int(seconds * cfg.data.features.frames_per_second)
    # the trainer's own step (asr_core.training.step.optimizer_step) on a batch as the loader makes it: features and
    # lengths on the host, token ids in lists
    x = torch.randn(batch, frames, cfg.data.features.n_mels)
    lengths = torch.full((batch,), frames)
    targets = [[int(t) for t in torch.randint(0, cfg.model.vocab_size - 1, (max(1, frames // 40),))]
               for _ in range(batch)]
    windows = [Window(i, 0.0, seconds, "", seconds) for i in range(batch)]
    one = Step(windows, [MicroBatch(x, lengths, targets)], Position())
    bf16 = dev.type == "cuda"
    done = [0]

    def step() -> None:
        optimizer_step(model, opt, one, done[0], 1000, cfg.train, cfg.data, dev, bf16)
        done[0] += 1
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, record_shapes=False) as prof:
        step()
    out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / "trace.json"))
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0 or getattr(e, "self_device_time_total", 0)]
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    total = sum(getattr(e, key, 0.0) for e in events) or 1.0
    rows = sorted(((e.key, getattr(e, key, 0.0) / 1e3, getattr(e, key, 0.0) / total, e.count) for e in events),
                  key=lambda r: -r[1])[:top]
    lines = [f"{'operator':<48}{'own ms':>10}{'share':>8}{'calls':>8}"]
    lines += [f"{name[:47]:<48}{ms:>10.2f}{100 * share:>7.1f}%{calls:>8}" for name, ms, share, calls in rows]
    (out / "operators.txt").write_text("\n".join(lines) + "\n")
    return rows


def _pct(x: float | None) -> str:
    """A utilisation as a percentage, or "n/a" where the device's peak is unknown."""
    return "n/a" if x is None or x != x else f"{100 * x:.3g}%"


def _flash_on() -> bool:
    from asr_core.model.attention import flash_available

    return flash_available()


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m asr_core bench train", description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--frames", type=int, default=256, help="subsampled frames per recording (256 = 20.5 s)")
    ap.add_argument("--repeats", type=int, default=3)
    renamed(ap, "--contexts", ap.add_argument("--contexts-s", dest="contexts", default="30,60,120,240",
                                              help="seconds, comma-separated"))
    ap.add_argument("--max-minutes", type=int, default=120, help="upper bound of the GPU context search")
    ap.add_argument("--gpu-presets", default="main",
                    help="comma-separated presets for the GPU rows (default main; 'all' for every paper preset)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--profile", type=Path, default=None, metavar="DIR",
                    help="only profile one training step of --profile-preset (torch.profiler): DIR/trace.json "
                         "(Perfetto, chrome://tracing) and the operators by their own time, printed and in "
                         "DIR/operators.txt")
    ap.add_argument("--profile-preset", default="tiny", choices=sorted(PRESETS),
                    help="the model --profile runs (default tiny; main on a GPU)")
    args = ap.parse_args(argv)
    if args.profile is not None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        print(f"== profile: one training step of {args.profile_preset}, batch 4 x 20.48 s, {device} "
              f"({torch.get_num_threads()} threads)")
        profile_step(args.profile, args.profile_preset, device=device)
        print((args.profile / "operators.txt").read_text(), end="")
        print(f"trace: {args.profile / 'trace.json'}")
        return 0
    results: dict[str, object] = {"threads": torch.get_num_threads()}

    print(f"== throughput: Conformer stack, {args.layers}L d={args.d_model} {args.heads}H, batch {args.batch} x "
          f"{args.frames} frames (padded), forward+backward, CPU, {torch.get_num_threads()} threads")
    tp = throughput(args.d_model, args.layers, args.heads, args.batch, args.frames, args.repeats)
    results["cpu_throughput"] = tp
    print(f"{'implementation':<22}{'params':>12}{'frames/s':>12}{'MFU':>8}")
    print(f"{'asr_core':<22}{tp['params_ours']:>12,}{tp['ours']:>12,.0f}{_pct(tp['mfu_ours']):>8}")
    print(f"{'torchaudio Conformer':<22}{tp['params_torchaudio']:>12,}{tp['torchaudio']:>12,.0f}"
          f"{_pct(tp['mfu_torchaudio']):>8}")
    print(f"MFU: model FLOPs (forward + backward, the stack's arithmetic as asr_core.bench.mfu counts it) against "
          f"{tp['peak']}")
    print(f"ratio (ours / torchaudio): {tp['ratio']:.2f}  (goal >= 1.0)\n")

    contexts = [float(c) for c in args.contexts.split(",")]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    nc = _narrow_cfg()
    print(f"== peak memory of one forward+backward, batch 1, {nc.layers}L d={nc.d_model} {nc.heads}H, {device}")
    print(f"{'context s':>10}{'frames':>9}{'peak MiB':>11}{'MiB / s':>10}")
    peaks = []
    for c in contexts:
        peak = peak_memory_cuda(c) if device == "cuda" else _peak_memory_subprocess(c)
        peaks.append(peak)
        print(f"{c:>10g}{int(c * 100):>9}{peak:>11.1f}{peak / c:>10.2f}")
    exp = fit_exponent(contexts, peaks)
    results["memory"] = {"device": device, "contexts_s": contexts, "peak_mib": peaks, "exponent": exp}
    print(f"growth exponent (peak ~ context^k): k = {exp:.2f}  (goal <= 1.1)\n")

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        names = [p for p in PRESETS if p != "tiny"] if args.gpu_presets == "all" else args.gpu_presets.split(",")
        print(f"== GPU: bf16 forward+backward, {name}; frames are 10 ms input frames; "
              f"max context: batch 1, up to {args.max_minutes} min")
        print(f"{'model':<28}{'params':>8}{'frames/s':>12}{'max context (min)':>20}{'MFU':>8}")
        gpu = {}
        for p in names:
            g = gpu_rows(args.max_minutes, p)
            torch.cuda.empty_cache()  # the model is gone with gpu_rows; give its memory back before the next
            gpu[p] = g
            print(f"{p:<28}{g['params'] / 1e6:>7.1f}M{g['frames_per_s']:>12,.0f}{g['max_context_min']:>20.1f}"
                  f"{_pct(g['mfu']):>8}", flush=True)
        print(f"{'paper Table 1 (A100 80GB)':<28}{'':>8}{PAPER_FRAMES_PER_S:>12,}{PAPER_MAX_CONTEXT_MIN:>20}"
              "   (FastConformer main model with flash-attn)")
        if "main" in gpu:
            print(f"ratio main / paper: speed {gpu['main']['frames_per_s'] / PAPER_FRAMES_PER_S:.2f}, "
                  f"max context {gpu['main']['max_context_min'] / PAPER_MAX_CONTEXT_MIN:.2f}")
        print(f"flash-attn: {'yes' if _flash_on() else 'no (SDPA, whose flash kernel serves unpadded batches)'}")
        results["gpu"] = {"device": name, "presets": gpu}
    else:
        print("== GPU rows skipped: CUDA is not available here")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0
