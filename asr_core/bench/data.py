"""``python -m asr_core bench data``: the data side of a trial at the paper's scale, in one table.

The paper trains on about 58,000 hours of podcasts: 105,000 recordings and about half a billion words (2.4 words a
second). This machine does not hold that corpus, so the bench generates a prepared corpus index of the same shape at
``--fraction`` of its size (default a tenth: 10,500 recordings, about 50 million words; ``--fraction 1`` writes the
whole 6 GB) and measures, in a fresh process:

* resident bytes per word after a trial's data start-up (open the index, its identity, one epoch's plan of every
  recording's windows, 200 recordings built as a loader builds them; goal <= 16): private memory plus the index's
  mapped pages (the kernel's readahead maps neighbourhoods of what was read; never more than the index's size on
  disk, shared by every process of the machine and dropped under pressure), against the reader's ``Word`` objects of
  today (built as the podcast reader builds them);
* the index's load time and the data start-up time, extrapolated linearly to the whole corpus where a fraction was
  measured (the table says so);
* loader throughput: audio-seconds per second of one worker (one thread) reading audio and computing the model's
  features, for 16 kHz WAV, 44.1 kHz FLAC and 44.1 kHz OGG Vorbis (the Spotify dataset's format), resampled, against the 809 audio-seconds a second that the paper's
  80,900 frames/s consume (100 frames a second), with the workers that rate needs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from asr_core.contract.options import renamed

PAPER_RECORDINGS = 105_000
PAPER_HOURS = 58_000
PAPER_WORDS = 500_000_000
PAPER_AUDIO_S_PER_S = 809  # 80,900 frames/s (paper 000, Table 1) at 100 frames a second
GOAL_BYTES_PER_WORD = 16
LEXICON = 200_000
BUILT = 200  # recordings the probe builds, as a loader would


def generate_index(out: Path, fraction: float, seed: int = 0) -> dict[str, Any]:
    """A prepared corpus index shaped like the paper's podcasts at ``fraction`` of their size (arrays only; the audio
    paths name files that do not exist). Returns its manifest."""
    from asr_core.data.corpora.prepared import write_arrays

    rng = np.random.default_rng(seed)
    n_rec = max(1, round(PAPER_RECORDINGS * fraction))
    mean_s = PAPER_HOURS * 3600 / PAPER_RECORDINGS  # about 33 minutes
    durations = rng.lognormal(np.log(mean_s) - 0.125, 0.5, n_rec).clip(60, 4 * 3600)
    rate = PAPER_WORDS / (PAPER_HOURS * 3600)
    counts = rng.poisson(durations * rate * 0.97)  # a little room: the last word ends before the recording does
    offsets = np.zeros(n_rec + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    n = int(offsets[-1])
    gap_ms = int(1000 / rate)  # evenly spaced words; what the arrays hold does not matter here, their size does
    within = np.arange(n, dtype=np.int64) - np.repeat(offsets[:-1], counts)  # each word's index in its recording
    word_start = (within * gap_ms).astype(np.int32)
    word_end = (word_start + int(0.8 * gap_ms)).astype(np.int32)
    word_type = (rng.zipf(1.2, n) - 1).clip(max=LEXICON - 1).astype(np.uint32)
    out.mkdir(parents=True, exist_ok=True)
    arrays = {"durations": durations, "timed": (counts > 0).astype(np.uint8), "word_offsets": offsets,
              "word_start": word_start, "word_end": word_end, "word_type": word_type,
              "ignore": np.zeros((0, 2)), "ignore_offsets": np.zeros(n_rec + 1, dtype=np.int64)}
    ids = [f"show{i // 20:05d}/episode{i:06d}" for i in range(n_rec)]
    audio = [f"/data/spotify/podcasts-audio/{i % 8}/{i % 100}/{ids[i]}.ogg" for i in range(n_rec)]
    write_arrays(out, arrays, ids=ids, audio=audio, lexicon=[f"w{i}" for i in range(LEXICON)], name="podcasts",
                 source=f"generated: {fraction:g} of the paper's podcast corpus", content="generated")
    return json.loads((out / "prepared.json").read_text())


def _rss() -> dict[str, int]:
    """This process's resident memory in bytes: total, private (anonymous) and file-backed (mapped files)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def probe(path: Path) -> dict[str, Any]:
    """What a trial does with its data before step 0, timed and its memory measured (run in a fresh process)."""
    import numpy.lib.format  # noqa: F401 - everything imported before the baseline, as a trial has it
    from asr_core.data.chunking import duration_timed, window_bounds
    import asr_core.data.corpora.prepared  # noqa: F401
    from asr_core.data.corpora import load_corpus

    before = _rss()
    t0 = time.perf_counter()
    corpus = load_corpus(f"podcasts=prepared:{path}")
    t_open = time.perf_counter() - t0
    identity = corpus.fingerprint  # type: ignore[attr-defined]
    windows = 0
    for i in range(len(corpus)):  # one epoch's plan at a 10-minute context
        d, timed = duration_timed(corpus, i)
        windows += len(window_bounds(d, 600.0)) if timed else 0
    t_plan = time.perf_counter() - t0 - t_open
    rng = np.random.default_rng(1)
    t1 = time.perf_counter()
    words_built = 0
    for i in rng.integers(0, len(corpus), BUILT):  # one at a time, as a loader holds them
        words_built += len(corpus[int(i)].words)
    t_build = (time.perf_counter() - t1) / BUILT
    after = _rss()
    return {"open_s": t_open, "plan_s": t_plan, "startup_s": t_open + t_plan,
            "build_ms": 1000 * t_build, "words_built": words_built, "windows": windows,
            "identity": identity, "anon": after["RssAnon"] - before["RssAnon"],
            "file": after["RssFile"] - before["RssFile"], "words": corpus.manifest["words"]}  # type: ignore[attr-defined]


