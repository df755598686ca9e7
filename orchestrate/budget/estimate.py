"""GPU-hours of a grid before it is submitted: ``python -m orchestrate plan GRID --estimate [--calibration FILE]
[--profile P] [--trials]``.

For every trial the trainer's own planner is replayed over the training corpus's durations
(:meth:`asr_core.data.chunking.WindowStream.step_lengths`: the same order, groups and sequence-length warmup as
``train``, no audio or words read), so the window length and padded audio of every optimiser step are known. The
time of a trial on one device is then

* **training**: per step, ``overhead + padded_audio x (a - overhead + resid(L)) / B + attention x b / B`` where
  ``a + b * L`` is the calibration's seconds for a step of ``B = batch_audio_s`` padded audio in windows of ``L``
  seconds, ``overhead`` its per-step clipping + optimiser time, ``attention`` the step's windows x window length
  (squared window lengths summed: without padding when the calibration's attention is flash-attn's variable-length
  kernel, with it otherwise), and ``resid`` a measured calibration's departure from its own line, interpolated
  between its contexts. A model other than the calibration's is scaled by its arithmetic
  (:func:`asr_core.bench.calibrate.model_macs`): the linear part by the ratio of per-frame multiply-accumulates,
  the attention part by that of ``layers x d_model``. With no loader threads (``data.num_workers`` 0, after the
  profile's :meth:`~orchestrate.backends.profile.Profile.fit`) the loader's once-per-recording statistics are
  added (a measured calibration's rate x the corpus's audio);
* **evaluation**: :func:`orchestrate.grid.eval_work`'s decoded audio (test-set hours x conditions x windows per
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
:data:`PAPER_CORPUS_ASSUMPTION`, printed with the estimate. Plans are cached per (corpus, the data settings that
change the plan, seed), so the paper grid's 321 trials replay 30 plans of 105,000 recordings in a few seconds.

The built-in calibration, ``orchestrate/calibrations/a100-paper.json`` (``"source": "paper 000 Table 1 and
training times"``), is derived in :func:`paper_fit` (``python -m orchestrate.budget.estimate --derive``).
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from asr_core.data.chunking import StepLengths, WindowStream
from asr_core.config import Config
from orchestrate.grid import (KNOWN_TEST_RECORDINGS, Grid, eval_set_durations, eval_set_hours, eval_set_recordings,
                             eval_work)

BUILTIN = Path(__file__).resolve().parent / "calibrations" / "a100-paper.json"
PAPER_SOURCE = "paper 000 Table 1 and training times"

# The paper's training corpus when it is not on disk (../shared/REFERENCE.md: ~58k hours, ~105k podcasts).
PAPER_RECORDINGS = 105_000
PAPER_HOURS = 58_000.0
PAPER_GAMMA_SHAPE = 2.0
PAPER_CLIP_S = (60.0, 4 * 3600.0)
PAPER_SEED = 0
PAPER_CORPUS_ASSUMPTION = (
    f"{PAPER_RECORDINGS:,} recordings, {PAPER_HOURS:,.0f} h (paper 000: ~105k podcasts, ~58k hours); durations "
    f"drawn from a gamma distribution of shape {PAPER_GAMMA_SHAPE:g} (coefficient of variation 0.71, median ~28 min) "
    f"with mean {PAPER_HOURS * 60 / PAPER_RECORDINGS:.1f} min, clipped to 1 min-4 h and rescaled to the total "
    f"(seed {PAPER_SEED}); every word timed. The paper gives no distribution: the shape is an assumption")


class EstimateError(ValueError):
    """A calibration file or corpus the estimate cannot use; the message names it."""


# ---- calibration ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    """What the estimate needs of a calibration file (format: :mod:`asr_core.bench.calibrate`)."""

    path: str
    source: str
    device: str
    a: float  # seconds per step of batch_audio_s padded audio at window L: a + b L (overhead included)
    b: float
    overhead_s: float
    batch_audio_s: float
    attention: str  # flash: attention over unpadded windows; sdpa: padded
    macs_linear: float
    macs_attention: float
    params: int
    model: str  # e.g. "main 6L d=768 6H"
    resid: tuple[tuple[float, float], ...]  # (L, measured full-step seconds - fit) at measured contexts
    decode: tuple[tuple[float, float], ...]  # (L, window-frames decoded per second)
    features_s_per_audio_s: float
    music_s_per_audio_s: float
    music_s_per_call: float  # composing the music, per recording and noisy condition
    stats_s_per_audio_s: float
    checkpoint_s: float
    startup_s: float
    num_workers: int
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def builtin(self) -> bool:
        return self.source == PAPER_SOURCE

    def residual(self, length: float) -> float:
        """A measured calibration's full-step seconds minus its line at window ``length``: interpolated between
        its contexts, the end values beyond them (0 for the built-in one)."""
        if not self.resid:
            return 0.0
        xs = [x for x, _ in self.resid]
        ys = [y for _, y in self.resid]
        return float(np.interp(length, xs, ys))

    def decode_fps(self, length: float) -> float:
        """Window-frames decoded per second at window ``length`` (log-linear between measured contexts)."""
        if len(self.decode) == 1:
            return self.decode[0][1]
        xs = [math.log(x) for x, _ in self.decode]
        ys = [math.log(y) for _, y in self.decode]
        return math.exp(float(np.interp(math.log(length), xs, ys)))


def _need(raw: dict[str, Any], path: str, dotted: str, kind: type | tuple[type, ...] = (int, float)) -> Any:
    cur: Any = raw
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise EstimateError(f"calibration {path}: missing {dotted!r}; a calibration is the JSON file "
                                "`python -m asr_core bench calibrate` writes (see orchestrate/calibrations/)")
        cur = cur[part]
    if not isinstance(cur, kind) or isinstance(cur, bool):
        raise EstimateError(f"calibration {path}: {dotted!r} is {cur!r}, not a {getattr(kind, '__name__', 'number')}")
    return cur


def calibration_from_dict(raw: Any, path: str) -> Calibration:
    """A :class:`Calibration` from a calibration file's JSON; :class:`EstimateError` naming ``path`` and the field
    when something is missing or wrong."""
    from asr_core.bench.calibrate import FORMAT

    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise EstimateError(f"calibration {path}: not a calibration file (no \"format\": \"{FORMAT}\"); write one "
                            "with `python -m asr_core bench calibrate --out FILE`, or leave out --calibration for "
                            "the built-in A100 one")
    num = lambda k: float(_need(raw, path, k))  # noqa: E731
    a, b, overhead, batch = num("train.fit.a"), num("train.fit.b"), num("train.overhead_s"), num("data.batch_audio_s")
    if batch <= 0 or overhead < 0:
        raise EstimateError(f"calibration {path}: data.batch_audio_s must be positive and train.overhead_s not "
                            f"negative (got {batch}, {overhead})")
    contexts = raw.get("train", {}).get("contexts") or []
    resid = []
    for c in contexts:
        try:
            resid.append((float(c["context_s"]), float(c["full_step_s"]) - (a + b * float(c["context_s"]))))
        except (KeyError, TypeError, ValueError):
            raise EstimateError(f"calibration {path}: train.contexts entry {c!r} lacks context_s/full_step_s") from None
    ev = _need(raw, path, "eval", dict)
    if isinstance(ev.get("decode_frames_per_s"), (int, float)):
        decode = [(1.0, float(ev["decode_frames_per_s"]))]
    else:
        try:
            decode = sorted((float(d["context_s"]), float(d["frames_per_s"])) for d in ev.get("decode") or [])
        except (KeyError, TypeError, ValueError):
            raise EstimateError(f"calibration {path}: eval.decode entries need context_s and frames_per_s") from None
    if not decode or any(f <= 0 for _, f in decode):
        raise EstimateError(f"calibration {path}: no decoding speed (eval.decode or eval.decode_frames_per_s)")
    m = _need(raw, path, "model", dict)
    model = f"{raw.get('preset') or ''} {m.get('layers')}L d={m.get('d_model')} {m.get('heads')}H".strip()
    data = raw.get("data", {})
    return Calibration(
        path=path, source=str(raw.get("source", "")), device=str(raw.get("device", "?")), a=a, b=b,
        overhead_s=overhead, batch_audio_s=batch, attention=str(raw.get("attention", "sdpa")),
        macs_linear=num("model.macs_linear_per_s"), macs_attention=num("model.macs_attention_per_s2"),
        params=int(num("model.params")), model=model, resid=tuple(sorted(resid)), decode=tuple(decode),
        features_s_per_audio_s=float(ev.get("features_s_per_audio_s", 0.0)),
        music_s_per_audio_s=float(ev.get("music_s_per_audio_s", 0.0)),
        music_s_per_call=float(ev.get("music_s_per_call", 0.0)),
        stats_s_per_audio_s=float(data.get("stats_s_per_audio_s", 0.0)),
        checkpoint_s=num("checkpoint.save_s"), startup_s=num("startup_s"),
        num_workers=int(data.get("num_workers", 0)), raw=raw)


def load_calibration(path: str | Path | None = None) -> Calibration:
    """The calibration in ``path``, or a built-in one by name (``orchestrate/calibrations/NAME.json``:
    ``a100-paper``, derived from paper 000 and the default; ``h100-measured``, measured by ``bench calibrate``)."""
    p = Path(path) if path else BUILTIN
    if path and not p.exists() and (BUILTIN.parent / f"{path}.json").is_file():
        p = BUILTIN.parent / f"{path}.json"
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        names = ", ".join(sorted(f.stem for f in BUILTIN.parent.glob("*.json")))
        raise EstimateError(f"calibration {p}: file not found (built-in calibrations by name: {names})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise EstimateError(f"calibration {p}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise EstimateError(f"calibration {p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    return calibration_from_dict(raw, str(p))


# ---- the training corpus's durations -------------------------------------------------------------------------------
class Durations(Sequence[Any]):
    """A corpus as the planner sees it: (duration, every word timed) per recording, in the trainer's order."""

    def __init__(self, durations: np.ndarray, timed: np.ndarray) -> None:
        self.durations = np.asarray(durations, dtype=np.float64)
        self.timed = np.asarray(timed, dtype=bool)

    def __len__(self) -> int:
        return len(self.durations)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return Durations(self.durations[i], self.timed[i])
        raise TypeError("a Durations corpus holds durations only (the planner asks duration_timed)")

    def __iter__(self) -> Iterator[Any]:
        raise TypeError("a Durations corpus holds durations only")

    def duration_timed(self, i: int) -> tuple[float, bool]:
        return float(self.durations[i]), bool(self.timed[i])

    def durations_timed(self) -> tuple[np.ndarray, np.ndarray]:
        """Every recording's (duration, timed) at once (what :meth:`WindowStream.step_lengths` asks first)."""
        return self.durations, self.timed

    @property
    def hours(self) -> float:
        return float(self.durations.sum()) / 3600.0


