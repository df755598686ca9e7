"""Windows by word timestamps and optimiser steps of a fixed audio duration: the authors' interleaved make-up
(step k = window k of each of B recordings) and the consecutive one."""

from pathlib import Path

import pytest

from asr_core.data.chunking import (Position, Window, WindowStream, cut_windows, group_size, micro_batches,
                               window_bounds)
from asr_core.config import DataConfig, preset
from asr_core.config.parse import ConfigError
from asr_core.data.corpora.base import Recording, Word


def _rec(i: int, dur: float, words: list[tuple[str, float, float]]) -> Recording:
    return Recording(f"r{i}", Path(f"/nowhere/r{i}.wav"), dur, tuple(Word(*w) for w in words))


def test_words_belong_only_to_the_window_they_lie_wholly_inside() -> None:
    rec = _rec(0, 25.0, [("a", 0.5, 1.0), ("b", 9.8, 10.3), ("c", 10.3, 11.0), ("d", 19.0, 20.0), ("e", 20.0, 21.0),
                         ("f", 24.8, 25.0)])
    wins = cut_windows(rec, 0, 10.0)
    assert [(w.start, w.end) for w in wins] == [(0.0, 10.0), (10.0, 20.0), (20.0, 25.0)]
    assert [w.text for w in wins] == ["a", "c d", "e f"]  # 'b' straddles the cut at 10 s: in neither


def test_short_tail_dropped_unless_whole_recording() -> None:
    assert window_bounds(20.3, 10.0) == [(0.0, 10.0), (10.0, 20.0)]
    assert window_bounds(0.3, 10.0) == [(0.0, 0.3)]
    untimed = Recording("u", Path("/x.wav"), 4.0, (Word("hi"),))
    assert [w.text for w in cut_windows(untimed, 0, 10.0)] == ["hi"] and cut_windows(untimed, 0, 3.0) == []


def _stream(batch_audio_s: float, seed: int = 0, **kw) -> WindowStream:
    recs = [_rec(i, 30.0 + 7 * i, [(f"w{i}_{k}", k + 0.1, k + 0.6) for k in range(int(30 + 7 * i))])
            for i in range(6)]
    kw.setdefault("batching", "consecutive")
    data = DataConfig(context_s=10.0, batch_audio_s=batch_audio_s, seqlen_warmup="none", **kw)
    return WindowStream(recs, data, seed)


def test_batches_hold_a_fixed_audio_duration_and_count_steps_agrees() -> None:
    s = _stream(40.0)
    batches = list(s.batches())
    assert len(batches) == s.count_steps()
    for wins, _ in batches[:-1]:
        assert sum(w.duration for w in wins) <= 40.0 + 1e-6 and len(wins) >= 3
    n_windows = sum(len(w) for w, _ in batches)
    assert n_windows == sum(len(window_bounds(r.duration, 10.0)) for r in s.recordings)


def test_resuming_from_a_position_continues_the_same_stream() -> None:
    s = _stream(30.0, seed=3)
    full = list(s.batches())
    _, pos = full[4]
    again = list(_stream(30.0, seed=3).batches(Position.from_dict(pos.to_dict())))
    assert again == full[5:]


def test_seed_sets_the_data_order() -> None:
    a = [w[0].recording for w, _ in _stream(10.0, seed=0).batches()]
    b = [w[0].recording for w, _ in _stream(10.0, seed=1).batches()]
    assert a != b and sorted(set(a)) == sorted(set(b))


def test_sequence_length_warmup_grows_windows() -> None:
    recs = [_rec(i, 40.0, [("x", 1.0, 1.5)]) for i in range(8)]
    data = DataConfig(context_s=40.0, batch_audio_s=40.0, seqlen_warmup="code", seqlen_warmup_start_s=5.0,
                      seqlen_warmup_every=2, batching="consecutive")
    s = WindowStream(recs, data, 0)
    lens = [s.seq_len(0, i) for i in range(8)]
    assert lens == [5, 5, 10, 10, 20, 20, 40, 40]
    sizes = [len(w) for w, _ in s.batches()]
    assert sizes[0] == 8 and sizes[-1] == 1  # batch = batch_audio_s / current length


def _windows(durations: list[float]) -> list[Window]:
    out, t = [], 0.0
    for d in durations:
        out.append(Window(0, t, t + d, ""))
        t += d
    return out