def reader_bytes_per_word(n: int = 200_000) -> float:
    """Bytes a word takes as the podcast reader holds it today: its text parsed from JSON, its times as floats, one
    frozen ``Word`` each (measured with tracemalloc)."""
    from asr_core.data.corpora.base import Word

    doc = json.dumps([{"word": f"w{i % 5000}", "startTime": f"{i * 0.4:.1f}s", "endTime": f"{i * 0.4 + 0.3:.1f}s"}
                      for i in range(n)])
    parsed = json.loads(doc)
    tracemalloc.start()
    words = tuple(Word(w["word"] + "", float(w["startTime"][:-1]), float(w["endTime"][:-1])) for w in parsed)
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del parsed
    return size / len(words)


def loader_rate(work: Path, seconds: float = 60.0) -> dict[str, float]:
    """Audio-seconds per second of one worker thread: read the file, resample to 16 kHz, the model's features."""
    import soundfile as sf
    import torch

    from asr_core.data.audio import load_audio
    from asr_core.config import preset
    from asr_core.data.features import FeatureExtractor

    torch.set_num_threads(1)
    extractor = FeatureExtractor(preset("main").data.features)
    rng = np.random.default_rng(0)
    out = {}
    for label, sr, fmt, sub in (("16 kHz WAV", 16_000, "WAV", "PCM_16"), ("44.1 kHz FLAC", 44_100, "FLAC", "PCM_16"),
                                ("44.1 kHz OGG Vorbis", 44_100, "OGG", "VORBIS")):
        path = work / f"audio.{fmt.lower()}"
        wave = (0.1 * rng.standard_normal(int(seconds * sr))).astype(np.float32)
        with sf.SoundFile(str(path), "w", sr, 1, format=fmt, subtype=sub) as f:
            for i in range(0, len(wave), sr):  # a second at a time: libsndfile's Vorbis encoder crashes on one write
                f.write(wave[i:i + sr])
        extractor(load_audio(path))  # warm-up
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            extractor(load_audio(path))
            best = min(best, time.perf_counter() - t0)
        out[label] = seconds / best
        if fmt in ("WAV", "OGG"):
            out[f"{fmt} by window"] = seconds / _windowed_time(path, extractor, 10.24)
    threads = min(8, os.cpu_count() or 1)
    if threads > 1:  # the loader's workers are threads: decoding and features release the GIL
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            t0 = time.perf_counter()
            list(pool.map(lambda _: extractor(load_audio(path)), range(2 * threads)))
            out[f"{threads} threads together, OGG"] = 2 * threads * seconds / (time.perf_counter() - t0)
    return out


def _windowed_time(path: Path, extractor: Any, window_s: float) -> float:
    """Seconds to deliver the whole file as the interleaved loader does (best of 3): one read for the recording's
    statistics, then every window read by seeking, its frames computed and normalised."""
    from asr_core.data.audio import load_audio, read_segment
    from asr_core.data.features import normalise, statistics

    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        wave = load_audio(path)
        stats = statistics(extractor.raw(wave))
        samples = int(wave.shape[0])
        del wave
        total = extractor.n_frames(samples)
        step = int(round(window_s * extractor.frames_per_second))
        for a in range(0, total, step):
            b = min(total, a + step)
            lo, hi = extractor.sample_span(a, b)
            seg = read_segment(path, max(0, lo), min(samples, hi))
            normalise(extractor.frames(seg, a, b, samples), stats=stats)
        best = min(best, time.perf_counter() - t0)
    return best


