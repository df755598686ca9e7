"""GPU-hours of a grid before it is submitted: ``python -m orchestrate plan GRID --estimate [--calibration FILE]
[--profile P] [--trials]``.

For every trial the trainer's own planner is replayed over the training corpus's durations
(:func:`asr_core.data.step_plan.step_lengths`: the same order, groups and sequence-length warmup as
``train``, no audio or words read), so the window length and padded audio of every optimiser step are known. The
time of a trial on one device is then

* **training**: per step, ``overhead + padded_audio x (a - overhead + resid(L)) / B + attention x b / B`` where
  ``a + b * L`` is the calibration's seconds for a step of ``B = batch_audio_s`` padded audio in windows of ``L``
  seconds, ``overhead`` its per-step clipping + optimiser time, ``attention`` the step's windows x window length
  (squared window lengths summed: without padding when the calibration's attention is flash-attn's variable-length
  kernel, with it otherwise), and ``resid`` a measured calibration's departure from its own line, interpolated
  between its contexts. A model other than the calibration's is scaled by its arithmetic
  (:func:`asr_core.model.cost.model_macs`): the linear part by the ratio of per-frame multiply-accumulates,
  the attention part by that of ``layers x d_model``. With no loader threads (``data.num_workers`` 0, after the
  profile's :meth:`~orchestrate.plan.profile.Profile.fit`) the loader's once-per-recording statistics are
  added (a measured calibration's rate x the corpus's audio);
* **evaluation**: :func:`orchestrate.plan.grid.eval_work`'s decoded audio (test-set hours x conditions x windows per
  frame) at the calibration's decoding speed for the trial's context (interpolated between measured contexts;
  scaled by the model's arithmetic at that context), plus reading + features per audio-second and condition and
  music per noisy condition;
* **checkpoints**: one every ``train.checkpoint_every`` steps, the last one and the rewrite without optimiser
  state, at the calibration's save time scaled by parameters; **start-up** (imports, model) once per segment.

With a profile: the segments each trial needs under its ``time_limit`` (``ceil(hours / (limit - signal_delay))``,
each later segment paying start-up and a checkpoint again), and a lower bound of the sweep's wall time on
``max_parallel`` GPUs (longest trials first onto the GPU that frees first; never below the longest trial or the
total over ``max_parallel``; queue waits not counted).

Where the training corpus is not on disk (the paper's ``data/spotify/train``), its durations are an assumption,
:data:`~orchestrate.budget.corpus.PAPER_CORPUS_ASSUMPTION`, printed with the estimate (the corpus and the replayed
plans: :mod:`orchestrate.budget.corpus`; the evaluation's seconds: :mod:`orchestrate.budget.evaluation_time`).

The built-in calibration, ``orchestrate/calibrations/a100-paper.json`` (``"source": "paper 000 Table 1 and
training times"``, read by :mod:`orchestrate.budget.calibration`), is derived in
:func:`orchestrate.budget.paper_fit.paper_fit` (``python -m orchestrate.budget.estimate --derive``).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from asr_core.config import Config
from asr_core.data.step_plan import StepLengths
from orchestrate.plan.profile import parse_minutes, time_limit_minutes
from orchestrate.budget.calibration import Calibration, EstimateError
from orchestrate.budget.corpus import training_corpus, trial_steps
from orchestrate.budget.evaluation_time import eval_seconds
from orchestrate.budget.paper_fit import derive_cli
from orchestrate.plan.grid import Grid, eval_set_hours


# ---- one trial's hours ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialEstimate:
    key: str
    label: str
    subgrids: tuple[str, ...]
    context_s: float
    model: str
    steps: int
    train_s: float
    eval_s: float | None  # None: a test set's size is unknown
    checkpoint_s: float
    startup_s: float
    scale: float  # the model's linear arithmetic relative to the calibration's (1.0: the calibration's model)
    segments: int = 1
    limit_h: float | None = None

    @property
    def seconds(self) -> float:
        return self.train_s + (self.eval_s or 0.0) + self.checkpoint_s + self.startup_s

    @property
    def hours(self) -> float:
        return self.seconds / 3600.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["subgrids"] = list(self.subgrids)
        d["hours"] = self.hours
        d["requeues"] = self.segments - 1
        return d


def _model_name(cfg: Config) -> str:
    m = cfg.model
    return f"{m.layers}L d={m.d_model} {m.heads}H"


def train_seconds(steps: dict[float, StepLengths], cal: Calibration, linear: float, attention: float) -> float:
    """Seconds of the steps at ``cal``, a model of ``linear`` and ``attention`` arithmetic relative to the
    calibration's model (1.0, 1.0: the same model)."""
    total = 0.0
    for st in steps.values():
        if not st.steps:
            continue
        att = st.audio_s2 if cal.attention == "flash" else st.padded_s2
        length = att / st.padded_s if st.padded_s else 0.0
        lin_rate = (cal.a - cal.overhead_s + cal.residual(length)) / cal.batch_audio_s
        total += (st.steps * cal.overhead_s + st.padded_s * lin_rate * linear
                  + att * cal.b / cal.batch_audio_s * attention)
    return total


