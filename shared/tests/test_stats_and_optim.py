"""Tests of mixlab.shared.stats and mixlab.shared.optim."""

from itertools import pairwise

import pytest
import torch

from mixlab.shared import interleaved_median_seconds, mean_std, warmup_cosine


def test_mean_std_is_the_sample_spread():
    assert mean_std([2.0]) == (2.0, 0.0)
    mean, std = mean_std([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert std == pytest.approx(1.0)  # ddof 1, not the population 0.816
    with pytest.raises(ValueError, match="at least one"):
        mean_std([])


def test_interleaved_timing_alternates_the_order_and_warms_up():
    order = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = interleaved_median_seconds(calls, 3)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then a b / b a / a b
    assert set(times) == {"a", "b"}
    assert all(t >= 0 for t in times.values())
    order.clear()
    interleaved_median_seconds(calls, 1, warmup=False)
    assert order == ["a", "b"]
    with pytest.raises(ValueError, match="repeats must be"):
        interleaved_median_seconds(calls, 0)


def test_warmup_cosine_rises_then_decays_to_zero():
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    schedule = warmup_cosine(optimizer, 100)  # 5 warm-up steps
    rates = []
    for _ in range(100):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert rates[5] == pytest.approx(1.0)
    assert all(a >= b for a, b in pairwise(rates[5:]))
    assert rates[-1] < 1e-3
    with pytest.raises(ValueError, match="steps"):
        warmup_cosine(optimizer, 0)


def test_loglog_slope_fits_positive_points_and_needs_two():
    from mixlab.shared.stats import loglog_slope

    assert abs(loglog_slope([1, 2, 4, 8], [3, 12, 48, 192]) - 2.0) < 1e-9  # y = 3x²
    assert abs(loglog_slope([1, 2, 4], [5, None, 20]) - 1.0) < 1e-9  # None and y <= 0 skipped
    assert loglog_slope([1, 2], [0.0, 4.0]) is None