def paper_durations(recordings: int = PAPER_RECORDINGS, hours: float = PAPER_HOURS) -> Durations:
    """:data:`PAPER_CORPUS_ASSUMPTION`: durations drawn once, deterministically."""
    rng = np.random.default_rng(PAPER_SEED)
    total = hours * 3600.0
    d = rng.gamma(PAPER_GAMMA_SHAPE, 1.0, recordings)
    d = np.clip(d / d.mean() * total / recordings, *PAPER_CLIP_S)
    d *= total / d.sum()
    return Durations(d, np.ones(recordings, dtype=bool))


@dataclass(frozen=True)
class Corpus:
    key: str  # what the plans are cached under
    durations: Durations
    note: str  # where the durations came from, printed with the estimate
    assumed: bool


_corpora: dict[str, Corpus] = {}


def training_corpus(spec: str, workdir: Path | None = None) -> Corpus:
    """The durations of ``data.train``: a prepared corpus's arrays, another corpus's transcripts (``load_corpus(spec,
    audio=False)``: a recording lasts until its last word), or, when the path is not here, the paper's corpus as
    assumed (:data:`PAPER_CORPUS_ASSUMPTION`). Read once per process."""
    from asr_core.data.corpora import CorpusError, load_corpus, split_named_spec, split_spec

    try:
        fmt, path = split_spec(split_named_spec(spec)[1])
    except CorpusError as e:
        raise EstimateError(f"data.train {spec!r}: {e}") from None
    if workdir is not None and not path.is_absolute():
        path = workdir / path
    if not path.exists():
        key = "assumed:paper"
        if key not in _corpora:
            _corpora[key] = Corpus(key, paper_durations(), f"not on disk here ({path}); assumed: "
                                   + PAPER_CORPUS_ASSUMPTION, True)
        return _corpora[key]
    key = f"{fmt}:{path.resolve()}"
    if key not in _corpora:
        try:
            if fmt == "prepared":
                from asr_core.data.corpora.prepared import PreparedCorpus

                corpus = PreparedCorpus(path)
                pairs = [corpus.duration_timed(i) for i in range(len(corpus))]
                how = "a prepared corpus's arrays"
            else:  # the trainer orders recordings by id
                recs = sorted(load_corpus(f"{fmt}:{path}", audio=False), key=lambda r: r.id)
                pairs = [(r.duration, r.timed) for r in recs]
                how = "transcripts (a recording lasts until its last word)"
        except CorpusError as e:
            raise EstimateError(f"data.train {spec!r}: {e}") from None
        d = Durations(np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
        _corpora[key] = Corpus(key, d, f"{path}: {len(d):,} recordings, {d.hours:,.1f} h, durations from {how}",
                               False)
    return _corpora[key]


# ---- the plan of one trial ----------------------------------------------------------------------------------------
_plans: dict[tuple[Any, ...], dict[float, StepLengths]] = {}


def plan_key(cfg: Config, corpus: Corpus) -> tuple[Any, ...]:
    """What a trial's steps depend on: the corpus, the data settings that cut and group windows, the seed (the
    order), epochs and max_steps."""
    d, t = cfg.data, cfg.train
    return (corpus.key, d.context_s, d.batch_audio_s, d.batching, d.seqlen_warmup, d.seqlen_warmup_start_s,
            d.seqlen_warmup_every, d.max_recordings, t.seed, t.epochs, t.max_steps)


def trial_steps(cfg: Config, corpus: Corpus) -> dict[float, StepLengths]:
    """The trainer's steps of ``cfg`` over ``corpus`` per window length (cached per :func:`plan_key`): the same
    stream ``asr_core.training.train`` builds (``train.max_steps`` repeats the data until that many steps)."""
    key = plan_key(cfg, corpus)
    if key not in _plans:
        recs: Durations = corpus.durations
        if cfg.data.max_recordings:
            recs = recs[: cfg.data.max_recordings]
        t = cfg.train
        stream = WindowStream(recs, cfg.data, t.seed, t.epochs if not t.max_steps else 1 << 30)
        _plans[key] = stream.step_lengths(t.max_steps)
    return _plans[key]


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
    :class:`~orchestrate.backends.profile.Profile`) adds its loader threads, time limit and segments."""
    from asr_core.bench.calibrate import model_macs
    from orchestrate.budget.resources import parse_minutes, time_limit_minutes

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
    if profile.time_rule:  # each trial's own limit (orchestrate.budget.resources), capped at time_max if set
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
    from asr_core.bench.calibrate import model_params

    return model_params(cfg.model, cfg.data.features.n_mels)


_window_hours: dict[tuple[Any, ...], float | None] = {}


def decoded_frames(frames: int, window: int, stride_fraction: float, subsampling: int) -> int:
    """Input frames the moving-window decoder runs through for a recording of ``frames``: the windows of
    :func:`asr_core.decoding.decode.plan_windows` (stride ``stride_fraction`` of the window, in whole output frames; the
    last windows cut at the end), summed in closed form and without importing torch (the tests hold the two
    equal)."""
    stride = min(max(subsampling, int(round(stride_fraction * window / subsampling)) * subsampling), window)
    n = 1 if frames <= window else 1 + math.ceil((frames - window) / stride)
    full = min(n, max(0, (frames - window) // stride + 1))  # windows that end inside the recording
    return full * window + sum(frames - i * stride for i in range(full, n))


def decoded_hours_of(cfg: Config, hours_of: Callable[[str], float | None] = eval_set_hours
                     ) -> Callable[[str], float | None]:
    """``hours_of`` for :func:`orchestrate.grid.eval_work` that makes its decoded audio exact for test sets on disk:
    ``eval_work`` counts ``1 / stride`` windows over every frame, but a recording shorter than the window is
    decoded once (and one a few windows long a little less than ``1 / stride`` times), so a set on disk answers
    with the hours that, times ``1 / stride``, are the windows :func:`asr_core.decoding.decode.plan_windows` will decode.
    A set not on disk whose recordings are counted in :data:`KNOWN_TEST_RECORDINGS` is taken as that many
    recordings of equal length; any other keeps ``hours_of``'s answer (an upper bound at long contexts)."""
    from asr_core.data.corpora import CorpusError, dataset_name, split_named_spec, split_spec

    fps = cfg.data.features.frames_per_second
    sub = cfg.model.subsampling_factor
    window = max(sub, int(round(cfg.data.context_s * fps / sub)) * sub)  # asr_core.decoding.decode.window_frames

    def hours(spec: str) -> float | None:
        try:
            _, path = split_spec(split_named_spec(spec)[1])
        except CorpusError:
            return hours_of(spec)
        key = (spec, str(path.resolve()), window, cfg.eval.stride, sub, hours_of)
        if key in _window_hours:
            return _window_hours[key]
        durations: Sequence[float] | None = eval_set_durations(spec)
        if durations is None:
            total, count = hours_of(spec), KNOWN_TEST_RECORDINGS.get(dataset_name(spec))
            if total is not None and count:
                durations = [total * 3600.0 / count] * count
        if durations is None:
            _window_hours[key] = hours_of(spec)
        else:
            frames = sum(decoded_frames(max(1, int(d * fps) + 1), window, cfg.eval.stride, sub) for d in durations)
            _window_hours[key] = frames * cfg.eval.stride / fps / 3600.0
        return _window_hours[key]

    return hours


