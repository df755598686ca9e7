"""``python -m asr_core bench decode``: real-time factor of moving-window decoding, in one run.

Rows: non-overlapping windows (stride = window, the cost of one pass), moving windows at the evaluation stride
(12.5%) decoded in batches, and the same one window at a time. Overlapping windows at stride ``s`` cost ``1/s``
passes (8 at 12.5%): that is the compute floor, and the batched implementation should come within 1.2× of it.
Times are the best of ``--repeats`` runs after a warm-up, on normalised features of a synthetic recording (the
one-off feature extraction is reported on its own row).

Beam rows (``--beam-lm none,tiny,paper``): CTC prefix beam search (:mod:`asr_core.decoding.beam`, width ``--beam-width``)
over ``--beam-seconds`` of posteriors shaped like a trained model's (a token peak on about one output frame in four,
blank elsewhere, both with noise), without an LM and with an untrained LM of each preset (:mod:`asr_core.lm`; an
LM's speed does not depend on its weights) on the acoustic preset's vocabulary: seconds, real-time factor, batched
LM calls per second and beams per call. The posteriors are synthetic so that the search does the work it does on
real speech (an untrained acoustic model's flat posteriors would let every token through the threshold).

Window fusion rows (``--fusion``, paper 001; :mod:`asr_core.decoding.fused`): per method, the seconds it takes on
its own (its windows run and joined) and the seconds it adds after the averaging pass of an evaluation (whose
windows it reuses), each with its real-time factor and its ratio to the averaging pass.
"""

from __future__ import annotations

import argparse
import time

import torch

from asr_core.config import PRESETS, preset
from asr_core.decoding.decode import plan_windows, posteriors, window_frames


def _best_time(fn, repeats: int) -> float:
    fn()  # warm-up: allocator, kernels, caches
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run(preset_name: str = "tiny", context_s: float = 10.24, minutes: float = 3.0, stride: float = 0.125,
        batch_windows: int = 8, repeats: int = 2, device: str = "cpu", threads: int = 0) -> list[dict]:
    """Measure and return the table rows (also printed by :func:`cli`)."""
    from asr_core.data.features import FeatureExtractor
    from asr_core.model.acoustic import build_model

    if threads:
        torch.set_num_threads(threads)
    cfg = preset(preset_name).with_overrides([f"data.context_s={context_s}",
                                              f"data.batch_audio_s={max(context_s, 3600.0)}"])
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.data.features.n_mels, cfg.data.features.frames_per_second).to(device).eval()
    fps = cfg.data.features.frames_per_second
    sub = cfg.model.subsampling_factor
    window = window_frames(cfg.data.context_s, fps, sub)
    seconds = minutes * 60.0
    wave = torch.randn(int(seconds * cfg.data.features.sample_rate)) * 0.1
    extractor = FeatureExtractor(cfg.data.features)
    feats_time = _best_time(lambda: extractor(wave), 1)
    feats = extractor(wave)

    def decode(s: float, b: int) -> float:
        return _best_time(lambda: posteriors(model, feats, window, stride=s, batch_windows=b, subsampling=sub,
                                             device=device), repeats)

    one_pass = decode(1.0, batch_windows)
    floor = one_pass / stride
    rows = [{"mode": "features (once per recording)", "windows": 0, "seconds": feats_time},
            {"mode": "single pass (stride = window)", "windows": len(plan_windows(feats.shape[0], window, 1.0,
                                                                                  sub).starts),
             "seconds": one_pass},
            {"mode": f"floor: {1 / stride:g} x single pass", "windows": 0, "seconds": floor}]
    n = len(plan_windows(feats.shape[0], window, stride, sub).starts)
    rows.append({"mode": f"moving, batches of {batch_windows}", "windows": n, "seconds": decode(stride, batch_windows)})
    rows.append({"mode": "moving, one window at a time", "windows": n, "seconds": decode(stride, 1)})
    for r in rows:
        r["rtf"] = r["seconds"] / seconds
        r["x_floor"] = r["seconds"] / floor if r["windows"] and "moving" in r["mode"] else None
    return rows


