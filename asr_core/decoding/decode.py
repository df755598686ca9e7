"""Moving-window decoding (paper 000 §2.2, paper 004 §2.3): windows of the model's context length at a stride,
run in batches, per-frame probabilities averaged over every window covering the frame, then greedy CTC.

A recording's features are computed and normalised over the whole recording first (as in training on whole
podcasts), untranscribed regions are zeroed, and only then cut into windows. Window ``i`` starts at frame
``i * stride``; windows are added until one reaches the end of the recording, so every frame is covered and the
last window may be shorter than the context. With a stride of 12.5% of the window most frames are covered by 8
windows: the compute is 8× that of a single pass (``python -m asr_core bench decode`` measures how close to that
floor the batched implementation comes).

A *model* here is any callable ``model(features (B, T, F), lengths (B,)) -> (logits (B, T', V), out_lengths (B,))``
with ``T' = ceil(T / subsampling)`` and the CTC blank at ``V - 1`` (docs/ARCHITECTURE.md, "Model contract").

Precision (``eval.precision``): ``bf16`` runs the model under bf16 autocast on CUDA, as training does; ``fp32``
in float32 (the authors' decoding, ``lcasr/eval/utils.py``, ran the model in float32 with fp16 flash attention);
``auto`` is bf16 on CUDA and fp32 on the CPU (:func:`asr_core.device.resolve_precision`). Either way the softmax and the per-frame
sums are float32.

Windows per batch (``eval.batch_windows``): a :class:`WindowBatch` is shared by every recording of an evaluation.
It starts at the configured size, or, for 0, at what :func:`windows_that_fit` estimates the GPU's free memory holds
(8 on the CPU); an out-of-memory error halves it *for the rest of the evaluation*, so a 1 h context pays for its
failed attempts once, not once per recording.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from asr_core.device import use_bf16

Model = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
Progress = Callable[[int, int], None]  # (windows done, windows total)

CPU_BATCH_WINDOWS = 8  # eval.batch_windows=0 on the CPU: memory is not the limit there, and 8 keeps progress fine
MAX_BATCH_WINDOWS = 512  # eval.batch_windows=0 never batches more (short windows: ~0.5M frames a batch is plenty)
FREE_MEMORY_FRACTION = 0.7  # of the free GPU memory left to the estimate's windows (allocator slack, workspaces)


def window_bytes(window_frames: int, *, n_mels: int = 80, subsampling_channels: int = 256, d_model: int = 768,
                 vocab_size: int = 4096, subsampling: int = 8, bf16: bool = True) -> int:
    """Estimated peak GPU memory of ONE window of ``window_frames`` input frames in a forward-only (no autograd)
    pass of the FastConformer, in bytes. Activations are freed layer by layer, so depth does not enter; attention is
    flash or memory-efficient SDPA (linear in T). Per input frame, with ``a`` = 2 bytes (bf16) or 4 (fp32):

    * subsampling, the peak: the first stride-2 convolution's output is (T/2) x (F/2) x C elements, i.e.
      F*C/4 per input frame, and three such tensors live at once (convolution output, SiLU, the masked copy the
      next stage reads): 3 * F*C/4 * a (main model: 30 KiB a frame in bf16, two thirds of the total);
    * one Conformer layer's working set, ~16 d-wide vectors per output frame (macaron FF 4d hidden and its
      activation, q/k/v and rotated q/k, the convolution module's 2d), in float32 since LayerNorm runs in float32
      under autocast: 16 * d * 4 / subsampling;
    * the CTC head and self-conditioning: logits, their float32 copy, softmax and the decoder's float32
      probabilities, ~16 bytes per vocabulary entry per output frame: 16 * V / subsampling;
    * the float32 input features and their masked copy: 2 * F * 4.

    The main model (F=80, C=256, d=768, V=4096) comes to ~45 KiB per input frame in bf16 (~15 GiB for a 1 h
    window of 360,000 frames, ~45 MiB for 10.24 s), ~75 KiB in fp32. Deliberately generous: an estimate too high
    costs some speed, one too low an out-of-memory error (caught, and the batch halved for good).
    """
    a = 2 if bf16 else 4
    per_frame = (3 * n_mels * subsampling_channels / 4 * a + 16 * d_model * 4 / subsampling
                 + 16 * vocab_size / subsampling + 2 * n_mels * 4)
    return int(math.ceil(window_frames * per_frame))


def windows_that_fit(free_bytes: int, window_frames: int, *, reserve_bytes: int = 0,
                     fraction: float = FREE_MEMORY_FRACTION, most: int = MAX_BATCH_WINDOWS, **model_dims) -> int:
    """How many windows to decode at once: ``fraction`` of ``free_bytes`` (the GPU's free memory with the model
    loaded) less ``reserve_bytes`` (the per-recording float32 sums), over :func:`window_bytes` (``model_dims``:
    its keyword arguments). At least 1 (an out-of-memory error then says so), at most ``most``."""
    usable = fraction * max(0, free_bytes - reserve_bytes)
    return max(1, min(most, int(usable // window_bytes(window_frames, **model_dims))))


class WindowBatch:
    """Windows decoded together, shared by every recording of one evaluation. :meth:`shrink` after an
    out-of-memory error halves it for good: every later recording starts from the smaller size."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"windows per batch must be at least 1, got {size}")
        self.size = size
        self.initial = size

    def shrink(self, tried: int) -> bool:
        """After ``tried`` windows ran out of memory: half of them from now on; False when already at one."""
        if tried <= 1:
            return False
        self.size = max(1, min(self.size, tried // 2))
        return True

    def __repr__(self) -> str:
        return f"WindowBatch(size={self.size}, initial={self.initial})"


def auto_batch_windows(window: int, device: torch.device | str, *, bf16: bool, reserve_bytes: int = 0,
                       **model_dims) -> int:
    """``eval.batch_windows=0``: :func:`windows_that_fit` from ``torch.cuda.mem_get_info`` on CUDA, else
    :data:`CPU_BATCH_WINDOWS`. Call with the model already on the device."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return CPU_BATCH_WINDOWS
    free, _total = torch.cuda.mem_get_info(dev)
    return windows_that_fit(free, window, reserve_bytes=reserve_bytes, bf16=bf16, **model_dims)


@dataclass(frozen=True)
class WindowPlan:
    """Where the windows of one recording go, in input frames (all multiples of the subsampling factor)."""

    frames: int  # T, input frames in the recording
    window: int  # W, frames per window (the context length)
    stride: int  # S, frames between window starts
    starts: tuple[int, ...]

    @property
    def spans(self) -> list[tuple[int, int]]:
        return [(s, min(s + self.window, self.frames)) for s in self.starts]


def window_frames(context_s: float, frames_per_second: float, subsampling: int) -> int:
    """The context length in input frames, rounded to a whole number of output frames (at least one)."""
    return max(subsampling, int(round(context_s * frames_per_second / subsampling)) * subsampling)


def plan_windows(frames: int, window: int, stride_fraction: float, subsampling: int = 8) -> WindowPlan:
    """Window starts ``0, S, 2S, ...`` up to the first window that reaches frame ``frames``.

    ``S = stride_fraction * window`` rounded to a multiple of ``subsampling`` (so every window's outputs land on
    whole output frames of the recording); at least one window, even for an empty or short recording.
    """
    if frames < 0 or window <= 0 or window % subsampling:
        raise ValueError(f"window must be a positive multiple of {subsampling} frames, got {window}")
    if not 0 < stride_fraction <= 1:
        raise ValueError(f"stride must be a fraction in (0, 1] of the window, got {stride_fraction}")
    stride = max(subsampling, int(round(stride_fraction * window / subsampling)) * subsampling)
    stride = min(stride, window)
    n = 1 if frames <= window else 1 + math.ceil((frames - window) / stride)
    return WindowPlan(frames, window, stride, tuple(i * stride for i in range(n)))


# no_grad, not inference_mode: inference tensors cached by a model (e.g. rotary tables) would break training later
@torch.no_grad()
def posteriors(model: Model, features: torch.Tensor, window: int, *, stride: float = 0.125,
               batch_windows: int | WindowBatch = 8, subsampling: int = 8, device: torch.device | str = "cpu",
               progress: Progress | None = None, precision: str = "fp32",
               on_window: Callable[[tuple[int, int], torch.Tensor], None] | None = None) -> torch.Tensor:
    """Frame posteriors of a whole recording by moving windows.

    features: (T, F), already normalised over the recording. Returns (ceil(T / subsampling), V) float32
    probabilities (softmax, not log), each output frame the mean over the windows covering it. ``batch_windows``:
    a count (for this recording only) or the evaluation's :class:`WindowBatch` (an out-of-memory error shrinks it
    for every later recording too). ``precision``: ``fp32``, ``bf16`` (autocast, CUDA only) or ``auto``.
    ``on_window``: called with each window's span (input frames) and its (T_i', V) probabilities, so that other
    ways of joining the windows (:mod:`asr_core.decoding.fused`) need not run them again.
    """
    if features.dim() != 2:
        raise ValueError(f"features must be (T, F), got shape {tuple(features.shape)}")
    state = batch_windows if isinstance(batch_windows, WindowBatch) else WindowBatch(batch_windows)
    bf16 = use_bf16(precision, device, setting="eval.precision")
    plan = plan_windows(features.shape[0], window, stride, subsampling)
    t_out = math.ceil(plan.frames / subsampling)
    feats = features.to(device=device, dtype=torch.float32)
    sums: torch.Tensor | None = None
    counts = torch.zeros(t_out, device=device)
    spans = plan.spans
    b0 = 0
    while b0 < len(spans):
        chunk = spans[b0: b0 + state.size]
        try:
            probs, out_lengths = forward_windows(model, feats, chunk, device, bf16)
        except torch.OutOfMemoryError:
            # long contexts: fewer windows at once rather than failing the evaluation, and remembered (state)
            if not state.shrink(len(chunk)):
                raise
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
            print(f"[decode] out of memory with {len(chunk)} windows of {window} frames; {state.size} at a time "
                  "from now on", file=sys.stderr)
            continue
        if sums is None:
            sums = torch.zeros(t_out, probs.shape[-1], device=device)
        for i, (s, _) in enumerate(chunk):
            o = s // subsampling
            n = min(int(out_lengths[i]), t_out - o)
            sums[o: o + n] += probs[i, :n]
            counts[o: o + n] += 1
            if on_window is not None:
                on_window(chunk[i], probs[i, :n])
        b0 += len(chunk)
        if progress is not None:
            progress(b0, len(spans))
    if sums is None:  # pragma: no cover - plan_windows always yields one window
        raise RuntimeError("no windows were decoded")
    if t_out and bool((counts == 0).any()):
        missing = int((counts == 0).sum())
        raise RuntimeError(f"{missing} output frames were covered by no window: the model's out_lengths are "
                           f"shorter than ceil(T / {subsampling})")
    return (sums / counts.clamp(min=1).unsqueeze(1)).cpu()


@torch.no_grad()
def posteriors_at(model: Model, features: torch.Tensor, window: int, frames: tuple[int, int], *,
                  stride: float = 0.125, subsampling: int = 8, batch_windows: int = 8,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """The moving-window posteriors of output frames ``frames = (a, b)`` only, as :func:`posteriors` gives them
    for the whole recording (the same window placements; only the windows covering the stretch run).

    features: (T, F), normalised over the whole recording. Returns (b - a, V) float32 probabilities (fp32)."""
    a, b = frames
    t_out = math.ceil(features.shape[0] / subsampling)
    if not 0 <= a < b <= t_out:
        raise ValueError(f"output frames {frames} are not a stretch of the recording's {t_out}")
    plan = plan_windows(features.shape[0], window, stride, subsampling)
    spans = [(s, e) for s, e in plan.spans
             if s // subsampling < b and s // subsampling + math.ceil((e - s) / subsampling) > a]
    feats = features.to(device=device, dtype=torch.float32)
    sums: torch.Tensor | None = None
    counts = torch.zeros(b - a, device=device)
    for b0 in range(0, len(spans), batch_windows):
        chunk = spans[b0: b0 + batch_windows]
        probs, out_lengths = forward_windows(model, feats, chunk, device)
        if sums is None:
            sums = torch.zeros(b - a, probs.shape[-1], device=device)
        for i, (s, _) in enumerate(chunk):
            o = s // subsampling
            lo, hi = max(a, o), min(b, o + int(out_lengths[i]))
            if hi > lo:
                sums[lo - a: hi - a] += probs[i, lo - o: hi - o]
                counts[lo - a: hi - a] += 1
    if sums is None or bool((counts == 0).any()):
        raise RuntimeError(f"output frames {frames} were not all covered by a window")
    return (sums / counts.unsqueeze(1)).cpu()


def forward_windows(model: Model, feats: torch.Tensor, chunk: list[tuple[int, int]], device: torch.device | str,
                    bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of windows (zero-padded to the longest; the model masks padding). Returns float32 probabilities
    (B, T', V) and output lengths (B,). ``bf16``: the model runs under CUDA bf16 autocast."""
    lengths = torch.tensor([e - s for s, e in chunk], device=device)
    batch = feats.new_zeros(len(chunk), max(int(lengths.max()), 1), feats.shape[1])
    for i, (s, e) in enumerate(chunk):
        batch[i, : e - s] = feats[s:e]
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        logits, out_lengths = model(batch, lengths)
    return torch.softmax(logits.float(), dim=-1), out_lengths