def estimate_trial(trial: Any, cal: Calibration, profile: Any = None,
                   hours_of: Callable[[str], float | None] = eval_set_hours, workdir: Path | None = None
                   ) -> TrialEstimate:
    """The hours of one trial (see the module docstring); ``profile`` (a
    :class:`~orchestrate.plan.profile.Profile`) adds its loader threads, time limit and segments."""
    from asr_core.model.cost import model_macs

    if profile is not None:
        trial = profile.fit(trial)
    cfg: Config = trial.config
    corpus = training_corpus(cfg.data.train, workdir) if cfg.data.train else None
    if corpus is None:
        raise EstimateError(f"trial {trial.label}: data.train is empty; the estimate replays the training corpus")
    steps = trial_steps(cfg, corpus)
    lin, att = model_macs(cfg.model, cfg.data.features)
    r_lin, r_att = lin / cal.macs_linear, att / cal.macs_attention
    train_s = train_seconds(steps, cal, r_lin, r_att)
    n_steps = sum(s.steps for s in steps.values())
    if cfg.data.num_workers == 0:  # statistics of every recording, once, in the training loop
        used = corpus.durations[: cfg.data.max_recordings] if cfg.data.max_recordings else corpus.durations
        train_s += used.hours * 3600.0 * cal.stats_s_per_audio_s
    eval_s = eval_seconds(cfg, cal, hours_of)
    params = _params(cfg)
    ckpt_each = cal.checkpoint_s * params / cal.params
    checkpoints = n_steps // cfg.train.checkpoint_every + 2  # the periodic ones, the last, the one without optimiser
    est = TrialEstimate(key=trial.key, label=trial.label, subgrids=tuple(trial.subgrids),
                        context_s=cfg.data.context_s, model=_model_name(cfg), steps=n_steps, train_s=train_s,
                        eval_s=eval_s, checkpoint_s=checkpoints * ckpt_each, startup_s=cal.startup_s, scale=r_lin)
    if profile is None:
        return est
    if profile.time_rule:  # each trial's own limit (as resources asks it), capped at time_max if set
        cap = parse_minutes(profile.time_max) if profile.time_max else None
        limit_h = time_limit_minutes(est.hours, profile.time_margin, cap, profile.signal_delay_s) / 60.0
    else:
        limit_h = profile.time_limit_min() / 60.0
    segments = segments_needed(est.hours, limit_h, profile.signal_delay_s)
    # every later segment starts again and the one before it ends with a checkpoint
    return dataclasses.replace(est, startup_s=segments * cal.startup_s,
                               checkpoint_s=est.checkpoint_s + (segments - 1) * ckpt_each, segments=segments,
                               limit_h=limit_h)


def _params(cfg: Config) -> int:
    from asr_core.model.cost import model_params

    return model_params(cfg.model, cfg.data.features.n_mels)


def segments_needed(hours: float, limit_h: float, signal_delay_s: float) -> int:
    """Job segments a trial of ``hours`` needs under a time limit of ``limit_h`` hours, each segment ending
    ``signal_delay_s`` before the limit with a checkpoint: ``ceil(hours / (limit - signal_delay))``."""
    usable = limit_h - signal_delay_s / 3600.0
    if usable <= 0:
        raise EstimateError(f"the profile's time limit ({limit_h:g} h) is not longer than its signal_delay_s "
                            f"({signal_delay_s} s): no segment could train at all")
    return max(1, math.ceil(hours / usable - 1e-9))


