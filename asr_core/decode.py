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
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

Model = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
Progress = Callable[[int, int], None]  # (windows done, windows total)


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
               batch_windows: int = 8, subsampling: int = 8, device: torch.device | str = "cpu",
               progress: Progress | None = None) -> torch.Tensor:
    """Frame posteriors of a whole recording by moving windows.

    features: (T, F), already normalised over the recording. Returns (ceil(T / subsampling), V) float32
    probabilities (softmax, not log), each output frame the mean over the windows covering it.
    """
    if features.dim() != 2:
        raise ValueError(f"features must be (T, F), got shape {tuple(features.shape)}")
    plan = plan_windows(features.shape[0], window, stride, subsampling)
    t_out = math.ceil(plan.frames / subsampling)
    feats = features.to(device=device, dtype=torch.float32)
    sums: torch.Tensor | None = None
    counts = torch.zeros(t_out, device=device)
    spans = plan.spans
    b0, batch = 0, batch_windows
    while b0 < len(spans):
        chunk = spans[b0: b0 + batch]
        try:
            probs, out_lengths = _forward_windows(model, feats, chunk, device)
        except torch.OutOfMemoryError:
            if batch == 1:
                raise
            batch = max(1, batch // 2)  # long contexts: fewer windows at once rather than failing the evaluation
            if str(device).startswith("cuda"):
                torch.cuda.empty_cache()
            print(f"[decode] out of memory with {len(chunk)} windows of {window} frames; retrying {batch} at a "
                  "time", file=sys.stderr)
            continue
        if sums is None:
            sums = torch.zeros(t_out, probs.shape[-1], device=device)
        for i, (s, _) in enumerate(chunk):
            o = s // subsampling
            n = min(int(out_lengths[i]), t_out - o)
            sums[o: o + n] += probs[i, :n]
            counts[o: o + n] += 1
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


def _forward_windows(model: Model, feats: torch.Tensor, chunk: list[tuple[int, int]], device: torch.device | str
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of windows (zero-padded to the longest; the model masks padding). Returns probabilities
    (B, T', V) and output lengths (B,)."""
    lengths = torch.tensor([e - s for s, e in chunk], device=device)
    batch = feats.new_zeros(len(chunk), max(int(lengths.max()), 1), feats.shape[1])
    for i, (s, e) in enumerate(chunk):
        batch[i, : e - s] = feats[s:e]
    logits, out_lengths = model(batch, lengths)
    return torch.softmax(logits.float(), dim=-1), out_lengths


def greedy_ids(probs: torch.Tensor, blank: int) -> list[int]:
    """Greedy CTC: best class per frame, repeats merged, blanks removed. probs: (T', V)."""
    if probs.shape[0] == 0:
        return []
    best = probs.argmax(dim=-1)
    keep = torch.ones_like(best, dtype=torch.bool)
    keep[1:] = best[1:] != best[:-1]
    keep &= best != blank
    return best[keep].tolist()


def decode_features(model: Model, features: torch.Tensor, window: int, decode_ids: Callable[[list[int]], str], *,
                    blank: int, stride: float = 0.125, batch_windows: int = 8, subsampling: int = 8,
                    device: torch.device | str = "cpu", progress: Progress | None = None) -> str:
    """Text of one recording from its normalised features (T, F)."""
    probs = posteriors(model, features, window, stride=stride, batch_windows=batch_windows,
                       subsampling=subsampling, device=device, progress=progress)
    return decode_ids(greedy_ids(probs, blank))


def prepare_features(extractor: Callable[[torch.Tensor], torch.Tensor], wave: torch.Tensor,
                     ignore: Iterable[tuple[float, float]] = (), frames_per_second: float = 100.0) -> torch.Tensor:
    """Normalised features of a whole recording (N,) -> (T, F), untranscribed regions set to zero."""
    feats = extractor(wave)
    regions: Sequence[tuple[float, float]] = list(ignore)
    if regions:
        from asr_core.features import zero_regions

        feats = zero_regions(feats, regions, frames_per_second)
    return feats