def greedy_frames(probs: torch.Tensor, blank: int) -> list[tuple[int, int]]:
    """Greedy CTC with where each token was emitted: ``(token id, output frame)`` per token, the frame the first of
    its run. probs: (T', V)."""
    return collapse_frames(probs.argmax(dim=-1), blank) if probs.shape[0] else []


def collapse_frames(best: torch.Tensor, blank: int) -> list[tuple[int, int]]:
    """CTC's collapse of a best-class-per-frame sequence (T',) (repeats merged, blanks removed): ``(token id,
    output frame)`` per token, the frame the first of its run."""
    if best.shape[0] == 0:
        return []
    keep = torch.ones_like(best, dtype=torch.bool)
    keep[1:] = best[1:] != best[:-1]
    keep &= best != blank
    frames = keep.nonzero().flatten()
    return list(zip(best[frames].tolist(), frames.tolist()))


def greedy_ids(probs: torch.Tensor, blank: int) -> list[int]:
    """Greedy CTC: best class per frame, repeats merged, blanks removed (:func:`greedy_frames`' ids). probs: (T', V)."""
    return [token for token, _ in greedy_frames(probs, blank)]


def decode_features(model: Model, features: torch.Tensor, window: int, decode_ids: Callable[[list[int]], str], *,
                    blank: int, stride: float = 0.125, batch_windows: int | WindowBatch = 8, subsampling: int = 8,
                    device: torch.device | str = "cpu", progress: Progress | None = None,
                    precision: str = "fp32") -> str:
    """Text of one recording from its normalised features (T, F) (arguments as :func:`posteriors`)."""
    probs = posteriors(model, features, window, stride=stride, batch_windows=batch_windows,
                       subsampling=subsampling, device=device, progress=progress, precision=precision)
    return decode_ids(greedy_ids(probs, blank))


def prepare_features(extractor: Callable[[torch.Tensor], torch.Tensor], wave: torch.Tensor,
                     ignore: Iterable[tuple[float, float]] = (), frames_per_second: float = 100.0) -> torch.Tensor:
    """Normalised features of a whole recording (N,) -> (T, F), untranscribed regions set to zero."""
    feats = extractor(wave)
    regions: Sequence[tuple[float, float]] = list(ignore)
    if regions:
        from asr_core.data.features import zero_regions

        feats = zero_regions(feats, regions, frames_per_second)
    return feats
