"""Evaluate a checkpoint: moving-window greedy CTC on long recordings, clean and with music at given SNRs.

``python -m asr_core evaluate CKPT --data NAME=FORMAT:PATH [--data ...] [--snr DB ...] [--noisy NAME ...]
[--stride 0.125] [--precision auto|bf16|fp32] [--batch-windows N] [--out DIR]``

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
metadata next to the split folder, :func:`asr_core.data.corpora.cues.planted`) also gets the cue-word error rate: the
planted words substituted or deleted, per recording in the columns ``cue_words`` and ``cue_errors`` (empty for
datasets without a plant), and as metrics ``cue/<NAME>`` and ``cue/<NAME>/snr<DB:g>`` in percent (beam decoders:
``cue_<decoder>/...``). Datasets without planted words log no ``cue/`` metric.

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

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import torch

from asr_core.decoding.beam import BeamConfig, beam_search
from asr_core.data.corpora import CorpusError, Recording, load_corpus, parse_dataset_spec
from asr_core.data.corpora.cues import planted
from asr_core.data.corpora.fingerprint import fingerprint
from asr_core.decoding.decode import (WindowBatch, auto_batch_windows, greedy_ids, plan_windows, posteriors,
                              prepare_features, resolve_precision, window_frames)
from asr_core.contract.evaluation import merge_tables
from asr_core.data.noise import add_music
from asr_core.runtime.outbox import Outbox, fail_fast_http
from asr_core.evaluation.score import Counts, corpus_wer, marked_counts, normalise, normalise_marked, score
from asr_core.evaluation.stage_run import check_fingerprints, known_tags, log_stage, stage_run
from asr_core.contract.trial import EVAL_DIR, ProgressLog

CSV_COLUMNS = ["dataset", "condition", "snr_db", "recording", "ref_words", "substitutions", "deletions",
               "insertions", "hyp_words", "wer", "cue_words", "cue_errors"]
GREEDY = "greedy"


@dataclass(frozen=True)
class BeamDecoding:
    """Beam search (with an LM or without) as an evaluation's decoder: its results are logged as
    ``wer_<name>/<NAME>[/snr<DB>]`` and ``eval/<NAME>.<name>.csv`` beside the greedy ones, and ``describe`` (the
    LM checkpoint, its fingerprint, alpha, beta, ...) as the run's tag ``eval.decoder.<name>``.
    ``lm``: an :class:`asr_core.decoding.beam.LanguageModel` (None: no LM); ``prompt``: token ids the LM reads first."""

    config: BeamConfig
    lm: Any = None
    prompt: tuple[int, ...] = ()
    name: str = "beam"
    describe: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name) or self.name == GREEDY:
            raise ValueError(f"decoder name {self.name!r}: letters, digits, '-', '_' and '.' only, not 'greedy'")

    def metric_key(self, dataset: str, snr_db: float | None = None) -> str:
        return f"wer_{self.name}/" + metric_key(dataset, snr_db).split("/", 1)[1]

    def cue_metric_key(self, dataset: str, snr_db: float | None = None) -> str:
        return f"cue_{self.name}/" + metric_key(dataset, snr_db).split("/", 1)[1]

    def decode(self, probs: torch.Tensor, blank: int) -> Any:
        return beam_search(probs, blank=blank, lm=self.lm, config=self.config, prompt=self.prompt)


def condition_name(snr_db: float | None) -> str:
    return "clean" if snr_db is None else f"snr{snr_db:g}"


def metric_key(dataset: str, snr_db: float | None = None) -> str:
    return f"wer/{dataset}" if snr_db is None else f"wer/{dataset}/{condition_name(snr_db)}"


def cue_metric_key(dataset: str, snr_db: float | None = None) -> str:
    """``cue/<NAME>[/snr<DB>]``: the cue-word error rate of a dataset with planted words."""
    return "cue/" + metric_key(dataset, snr_db).split("/", 1)[1]


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def evaluate(checkpoint: str | Path, datasets: list[str], snrs: list[float], stride: float = 0.125,
             batch_windows: int = 0, noise: str = "synthetic", tracking_uri: str | None = None,
             run_id: str | None = None, out_dir: str | Path | None = None, *, device: str = "auto",
             strict: bool = False, noise_seed: int = 0, log: bool = True,
             progress: ProgressLog | None = None, outbox: Outbox | None = None,
             noisy: Sequence[str] = (), precision: str = "auto", beam: BeamDecoding | None = None,
             conditions: Mapping[str, Sequence[float | None]] | None = None,
             tables_from: Sequence[Path] = ()) -> pd.DataFrame:
    """WER of ``checkpoint`` on each ``NAME=FORMAT:PATH`` dataset, clean, and at each SNR (dB) for the datasets
    named in ``noisy`` (empty: every dataset).

    ``precision``: ``auto`` (bf16 autocast on CUDA, fp32 on the CPU), ``bf16`` (CUDA only) or ``fp32``.
    ``batch_windows``: windows decoded together; 0 sizes it from the GPU's free memory (8 on the CPU). One
    :class:`~asr_core.decoding.decode.WindowBatch` serves the whole evaluation, so a size halved after an out-of-memory error
    stays halved for every later recording.

    ``conditions``: exactly what to decode of each dataset, by name (None: clean audio, a number: that SNR),
    instead of the rule above (``snrs`` and ``noisy`` are then ignored): an evaluation job decodes only what its
    model lacks (:mod:`asr_core.contract.evaluation`). ``tables_from``: folders of earlier evaluations of the same
    model whose tables of the same name are merged into each table written here before it is logged, so that the
    run's ``eval/<dataset>[.<decoder>].csv`` keeps every condition measured
    (:func:`asr_core.contract.evaluation.merge_tables`).

    ``beam``: also decode by beam search (:class:`BeamDecoding`) from the same posteriors; then only the beam's
    metrics, tables and decoder tag are logged (the greedy ones are the trial's own, printed here for comparison).

    Returns the per-recording table (columns :data:`CSV_COLUMNS`, and ``decoder`` with ``beam``). MLflow logging goes to ``run_id`` at
    ``tracking_uri`` (default: the ones stored in the checkpoint); with no run known, nothing is logged.
    Before any decoding, each dataset's fingerprint is checked against and recorded in the run's
    :func:`~asr_core.contract.trial.eval_fingerprint_tag` (raises :class:`~asr_core.evaluation.stage_run.EvalDataChanged` on a mismatch).
    ``progress`` receives an ``eval`` record per recording and condition. ``outbox`` (the trial job's) receives the
    metrics, tags and artifacts instead of MLflow; without one, they go through an outbox in ``out_dir``.
    """
    checkpoint = Path(checkpoint)
    # ---- validate everything before any work ----
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} not found")
    if not 0 < stride <= 1:
        raise ValueError(f"stride must be a fraction in (0, 1] of the window, got {stride}")
    if batch_windows < 0:
        raise ValueError(f"batch_windows must be 0 (sized from free GPU memory) or a positive integer, "
                         f"got {batch_windows}")
    dev = _device(device)
    bf16 = resolve_precision(precision, dev) == "bf16"  # raises for bf16 without CUDA or an unknown precision
    if not datasets:
        raise ValueError("no datasets to evaluate: give at least one NAME=FORMAT:PATH")
    parsed = [parse_dataset_spec(d) for d in datasets]
    names = [n for n, _ in parsed]
    if len(set(names)) != len(names):
        raise ValueError(f"dataset names must be unique, got {names}")
    snr_list = [float(s) for s in snrs]
    if any(not math.isfinite(s) for s in snr_list):
        raise ValueError(f"SNRs must be finite numbers of dB, got {snrs}")
    noisy = tuple(noisy)
    unknown = [n for n in noisy if n not in names]
    if unknown:
        raise ValueError(f"noisy names {unknown} are not among the datasets ({', '.join(names)}); name datasets "
                         "given with NAME=FORMAT:PATH, or none for every dataset")
    if conditions is not None:
        lacking = [n for n in names if not conditions.get(n)]
        if lacking:
            raise ValueError(f"conditions name nothing to decode for datasets {lacking}")
        conditions = {n: list(conditions[n]) for n in names}
    else:
        conditions = {n: [None, *snr_list] if not noisy or n in noisy else [None] for n in names}
    if noise != "synthetic" and not Path(noise).is_file():
        raise FileNotFoundError(f"noise file {noise} not found; use 'synthetic' or the path of an audio file")
    corpora = {name: load_corpus(spec, strict=strict) for name, spec in parsed}
    cues = {name: planted(recs) for name, recs in corpora.items()}  # None: no planted words in the dataset
    run: tuple[str, str | None] | None = None
    new_tags: dict[str, str] = {}
    if log:
        run = stage_run(checkpoint, run_id, tracking_uri, outbox, "eval")
        if run is not None:
            new_tags = check_fingerprints(run[0], known_tags(run, outbox),
                                          {name: fingerprint(recs) for name, recs in corpora.items()})
            if outbox is not None and new_tags:  # recorded before any decoding (the standalone command: at the end)
                outbox.tags(new_tags)
                new_tags = {}

    from asr_core.training.checkpoint import load_for_eval
    from asr_core.data.features import FeatureExtractor

    model, cfg, tokenizer = load_for_eval(checkpoint, dev)
    if isinstance(model, torch.nn.Module):
        model.eval()
    extractor = FeatureExtractor(cfg.data.features)
    fps = cfg.data.features.frames_per_second
    sub = cfg.model.subsampling_factor
    window = window_frames(cfg.data.context_s, fps, sub)
    batch = WindowBatch(batch_windows or _auto_batch(cfg, window, dev, bf16, corpora))
    print(f"[eval] {checkpoint}: context {cfg.data.context_s:g} s = {window} frames, stride {stride:g}, "
          f"{'bf16' if bf16 else 'fp32'}, {batch.size} windows at a time"
          f"{' (sized from free memory)' if not batch_windows else ''}, {len(corpora)} datasets, conditions: "
          + "; ".join(f"{n}: {', '.join(condition_name(s) for s in conditions[n])}" for n in names),
          file=sys.stderr, flush=True)

    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="asr-eval-"))
    out.mkdir(parents=True, exist_ok=True)
    if beam is not None:
        _check_lm_vocabulary(beam, tokenizer)
    decoders = [GREEDY] + ([beam.name] if beam is not None else [])
    rows: list[dict[str, Any]] = []
    metrics: dict[str, float] = {}
    logged: list[Path] = []
    for name, recordings in corpora.items():
        ds_snrs = [s for s in conditions[name] if s is not None]
        by_decoder, hyps = _evaluate_dataset(name, recordings, ds_snrs, model, extractor, tokenizer, window, stride,
                                             batch, sub, fps, dev, noise, noise_seed, progress,
                                             "bf16" if bf16 else "fp32", beam, cues[name],
                                             clean=None in conditions[name])
        for decoder in decoders:
            ds_rows = by_decoder[decoder]
            rows.extend({**r, "decoder": decoder} for r in ds_rows)
            csv = out / (f"{name}.csv" if decoder == GREEDY else f"{name}.{decoder}.csv")
            pd.DataFrame(ds_rows, columns=CSV_COLUMNS).to_csv(csv, index=False)
            if tables_from:
                merge_tables(csv, [Path(d) / csv.name for d in tables_from])
            if beam is None or decoder != GREEDY:
                logged.append(csv)
            for snr in conditions[name]:
                part = [r for r in ds_rows if r["condition"] == condition_name(snr)]
                wer = corpus_wer(Counts(r["ref_words"], r["substitutions"], r["deletions"], r["insertions"],
                                        r["hyp_words"]) for r in part)
                key = metric_key(name, snr) if decoder == GREEDY else beam.metric_key(name, snr)  # type: ignore[union-attr]
                if not math.isnan(wer) and (beam is None or decoder != GREEDY):
                    metrics[key] = wer
                print(f"[eval] {key} = {wer:.2f}%", file=sys.stderr, flush=True)
                if cues[name] is None:
                    continue
                n_cue, n_wrong = sum(r["cue_words"] for r in part), sum(r["cue_errors"] for r in part)
                key = cue_metric_key(name, snr) if decoder == GREEDY else beam.cue_metric_key(name, snr)  # type: ignore[union-attr]
                if n_cue and (beam is None or decoder != GREEDY):
                    metrics[key] = 100.0 * n_wrong / n_cue
                print(f"[eval] {key} = " + (f"{100.0 * n_wrong / n_cue:.2f}%" if n_cue else "n/a")
                      + f" ({n_wrong} of {n_cue} planted words wrong)", file=sys.stderr, flush=True)
        with (out / f"{name}.hyp.jsonl").open("w", encoding="utf-8") as fh:
            for h in hyps:
                fh.write(json.dumps(h, ensure_ascii=False) + "\n")
    df = pd.DataFrame(rows, columns=CSV_COLUMNS + ["decoder"])
    for col in ("cue_words", "cue_errors"):  # counts where planted words exist, NaN elsewhere (not None)
        df[col] = pd.to_numeric(df[col])
    if beam is None:
        df = df[CSV_COLUMNS]
    if run is not None:
        if beam is not None:
            new_tags = {**new_tags, f"eval.decoder.{beam.name}": json.dumps(dict(beam.describe), sort_keys=True)}
        log_stage(outbox, out, run, new_tags, metrics, logged, EVAL_DIR, "eval")
    return df


def _check_lm_vocabulary(beam: BeamDecoding, tokenizer: Any) -> None:
    """The LM must read the acoustic model's ids: same vocabulary size (its own tokenizer, when it says, the same)."""
    if beam.lm is None:
        return
    cfg = getattr(beam.lm, "cfg", None)
    if cfg is not None and getattr(cfg, "vocab_size", tokenizer.vocab_size) != tokenizer.vocab_size:
        raise ValueError(f"the LM reads {cfg.vocab_size} token ids but the acoustic model's tokenizer has "
                         f"{tokenizer.vocab_size}: train the LM with this model's tokenizer (lm train --tokenizer CKPT)")


def _auto_batch(cfg, window: int, dev: torch.device, bf16: bool, corpora: dict[str, list[Recording]]) -> int:
    """``batch_windows=0``: windows that fit the GPU's free memory now (the model loaded), keeping room for the
    float32 sums of the longest recording (twice: the sums and their average)."""
    longest_s = max((r.duration for recs in corpora.values() for r in recs), default=0.0)
    out_frames = math.ceil(longest_s * cfg.data.features.frames_per_second / cfg.model.subsampling_factor)
    m = cfg.model
    return auto_batch_windows(window, dev, bf16=bf16, reserve_bytes=2 * 4 * out_frames * (m.vocab_size + 1),
                              n_mels=cfg.data.features.n_mels, subsampling_channels=m.subsampling_channels,
                              d_model=m.d_model, vocab_size=m.vocab_size, subsampling=m.subsampling_factor)


def _evaluate_dataset(name: str, recordings: list[Recording], snrs: list[float], model, extractor, tokenizer,
                      window: int, stride: float, batch: WindowBatch | int, sub: int, fps: float, dev: torch.device,
                      noise: str, noise_seed: int, progress: ProgressLog | None = None, precision: str = "fp32",
                      beam: BeamDecoding | None = None, cues: dict[str, tuple[int, ...]] | None = None,
                      clean: bool = True) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Rows per decoder (``greedy``, and ``beam.name`` with a beam) and the hypotheses, of one dataset: each
    recording and condition decoded once into posteriors, then by each decoder. ``cues``: the planted words' indices
    per recording id (:func:`asr_core.data.corpora.cues.planted`), counted in ``cue_words``/``cue_errors``; None: the
    dataset has none (the columns stay empty)."""
    from tqdm import tqdm

    from asr_core.data.audio import load_audio

    rows: dict[str, list[dict[str, Any]]] = {GREEDY: [], **({beam.name: []} if beam is not None else {})}
    hyps = []
    batch = batch if isinstance(batch, WindowBatch) else WindowBatch(batch)  # an int: this dataset's own
    blank = tokenizer.blank_id
    todo: list[float | None] = ([None] if clean else []) + list(snrs)
    total = len(recordings) * len(todo)
    if progress is not None:  # the dataset's name shows before its first (possibly long) recording is done
        progress.write("eval", 0, total, name)
    for i, rec in enumerate(recordings, 1):
        clean = load_audio(rec.audio)
        ref = normalise(rec.text)
        # the reference normalised word by word, so that the planted words' indices follow
        cue_ref, cue_marks = (normalise_marked([w.text for w in rec.words], cues.get(rec.id, ()))
                              if cues is not None else ([], []))
        for snr in todo:
            t0 = time.perf_counter()
            wave = clean if snr is None else add_music(clean, rec.id, snr, noise, noise_seed)
            feats = prepare_features(extractor, wave, rec.ignore, fps)
            n_windows = len(plan_windows(feats.shape[0], window, stride, sub).starts)
            with tqdm(total=n_windows, desc=f"{name} {rec.id} {condition_name(snr)}", unit="win", leave=False,
                      file=sys.stderr, disable=n_windows <= batch.size) as bar:
                probs = posteriors(model, feats, window, stride=stride, batch_windows=batch, subsampling=sub,
                                   device=dev, precision=precision,
                                   progress=lambda done, _total: bar.update(done - bar.n))
            texts = {GREEDY: tokenizer.decode(greedy_ids(probs, blank))}
            took = {GREEDY: time.perf_counter() - t0}
            if beam is not None:
                t1 = time.perf_counter()
                texts[beam.name] = tokenizer.decode(list(beam.decode(probs, blank).ids))
                took[beam.name] = time.perf_counter() - t1
            hyp: dict[str, Any] = {"recording": rec.id, "condition": condition_name(snr), "ref": ref}
            line = []
            for decoder, text in texts.items():
                hyp_norm = normalise(text)
                c = score(ref, hyp_norm, normalised=True)
                m = marked_counts(cue_ref, hyp_norm.split(), cue_marks) if cues is not None else None
                rows[decoder].append({"dataset": name, "condition": condition_name(snr), "snr_db": snr,
                                      "recording": rec.id, "ref_words": c.ref_words,
                                      "substitutions": c.substitutions, "deletions": c.deletions,
                                      "insertions": c.insertions, "hyp_words": c.hyp_words, "wer": c.wer,
                                      "cue_words": None if m is None else m.words,
                                      "cue_errors": None if m is None else m.errors})
                hyp["hyp" if decoder == GREEDY else f"hyp_{decoder}"] = text
                cue_note = f", cue {m.errors}/{m.words}" if m is not None and m.words else ""
                line.append(f"{'' if decoder == GREEDY else decoder + ' '}WER {c.wer:.1f}%{cue_note} "
                            f"(RTF {took[decoder] / max(rec.duration, 1e-9):.3f})")
            hyps.append(hyp)
            if progress is not None:
                progress.write("eval", len(rows[GREEDY]), total, name)
            print(f"[eval] {name} {i}/{len(recordings)} {rec.id} {condition_name(snr)}: {'; '.join(line)} "
                  f"({c.ref_words} words, {n_windows} windows)", file=sys.stderr, flush=True)
    return rows, hyps


def beam_decoding(decoder: str, *, lm_path: Path | None = None, alpha: float | None = None,
                  beta: float | None = None, beam_width: int | None = None, lm_context: int | None = None,
                  prompt: Path | None = None, name: str | None = None, tokenizer_of: Path | None = None,
                  device: str = "auto") -> BeamDecoding | None:
    """The :class:`BeamDecoding` the command line asks for (None for greedy); errors name the option and file.
    The LM must have been trained with the acoustic checkpoint's tokenizer (``tokenizer_of``)."""
    if decoder == GREEDY:
        if any(v is not None for v in (lm_path, alpha, beta, beam_width, lm_context, prompt, name)):
            raise ValueError("--lm, --alpha, --beta, --beam-width, --lm-context, --prompt and --decoder-name go "
                             "with --decoder beam")
        return None
    base = BeamConfig(alpha=BeamConfig().alpha if lm_path is not None else 0.0)  # without an LM, alpha means nothing
    kw = {k: v for k, v in (("alpha", alpha), ("beta", beta), ("beam_width", beam_width),
                            ("lm_context", lm_context)) if v is not None}
    if lm_path is None and alpha is not None:
        raise ValueError("--alpha weighs the LM: it goes with --lm")
    cfg = BeamConfig(**{**{f: getattr(base, f) for f in ("alpha", "beta", "beam_width", "lm_context",
                                                          "prune_threshold", "token_threshold")}, **kw})
    lm, describe, ids = None, {"alpha": f"{cfg.alpha:g}", "beta": f"{cfg.beta:g}", "beam_width": str(cfg.beam_width),
                               "lm_context": str(cfg.lm_context)}, ()
    if lm_path is not None:
        from asr_core.lm.train import load_lm

        if not Path(lm_path).is_file():
            raise FileNotFoundError(f"--lm {lm_path} not found")
        loaded = load_lm(lm_path, _device(device))
        lm, lm_tok = loaded.model, loaded.tokenizer
        if tokenizer_of is not None:
            ck = torch.load(str(tokenizer_of), map_location="cpu", weights_only=True, mmap=True)
            if bytes(ck["tokenizer"]) != lm_tok.to_bytes():
                raise ValueError(f"LM {lm_path} was trained with another tokenizer than acoustic checkpoint "
                                 f"{tokenizer_of}: retrain it with `lm train --tokenizer {tokenizer_of}`")
        describe.update({"lm": str(Path(lm_path).resolve()), "lm_step": str(loaded.step),
                         "lm_run": str(loaded.mlflow_run_id or "")})
        if prompt is not None:
            if not prompt.is_file():
                raise FileNotFoundError(f"--prompt {prompt} not found")
            ids = tuple(lm_tok.encode(" ".join(prompt.read_text().split())))
            describe["prompt"] = str(prompt.resolve())
    elif prompt is not None:
        raise ValueError("--prompt needs --lm")
    else:
        describe["lm"] = "none"
    default_name = "beam" if lm is None else f"beam-lm{cfg.lm_context}"
    return BeamDecoding(cfg, lm, ids, name or default_name, tuple(sorted(describe.items())))


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m asr_core evaluate", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--data", action="append", default=None, metavar="NAME=FORMAT:PATH",
                    help="a dataset (repeatable); default: eval.datasets of the checkpoint's config")
    ap.add_argument("--snr", action="append", type=float, default=None, metavar="DB",
                    help="music at this SNR in dB (repeatable); clean audio is always evaluated; default: the "
                         "checkpoint's eval.snrs")
    ap.add_argument("--clean-only", action="store_true", help="no music at all (not the checkpoint's eval.snrs)")
    ap.add_argument("--noisy", action="append", default=None, metavar="NAME",
                    help="a dataset also decoded with music at the SNRs (repeatable); default: the checkpoint's "
                         "eval.noisy when --data is not given, else every dataset")
    ap.add_argument("--stride", type=float, default=None, help="window stride as a fraction of the context "
                    "(default: the checkpoint's eval.stride, 0.125)")
    ap.add_argument("--batch-windows", type=int, default=None,
                    help="windows decoded together; 0 = sized from the GPU's free memory (8 on the CPU); default: "
                         "the checkpoint's eval.batch_windows")
    ap.add_argument("--precision", default=None, choices=("auto", "bf16", "fp32"),
                    help="auto: bf16 autocast on CUDA, fp32 on the CPU; default: the checkpoint's eval.precision")
    ap.add_argument("--noise", default=None, help="'synthetic' or an audio file of music")
    ap.add_argument("--out", type=Path, default=None, help="folder for the CSV tables (default: next to CKPT)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--strict", action="store_true", help="a bad corpus file is fatal instead of skipped")
    ap.add_argument("--tracking-uri", default=None)
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--no-log", action="store_true", help="do not log to MLflow")
    b = ap.add_argument_group("beam search (paper 004): logged as wer_<NAME>/... beside the greedy wer/...")
    b.add_argument("--decoder", default=GREEDY, choices=(GREEDY, "beam"), help="greedy (default) or beam")
    b.add_argument("--lm", type=Path, default=None, help="with --decoder beam: an LM checkpoint (lm train)")
    b.add_argument("--alpha", type=float, default=None, help="LM weight (default: BeamConfig's, paper 004's code)")
    b.add_argument("--beta", type=float, default=None, help="bonus per token")
    b.add_argument("--beam-width", type=int, default=None)
    b.add_argument("--lm-context", type=int, default=None, help="tokens the LM remembers")
    b.add_argument("--prompt", type=Path, default=None, help="a text file the LM reads before each recording")
    b.add_argument("--decoder-name", default=None,
                   help="the metrics' prefix wer_<NAME>/ (default: beam, or beam-lm<CONTEXT> with an LM)")
    a = ap.parse_args(argv)
    fail_fast_http()  # one MLflow call fails fast; the outbox retries
    if not a.checkpoint.is_file():
        print(f"evaluate: checkpoint {a.checkpoint} not found", file=sys.stderr)
        return 2
    try:
        from asr_core.config import Config

        ck = torch.load(str(a.checkpoint), map_location="cpu", weights_only=True, mmap=True)
        ev = Config.from_stored(ck["config"], source=str(a.checkpoint)).eval
        noisy = a.noisy if a.noisy is not None else ([] if a.data else list(ev.noisy))
        beam = beam_decoding(a.decoder, lm_path=a.lm, alpha=a.alpha, beta=a.beta, beam_width=a.beam_width,
                             lm_context=a.lm_context, prompt=a.prompt, name=a.decoder_name,
                             tokenizer_of=a.checkpoint, device=a.device)
        if a.clean_only and a.snr:
            raise ValueError("--clean-only and --snr contradict each other: give one")
        snrs = [] if a.clean_only else a.snr if a.snr is not None else list(ev.snrs)
        df = evaluate(a.checkpoint, a.data or list(ev.datasets), snrs,
                      stride=a.stride if a.stride is not None else ev.stride,
                      batch_windows=a.batch_windows if a.batch_windows is not None else ev.batch_windows,
                      noise=a.noise or ev.noise, tracking_uri=a.tracking_uri, run_id=a.run_id,
                      out_dir=a.out or a.checkpoint.parent / EVAL_DIR, device=a.device, strict=a.strict,
                      log=not a.no_log, noisy=noisy, precision=a.precision or ev.precision, beam=beam)
    except (CorpusError, ValueError, FileNotFoundError, KeyError) as e:
        print(f"evaluate: {e}", file=sys.stderr)
        return 2
    keys = ["decoder", "dataset", "condition"] if "decoder" in df.columns else ["dataset", "condition"]
    summary = df.groupby(keys, sort=False)[["ref_words", "substitutions", "deletions",
                                                                 "insertions"]].sum()
    summary["wer"] = 100 * (summary.substitutions + summary.deletions + summary.insertions) / summary.ref_words
    if df["cue_words"].notna().any():
        cue = df.dropna(subset=["cue_words"]).groupby(keys, sort=False)[["cue_words", "cue_errors"]].sum()
        summary = summary.join(cue)
        summary["cue"] = 100 * summary.cue_errors / summary.cue_words.where(summary.cue_words > 0)
    print(summary.round(2).to_string())
    return 0