_evals: dict[tuple[Any, ...], float | None] = {}


def eval_seconds(cfg: Config, cal: Calibration, hours_of: Callable[[str], float | None] = eval_set_hours
                 ) -> float | None:
    """:func:`_eval_seconds`, once per evaluation, model, context and calibration (seeds share it)."""
    key = (cfg.eval, cfg.model, cfg.data.context_s, cfg.data.features, cal, hours_of)
    if key not in _evals:
        _evals[key] = _eval_seconds(cfg, cal, hours_of)
    return _evals[key]


def _eval_seconds(cfg: Config, cal: Calibration, hours_of: Callable[[str], float | None] = eval_set_hours
                  ) -> float | None:
    """Seconds of the trial's evaluation: :func:`orchestrate.grid.eval_work`'s decoded audio (windows as
    :func:`decoded_hours_of` counts them) at the calibration's decoding speed for this context and model, plus
    reading + features per audio-second and condition, and music per noisy condition (per audio-second and per
    recording). None when a test set's size is unknown."""
    from asr_core.bench.calibrate import model_macs

    work = eval_work(cfg, hours_of)
    if work is None:
        return None
    decoded = eval_work(cfg, decoded_hours_of(cfg, hours_of))
    clean_cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, snrs=()))
    clean = eval_work(clean_cfg, hours_of)
    stride = cfg.eval.stride
    audio_conditions_s = work[0] * stride * 3600.0
    noisy_s = audio_conditions_s - (clean[0] if clean else 0.0) * stride * 3600.0
    # the same function counting recordings instead of hours: (recording, condition) pairs / stride
    pairs, clean_pairs = eval_work(cfg, eval_set_recordings), eval_work(clean_cfg, eval_set_recordings)
    noisy_calls = (pairs[0] - clean_pairs[0]) * stride if pairs and clean_pairs else 0.0
    ctx = cfg.data.context_s
    lin, att = model_macs(cfg.model, cfg.data.features)
    ratio = (lin + att * ctx) / (cal.macs_linear + cal.macs_attention * ctx)
    frames = (decoded or work)[0] * 3600.0 * cfg.data.features.frames_per_second
    return (frames / cal.decode_fps(ctx) * ratio + audio_conditions_s * cal.features_s_per_audio_s
            + noisy_s * cal.music_s_per_audio_s + noisy_calls * cal.music_s_per_call)


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


