"""What each trial asks SLURM for: its time limit, the least time it may start with, and its memory.

A profile gives either fixed values (``time_limit: "48:00:00"``, ``mem_gb: 64``: every trial asks the same) or rules:

- ``time_limit: estimate``: a trial's limit is its estimated hours (:mod:`orchestrate.budget.estimate`, at the profile's
  ``calibration``) times ``time_margin``, rounded up to the hour, at most ``time_max`` (or, when that is unset, the
  partition's ``MaxTime`` from ``scontrol show partition``). A trial that needs more than the cap checkpoints at
  USR2 and is requeued, as with a fixed limit. The paper grid's main model asks ~18 h at 10 s of context and the
  cap at 1 h, instead of 48 h for every trial: SLURM's backfill can place the short ones in gaps.
- ``time_min: "HH:MM:SS"``: ``--time-min``, so the scheduler may start a trial with less time than its limit when
  that lets it start sooner (backfill); the trial checkpoints at USR2 before that shorter limit and is requeued,
  so nothing is lost. Never more than the trial's limit.
- ``mem_gb: estimate``: host memory from the model's size, the loader's threads and the longest training recording
  (:func:`memory_gb`). A step holds ``data.batch_audio_s`` of audio whatever its window length, so context changes
  host memory only where a window is longer than a step's audio.

Trials asking the same (limit, time-min, memory) share a job array (:func:`group_by_resources`); arrays are then
split at ``MaxArraySize`` by the backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from orchestrate.plan.profile import ESTIMATE, Profile, format_minutes, parse_minutes, time_limit_minutes

if TYPE_CHECKING:
    from orchestrate.sweep.trial import Trial

# Host memory of a trial (mem_gb: estimate). Bytes per second of audio, from the shapes the loader holds:
STEP_BYTES_PER_AUDIO_S = 16_000 * 4 + 100 * 80 * 4  # a window's 16 kHz float32 samples and its 80 float32 mels
# a recording's statistics read (interleaved batching) holds the whole recording at once: the source's samples
# (44.1 kHz float32), the 16 kHz ones, the spectrogram (257 bins, complex64, 100 frames/s) and the mels, 467 KiB an
# audio-second by their shapes; measured: the peak resident growth of load_audio + features.raw + statistics over
# 20 minutes of 44.1 kHz FLAC was 531 KiB an audio-second (622 MB)
STATS_BYTES_PER_AUDIO_S = 544_000
BASE_GB = 4.0  # the Python process with torch, CUDA's host side, MLflow client, the prepared corpus's index pages
PARAM_BYTES = 24  # fp32 weights and the optimiser's two moments on the host while a checkpoint is written, and the
# serialised copy beside them
MEM_MARGIN = 1.25
MEM_STEP_GB = 4  # requests rounded up to this, so that trials of similar size share a job array


@dataclass(frozen=True)
class Resources:
    """One trial's request: ``--time`` (minutes), ``--time-min`` (minutes, 0: none), ``--mem`` (MB, 0: the
    partition's default) and how they were reached (a line for people)."""

    time_min: int
    start_min: int = 0
    mem_mb: int = 0
    why: str = ""

    def group(self) -> tuple[int, int, int]:
        return (self.time_min, self.start_min, self.mem_mb)

    def describe(self) -> str:
        out = f"time {format_minutes(self.time_min)}"
        if self.start_min:
            out += f" (may start with {format_minutes(self.start_min)})"
        if self.mem_mb:
            out += f", mem {self.mem_mb / 1024:g} GB"
        return out


