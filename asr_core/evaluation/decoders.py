"""The decoders of an evaluation, and one dataset decoded by them.

Each recording and condition (clean, or music at an SNR) is decoded once into posteriors by the moving-window
model (:func:`asr_core.decoding.decode.posteriors`), then by each decoder: greedy CTC, and with a
:class:`BeamDecoding` beam search from the same posteriors (with an LM or without, paper 004; built from the
command line's options by :func:`beam_decoding`); a greedy decoder at another window than the model's context
(``window-<W:g>s``) decodes posteriors of its own, made the same way with its window. :func:`evaluate_dataset`
scores each decoder's hypothesis against the normalised reference, the planted cue words where the dataset has
them, and the tail words when given a tail set (:mod:`asr_core.evaluation.tail`), into the rows of
:func:`asr_core.evaluation.evaluate.evaluate`'s tables.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from asr_core.contract.metrics import (GREEDY, condition_name, cue_metric_key, fusion_decoder, is_decoder_name,
                                      metric_key)
from asr_core.contract.trial import ProgressLog
from asr_core.data.corpora import Recording
from asr_core.data.noise import add_music
from asr_core.decoding.beam import BeamConfig, beam_search
from asr_core.decoding.decode import WindowBatch, greedy_ids, plan_windows, posteriors, prepare_features
from asr_core.decoding.fused import WindowIds, fused_texts
from asr_core.decoding.fusion import tokenizer_pieces
from asr_core.device import resolve_device
from asr_core.evaluation.score import marked_counts, normalise, normalise_marked, score
from asr_core.evaluation.tail import TailSet, tail_counts
from asr_core.training.checkpoint import read_header


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
        if not is_decoder_name(self.name):
            raise ValueError(f"decoder name {self.name!r}: letters, digits, '-', '_' and '.' only, not 'greedy'")

    def metric_key(self, dataset: str, snr_db: float | None = None) -> str:
        return metric_key(dataset, snr_db, self.name)

    def cue_metric_key(self, dataset: str, snr_db: float | None = None) -> str:
        return cue_metric_key(dataset, snr_db, self.name)

    def decode(self, probs: torch.Tensor, blank: int) -> Any:
        return beam_search(probs, blank=blank, lm=self.lm, config=self.config, prompt=self.prompt)


def beam_decoding(decoder: str, *, lm_path: Path | None = None, alpha: float | None = None,
                  beta: float | None = None, beam_width: int | None = None, lm_context: int | None = None,
                  prompt: Path | None = None, name: str | None = None, tokenizer_of: Path | None = None,
                  device: str = "auto") -> BeamDecoding | None:
    """The :class:`BeamDecoding` the command line asks for (None for greedy); errors name the option and file.
    The LM must have been trained with the acoustic checkpoint's tokenizer (``tokenizer_of``)."""
    if decoder == GREEDY:
        if any(v is not None for v in (lm_path, alpha, beta, beam_width, lm_context, prompt, name)):
            raise ValueError("--lm, --lm-weight, --token-bonus, --beam-width, --lm-context, --prompt and "
                             "--decoder-name go with --decoder beam")
        return None
    base = BeamConfig(alpha=BeamConfig().alpha if lm_path is not None else 0.0)  # without an LM, alpha means nothing
    kw = {k: v for k, v in (("alpha", alpha), ("beta", beta), ("beam_width", beam_width),
                            ("lm_context", lm_context)) if v is not None}
    if lm_path is None and alpha is not None:
        raise ValueError("--lm-weight weighs the LM: it goes with --lm")
    cfg = BeamConfig(**{**{f: getattr(base, f) for f in ("alpha", "beta", "beam_width", "lm_context",
                                                          "prune_threshold", "token_threshold")}, **kw})
    lm, describe, ids = None, {"alpha": f"{cfg.alpha:g}", "beta": f"{cfg.beta:g}", "beam_width": str(cfg.beam_width),
                               "lm_context": str(cfg.lm_context)}, ()
    if lm_path is not None:
        from asr_core.lm.checkpoint import load_lm

        if not Path(lm_path).is_file():
            raise FileNotFoundError(f"--lm {lm_path} not found")
        loaded = load_lm(lm_path, resolve_device(device))
        lm, lm_tok = loaded.model, loaded.tokenizer
        if tokenizer_of is not None:
            ck = read_header(tokenizer_of)
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


def check_lm_vocabulary(beam: BeamDecoding, tokenizer: Any) -> None:
    """The LM must read the acoustic model's ids: same vocabulary size (its own tokenizer, when it says, the same)."""
    if beam.lm is None:
        return
    cfg = getattr(beam.lm, "cfg", None)
    if cfg is not None and getattr(cfg, "vocab_size", tokenizer.vocab_size) != tokenizer.vocab_size:
        raise ValueError(f"the LM reads {cfg.vocab_size} token ids but the acoustic model's tokenizer has "
                         f"{tokenizer.vocab_size}: train the LM with this model's tokenizer (lm train --tokenizer CKPT)")


