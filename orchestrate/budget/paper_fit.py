"""The built-in A100 calibration's a and b, derived from paper 000's training times (``python -m
orchestrate.budget.estimate --derive`` prints the derivation; ``orchestrate/calibrations/a100-paper.json`` holds the
result)."""

from __future__ import annotations

import argparse
from typing import Any, Sequence

import numpy as np

from orchestrate.budget.calibration import EstimateError
from orchestrate.budget.corpus import PAPER_CORPUS_ASSUMPTION, training_corpus, trial_steps

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
