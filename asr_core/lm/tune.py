"""``python -m asr_core lm tune AM_CKPT --lm LM_CKPT --data NAME=FORMAT:PATH``: the LM weight alpha and the length
bonus beta that give the lowest WER on a dev set (paper 004 §3.4 tuned them on dev data), by grid search.

The acoustic model's moving-window posteriors of every dev recording are computed once (clean audio, the
checkpoint's context and the evaluation's stride); each (alpha, beta) pair then runs only the beam search. Prints
the grid's WERs and the best pair beside greedy decoding's WER, and writes them as JSON with ``--out``; the pair is
what ``evaluate --decoder beam --lm-weight A --token-bonus B`` and ``orchestrate evaluate --spec FILE`` take.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from asr_core.decoding.beam import BeamConfig, beam_search
from asr_core.scoring.score import Counts, corpus_wer, normalise, score
from asr_core.contract.options import renamed

DEFAULT_ALPHAS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
DEFAULT_BETAS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5)


@dataclass(frozen=True)
class DevPosteriors:
    """One dev recording: its normalised reference and the acoustic model's posteriors (T', V)."""

    id: str
    ref: str
    probs: torch.Tensor


def dev_posteriors(am_checkpoint: Path, spec: str, *, stride: float = 0.125, device: str = "cpu",
                   max_recordings: int = 0) -> tuple[list[DevPosteriors], Any]:
    """Posteriors of the dev set ``spec`` under the acoustic checkpoint, and its tokenizer."""
    from asr_core.data.audio import load_audio
    from asr_core.training.checkpoint import load_for_eval
    from asr_core.contract.specs import parse_dataset_spec
    from asr_core.data.corpora import load_corpus
    from asr_core.decoding.decode import posteriors, prepare_features, window_frames
    from asr_core.data.features import FeatureExtractor

    model, cfg, tokenizer = load_for_eval(am_checkpoint, device)
    model.eval()
    extractor = FeatureExtractor(cfg.data.features)
    fps, sub = cfg.data.features.frames_per_second, cfg.model.subsampling_factor
    window = window_frames(cfg.data.context_s, fps, sub)
    recs = load_corpus(parse_dataset_spec(spec)[1])
    if max_recordings:
        recs = recs[:max_recordings]
    out = []
    for rec in recs:
        feats = prepare_features(extractor, load_audio(rec.audio), rec.ignore, fps)
        probs = posteriors(model, feats, window, stride=stride, subsampling=sub, device=device)
        out.append(DevPosteriors(rec.id, normalise(rec.text), probs))
    return out, tokenizer


def wer_of(dev: Sequence[DevPosteriors], decode: Any, tokenizer: Any) -> float:
    """Corpus WER (%) of ``decode(probs) -> ids`` over ``dev``."""
    counts: list[Counts] = []
    for d in dev:
        counts.append(score(d.ref, normalise(tokenizer.decode(list(decode(d.probs)))), normalised=True))
    return corpus_wer(counts)


def grid_search(dev: Sequence[DevPosteriors], tokenizer: Any, lm: Any, base: BeamConfig,
                alphas: Sequence[float], betas: Sequence[float], progress: bool = True) -> list[dict[str, float]]:
    """WER of every (alpha, beta) on ``dev``, in grid order."""
    blank = tokenizer.blank_id
    rows = []
    pairs = list(itertools.product(alphas, betas))
    t0 = time.perf_counter()
    for i, (a, b) in enumerate(pairs, 1):
        cfg = replace(base, alpha=float(a), beta=float(b))
        with torch.no_grad():
            w = wer_of(dev, lambda p: beam_search(p, blank=blank, lm=lm, config=cfg).ids, tokenizer)
        rows.append({"alpha": float(a), "beta": float(b), "wer": w})
        if progress:
            print(f"[lm tune] {i}/{len(pairs)} alpha {a:g} beta {b:g}: WER {w:.2f}% "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    return rows


def best(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """The lowest WER; ties go to the smaller alpha, then the smaller beta (the simpler decoder)."""
    return min(rows, key=lambda r: (r["wer"], r["alpha"], r["beta"]))


def parse_floats(text: str, flag: str) -> tuple[float, ...]:
    """The comma-separated numbers of the option ``flag`` (``"0,0.5,1"`` -> ``(0.0, 0.5, 1.0)``); ValueError naming
    the option when one is no finite number or there are none."""
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} {text!r}: give comma-separated numbers, e.g. 0,0.5,1") from None
    if not vals or any(not math.isfinite(v) for v in vals):
        raise ValueError(f"{flag} {text!r}: give finite comma-separated numbers")
    return vals


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m asr_core lm tune", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path, help="the acoustic model's checkpoint")
    ap.add_argument("--lm", type=Path, required=True, help="an LM checkpoint (lm train)")
    ap.add_argument("--data", required=True, metavar="NAME=FORMAT:PATH", help="the dev set")
    renamed(ap, "--alpha", ap.add_argument("--lm-weights", dest="alpha", default=",".join(
        f"{a:g}" for a in DEFAULT_ALPHAS), help="the LM weights to try, comma-separated"))
    renamed(ap, "--beta", ap.add_argument("--token-bonuses", dest="beta", default=",".join(
        f"{b:g}" for b in DEFAULT_BETAS), help="the bonuses per token to try, comma-separated"))
    ap.add_argument("--beam-width", type=int, default=BeamConfig().beam_width)
    ap.add_argument("--lm-context", type=int, default=BeamConfig().lm_context, help="tokens the LM remembers")
    ap.add_argument("--stride", type=float, default=0.125)
    ap.add_argument("--max-recordings", type=int, default=0, help="only the first N dev recordings (0: all)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--out", type=Path, default=None, help="write the grid and the best pair as JSON")
    a = ap.parse_args(argv)
    try:
        alphas, betas = parse_floats(a.alpha, "--lm-weights"), parse_floats(a.beta, "--token-bonuses")
        base = BeamConfig(beam_width=a.beam_width, lm_context=a.lm_context)
        for path, what in ((a.checkpoint, "acoustic checkpoint"), (a.lm, "--lm")):
            if not path.is_file():
                raise FileNotFoundError(f"{what} {path} not found")
        from asr_core.lm.checkpoint import load_lm

        lm = load_lm(a.lm, a.device)
        dev, tokenizer = dev_posteriors(a.checkpoint, a.data, stride=a.stride, device=a.device,
                                        max_recordings=a.max_recordings)
        if lm.tokenizer.to_bytes() != tokenizer.to_bytes():
            raise ValueError(f"LM {a.lm} was trained with another tokenizer than {a.checkpoint}: retrain it with "
                             f"`lm train --tokenizer {a.checkpoint}`")
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"lm tune: {e}", file=sys.stderr)
        return 2
    from asr_core.decoding.decode import greedy_ids

    greedy = wer_of(dev, lambda p: greedy_ids(p, tokenizer.blank_id), tokenizer)
    rows = grid_search(dev, tokenizer, lm.model, base, alphas, betas)
    top = best(rows)
    print(f"{'alpha':>6s} " + " ".join(f"{'b=' + format(b, 'g'):>7s}" for b in betas))
    for al in alphas:
        print(f"{al:6g} " + " ".join(f"{r['wer']:7.2f}" for r in rows if r["alpha"] == al))
    rel = 100 * (greedy - top["wer"]) / greedy if greedy else float("nan")
    print(f"best: alpha {top['alpha']:g}, beta {top['beta']:g}: WER {top['wer']:.2f}% against greedy "
          f"{greedy:.2f}% ({rel:.1f}% relative) on {len(dev)} recordings of {a.data}")
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"dev": a.data, "recordings": len(dev), "greedy_wer": greedy, "best": top,
                                     "beam_width": a.beam_width, "lm_context": a.lm_context, "grid": rows},
                                    indent=1) + "\n")
    return 0