def test_micro_batches_split_a_step_in_order_into_balanced_passes_within_the_limit() -> None:
    hour = _windows([10.24] * 351)  # paper: one hour of 10.24 s windows per step
    assert micro_batches(hour, 0.0) == [hour]  # no accumulation: one pass
    thirds = micro_batches(hour, 1200.0)
    assert [len(m) for m in thirds] == [117, 117, 117] and sum(thirds, []) == hour
    uneven = _windows([2.0, 2.0, 1.5, 2.0, 2.0, 2.0, 0.7])
    parts = micro_batches(uneven, 6.0)
    assert [len(m) for m in parts] == [3, 2, 2] and sum(parts, []) == uneven
    for limit in (2.0, 4.5, 6.0, 9.9, 13.9, 14.0):
        parts = micro_batches(uneven, limit)
        sizes = [len(m) for m in parts]
        assert sum(parts, []) == uneven and max(sizes) - min(sizes) <= 1
        assert all(len(m) * max(w.duration for w in m) <= limit + 1e-9 for m in parts), limit  # padded audio
        assert len(parts) == -(-len(uneven) // max(1, int(limit // 2.0)))  # the fewest passes that fit
    assert [len(m) for m in micro_batches(_windows([30.0, 5.0]), 10.0)] == [1, 1]  # too long: a pass of its own
    with pytest.raises(ValueError, match="max_audio_s"):
        micro_batches(uneven, -1.0)


def test_micro_batch_audio_is_validated_against_the_context() -> None:
    assert DataConfig(context_s=10.0, micro_batch_audio_s=0.0).micro_batch_audio_s == 0.0
    assert DataConfig(context_s=10.0, micro_batch_audio_s=10.0).micro_batch_audio_s == 10.0
    for bad in (-1.0, 5.0):
        with pytest.raises(ConfigError, match=r"data\.micro_batch_audio_s.*at least data\.context_s=10\.0"):
            DataConfig(context_s=10.0, micro_batch_audio_s=bad)
    with pytest.raises(ConfigError, match="data.micro_batch_audio_s"):
        preset("tiny").with_overrides(["data.micro_batch_audio_s=3"])


# ---- the authors' make-up: B recordings interleaved ----------------------------------------------------------
def _corpus(n: int = 40) -> list[Recording]:
    """Recordings of 12-95 s (shuffled lengths), a word every second."""
    out = []
    for i in range(n):
        dur = 12.0 + (i * 37) % 84
        out.append(_rec(i, dur, [(f"w{i}_{k}", k + 0.2, k + 0.7) for k in range(int(dur))]))
    return out


def _interleaved(seed: int = 0, **kw) -> WindowStream:
    kw = {"context_s": 20.0, "batch_audio_s": 40.0, "seqlen_warmup": "code", "seqlen_warmup_start_s": 5.0,
          "seqlen_warmup_every": 12, **kw}
    return WindowStream(_corpus(), DataConfig(batching="interleaved", **kw), seed, epochs=2)


def test_group_size_is_one_hour_over_the_window_halving_as_the_window_doubles() -> None:
    code = DataConfig(context_s=3600.0)  # the defaults: one hour per step, warmup from 5.12 s (the code)
    assert [group_size(5.12 * 2**d, code) for d in range(10)] == [704, 352, 176, 88, 44, 22, 11, 5, 2, 1]
    assert group_size(3600.0, code) == 1
    assert group_size(10.24, DataConfig(context_s=10.24, seqlen_warmup="none")) == 352
    assert group_size(10.0, DataConfig(seqlen_warmup="paper", seqlen_warmup_start_s=5.0)) == 360


def test_step_k_holds_window_k_of_each_of_the_groups_recordings() -> None:
    s = _interleaved()
    recs = s.recordings
    steps = list(s.batches())
    assert len(steps) == s.count_steps()
    order0 = [int(i) for i in s.order(0)]
    index, k, seen_groups = 0, 0, 0
    for wins, nxt in steps:
        if nxt.epoch != 0 or index >= len(recs):
            break
        seq = s.seq_len(0, index)
        b = group_size(seq, s.data)
        members = order0[index:index + b]
        expect = [cut_windows(recs[m], m, seq) for m in members]
        assert wins == [w[k] for w in expect if k < len(w)]  # window k of each member still running, in order
        depth = max(len(w) for w in expect)
        if k + 1 < depth:
            assert nxt == Position(0, index, k + 1)
            k += 1
        else:
            assert nxt == Position(0, index + len(members), 0)
            index, k, seen_groups = index + len(members), 0, seen_groups + 1
    assert seen_groups >= 4
    sizes = [len(w) for w, _ in steps]
    assert max(sizes) == 8 and 2 in sizes  # 40 s / 5 s, then halving with the window (40 s / 20 s)


def test_groups_hold_recordings_of_similar_duration_and_every_recording_once_an_epoch(monkeypatch) -> None:
    import asr_core.data.chunking as chunking

    monkeypatch.setattr(chunking, "SUBGROUP", 8)  # the code shuffles within runs of 2000 of ~105k recordings
    s = _interleaved(context_s=5.0)  # groups of 8 throughout
    order = [int(i) for i in s.order(0)]
    assert sorted(order) == list(range(len(s.recordings)))
    spread = [max(s.recordings[i].duration for i in order[j:j + 8]) - min(s.recordings[i].duration
                                                                         for i in order[j:j + 8])
              for j in range(0, len(order), 8)]
    everything = max(r.duration for r in s.recordings) - min(r.duration for r in s.recordings)
    assert max(spread) < everything / 2  # sorted blocks, not a random draw
    assert order != [int(i) for i in s.order(1)] and order != [int(i) for i in _interleaved(seed=1).order(0)]


@pytest.mark.parametrize("cut", [0, 1, 5, 17, 40, -1])
def test_interleaved_stream_resumes_from_any_step(cut: int) -> None:
    full = list(_interleaved(seed=4).batches())
    cut = cut if cut >= 0 else len(full) - 2
    _, pos = full[cut]
    again = list(_interleaved(seed=4).batches(Position.from_dict(pos.to_dict())))
    assert again == full[cut + 1:]
