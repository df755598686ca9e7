"""Schedules match their formulas at chosen points."""

import math

import pytest

from asr_core.schedules import learning_rate, sequence_length


def test_learning_rate_linear_warmup_then_cosine_to_zero() -> None:
    peak, warm, total = 3e-3, 100, 1100
    assert learning_rate(0, peak, warm, total) == pytest.approx(peak / 100)
    assert learning_rate(49, peak, warm, total) == pytest.approx(peak * 0.5)
    assert learning_rate(99, peak, warm, total) == pytest.approx(peak)
    assert learning_rate(100, peak, warm, total) == pytest.approx(peak)
    assert learning_rate(600, peak, warm, total) == pytest.approx(peak * 0.5)  # half way through the cosine
    assert learning_rate(350, peak, warm, total) == pytest.approx(peak * 0.5 * (1 + math.cos(math.pi / 4)))
    assert learning_rate(1100, peak, warm, total) == pytest.approx(0.0, abs=1e-15)
    assert learning_rate(5000, peak, warm, total) == pytest.approx(0.0, abs=1e-15)
    lrs = [learning_rate(s, peak, warm, total) for s in range(100, 1100)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    with pytest.raises(ValueError):
        learning_rate(-1, peak, warm, total)


def test_sequence_length_paper_formula() -> None:
    # s_r = min(s0 + s0 * 2^floor(r/n), s_m)
    f = lambda r: sequence_length(r, 3600.0, 5.0, 5000, "paper")  # noqa: E731
    assert f(0) == 10.0 and f(4999) == 10.0 and f(5000) == 15.0 and f(10_000) == 25.0 and f(15_000) == 45.0
    assert f(45_000) == 5 + 5 * 512 and f(50_000) == 3600.0  # 5 + 5*1024 > 3600: capped
    assert sequence_length(10**12, 10.24, 5.0, 5000, "paper") == 10.24


def test_sequence_length_code_formula_and_none() -> None:
    # s_r = min(s0 * 2^floor(r/n), s_m)
    f = lambda r: sequence_length(r, 82.0, 5.0, 5000, "code")  # noqa: E731
    assert (f(0), f(5000), f(10_000), f(15_000), f(20_000), f(25_000)) == (5.0, 10.0, 20.0, 40.0, 80.0, 82.0)
    assert sequence_length(0, 82.0, 5.0, 5000, "none") == 82.0
    with pytest.raises(ValueError, match="valid: paper, code, none"):
        sequence_length(0, 82.0, 5.0, 5000, "linear")


def authors_loop(groups: list[tuple[int, int]], peak: float, warmup: int) -> list[float]:
    """The learning rate of each optimiser step as the authors' trainer sets it (exp/train.py with lcasr's
    CosineLRScheduler, final value 0), for ``groups`` of (recordings, optimiser steps), written out as they run it:
    during the warmup the scheduler steps after every optimiser step; at the first group that starts with the warmup's
    steps done the cosine is set from the recordings seen so far (that group's included) to the run's total, and it
    then steps once after every group, with the recordings seen so far."""
    import math

    total = sum(b for b, _ in groups)
    done, seen, lr, warming, offset, span = 0, 0, 0.0, True, 0, 1
    out = []
    for b, d in groups:
        seen += b
        if warming and done >= warmup:
            warming, offset, span = False, -seen, total - seen + 1
        for _ in range(d):
            out.append(lr)
            if warming:
                done += 1
                lr = peak * min(1.0, done / warmup)
        if not warming:
            lr = 0.5 * peak * (1 + math.cos((seen + offset) / span * math.pi))
    return out


def test_the_cosine_over_recordings_is_the_authors_after_the_warmup() -> None:
    from asr_core.schedules import learning_rate_by_recordings

    groups = [(4, 3), (4, 5), (3, 2), (4, 6), (2, 1), (4, 4), (3, 7), (4, 2), (1, 3)]  # (recordings, steps)
    peak, warmup = 2e-3, 6
    want = authors_loop(groups, peak, warmup)
    before, after = [], []
    seen = 0
    for b, d in groups:
        before += [seen] * d
        after += [seen + b] * d
        seen += b
    first = next(s for s in range(len(before)) if s >= warmup and before[s] != before[s - 1])
    got = [learning_rate_by_recordings(s, peak, warmup, before[s], after[first], seen) for s in range(len(before))]
    assert got[warmup:] == pytest.approx(want[warmup:], rel=1e-12, abs=1e-15)
    # the warmup counts steps from 1 here ((step + 1) / warmup), from 0 there (the first step at LR 0)
    assert got[:warmup] == pytest.approx([peak * (s + 1) / warmup for s in range(warmup)])
    assert want[:warmup] == pytest.approx([peak * s / warmup for s in range(warmup)])
    # one LR per group once the decay runs; it falls, and the steps of the longest groups share theirs
    decaying = got[after.index(after[first]) + groups[2][1]:]
    assert decaying == sorted(decaying, reverse=True) and got[-1] > 0


def test_a_runs_schedule_over_recordings_follows_its_streams_groups() -> None:
    """LRSchedule.of reads the stream's plan: every step of a group shares one LR once the decay runs, each group's
    recordings are those its steps train on, and the run's recordings are the corpus's."""
    from pathlib import Path

    from asr_core.config import preset
    from asr_core.data.chunking import WindowStream
    from asr_core.data.corpora.base import Recording, Word
    from asr_core.training.step import LRSchedule

    recs = [Recording(f"r{i:02d}", Path("/nowhere.wav"), 3.0 + (i % 5) * 1.7,
                      tuple(Word("a", 0.2 + 0.5 * k, 0.5 + 0.5 * k) for k in range(int((3.0 + (i % 5) * 1.7) * 2) - 1)))
            for i in range(23)]
    cfg = preset("tiny").with_overrides(["data.context_s=2.0", "data.batch_audio_s=8", "data.seqlen_warmup=none",
                                         "train.warmup_steps=5"])
    stream = WindowStream(recs, cfg.data, seed=3)
    total = stream.count_steps()
    before, after = stream.step_recordings(total)
    assert len(before) == total and after[-1] == len(recs) and before[0] == 0
    order = stream.order(0)
    for s, (windows, _) in enumerate(stream.batches()):
        group = {int(i) for i in order[before[s]:after[s]]}
        assert {w.recording for w in windows} <= group, s
    lr = LRSchedule.of(cfg.train, total, stream, len(recs))
    assert lr.total_recordings == len(recs) and lr.decay_start > 0
    rates = [lr(s) for s in range(total)]
    late = [s for s in range(total) if before[s] >= lr.decay_start]
    assert late and all(rates[s] == rates[t] for s in late for t in late if before[s] == before[t])
    assert [rates[s] for s in late] == sorted((rates[s] for s in late), reverse=True)
    steps = LRSchedule.of(cfg.train.__class__(**{**cfg.train.__dict__, "lr_decay_over": "steps"}), total, stream,
                          len(recs))
    assert [steps(s) for s in range(total)] == [learning_rate(s, cfg.train.lr, 5, total) for s in range(total)]
