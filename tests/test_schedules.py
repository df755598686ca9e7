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
