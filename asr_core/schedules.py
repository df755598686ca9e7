"""Pure schedule functions: learning rate per optimiser step (its cosine over steps, or over recordings as the
authors' trainer has it), sequence length per recording (paper 000 §2.3, §3.3).

Both are functions of a counter only, so resuming a run needs nothing but the counter.
"""

from __future__ import annotations

import math

MAX_DOUBLINGS = 60  # 2**60 windows of 5 s outlast any corpus; avoids float overflow on huge counters


def learning_rate(step: int, peak: float, warmup_steps: int, total_steps: int) -> float:
    """LR for optimiser step ``step`` (0-based): linear warmup to ``peak`` over ``warmup_steps``
    (``peak * (step + 1) / warmup_steps``), then cosine from ``peak`` to 0 at ``step == total_steps``."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    decay = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


def learning_rate_by_recordings(step: int, peak: float, warmup_steps: int, recordings_before: int,
                                decay_start: int, total_recordings: int) -> float:
    """LR for optimiser step ``step`` (0-based) when the cosine decays over recordings, as the authors' trainer
    does (``lcasr/utils/scheduling.py``'s CosineLRScheduler, stepped once per data-loader group in ``exp/train.py``).

    Warmup as :func:`learning_rate`. After it the LR stays at ``peak`` until the group in which the warmup ended has
    been trained; from then on it is fixed for the whole of a group at
    ``peak * 0.5 * (1 + cos(pi * (P - P0) / (T - P0 + 1)))``, where ``P`` = ``recordings_before`` (recordings of
    the groups before the step's own), ``P0`` = ``decay_start`` (recordings up to and including the first group
    that started after the warmup) and ``T`` = ``total_recordings`` of the run."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    if recordings_before < decay_start:
        return peak
    progress = min(1.0, (recordings_before - decay_start) / max(1, total_recordings - decay_start + 1))
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


def sequence_length(recordings_seen: int, max_s: float, start_s: float, every: int, variant: str) -> float:
    """Window length in seconds once ``recordings_seen`` recordings have been used (``r``).

    - ``paper``: ``s_r = min(s0 + s0 * 2^floor(r/n), s_m)`` (paper 000 §2.3; 10 s at r = 0);
    - ``code``:  ``s_r = min(s0 * 2^floor(r/n), s_m)`` (the authors' release; 5 s at r = 0);
    - ``none``:  ``s_m`` throughout.
    """
    if recordings_seen < 0:
        raise ValueError(f"recordings_seen must be >= 0, got {recordings_seen}")
    doublings = min(recordings_seen // every, MAX_DOUBLINGS)
    if variant == "paper":
        return min(start_s + start_s * 2.0**doublings, max_s)
    if variant == "code":
        return min(start_s * 2.0**doublings, max_s)
    if variant == "none":
        return max_s
    raise ValueError(f"unknown sequence-length warmup {variant!r}; valid: paper, code, none")
