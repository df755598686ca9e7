"""One dataset decoded by an evaluation's decoders and scored by its word scorers.

Each recording and condition (clean, or music at an SNR) is decoded once into posteriors by the moving-window
model (:func:`asr_core.decoding.decode.posteriors`), then by each decoder (:mod:`asr_core.evaluation.decoders`) from
what that pass heard; each hypothesis is normalised and scored by each word scorer bound to the dataset
(:mod:`asr_core.evaluation.scorers.base`), into the rows of :func:`asr_core.evaluation.evaluate.evaluate`'s tables. This
loop names no decoder and no scorer: a new one is a plug-in (:mod:`asr_core.evaluation.registry`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asr_core.contract.metrics import GREEDY, condition_name
from asr_core.contract.trial import ProgressLog
from asr_core.data.corpora import Recording
from asr_core.data.noise import add_music
from asr_core.decoding.decode import plan_windows, posteriors, prepare_features
from asr_core.decoding.fused import WindowIds
from asr_core.evaluation.decoders import Heard, Setup
from asr_core.scoring.score import normalise
from asr_core.evaluation.scorers.base import Bound

Rows = dict[str, list[dict[str, Any]]]  # decoder name -> one row per recording and condition


@dataclass(frozen=True)
class Conditions:
    """What a dataset is decoded in: clean audio (``clean``) and music mixed in at each of ``snrs`` (dB) from
    ``noise`` (``synthetic`` or an audio file) with ``noise_seed``."""

    clean: bool = True
    snrs: tuple[float, ...] = ()
    noise: str = "synthetic"
    noise_seed: int = 0

    def todo(self) -> list[float | None]:
        """The conditions in decoding order: None (clean) first, then the SNRs."""
        return ([None] if self.clean else []) + list(self.snrs)


def evaluate_dataset(name: str, recordings: Sequence[Recording], conditions: Conditions, setup: Setup,
                     decoders: Sequence[Any], scorers: Sequence[Bound], progress: ProgressLog | None = None
                     ) -> tuple[Rows, list[dict[str, Any]]]:
    """Rows per decoder (by ``decoder.name``; each row the recording's ids and every bound scorer's values) and the
    hypotheses (``recording``, ``condition``, ``ref``, ``hyp`` for greedy and ``hyp_<decoder>`` for the others), of
    the dataset ``name``: each recording and condition decoded once into posteriors, then by each decoder."""
    from tqdm import tqdm

    from asr_core.data.audio import load_audio

    rows: Rows = {d.name: [] for d in decoders}
    hyps: list[dict[str, Any]] = []
    keep = any(d.keeps_windows for d in decoders)
    todo = conditions.todo()
    total = len(recordings) * len(todo)
    if progress is not None:  # the dataset's name shows before its first (possibly long) recording is done
        progress.write("eval", 0, total, name)
    for i, rec in enumerate(recordings, 1):
        clean = load_audio(rec.audio)
        ref = normalise(rec.text)
        for snr in todo:
            t0 = time.perf_counter()
            wave = clean if snr is None else add_music(clean, rec.id, snr, conditions.noise, conditions.noise_seed)
            feats = prepare_features(setup.extractor, wave, rec.ignore, setup.fps)
            n_windows = len(plan_windows(feats.shape[0], setup.window, setup.stride, setup.subsampling).starts)
            windows = (WindowIds(setup.model, feats, subsampling=setup.subsampling, batch=setup.batch,
                                 device=setup.device, bf16=setup.precision == "bf16") if keep else None)
            with tqdm(total=n_windows, desc=f"{name} {rec.id} {condition_name(snr)}", unit="win", leave=False,
                      file=sys.stderr, disable=n_windows <= setup.batch.size) as bar:
                probs = posteriors(setup.model, feats, setup.window, stride=setup.stride,
                                   batch_windows=setup.batch, subsampling=setup.subsampling, device=setup.device,
                                   precision=setup.precision, progress=lambda done, _total: bar.update(done - bar.n),
                                   on_window=windows.keep if windows is not None else None)
            heard = Heard(feats, probs, setup, windows)
            hyp: dict[str, Any] = {"recording": rec.id, "condition": condition_name(snr), "ref": ref}
            line = []
            for decoder in decoders:
                t1 = t0 if decoder.name == GREEDY else time.perf_counter()  # greedy's time includes the pass
                text, said = decoder.text(heard)
                took = time.perf_counter() - t1
                hyp_norm = normalise(text)
                row: dict[str, Any] = {"dataset": name, "condition": condition_name(snr), "snr_db": snr,
                                       "recording": rec.id}
                note = ""
                for scorer in scorers:
                    values = scorer.count(rec, ref, hyp_norm)
                    row.update(values)
                    note += scorer.note(values)
                rows[decoder.name].append(row)
                hyp["hyp" if decoder.name == GREEDY else f"hyp_{decoder.name}"] = text
                line.append(f"{'' if decoder.name == GREEDY else decoder.name + ' '}{note} "
                            f"(RTF {took / max(rec.duration, 1e-9):.3f}{said})")
            hyps.append(hyp)
            if progress is not None:
                progress.write("eval", len(rows[decoders[0].name]), total, name)
            words = rows[decoders[0].name][-1].get("ref_words", len(ref.split()))
            print(f"[eval] {name} {i}/{len(recordings)} {rec.id} {condition_name(snr)}: {'; '.join(line)} "
                  f"({words} words, {n_windows} windows)", file=sys.stderr, flush=True)
    return rows, hyps