def evaluate_dataset(name: str, recordings: list[Recording], snrs: list[float], model, extractor, tokenizer,
                     window: int, stride: float, batch: WindowBatch | int, sub: int, fps: float, dev: torch.device,
                     noise: str, noise_seed: int, progress: ProgressLog | None = None, precision: str = "fp32",
                     beam: BeamDecoding | None = None, cues: dict[str, tuple[int, ...]] | None = None,
                     clean: bool = True, tail: TailSet | None = None, fusion: tuple[str, ...] = (),
                     other_windows: Mapping[str, int] | None = None
                     ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Rows per decoder (``greedy``, ``beam.name`` with a beam, ``fusion-<METHOD>`` for each window fusion method
    of ``fusion``: :mod:`asr_core.decoding.fused`) and the hypotheses, of one dataset: each recording and condition
    decoded once into posteriors, then by each decoder (the fusion methods reuse the averaging pass's windows).
    ``other_windows``: decoder name (``window-<W:g>s``) → its window in input frames
    (:func:`~asr_core.decoding.decode.window_frames`): each decodes posteriors made again with that window, greedily.
    ``cues``: the planted words' indices per recording id (:func:`asr_core.data.corpora.cues.planted`), counted in
    ``cue_words``/``cue_errors``; None: the dataset has none (the columns stay empty). ``tail``: a tail set whose words' errors are counted in
    ``tail_words``/``tail_errors`` (:func:`asr_core.evaluation.tail.tail_counts`); None: the rows have no such keys."""
    from tqdm import tqdm

    from asr_core.data.audio import load_audio

    rows: dict[str, list[dict[str, Any]]] = {GREEDY: [], **({beam.name: []} if beam is not None else {}),
                                             **{fusion_decoder(m): [] for m in fusion},
                                             **{d: [] for d in other_windows or {}}}
    pieces = tokenizer_pieces(tokenizer) if fusion else []
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
            windows = (WindowIds(model, feats, subsampling=sub, batch=batch, device=dev, bf16=precision == "bf16")
                       if fusion else None)
            with tqdm(total=n_windows, desc=f"{name} {rec.id} {condition_name(snr)}", unit="win", leave=False,
                     file=sys.stderr, disable=n_windows <= batch.size) as bar:
                probs = posteriors(model, feats, window, stride=stride, batch_windows=batch, subsampling=sub,
                                  device=dev, precision=precision,
                                  progress=lambda done, _total: bar.update(done - bar.n),
                                  on_window=windows.keep if windows is not None else None)
            texts = {GREEDY: tokenizer.decode(greedy_ids(probs, blank))}
            took = {GREEDY: time.perf_counter() - t0}
            if beam is not None:
                t1 = time.perf_counter()
                texts[beam.name] = tokenizer.decode(list(beam.decode(probs, blank).ids))
                took[beam.name] = time.perf_counter() - t1
            for method in fusion:
                t1 = time.perf_counter()
                texts[fusion_decoder(method)] = fused_texts(windows, (method,), window=window, stride=stride,
                                                            tokenizer=tokenizer, pieces=pieces, fps=fps)[method]
                took[fusion_decoder(method)] = time.perf_counter() - t1
            ran: dict[str, int] = {}  # the windows each window decoder ran
            for decoder, frames in (other_windows or {}).items():
                t1 = time.perf_counter()
                texts[decoder], ran[decoder] = greedy_at(model, feats, frames, stride, batch, sub, dev, precision,
                                                         tokenizer)
                took[decoder] = time.perf_counter() - t1
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
                if tail is not None:
                    t = tail_counts(ref, hyp_norm, tail, normalised=True)
                    rows[decoder][-1].update(tail_words=t.words, tail_errors=t.errors)
                hyp["hyp" if decoder == GREEDY else f"hyp_{decoder}"] = text
                cue_note = f", cue {m.errors}/{m.words}" if m is not None and m.words else ""
                if tail is not None:
                    cue_note += f", tail {t.errors}/{t.words}"
                line.append(f"{'' if decoder == GREEDY else decoder + ' '}WER {c.wer:.1f}%{cue_note} "
                           f"(RTF {took[decoder] / max(rec.duration, 1e-9):.3f}"
                           + (f", {ran[decoder]} windows)" if decoder in ran else ")"))
            hyps.append(hyp)
            if progress is not None:
                progress.write("eval", len(rows[GREEDY]), total, name)
            print(f"[eval] {name} {i}/{len(recordings)} {rec.id} {condition_name(snr)}: {'; '.join(line)} "
                  f"({c.ref_words} words, {n_windows} windows)", file=sys.stderr, flush=True)
    return rows, hyps


def greedy_at(model, feats: torch.Tensor, window: int, stride: float, batch: WindowBatch, sub: int,
              dev: torch.device, precision: str, tokenizer) -> tuple[str, int]:
    """Greedy CTC of one recording's features decoded with moving windows of ``window`` input frames (not the
    model's context), averaged at ``stride`` as :func:`~asr_core.decoding.decode.posteriors` averages: the text and
    the windows run (:func:`~asr_core.decoding.decode.plan_windows`'s, as :func:`posteriors` runs them)."""
    probs = posteriors(model, feats, window, stride=stride, batch_windows=batch, subsampling=sub, device=dev,
                       precision=precision)
    ran = len(plan_windows(feats.shape[0], window, stride, sub).starts)
    return tokenizer.decode(greedy_ids(probs, tokenizer.blank_id)), ran
