"""Evaluate a checkpoint: moving-window greedy CTC on long recordings, clean and with music at given SNRs.

``python -m asr_core evaluate CKPT --data NAME=FORMAT:PATH [--data ...] [--snr DB ...] [--noisy NAME ...]
[--stride 0.125] [--fusion METHOD,...] [--window-s SECONDS,...] [--precision auto|bf16|fp32] [--batch-windows N]
[--out DIR]`` (its options: :mod:`asr_core.evaluation.evaluate_cli`)

Every dataset is decoded clean; the datasets named in ``noisy`` (``eval.noisy``; none named = every dataset) are
also decoded with music at each SNR. The paper added music to Rev16 only, for the main (context) family
(``grids/context.yaml``). Decoding runs in ``precision`` (``auto``: bf16 autocast on CUDA, fp32 on the CPU) with
``batch_windows`` windows at once (0: sized from the GPU's free memory, :func:`asr_core.decoding.decode.windows_that_fit`;
an out-of-memory error halves it for the rest of the evaluation).

Writes ``DIR/<NAME>.csv`` (one row per recording and condition; columns :data:`CSV_COLUMNS`) and logs into the
checkpoint's MLflow run (docs/ARCHITECTURE.md, "Evaluation contract"): metrics ``wer/<NAME>`` (clean) and
``wer/<NAME>/snr<DB:g>`` in percent, artifacts ``eval/<NAME>.csv`` (the folder is
:data:`~asr_core.contract.trial.EVAL_DIR`). Hypotheses go to ``DIR/<NAME>.hyp.jsonl`` (local only) for inspection.

A dataset whose recordings have planted cue words (a synthetic corpus made with ``synth --cue``; found in its
metadata next to the split folder, :func:`asr_core.data.synth.cues.planted`) also gets the cue-word error rate: the
planted words substituted or deleted, per recording in the columns ``cue_words`` and ``cue_errors`` (empty for
datasets without a plant), and as metrics ``cue/<NAME>`` and ``cue/<NAME>/snr<DB:g>`` in percent (beam decoders:
``cue_<decoder>/...``). Datasets without planted words log no ``cue/`` metric.

Given a tail set (``--tail FILE.json``, ``eval.tail``; made by ``python -m asr_core tailset``), every dataset also
gets the tail-word error rate of paper 002 (:mod:`asr_core.scoring.tail`): errors on the tail words only, per
recording in the columns ``tail_words`` and ``tail_errors`` (after the others; without a tail set the tables have
no such columns), as metrics ``tail/<NAME>`` and ``tail/<NAME>/snr<DB:g>`` in percent (beam decoders:
``tail_<decoder>/...``), and the run's tag ``eval.tail`` (JSON: the set's source, threshold, word types, share of its
own text and of each dataset's references).

A dataset whose recordings carry the recall plant's slots (``synth --recall``; :mod:`asr_core.evaluation.scorers.slots`)
also gets a per-slot table ``DIR/<NAME>.slots.csv`` (``<NAME>.<decoder>.slots.csv`` for a beam decoder; one row
per slot and condition, columns :data:`~asr_core.contract.metrics.SLOT_COLUMNS`), logged beside the per-recording
table (moving-window rows, and for greedy decoding of clean audio one row per slot decoded from the one window that
ends 1 s after it: :mod:`asr_core.evaluation.scorers.slot_window`), and the clean condition's moving-window slot accuracy in
percent as metrics ``recall/<NAME>/near``, ``.../far`` (masked
slots with a key sentence), ``.../unmasked`` and ``.../no-key`` (the controls). Datasets without slots write and
log nothing more.

With ``--fusion`` (paper 001), each window fusion method named (:mod:`asr_core.decoding.fused`: ``select``,
``blockwise``, ``blockwise-frames``, ``chiu``, ``chiu-seconds``, ``lcs``, ``rover``) is decoded beside the greedy
averaging and logged as a beam decoder is, under ``fusion-<METHOD>`` (``wer_fusion-chiu/<NAME>``,
``eval/<NAME>.fusion-chiu.csv``, tag ``eval.decoder.fusion-chiu``: JSON of ``method``, ``stride``, ``decoding``, and
``join`` for the block-wise methods, ``confidence`` for Chiu's; results logged before those two existed are
``blockwise`` by frames and ``chiu`` by seconds).

With ``--window-s`` (comma-separated seconds, each positive and given once), the same greedy decoding, windows
averaged at the same stride, is run again at each window W instead of the model's context (the
context-or-fragmentation control: the model's windows shortened at decoding only), logged as the fusion decoders
are under ``window-<W:g>s`` (``wer_window-5.12s/<NAME>``, ``eval/<NAME>.window-5.12s.csv``, tag
``eval.decoder.window-5.12s``: JSON of ``window_s``, ``stride``, ``decoding`` and the model's
``trained_context_s``). A bad value is refused before any work (exit 2).

Everything logged goes through an outbox (:mod:`asr_core.runtime.outbox`): the trial job passes its own, so evaluation never
waits for MLflow; the standalone command keeps one in ``DIR/outbox`` and waits for it at most
``ASR_CORE_FINAL_FLUSH_S`` seconds at the end (what is left is shipped later with ``python -m asr_core outbox DIR
--tracking-uri URI --run-id RUN``).

A dataset *name* stands for one content within a run: each dataset's content fingerprint
(:func:`asr_core.data.corpora.fingerprint.fingerprint`) is recorded as the run's tag ``eval.<NAME>.fingerprint``
(:func:`asr_core.contract.trial.eval_fingerprint_tag`), and an evaluation that finds the same name with other
content refuses to run (:class:`asr_core.evaluation.stage_run.EvalDataChanged`) rather than mix two test sets under one metric (the trial job
checks against the tags its outbox recorded, without a call to MLflow; the standalone command reads the run's tags
once before any work). Progress goes to
an optional :class:`~asr_core.contract.trial.ProgressLog` as ``eval`` records: recordings × conditions done of the
dataset's total.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from asr_core.contract.folder.checkpoint_file import command_refusal
from asr_core.contract.specs import parse_dataset_spec
from asr_core.data.corpora import CorpusError, Recording, load_corpus
from asr_core.data.corpora.fingerprint import fingerprint
from asr_core.contract.evaluation import merge_tables
from asr_core.contract.ledger import shown_tags
from asr_core.contract.metrics import (CUE_COLUMNS, GREEDY, TABLE_COLUMNS, condition_name, decoder_tag, fusion_decoder,
                                       table_file, window_decoder)
from asr_core.evaluation.evaluate_cli import parse_fusion, parse_windows, parser, print_summary
from asr_core.runtime.outbox import Outbox, fail_fast_http
from asr_core.contract.trial import EVAL_DIR, ProgressLog

# torch, pandas, scipy (the recall plant's tables) and what imports them are imported where they are used: a
# refusal of the command line, of a checkpoint's file or of an evaluation's options needs none of them
if TYPE_CHECKING:
    import pandas as pd
    import torch

    from asr_core.config import EvalConfig
    from asr_core.evaluation.decoders import BeamDecoding

CSV_COLUMNS = [*TABLE_COLUMNS, *CUE_COLUMNS]


@dataclass(frozen=True)
class EvaluationRun:
    """One evaluation of ``checkpoint``: what is decoded, and how. :meth:`of` makes the one a config's ``eval``
    section asks for.

    ``datasets``: ``NAME=FORMAT:PATH`` specs, each decoded clean, and at each of ``snrs`` (dB) when named in
    ``noisy`` (empty: every dataset). ``conditions``: exactly what to decode of each dataset, by name (None: clean
    audio, a number: that SNR), instead of that rule (``snrs`` and ``noisy`` are then ignored): an evaluation job
    decodes only what its model lacks (:mod:`asr_core.contract.evaluation`).

    ``stride``: the windows' stride as a fraction of the context. ``precision``: ``auto`` (bf16 autocast on CUDA,
    fp32 on the CPU), ``bf16`` (CUDA only) or ``fp32``; ``device``: ``auto``, ``cuda`` or ``cpu``.
    ``batch_windows``: windows decoded together; 0 sizes it from the GPU's free memory (8 on the CPU). One
    :class:`~asr_core.decoding.decode.WindowBatch` serves the whole evaluation, so a size halved after an
    out-of-memory error stays halved for every later recording. ``noise``: ``synthetic`` or an audio file of
    music, mixed in with ``noise_seed``; ``strict``: a bad corpus file is fatal instead of skipped.

    ``beam``: also decode by beam search (:class:`~asr_core.evaluation.decoders.BeamDecoding`) from the same
    posteriors; then only the beam's metrics, tables and decoder tag are logged (the greedy ones are the trial's
    own, printed here for comparison). ``tables_from``: folders of earlier evaluations of the same model whose
    tables of the same name are merged into each table written here before it is logged, so that the run's
    ``eval/<dataset>[.<decoder>].csv`` keeps every condition measured
    (:func:`asr_core.contract.evaluation.merge_tables`). ``tail``: a tail set's JSON file; also measure the
    tail-word error rate against it (None: not measured, and the tables have no tail columns).

    ``fusion``: window fusion methods (:data:`~asr_core.contract.metrics.FUSION_METHODS`, paper 001) decoded beside
    the greedy averaging, each as the decoder ``fusion-<METHOD>`` (:mod:`asr_core.decoding.fused`); as with a beam,
    only these extra decoders are then logged. ``windows``: decoding windows in seconds, each positive and given
    once (one equal to the model's context is decoded again), each decoded as the greedy decoder is but with that
    window instead of the model's context (at the same stride), as the decoder ``window-<W:g>s``
    (:func:`~asr_core.contract.metrics.window_decoder`); logged as the fusion decoders are.

    ``reader``: where the model comes from instead of reading ``checkpoint`` here: an object whose
    ``for_eval(device)`` gives (model, config, tokenizer), as an evaluation job's one verified read of its model's
    checkpoint (:class:`asr_core.evaluation.checkpoint_read.ModelCheckpoint`).
    """

    checkpoint: Path
    datasets: Sequence[str]
    snrs: Sequence[float] = ()
    noisy: Sequence[str] = ()
    stride: float = 0.125
    batch_windows: int = 0
    precision: str = "auto"
    noise: str = "synthetic"
    noise_seed: int = 0
    device: str = "auto"
    strict: bool = False
    beam: BeamDecoding | None = None
    conditions: Mapping[str, Sequence[float | None]] | None = None
    tables_from: Sequence[Path] = ()
    tail: Path | None = None
    fusion: tuple[str, ...] = ()
    windows: tuple[float, ...] = ()
    reader: Any = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "checkpoint", Path(self.checkpoint))
        object.__setattr__(self, "fusion", tuple(self.fusion))
        for m in self.fusion:
            fusion_decoder(m)  # raises naming the valid methods
        if "average" in self.fusion or len(set(self.fusion)) != len(self.fusion):
            raise ValueError(f"fusion methods {list(self.fusion)}: each at most once, and not 'average' (the greedy "
                             "decoder is the averaging)")
        names = [window_decoder(w) for w in self.windows]  # raises naming what is valid
        if len(set(names)) != len(names):
            raise ValueError(f"decoding windows {list(self.windows)}: valid are positive numbers of seconds, each "
                             "at most once")
        object.__setattr__(self, "windows", tuple(float(w) for w in self.windows))
        if self.tail is not None:
            object.__setattr__(self, "tail", Path(self.tail))

    @classmethod
    def of(cls, checkpoint: str | Path, ev: "EvalConfig", **changes: Any) -> "EvaluationRun":
        """The evaluation that ``ev`` (a config's ``eval`` section) asks for, with ``changes`` (fields of this
        class) made to it."""
        asked = {"datasets": list(ev.datasets), "snrs": list(ev.snrs), "noisy": tuple(ev.noisy), "stride": ev.stride,
                 "batch_windows": ev.batch_windows, "precision": ev.precision, "noise": ev.noise,
                 "tail": Path(ev.tail) if ev.tail else None}
        return cls(Path(checkpoint), **{**asked, **changes})

    def replace(self, **changes: Any) -> "EvaluationRun":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Destination:
    """Where an evaluation's results go. ``out_dir``: the tables (``<NAME>.csv``, one row per recording and
    condition) and hypotheses (``<NAME>.hyp.jsonl``); default a new temporary folder. ``log``: False logs nothing.
    ``outbox`` (the trial job's) receives the metrics, tags and tables; without one they go to ``run_id`` at
    ``tracking_uri`` (default: the ones stored in the checkpoint; with no run known, nothing is logged) through an
    outbox in ``out_dir``. ``progress`` receives an ``eval`` record per recording and condition."""

    out_dir: Path | None = None
    log: bool = True
    run_id: str | None = None
    tracking_uri: str | None = None
    outbox: Outbox | None = None
    progress: ProgressLog | None = None


@dataclass
class _Plan:
    """What an evaluation decodes, checked before any work: the datasets' recordings, each dataset's conditions
    (None: clean, a number: that SNR), the word scorers, the device and precision."""

    corpora: dict[str, list[Recording]]
    conditions: dict[str, list[float | None]]
    scorers: list[Any]
    device: Any
    bf16: bool


@dataclass
class _Results:
    """What the datasets' decoding gathered for the table returned and the run: rows, metrics, tables to log."""

    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    logged: list[Path] = dataclasses.field(default_factory=list)


def evaluate(job: EvaluationRun, to: Destination = Destination()) -> pd.DataFrame:
    """WER of ``job.checkpoint`` on each of ``job.datasets`` in the conditions ``job`` names
    (:class:`EvaluationRun`), written and logged where ``to`` says (:class:`Destination`).

    Returns the per-recording table (columns :data:`CSV_COLUMNS`, and ``decoder`` with a beam decoder). Everything
    is checked before any work; before any decoding, each dataset's fingerprint is checked against and recorded in
    the run's :func:`~asr_core.contract.trial.eval_fingerprint_tag` (raises
    :class:`~asr_core.evaluation.stage_run.EvalDataChanged` on a mismatch). The decoders and word scorers are the
    plug-ins :mod:`asr_core.evaluation.registry` makes of ``job``; this function names none.
    """
    plan = _checked(job)
    run, new_tags = _staged(job, to, plan)

    import pandas as pd

    from asr_core.evaluation.decoders import check_lm_vocabulary
    from asr_core.evaluation.registry import decoders_for

    setup = _setup(job, plan)
    out = Path(to.out_dir) if to.out_dir is not None else Path(tempfile.mkdtemp(prefix="asr-eval-"))
    out.mkdir(parents=True, exist_ok=True)
    if job.beam is not None:
        check_lm_vocabulary(job.beam, setup.tokenizer)
    decoders = decoders_for(job, setup)
    columns = [*TABLE_COLUMNS[:4], *(c for scorer in plan.scorers for c in scorer.columns)]
    results = _Results()
    for name, recordings in plan.corpora.items():
        _dataset(name, recordings, job, plan, setup, decoders, columns, out, to.progress, results)
    df = pd.DataFrame(results.rows, columns=columns + ["decoder"])
    for col in ("cue_words", "cue_errors"):  # counts where planted words exist, NaN elsewhere (not None)
        df[col] = pd.to_numeric(df[col])
    if len(decoders) == 1:
        df = df[columns]
    if run is not None:
        for decoder in decoders:
            setting = decoder.setting(job.stride, setup.context_s)
            if setting is not None:
                new_tags[decoder_tag(decoder.name)] = json.dumps(setting, sort_keys=True)
        for scorer in plan.scorers:
            new_tags.update(scorer.tags(plan.corpora))
        from asr_core.evaluation.stage_run import log_stage

        # the saved view's rounded WERs (asr_core.contract.ledger), beside the metrics
        log_stage(to.outbox, out, run, {**new_tags, **shown_tags(results.metrics)}, results.metrics,
                  results.logged, EVAL_DIR, "eval")
    return df


def _checked(job: EvaluationRun) -> _Plan:
    """Every check of ``job`` before any work (raises ValueError, FileNotFoundError or CorpusError naming what is
    wrong), then its datasets read and its word scorers made."""
    if not job.checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {job.checkpoint} not found")
    if not 0 < job.stride <= 1:
        raise ValueError(f"stride must be a fraction in (0, 1] of the window, got {job.stride}")
    if job.batch_windows < 0:
        raise ValueError(f"batch_windows must be 0 (sized from free GPU memory) or a positive integer, "
                         f"got {job.batch_windows}")
    from asr_core.device import resolve_device, use_bf16

    dev = resolve_device(job.device)
    bf16 = use_bf16(job.precision, dev, setting="eval.precision")  # raises for bf16 without CUDA, or an unknown one
    if not job.datasets:
        raise ValueError("no datasets to evaluate: give at least one NAME=FORMAT:PATH")
    parsed = [parse_dataset_spec(d) for d in job.datasets]
    names = [n for n, _ in parsed]
    if len(set(names)) != len(names):
        raise ValueError(f"dataset names must be unique, got {names}")
    snr_list = [float(s) for s in job.snrs]
    if any(not math.isfinite(s) for s in snr_list):
        raise ValueError(f"SNRs must be finite numbers of dB, got {list(job.snrs)}")
    unknown = [n for n in job.noisy if n not in names]
    if unknown:
        raise ValueError(f"noisy names {unknown} are not among the datasets ({', '.join(names)}); name datasets "
                         "given with NAME=FORMAT:PATH, or none for every dataset")
    if job.conditions is not None:
        lacking = [n for n in names if not job.conditions.get(n)]
        if lacking:
            raise ValueError(f"conditions name nothing to decode for datasets {lacking}")
        conditions = {n: list(job.conditions[n]) for n in names}
    else:
        conditions = {n: [None, *snr_list] if not job.noisy or n in job.noisy else [None] for n in names}
    if job.noise != "synthetic" and not Path(job.noise).is_file():
        raise FileNotFoundError(f"noise file {job.noise} not found; use 'synthetic' or the path of an audio file")
    from asr_core.evaluation.registry import scorers_for

    scorers = scorers_for(job)  # a tail set is read here: a bad one is refused before any work
    corpora = {name: load_corpus(spec, strict=job.strict) for name, spec in parsed}
    return _Plan(corpora, conditions, scorers, dev, bf16)


def _staged(job: EvaluationRun, to: Destination, plan: _Plan) -> tuple[tuple[str, str | None] | None, dict]:
    """The run the results go to (None: nothing is logged) and the tags still to record, the datasets'
    fingerprints checked against the run's (recorded at once through the trial job's outbox)."""
    from asr_core.evaluation.stage_run import check_fingerprints, known_tags, stage_run

    if not to.log:
        return None, {}
    run = stage_run(job.checkpoint, to.run_id, to.tracking_uri, to.outbox, "eval")
    if run is None:
        return None, {}
    new_tags = check_fingerprints(run[0], known_tags(run, to.outbox),
                                  {name: fingerprint(recs) for name, recs in plan.corpora.items()})
    if to.outbox is not None and new_tags:  # recorded before any decoding (the standalone command: at the end)
        to.outbox.tags(new_tags)
        new_tags = {}
    return run, new_tags


def _setup(job: EvaluationRun, plan: _Plan) -> Any:
    """The model read (the job's reader, else its checkpoint) and how it decodes
    (:class:`asr_core.evaluation.decoders.Setup`); one line on stderr says so."""
    import torch

    from asr_core.data.features import FeatureExtractor
    from asr_core.decoding.decode import WindowBatch, window_frames
    from asr_core.evaluation.decoders import Setup
    from asr_core.training.checkpoint import load_for_eval

    dev, bf16 = plan.device, plan.bf16
    model, cfg, tokenizer = (job.reader.for_eval(dev) if job.reader is not None
                             else load_for_eval(job.checkpoint, dev))
    if isinstance(model, torch.nn.Module):
        model.eval()
    fps, sub = cfg.data.features.frames_per_second, cfg.model.subsampling_factor
    window = window_frames(cfg.data.context_s, fps, sub)
    batch = WindowBatch(job.batch_windows or _auto_batch(cfg, window, dev, bf16, plan.corpora))
    others = {window_decoder(w): window_frames(w, fps, sub) for w in job.windows}  # decoded again at other windows
    print(f"[eval] {job.checkpoint}: context {cfg.data.context_s:g} s = {window} frames, stride {job.stride:g}, "
          f"{'bf16' if bf16 else 'fp32'}, {batch.size} windows at a time"
          f"{' (sized from free memory)' if not job.batch_windows else ''}"
          + "".join(f", {d} = {n} frames" for d, n in others.items()) + f", {len(plan.corpora)} datasets, "
          "conditions: " + "; ".join(f"{n}: {', '.join(condition_name(s) for s in c)}"
                                     for n, c in plan.conditions.items()),
          file=sys.stderr, flush=True)
    return Setup(model, FeatureExtractor(cfg.data.features), tokenizer, window, job.stride, batch, sub, fps, dev,
                 "bf16" if bf16 else "fp32", cfg.data.context_s)


def _dataset(name: str, recordings: list[Recording], job: EvaluationRun, plan: _Plan, setup: Any,
             decoders: list[Any], columns: list[str], out: Path, progress: ProgressLog | None,
             results: _Results) -> None:
    """Decode and score one dataset; write its tables (merged with ``job.tables_from``'s) and its hypotheses to
    ``out`` and gather its rows, metrics and tables to log into ``results``. With more than one decoder only the
    extra ones are logged (greedy is the trial's own), but every one is written and printed."""
    import pandas as pd

    from asr_core.evaluation.dataset import Conditions, evaluate_dataset
    from asr_core.evaluation.scorers.base import DatasetDone, condition_rows

    bound = [b for scorer in plan.scorers if (b := scorer.bind(name, recordings)) is not None]
    conditions = plan.conditions[name]
    asked = Conditions(None in conditions, tuple(s for s in conditions if s is not None), job.noise, job.noise_seed)
    by_decoder, hyps = evaluate_dataset(name, recordings, asked, setup, decoders, bound, progress)
    for decoder in decoders:
        logs = len(decoders) == 1 or decoder.name != GREEDY
        rows = by_decoder[decoder.name]
        results.rows.extend({**r, "decoder": decoder.name} for r in rows)
        csv = out / table_file(name, decoder.name)
        pd.DataFrame(rows, columns=columns).to_csv(csv, index=False)
        if job.tables_from:
            merge_tables(csv, [Path(d) / csv.name for d in job.tables_from])
        if logs:
            results.logged.append(csv)
        found: dict[str, float] = {}
        lines = []
        for snr in conditions:
            part = condition_rows(rows, snr)
            for b in bound:
                for key, value, line in b.metrics(snr, decoder.name, part):
                    if value is not None:
                        found[key] = value
                    lines.append(line)
        done = DatasetDone(name, decoder.name, recordings, hyps, setup, None in conditions, out, job.tables_from)
        for b in bound:
            tables, metrics, said = b.tables(done)
            found.update(metrics)
            lines += said
            if logs:
                results.logged += tables
        if logs:
            results.metrics.update(found)
        for line in lines:
            print(f"[eval] {line}", file=sys.stderr, flush=True)
    with (out / f"{name}.hyp.jsonl").open("w", encoding="utf-8") as fh:
        for h in hyps:
            fh.write(json.dumps(h, ensure_ascii=False) + "\n")


def _auto_batch(cfg, window: int, dev: torch.device, bf16: bool, corpora: dict[str, list[Recording]]) -> int:
    """``batch_windows=0``: windows that fit the GPU's free memory now (the model loaded), keeping room for the
    float32 sums of the longest recording (twice: the sums and their average)."""
    from asr_core.decoding.decode import auto_batch_windows

    longest_s = max((r.duration for recs in corpora.values() for r in recs), default=0.0)
    out_frames = math.ceil(longest_s * cfg.data.features.frames_per_second / cfg.model.subsampling_factor)
    m = cfg.model
    return auto_batch_windows(window, dev, bf16=bf16, reserve_bytes=2 * 4 * out_frames * (m.vocab_size + 1),
                              n_mels=cfg.data.features.n_mels, subsampling_channels=m.subsampling_channels,
                              d_model=m.d_model, vocab_size=m.vocab_size, subsampling=m.subsampling_factor)


def cli(argv: list[str]) -> int:
    """``python -m asr_core evaluate`` (the module's docstring; options: :mod:`asr_core.evaluation.evaluate_cli`)."""
    a = parser(__doc__.split("\n\n")[0]).parse_args(argv)
    try:  # bad values are refused before the checkpoint is read
        windows, fusion = parse_windows(a.window_s), parse_fusion(a.fusion)
    except ValueError as e:
        print(f"evaluate: {e}", file=sys.stderr)
        return 2
    fail_fast_http()  # one MLflow call fails fast; the outbox retries
    refused = command_refusal("evaluate", a.checkpoint)  # before torch is imported: a second, not several
    if refused:
        print(refused, file=sys.stderr)
        return 2
    try:
        from asr_core.config import Config
        from asr_core.evaluation.decoders import beam_decoding
        from asr_core.training.checkpoint import acoustic_header

        ev = Config.from_stored(acoustic_header(a.checkpoint)["config"], source=str(a.checkpoint)).eval
        noisy = a.noisy if a.noisy is not None else ([] if a.data else list(ev.noisy))
        beam = beam_decoding(a.decoder, lm_path=a.lm, alpha=a.alpha, beta=a.beta, beam_width=a.beam_width,
                             lm_context=a.lm_context, prompt=a.prompt, name=a.decoder_name,
                             tokenizer_of=a.checkpoint, device=a.device)
        if a.clean_only and a.snr:
            raise ValueError("--clean-only and --snr contradict each other: give one")
        snrs = [] if a.clean_only else a.snr if a.snr is not None else list(ev.snrs)
        given = {k: v for k, v in (("stride", a.stride), ("batch_windows", a.batch_windows), ("tail", a.tail))
                 if v is not None}
        job = EvaluationRun.of(a.checkpoint, ev, datasets=a.data or list(ev.datasets), snrs=snrs, noisy=noisy,
                               noise=a.noise or ev.noise, precision=a.precision or ev.precision, device=a.device,
                               strict=a.strict, beam=beam, fusion=fusion, windows=windows,
                               **given)
        df = evaluate(job, Destination(out_dir=a.out or a.checkpoint.parent / EVAL_DIR, log=not a.no_log,
                                       run_id=a.run_id, tracking_uri=a.tracking_uri))
    except (CorpusError, ValueError, FileNotFoundError, KeyError) as e:
        print(f"evaluate: {e}", file=sys.stderr)
        return 2
    print_summary(df)
    return 0
