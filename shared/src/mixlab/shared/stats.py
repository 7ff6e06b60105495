"""Summaries over seeds, and the median wall time of a call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1) of ``values``; the spread of one value is 0."""
    if len(values) == 0:
        raise ValueError("values must hold at least one number")
    spread = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return float(np.mean(values)), spread


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn`` after one warm-up call (benchmarks)."""
    if repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