# ---- the built-in calibration's derivation -------------------------------------------------------------------------
PAPER_TARGETS = {"short_h": (13.0, 28.0), "short_below_s": 1200.0, "long_s": 3600.0, "long_h": 65.0,
                 "long_tolerance": 0.15}
PAPER_OVERHEAD_S = 0.05


def paper_fit(overhead_s: float = PAPER_OVERHEAD_S, seeds: Sequence[int] = (1, 2, 3)) -> dict[str, Any]:
    """The a and b of the built-in calibration, from paper 000's training times.

    The main model (6L, d=768, 6 heads) is replayed over the assumed corpus (:data:`PAPER_CORPUS_ASSUMPTION`) with
    grids/paper.yaml's data settings (one hour a step, interleaved, the code's warm-up from 5.12 s doubling every
    5,000 recordings) at each of the paper's context lengths and seeds (the seed orders the data, and which
    recordings come after the warm-up moves a long-context model's hours by up to ~15%). A trial's training hours
    are linear in (a, b): ``(steps x overhead + (a - overhead) x padded audio + b x sum of squared windows) / 3600
    / 3600``. The paper says 15-24 h below 20 minutes of context and 65 h at one hour; a line in L cannot give 15 h
    at 10 s, 24 h at 655 s and 65 h at 3600 s together (the paper's times grow faster than linearly, and half the
    corpus is seen during the warm-up at short windows whatever the context), so (a, b) is the point that stays
    furthest, relatively, inside the paper check's bands, each context's hours taken as the mean over the seeds (the
    paper gives one time per context for its three repeats): every context below 1200 s within 13-28 h and 3600 s
    within 65 h +-15%. Single seeds spread around that mean (at 3600 s by about +-8%), and no line keeps every
    seed of every context inside the bands. The per-step overhead (clipping, Madgrad over 90M parameters,
    launches) is set at 50 ms."""
    from asr_core.config import preset

    base = preset("main").with_overrides(["data.batch_audio_s=3600", "data.train=podcast:/nonexistent/spotify"])
    corpus = training_corpus(base.data.train)
    contexts = (10.24, 20.48, 40.96, 81.92, 163.84, 327.68, 655.36, 1310.72, 2621.44, 3600.0)
    sums = {}
    for seed in seeds:
        for ctx in contexts:
            cfg = base.with_overrides([f"data.context_s={ctx}", f"train.seed={seed}"])
            steps = trial_steps(cfg, corpus)
            sums[ctx, seed] = (sum(s.steps for s in steps.values()), sum(s.padded_s for s in steps.values()),
                               sum(s.audio_s2 for s in steps.values()))
    # hours(c) = k0 + ka * a + kb * b; maximise m with every band's relative margin >= m (a linear programme)
    coef = {k: ((n * overhead_s - overhead_s * p / 3600.0) / 3600.0, p / 3600.0 / 3600.0, q / 3600.0 / 3600.0)
            for k, (n, p, q) in sums.items()}
    for c in contexts:  # the mean over seeds
        coef[c] = tuple(float(np.mean([coef[c, s][i] for s in seeds])) for i in range(3))
    lo, hi = PAPER_TARGETS["short_h"]
    long_h, tol = PAPER_TARGETS["long_h"], PAPER_TARGETS["long_tolerance"]
    bands = [(c, lo, hi) for c in contexts if c < PAPER_TARGETS["short_below_s"]]
    bands.append((PAPER_TARGETS["long_s"], long_h * (1 - tol), long_h * (1 + tol)))
    a_ub, b_ub = [], []
    for c, low, high in bands:
        k0, ka, kb = coef[c]
        a_ub.append([-ka / low, -kb / low, 1.0])  # hours / low - 1 >= m
        b_ub.append(k0 / low - 1.0)
        a_ub.append([ka / high, kb / high, 1.0])  # 1 - hours / high >= m
        b_ub.append(1.0 - k0 / high)
    from scipy.optimize import linprog

    res = linprog([0.0, 0.0, -1.0], A_ub=a_ub, b_ub=b_ub, bounds=[(overhead_s, None), (0, None), (None, None)])
    if not res.success:  # pragma: no cover - the programme is always feasible in m
        raise EstimateError(f"paper fit failed: {res.message}")
    a, b, margin = (float(v) for v in res.x)
    return {"a": a, "b": b, "overhead_s": overhead_s, "margin": margin, "seeds": tuple(seeds),
            "hours": {k: coef[k][0] + coef[k][1] * a + coef[k][2] * b for k in coef},
            "steps": {k: sums[k][0] for k in sums}}


def derive_cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrate.budget.estimate",
                                 description="print the derivation of the built-in A100 calibration's a and b")
    ap.add_argument("--derive", action="store_true", required=True)
    ap.parse_args(argv)
    fit = paper_fit()
    print(f"assumed corpus: {PAPER_CORPUS_ASSUMPTION}")
    print(f"fit: a = {fit['a']:.4f} s, b = {fit['b']:.4e} s/s, per-step overhead {fit['overhead_s']} s "
          f"(margin {fit['margin']:.1%} inside the bands)")
    hours = fit["hours"]
    for c in sorted(k for k in hours if not isinstance(k, tuple)):
        each = ", ".join(f"{hours[c, s]:.1f}" for s in fit["seeds"])
        print(f"  main model at {c:>8g} s: {hours[c]:5.1f} h, mean of seeds {list(fit['seeds'])} ({each} h)")
    return 0


if __name__ == "__main__":
    sys.exit(derive_cli(sys.argv[1:]))