def fusion_rows(preset_name: str = "tiny", context_s: float = 10.24, minutes: float = 3.0, stride: float = 0.125,
                batch_windows: int = 8, repeats: int = 2, device: str = "cpu",
                methods: tuple[str, ...] = ()) -> list[dict]:
    """One row per window fusion method (all of :data:`~asr_core.contract.metrics.FUSION_METHODS` by default) on the
    recording of :func:`run`, with a tokenizer learned from the synthetic corpus's vocabulary; the averaging pass
    (the evaluation's greedy decoding) first, as the reference."""
    from asr_core.contract.metrics import FUSION_METHODS
    from asr_core.data.synth.text import TOPICS, vocabulary
    from asr_core.data.features import FeatureExtractor
    from asr_core.data.tokenizer import Tokenizer
    from asr_core.decoding.decode import WindowBatch
    from asr_core.decoding.fused import WindowIds, fused_texts
    from asr_core.decoding.fusion import tokenizer_pieces
    from asr_core.model.acoustic import build_model

    cfg = preset(preset_name).with_overrides([f"data.context_s={context_s}",
                                              f"data.batch_audio_s={max(context_s, 3600.0)}"])
    tok = Tokenizer.train([" ".join(vocabulary())] + [" ".join(t) for t in TOPICS.values()] * 20,
                          cfg.model.vocab_size)
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.data.features.n_mels, cfg.data.features.frames_per_second).to(device).eval()
    fps, sub = cfg.data.features.frames_per_second, cfg.model.subsampling_factor
    window = window_frames(cfg.data.context_s, fps, sub)
    seconds = minutes * 60.0
    feats = FeatureExtractor(cfg.data.features)(torch.randn(int(seconds * cfg.data.features.sample_rate)) * 0.1)
    pieces = tokenizer_pieces(tok)

    def windows() -> WindowIds:
        return WindowIds(model, feats, subsampling=sub, batch=WindowBatch(batch_windows), device=device)

    def averaging(cache: WindowIds | None = None) -> None:
        posteriors(model, feats, window, stride=stride, batch_windows=batch_windows, subsampling=sub, device=device,
                   on_window=cache.keep if cache is not None else None)

    def timed(method: str, filled: bool) -> float:
        best = float("inf")
        for _ in range(max(1, repeats)):
            cache = windows()
            if filled:
                averaging(cache)
            t0 = time.perf_counter()
            fused_texts(cache, (method,), window=window, stride=stride, tokenizer=tok, pieces=pieces, fps=fps)
            best = min(best, time.perf_counter() - t0)
        return best

    base = _best_time(averaging, repeats)
    rows = [{"mode": f"average (stride {stride:g})", "seconds": base, "extra": None}]
    for m in methods or FUSION_METHODS:
        rows.append({"mode": m, "seconds": timed(m, False), "extra": timed(m, True)})
    for r in rows:
        r["rtf"] = r["seconds"] / seconds
        r["x_average"] = r["seconds"] / base
    return rows