def wall_hours(hours: Sequence[float], parallel: int) -> tuple[float, float]:
    """(lower bound, schedule) of the wall time of trials of ``hours`` on ``parallel`` GPUs (0: one each): the
    bound is ``max(longest, total / parallel)``; the schedule puts the longest trials first, each on the GPU that
    frees first (LPT, within 4/3 of the best schedule), with no queue wait."""
    if not hours:
        return 0.0, 0.0
    n = parallel if parallel > 0 else len(hours)
    bound = max(max(hours), sum(hours) / n)
    gpus = [0.0] * min(n, len(hours))
    heapq.heapify(gpus)
    for h in sorted(hours, reverse=True):
        heapq.heappush(gpus, heapq.heappop(gpus) + h)
    return bound, max(gpus)


# ---- the grid ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GridEstimate:
    grid: Grid
    calibration: Calibration
    trials: tuple[TrialEstimate, ...]
    corpora: tuple[str, ...]  # notes on where durations came from
    profile: Any = None

    def by_subgrid(self) -> dict[str, list[TrialEstimate]]:
        """Trials under the first sub-grid that asks for them, so sub-grids add up to the grid."""
        out: dict[str, list[TrialEstimate]] = {s.name: [] for s in self.grid.subgrids}
        for t in self.trials:
            out.setdefault(t.subgrids[0], []).append(t)
        return out

    @property
    def total_hours(self) -> float:
        return sum(t.hours for t in self.trials)


def estimate_grid(grid: Grid, cal: Calibration, profile: Any = None,
                  hours_of: Callable[[str], float | None] = eval_set_hours, workdir: Path | None = None
                  ) -> GridEstimate:
    trials = tuple(estimate_trial(t, cal, profile, hours_of, workdir) for t in grid.trials)
    notes = []
    for spec in dict.fromkeys(t.config.data.train for t in grid.trials if t.config.data.train):
        notes.append(f"{spec}: {training_corpus(spec, workdir).note}")
    return GridEstimate(grid, cal, trials, tuple(notes), profile)


def _h(x: float) -> str:
    return f"{x:,.2f}" if x < 1 else f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def _table(rows: list[tuple[str, ...]], right: set[int], rule_after: Sequence[int] = (0,)) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for i, r in enumerate(rows):
        out.append("  ".join(c.rjust(w) if j in right else c.ljust(w) for j, (c, w) in
                             enumerate(zip(r, widths))).rstrip())
        if i in rule_after or i - len(rows) in rule_after:
            out.append("  ".join("-" * w for w in widths))
    return out


