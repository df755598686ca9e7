"""Compiling the model for training (``train.compile``, an execution setting: never in a key).

With ``train.compile: true`` the trainer compiles the model's parts in place with ``torch.compile`` before the first
step: the subsampling, each Conformer layer (one compiled graph serves all layers: they run the same code), the
self-conditioning and the CTC head. The model around them stays as it is, so

- the state dict, and with it the checkpoint format, is the plain model's (``nn.Module.compile`` keeps the module
  and its parameter names; a compiled run's checkpoint resumes uncompiled and the other way round);
- whether the batch is padded is known on the host before the layers run (:class:`asr_core.model.acoustic.
  AcousticModel`), so each layer compiles into one graph with no host synchronisation and no graph break, and at
  most one variant for padded and one for unpadded batches;
- window lengths and batch sizes that change from step to step (the sequence-length warmup, the shorter last steps
  of a group) do not recompile every step: after the first change of shape the graphs are recompiled once with
  dynamic shapes (PyTorch's automatic dynamic shapes).

Where compiling cannot work, training goes on uncompiled and says why in one line (:func:`compile_problem`): with
``model.activation_checkpointing`` (batch renormalisation replays its recorded statistics in the recomputation, which
a compiled graph cannot follow), with paper 003's head-diversity loss (its capture hooks the attention modules from
outside the graph), on a CPU without a C++ compiler, or on CUDA without Triton. A part that fails to compile later
falls back to running uncompiled, with PyTorch's warning in the log.

Compiled and plain steps give the same losses and gradients up to float rounding (tests/test_compile.py states the
tolerance); whether compiling pays is measured, not assumed: ``python -m asr_core bench calibrate --set
train.compile=true`` beside the plain calibration.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Callable

import torch
from torch import nn

from asr_core.config import Config
from asr_core.model.acoustic import AcousticModel
from asr_core.model.attention import SelfAttention
from asr_core.model.batchrenorm import MaskedBatchRenorm
from asr_core.contract.provenance import X86_LEVELS, cpu_level


def forced_level_problem() -> str | None:
    """Why compiling on this CPU would give wrong results: ``ATEN_CPU_CAPABILITY`` forces vector kernels below the
    CPU's own (avx2 on an AVX-512 CPU). torch.compile then writes AVX2 code for the subsampling's convolutions whose
    outputs were 0.12 away from the plain model's (torch 2.11; a segmentation fault with a warm kernel cache), while
    an AVX2 CPU running its own level compiles correctly. ``default`` (no vector code) is not affected."""
    forced = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    own = cpu_level()
    if forced in X86_LEVELS and forced != "default" and own in X86_LEVELS \
            and X86_LEVELS.index(forced) < X86_LEVELS.index(own):
        return (f"ATEN_CPU_CAPABILITY={forced} forces kernels below this CPU's own ({own}), where torch.compile's "
                "CPU code gives wrong results; unset it to compile")
    return None


def compile_problem(cfg: Config, device: torch.device) -> str | None:
    """Why ``cfg``'s model cannot be compiled for training on ``device``, in words; None where it can."""
    if cfg.model.activation_checkpointing:
        return ("model.activation_checkpointing is on (batch renormalisation replays its statistics in the "
                "recomputation, which a compiled graph cannot follow)")
    if cfg.train.head_diversity_weight > 0:
        return "paper 003's head-diversity loss is on (it hooks the attention modules from outside the graph)"
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return "CUDA without the triton package (install it, or the torch wheel that brings it)"
    if device.type == "cpu" and not any(shutil.which(c) for c in (os.environ.get("CXX", ""), "g++", "c++", "clang++")
                                        if c):
        return "no C++ compiler on this machine (g++, c++ or clang++; or set CXX)"
    if device.type == "cpu":
        return forced_level_problem()
    return None


def keep_uncompiled(model: nn.Module) -> None:
    """Mark what runs uncompiled inside ``model``'s compiled parts: batch renormalisation's correction (a compiled
    graph recomputed it from the running statistics it had moved, and gave other gradients: see
    :meth:`asr_core.model.batchrenorm.MaskedBatchRenorm.correction`) and flash-attn's kernel call
    (:meth:`asr_core.model.attention.SelfAttention.flash`). Done here rather than where they are defined, so that
    importing the model does not import the compiler."""
    for m in model.modules():
        if isinstance(m, MaskedBatchRenorm):
            m.correction = torch.compiler.disable(m.correction)  # type: ignore[method-assign]
        elif isinstance(m, SelfAttention):
            m.flash = torch.compiler.disable(m.flash)  # type: ignore[method-assign]


def compile_model(model: AcousticModel) -> None:
    """Compile ``model``'s parts in place (see the module docstring); its state dict is unchanged."""
    # a part that fails to compile runs as it is (PyTorch logs the failure) rather than ending the trial
    torch._dynamo.config.suppress_errors = True
    keep_uncompiled(model)
    model.subsampling.compile()
    for layer in model.layers:
        layer.compile()
    if model.self_conditioning is not None:
        model.self_conditioning.compile()
    model.head.compile()


def prepare_model(model: AcousticModel, cfg: Config, device: torch.device,
                  say: Callable[[str], None] = print) -> bool:
    """Compile ``model`` where ``train.compile`` asks and it can work; say what was done. Returns whether it was."""
    if not cfg.train.compile:
        return False
    problem = compile_problem(cfg, device)
    if problem is not None:
        say(f"[train] train.compile is on, but {problem}: training uncompiled")
        return False
    compile_model(model)
    say("[train] model compiled (torch.compile: subsampling, each layer, self-conditioning, head); the first steps "
        "and the first change of window length take longer while it compiles")
    return True
