"""Model FLOP utilisation: how much of the device's arithmetic a training step uses (the benchmarks print it).

* **Model FLOPs** come from the model's own arithmetic, :func:`asr_core.model.cost.model_macs` (checked against
  ``torch.utils.flop_counter`` in the tests): a forward pass is ``2 x (linear x audio + attention x audio x window)``
  FLOPs for ``audio`` seconds in windows of ``window`` seconds, and forward + backward three times that
  (:data:`FORWARD_BACKWARD`). Padding, recomputation and the optimiser are not model FLOPs: they lower the figure.
* **The peak** is the device's dense peak for the step's precision, from :data:`PEAKS` for known GPUs (the vendors'
  dense figures: no 2:4 sparsity), and for the CPU the measured rate of one large float32 matrix product on this
  machine's threads (:func:`cpu_matmul_peak`), so that the CPU figure means "share of what this CPU's matmul does".
  A GPU not in the table has no MFU (the caller says so).

``MFU = model FLOPs per step / step seconds / peak``. The share of a step spent outside the forward and backward pass
(data, clipping and the optimiser, logging, host synchronisation) is printed beside it where the step is timed in
parts (``bench calibrate``).
"""

from __future__ import annotations

import time

import torch

FORWARD_BACKWARD = 3.0  # a backward pass costs about twice the forward one
# dense peak FLOP/s by device name (the first key found in torch.cuda.get_device_name(), in this order): bf16 tensor
# cores and plain fp32, from the vendors' data sheets
PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bf16": 756e12, "fp32": 51e12}),
    ("H100", {"bf16": 989e12, "fp32": 67e12}),  # SXM / HBM3
    ("H200", {"bf16": 989e12, "fp32": 67e12}),
    ("GH200", {"bf16": 989e12, "fp32": 67e12}),
    ("A100", {"bf16": 312e12, "fp32": 19.5e12}),
    ("L40S", {"bf16": 362e12, "fp32": 91.6e12}),
    ("A10", {"bf16": 125e12, "fp32": 31.2e12}),
    ("V100", {"bf16": 0.0, "fp32": 15.7e12}),  # no bf16 tensor cores
)


def gpu_peak(name: str, precision: str) -> float | None:
    """The dense peak FLOP/s of the GPU called ``name`` at ``precision`` (``bf16`` or ``fp32``); None if unknown."""
    for key, peaks in PEAKS:
        if key.lower() in name.lower():
            value = peaks.get(precision)
            return value if value else None
    return None


def cpu_matmul_peak(n: int = 1024, repeats: int = 3) -> float:
    """FLOP/s of the best of ``repeats`` float32 ``n x n`` matrix products on this CPU with torch's threads."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


def device_peak(device: torch.device | str, precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s, where it comes from) for training on ``device`` at ``precision``: the table for a GPU, one
    measured matrix product for the CPU; (None, why) for a GPU the table does not know."""
    dev = torch.device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        peak = gpu_peak(name, precision)
        if peak is None:
            return None, f"{name}: no {precision} peak known (asr_core.bench.mfu.PEAKS)"
        return peak, f"{name} dense {precision} peak {peak / 1e12:.0f} TFLOP/s (data sheet)"
    peak = cpu_matmul_peak()
    return peak, (f"this CPU's float32 matmul, measured: {peak / 1e9:.1f} GFLOP/s on {torch.get_num_threads()} "
                  "threads")


def step_flops(linear_macs_per_s: float, attention_macs_per_s2: float, audio_s: float, window_s: float) -> float:
    """Model FLOPs of one forward + backward over ``audio_s`` seconds of audio in windows of ``window_s`` seconds,
    from :func:`~asr_core.model.cost.model_macs`'s two terms."""
    forward_macs = linear_macs_per_s * audio_s + attention_macs_per_s2 * audio_s * window_s
    return FORWARD_BACKWARD * 2.0 * forward_macs


def stack_flops(d_model: int, layers: int, ff_expansion: int, conv_kernel: int, frames: int, window: int) -> float:
    """Model FLOPs of one forward + backward of a Conformer layer stack over ``frames`` frames (already subsampled)
    in windows of ``window`` frames: per frame and layer the feed-forwards, projections and convolution module
    (as :func:`~asr_core.model.cost.model_macs` counts a layer) and ``2 x window x d_model`` for attention."""
    per_frame = layers * ((4 * ff_expansion + 4 + 3) * d_model * d_model + conv_kernel * d_model
                          + 2 * window * d_model)
    return FORWARD_BACKWARD * 2.0 * per_frame * frames


def mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    """The share of ``peak`` that ``flops`` in ``seconds`` is; None without a peak."""
    if peak is None or peak <= 0 or seconds <= 0:
        return None
    return flops / seconds / peak