def peaked_posteriors(frames: int, vocab: int, token_rate: float = 0.25, seed: int = 0) -> torch.Tensor:
    """(frames, vocab) probabilities like a trained CTC model's: a random token (not the blank, ``vocab - 1``) peaks
    on a ``token_rate`` share of frames, the blank on the others, with Gaussian noise on every logit."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(frames, vocab, generator=g)
    tokens = torch.randint(0, vocab - 1, (frames,), generator=g)
    peak = torch.where(torch.rand(frames, generator=g) < token_rate, tokens, torch.full_like(tokens, vocab - 1))
    logits[torch.arange(frames), peak] += 8.0
    return torch.softmax(logits, dim=-1)


def beam_rows(preset_name: str = "tiny", seconds: float = 30.0, lms: tuple[str, ...] = ("none", "tiny"),
              beam_width: int = 25, device: str = "cpu") -> list[dict]:
    """Beam search rows (see the module docstring): one per LM in ``lms`` (``none``, or an LM preset)."""
    from asr_core.decoding.beam import BeamConfig, beam_search
    from asr_core.lm import TransformerLM, preset as lm_preset

    cfg = preset(preset_name)
    vocab = cfg.model.vocab_size
    frames = int(seconds * cfg.data.features.frames_per_second / cfg.model.subsampling_factor)
    probs = peaked_posteriors(frames, vocab)
    rows = []
    for name in lms:
        lm = None
        if name != "none":
            torch.manual_seed(0)
            lm = TransformerLM(lm_preset(name, vocab_size=vocab)).to(device).eval()
        config = BeamConfig(beam_width=beam_width)
        with torch.no_grad():
            t0 = time.perf_counter()
            res = beam_search(probs, blank=vocab - 1, lm=lm, config=config)
            took = time.perf_counter() - t0
        rows.append({"mode": f"beam {beam_width}, " + ("no LM" if lm is None else f"{name} LM"), "windows": 0,
                     "seconds": took, "rtf": took / seconds, "x_floor": None,
                     "lm_calls_per_s": res.lm_calls / took if lm is not None else None,
                     "beams_per_call": res.lm_rows / res.lm_calls if res.lm_calls else None})
    return rows


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m asr_core bench decode", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--context-s", type=float, default=10.24)
    ap.add_argument("--minutes", type=float, default=3.0, help="length of the synthetic recording")
    ap.add_argument("--stride", type=float, default=0.125)
    ap.add_argument("--batch-windows", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--beam-lm", default="none,tiny",
                    help="beam rows: comma-separated LMs, each 'none' or an LM preset (tiny, paper); '' for none")
    ap.add_argument("--beam-seconds", type=float, default=30.0, help="audio the beam rows decode")
    ap.add_argument("--beam-width", type=int, default=25)
    ap.add_argument("--fusion", default="all", help="window fusion rows: comma-separated methods, 'all' or ''")
    a = ap.parse_args(argv)
    from asr_core.contract.metrics import FUSION_METHODS

    fusion = FUSION_METHODS if a.fusion.strip() == "all" else tuple(x.strip() for x in a.fusion.split(",")
                                                                     if x.strip())
    if any(m not in FUSION_METHODS for m in fusion):
        ap.error(f"--fusion {a.fusion!r}: valid: {', '.join(FUSION_METHODS)} (comma-separated), 'all' or ''")
    if not 0 < a.stride <= 1:
        ap.error(f"--stride must be in (0, 1], got {a.stride}")
    rows = run(a.preset, a.context_s, a.minutes, a.stride, a.batch_windows, a.repeats, a.device, a.threads)
    print(f"decode benchmark: preset {a.preset}, context {a.context_s:g} s, {a.minutes:g} min recording, "
          f"stride {a.stride:g}, device {a.device}, {torch.get_num_threads()} threads")
    print(f"{'mode':34s} {'windows':>8s} {'seconds':>9s} {'RTF':>8s} {'x floor':>8s}")
    for r in rows:
        xf = f"{r['x_floor']:8.2f}" if r["x_floor"] is not None else f"{'':8s}"
        w = f"{r['windows']:8d}" if r["windows"] else f"{'':8s}"
        print(f"{r['mode']:34s} {w} {r['seconds']:9.3f} {r['rtf']:8.4f} {xf}")
    lms = tuple(x.strip() for x in a.beam_lm.split(",") if x.strip())
    from asr_core.lm.config import PRESETS as LM_PRESETS

    bad = [x for x in lms if x != "none" and x not in LM_PRESETS]
    if bad:
        ap.error(f"--beam-lm {bad[0]!r}: valid: none, {', '.join(sorted(LM_PRESETS))}")
    if lms:
        brows = beam_rows(a.preset, a.beam_seconds, lms, a.beam_width, a.device)
        print(f"beam search over {a.beam_seconds:g} s of peaked posteriors ({preset(a.preset).model.vocab_size} "
              "tokens):")
        print(f"{'mode':34s} {'seconds':>9s} {'RTF':>8s} {'LM calls/s':>11s} {'beams/call':>11s}")
        for r in brows:
            calls = f"{r['lm_calls_per_s']:11.1f}" if r["lm_calls_per_s"] is not None else f"{'':11s}"
            per = f"{r['beams_per_call']:11.1f}" if r["beams_per_call"] is not None else f"{'':11s}"
            print(f"{r['mode']:34s} {r['seconds']:9.3f} {r['rtf']:8.4f} {calls} {per}")
    if fusion:
        frows = fusion_rows(a.preset, a.context_s, a.minutes, a.stride, a.batch_windows, a.repeats, a.device, fusion)
        print("window fusion (paper 001) on the same recording: alone, and added after the averaging pass")
        print(f"{'method':34s} {'seconds':>9s} {'RTF':>8s} {'x average':>10s} {'added s':>9s}")
        for r in frows:
            extra = f"{r['extra']:9.3f}" if r["extra"] is not None else f"{'':9s}"
            print(f"{r['mode']:34s} {r['seconds']:9.3f} {r['rtf']:8.4f} {r['x_average']:10.2f} {extra}")
    batched = next(r for r in rows if r["mode"].startswith("moving, batches"))
    goal = "meets" if batched["x_floor"] <= 1.2 else "misses"
    print(f"batched moving-window decoding is {batched['x_floor']:.2f}x the compute floor ({goal} the 1.2x goal)")
    return 0
