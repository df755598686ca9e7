"""Where a command runs and in which precision, resolved in one place for training, evaluation, probes, the
language model and the benchmarks.

``device``: ``auto`` (CUDA when there is a GPU, else the CPU), ``cuda`` (an error without one) or ``cpu``.
``precision``: ``auto`` (bf16 autocast on CUDA, fp32 elsewhere), ``bf16`` (CUDA only) or ``fp32``.
"""

from __future__ import annotations

import torch

DEVICES = ("auto", "cuda", "cpu")
PRECISIONS = ("auto", "bf16", "fp32")


class DeviceError(ValueError):
    """A device or precision this machine cannot give; the message names the setting and what would work."""


def resolve_device(want: str, *, setting: str = "device") -> torch.device:
    """``want`` (one of :data:`DEVICES`, or a torch device string such as ``cuda:1``) as a device of this
    machine. ``setting`` names the option in the error, e.g. ``train.device``."""
    if want == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(want)
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"{setting}={want!r} is not a device; valid: {', '.join(DEVICES)}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"{setting}={want!r} but CUDA is not available here; use {setting}=auto or cpu")
    return device


def resolve_precision(precision: str, device: torch.device | str, *, setting: str = "precision") -> str:
    """``precision`` on ``device``: ``auto`` -> ``bf16`` on CUDA, ``fp32`` elsewhere; ``bf16`` needs CUDA."""
    cuda = torch.device(device).type == "cuda"
    if precision == "auto":
        return "bf16" if cuda else "fp32"
    if precision == "bf16" and not cuda:
        raise DeviceError(f"{setting}='bf16' needs CUDA (bf16 autocast is used on the GPU only); use "
                          f"{setting}=auto or fp32 on the CPU")
    if precision not in PRECISIONS:
        raise DeviceError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    return precision


def use_bf16(precision: str, device: torch.device | str, *, setting: str = "precision") -> bool:
    """Whether ``precision`` on ``device`` means bf16 autocast."""
    return resolve_precision(precision, device, setting=setting) == "bf16"