def estimate_table(est: GridEstimate, trials: bool = False) -> str:
    """What ``plan --estimate`` prints: per sub-grid (and per trial with ``trials``), the grid's total, the
    requeues and wall time under the profile, and every assumption."""
    cal, prof = est.calibration, est.profile
    head = ["sub-grid", "trials", "steps", "train h", "eval h", "ckpt+start h", "GPU-h", "longest h"]
    if prof is not None:
        head.append("requeues")
    rows = [tuple(head)]

    def row(name: str, ts: list[TrialEstimate]) -> tuple[str, ...]:
        ev = sum(t.eval_s or 0.0 for t in ts) / 3600
        unknown = any(t.eval_s is None for t in ts)
        r = [name, str(len(ts)), f"{sum(t.steps for t in ts):,}", _h(sum(t.train_s for t in ts) / 3600),
             _h(ev) + ("+?" if unknown else ""), _h(sum(t.checkpoint_s + t.startup_s for t in ts) / 3600),
             _h(sum(t.hours for t in ts)), _h(max((t.hours for t in ts), default=0.0))]
        if prof is not None:
            r.append(str(sum(t.segments - 1 for t in ts)))
        return tuple(r)

    for name, ts in est.by_subgrid().items():
        rows.append(row(name, ts))
    rows.append(row("total (unique)", list(est.trials)))
    lines = [f"{est.grid.name}: estimated GPU-hours on {cal.device} (calibration: {cal.source}; {cal.path})"]
    lines += _table(rows, set(range(1, len(head))), (0, -2))
    if trials:
        th = ["trial", "sub-grid", "model", "context s", "steps", "train h", "eval h", "GPU-h"]
        if prof is not None:
            th += ["limit h", "segments"]
        trows = [tuple(th)]
        for t in est.trials:
            r = [t.label, t.subgrids[0], t.model, f"{t.context_s:g}", f"{t.steps:,}", _h(t.train_s / 3600),
                 "?" if t.eval_s is None else _h(t.eval_s / 3600), _h(t.hours)]
            if prof is not None:
                r += [f"{t.limit_h:g}", str(t.segments)]
            trows.append(tuple(r))
        lines += [""] + _table(trows, {3, 4, 5, 6, 7, 8})
    total = est.total_hours
    lines.append("")
    lines.append(f"total: {_h(total)} GPU-h for {len(est.trials)} trials (mean {_h(total / max(1, len(est.trials)))} "
                 f"h, longest {_h(max((t.hours for t in est.trials), default=0))} h)")
    if prof is not None:
        bound, lpt = wall_hours([t.hours for t in est.trials], prof.max_parallel)
        par = prof.max_parallel or len(est.trials)
        over = [t for t in est.trials if t.segments > 1]
        limit = (f"per trial, its estimate x {prof.time_margin:g} rounded up to the hour, at most "
                 + (prof.time_max if prof.time_max else "the partition's MaxTime (read at submit; not capped here)")
                 if prof.time_rule else prof.time_limit)
        lines.append(f"profile {prof.name}: time limit {limit} (USR2 {prof.signal_delay_s} s before it): "
                     f"{len(over)} trials outlive it, {sum(t.segments - 1 for t in est.trials)} requeues in all"
                     + (f" (longest: {max(over, key=lambda t: t.hours).label}, {max(t.segments for t in over)} "
                        "segments)" if over else ""))
        lines.append(f"wall time on max_parallel={par} GPUs: at least {_h(bound)} h ({bound / 24:.1f} days); "
                     f"{_h(lpt)} h ({lpt / 24:.1f} days) with the longest trials first and no queue wait")
    scaled = sorted({t.model for t in est.trials if abs(t.scale - 1.0) > 1e-9})
    lines.append(f"calibration model: {cal.model}; t(L) = {cal.a:.4g} + {cal.b:.4g} x L s per step of "
                 f"{cal.batch_audio_s:g} s padded audio, {cal.overhead_s:.3g} s per-step overhead, {cal.attention} "
                 "attention" + (f"; scaled by arithmetic to {', '.join(scaled)}" if scaled else ""))
    for note in est.corpora:
        lines.append(f"training data {note}")
    if cal.builtin:
        lines.append("not modelled: the loader (the authors trained from stored spectrograms; this project reads "
                     "audio at ~400-600 audio-s/s per thread, python -m asr_core bench data: short contexts may be "
                     "loader-bound), tokenizer training, queue waits")
    return "\n".join(lines)


def estimate_json(est: GridEstimate) -> dict[str, Any]:
    out: dict[str, Any] = {
        "grid": est.grid.name, "calibration": {"path": est.calibration.path, "source": est.calibration.source,
                                               "device": est.calibration.device},
        "training_data": list(est.corpora), "total_gpu_hours": est.total_hours,
        "subgrids": {name: {"trials": len(ts), "gpu_hours": sum(t.hours for t in ts),
                            "train_hours": sum(t.train_s for t in ts) / 3600,
                            "eval_hours": sum(t.eval_s or 0.0 for t in ts) / 3600,
                            "requeues": sum(t.segments - 1 for t in ts)}
                     for name, ts in est.by_subgrid().items()},
        "trials": [t.to_dict() for t in est.trials]}
    if est.profile is not None:
        bound, lpt = wall_hours([t.hours for t in est.trials], est.profile.max_parallel)
        out["profile"] = {"name": est.profile.name, "time_limit": est.profile.time_limit,
                          "max_parallel": est.profile.max_parallel, "wall_hours_lower_bound": bound,
                          "wall_hours_lpt": lpt}
    return out


if __name__ == "__main__":
    sys.exit(derive_cli(sys.argv[1:]))