def memory_gb(params: int, num_workers: int, batch_audio_s: float, context_s: float, longest_recording_s: float,
              interleaved: bool) -> float:
    """Host memory a trial needs, in GB (with a 25 % margin, rounded up to :data:`MEM_STEP_GB`): the process
    (:data:`BASE_GB`), the model and optimiser state on the host while a checkpoint is written
    (:data:`PARAM_BYTES` a parameter), the steps the loader holds (the one training and ``num_workers + 1`` in
    preparation, each ``max(batch_audio_s, context_s)`` of audio) and, for interleaved batching, the statistics
    reads in flight (``max(1, num_workers // 2)`` threads, each a whole recording of up to
    ``longest_recording_s``)."""
    step = (num_workers + 2) * max(batch_audio_s, context_s) * STEP_BYTES_PER_AUDIO_S
    stats = (max(1, num_workers // 2) * longest_recording_s * STATS_BYTES_PER_AUDIO_S) if interleaved else 0.0
    total = BASE_GB * 1e9 + params * PARAM_BYTES + step + stats
    return float(math.ceil(total * MEM_MARGIN / 2**30 / MEM_STEP_GB) * MEM_STEP_GB)


def trial_resources(trials: Sequence["Trial"], profile: Profile, cap_min: int | None = None,
                    workdir: Any = None) -> dict[str, Resources]:
    """{trial key: :class:`Resources`} under ``profile`` (its fixed values, or its rules: see the module docstring);
    ``cap_min``: the partition's ``MaxTime`` in minutes (None: unlimited or unknown), used when the profile sets no
    ``time_max``. Trials are estimated only when a rule needs it (``orchestrate.budget.estimate``: a second or two for
    the paper grid). Raises :class:`orchestrate.budget.calibration.EstimateError` naming the calibration or corpus it
    cannot use."""
    time_rule = str(profile.time_limit).strip() == ESTIMATE
    mem_rule = str(profile.mem_gb).strip() == ESTIMATE
    if profile.time_max:
        cap_min = parse_minutes(profile.time_max)
    start = parse_minutes(profile.time_min) if profile.time_min else 0
    fixed_time = None if time_rule else profile.time_limit_min()
    fixed_mem = 0 if mem_rule else int(float(profile.mem_gb or 0) * 1024)
    if not (time_rule or mem_rule):
        r = Resources(fixed_time or 0, start if start and start < (fixed_time or 0) else 0, fixed_mem,
                      "the profile's fixed values")
        return {t.key: r for t in trials}
    from asr_core.model.cost import model_params
    from orchestrate.budget.calibration import load_calibration
    from orchestrate.budget.corpus import training_corpus
    from orchestrate.budget.estimate import estimate_trial

    cal = load_calibration(profile.calibration or None)
    out: dict[str, Resources] = {}
    for t in trials:
        fitted = profile.fit(t)
        why = []
        if time_rule and fitted.is_evaluation:
            limit, note = _evaluation_limit(fitted, cal, profile, cap_min)
            why.append(note)
        elif time_rule:
            e = estimate_trial(fitted, cal, None, workdir=workdir)
            limit = time_limit_minutes(e.hours, profile.time_margin, cap_min, profile.signal_delay_s)
            capped = " (the cap)" if cap_min and limit == cap_min else ""
            why.append(f"estimate {e.hours:.1f} h x {profile.time_margin:g} -> {format_minutes(limit)}{capped}")
        else:
            limit = fixed_time or 0
        mem = fixed_mem
        if mem_rule:
            cfg = fitted.config
            corpus = training_corpus(cfg.data.train, workdir) if cfg.data.train else None
            longest = float(corpus.durations.durations_timed()[0].max()) if corpus is not None and len(
                corpus.durations) else cfg.data.context_s
            gb = memory_gb(model_params(cfg.model, cfg.data.features.n_mels), cfg.data.num_workers,
                           cfg.data.batch_audio_s, cfg.data.context_s, longest, cfg.data.batching == "interleaved")
            mem = int(gb * 1024)
            why.append(f"mem {gb:g} GB (longest recording {longest / 3600:.1f} h, {cfg.data.num_workers} loader "
                       "threads)")
        out[t.key] = Resources(limit, start if 0 < start < limit else 0, mem, "; ".join(why))
    return out


def _evaluation_limit(trial: "Trial", cal: Any, profile: Profile, cap_min: int | None) -> tuple[int, str]:
    """An evaluation job's time limit under ``time_limit: estimate``: a greedy evaluation's estimated decoding
    (:func:`orchestrate.budget.evaluation_time.eval_seconds` of what it decodes) x ``time_margin``; a beam decoder,
    or a test set of unknown size, gets the cap (``time_max`` or the partition's ``MaxTime``): an evaluation keeps no
    checkpoint, so a limit too short would end it again at every requeue."""
    from orchestrate.budget.calibration import EstimateError
    from orchestrate.budget.evaluation_time import eval_seconds
    from orchestrate.plan.evaluations import evaluation_config

    secs = eval_seconds(evaluation_config(trial), cal) if not trial.evaluation.get("decoder") else None
    if secs is None:
        if cap_min is None:
            raise EstimateError(f"evaluation job {trial.label}: a beam decoder or a test set of unknown size "
                                    "has no estimate, and neither time_max nor the partition's MaxTime caps it; set "
                                    "time_max in the profile")
        return cap_min, f"evaluation: the cap {format_minutes(cap_min)} (no estimate of its decoding)"
    hours = (secs + cal.startup_s) / 3600.0
    limit = time_limit_minutes(hours, profile.time_margin, cap_min, profile.signal_delay_s)
    return limit, f"evaluation estimate {hours:.2f} h x {profile.time_margin:g} -> {format_minutes(limit)}"


def group_by_resources(items: Iterable[Any], resources: dict[str, Resources], key: Any = lambda j: j.trial.key
                       ) -> list[tuple[Resources, list[Any]]]:
    """``items`` (jobs, in their order) grouped by the resources their trials ask, shortest limit first; each
    group keeps the items' order."""
    groups: dict[tuple[int, int, int], tuple[Resources, list[Any]]] = {}
    for it in items:
        r = resources[key(it)]
        groups.setdefault(r.group(), (r, []))[1].append(it)
    return [groups[g] for g in sorted(groups)]