def _row(what: str, value: str, goal: str, ratio: str, note: str) -> str:
    return f"{what:<44} {value:>14} {goal:>10} {ratio:>8}  {note}"


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m asr_core bench data", description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=0.1, help="of the paper's corpus to generate (default 0.1)")
    ap.add_argument("--audio-s", type=float, default=60.0, help="seconds of audio the loader rows read (default 60)")
    renamed(ap, "--keep", ap.add_argument("--out", dest="keep", metavar="DIR",
                                          help="generate into DIR and keep it (default: a temporary folder)"))
    ap.add_argument("--probe", metavar="DIR", help=argparse.SUPPRESS)  # the fresh process's part
    args = ap.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(Path(args.probe))))
        return 0
    if not 0 < args.fraction <= 1:
        print(f"bench data: --fraction {args.fraction} must be in (0, 1]", file=sys.stderr)
        return 2
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="asr-bench-data-"))
    try:
        index = work / "index"
        t0 = time.perf_counter()
        print(f"[bench data] generating an index of {args.fraction:g} of the paper's corpus", file=sys.stderr,
              flush=True)
        manifest = json.loads((index / "prepared.json").read_text()) if (index / "prepared.json").exists() \
            else generate_index(index, args.fraction)
        disk = sum(f.stat().st_size for f in index.iterdir())
        print(f"[bench data] {manifest['recordings']} recordings, {manifest['words']:,} words, "
              f"{disk / 2**30:.2f} GiB ({time.perf_counter() - t0:.0f} s); measuring in a fresh process",
              file=sys.stderr, flush=True)
        p = subprocess.run([sys.executable, "-m", "asr_core", "bench", "data", "--probe", str(index)],
                           capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            print(f"bench data: the probe failed: {p.stderr[-2000:]}", file=sys.stderr)
            return 1
        m = json.loads(p.stdout.strip().splitlines()[-1])
        reader = reader_bytes_per_word()
        rates = loader_rate(work, args.audio_s)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    scale = PAPER_WORDS / m["words"]
    extra = f" (x{scale:.1f}: measured on {m['words']:,} words)" if scale > 1.05 else ""
    anon, mapped = m["anon"] / m["words"], m["file"] / m["words"]
    print(f"asr_core bench data: {os.cpu_count()} cores; index of {manifest['recordings']:,} recordings, "
          f"{m['words']:,} words, {disk / m['words']:.1f} bytes a word on disk")
    print(_row("measure", "value", "goal", "ratio", "note"))
    print("-" * 100)
    total = anon + mapped
    print(_row("resident bytes/word (private + mapped)", f"{total:.2f}", f"{GOAL_BYTES_PER_WORD}",
               f"{total / GOAL_BYTES_PER_WORD:.2f}", "after open, identity, one epoch's plan, 200 recordings built"))
    print(_row("  private", f"{anon:.2f}", "-", "-", "this process's own memory"))
    print(_row("  mapped index pages", f"{mapped:.2f}", "-", "-",
               f"readahead around what was read: at most the index ({disk / m['words']:.1f} bytes/word) and a few "
               "MB of libraries; shared by every process of the machine"))
    print(_row("reader's Word objects today, bytes/word", f"{reader:.0f}", f"{GOAL_BYTES_PER_WORD}",
               f"{reader / GOAL_BYTES_PER_WORD:.1f}", f"{reader * PAPER_WORDS / 1e9:.0f} GB for the paper's words"))
    print(_row("index load", f"{m['open_s'] * scale:.2f} s", "-", "-", f"ids, paths, arrays mapped{extra}"))
    print(_row("trial data start-up", f"{m['startup_s'] * scale:.2f} s", "-", "-",
               f"load + identity + one epoch's plan ({m['windows']:,} windows){extra}"))
    print(_row("build one recording (as the loader does)", f"{m['build_ms']:.1f} ms", "-", "-",
               f"{m['words_built'] / BUILT:.0f} words on average"))
    for label, rate in rates.items():
        one = "threads" not in label
        print(_row(f"loader, {'one worker, ' if one else ''}{label}", f"{rate:.0f} a-s/s", f"{PAPER_AUDIO_S_PER_S}",
                   f"{rate / PAPER_AUDIO_S_PER_S:.2f}",
                   (f"audio-seconds/s read + features; {math.ceil(PAPER_AUDIO_S_PER_S / rate)} workers feed the "
                    "paper's 80,900 frames/s" + ("; the interleaved loader: statistics from one read, then 10.24 s "
                                                 "windows by seeking" if "by window" in label else ""))
                   if one else "the loader's threads share this machine's cores"))
    return 0
