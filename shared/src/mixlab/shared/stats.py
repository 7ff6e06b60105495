"""Summaries over seeds, the median wall time of a call (or of several, interleaved), and the
log-log slope of a measured curve."""

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


def cells_by_system(done: Sequence[dict]) -> dict[str, list[dict]]:
    """An experiment's cells grouped by their ``system``, each group in ``seed`` order."""
    out: dict[str, list[dict]] = {}
    for cell in sorted(done, key=lambda c: c["seed"]):
        out.setdefault(cell["system"], []).append(cell)
    return out


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


def interleaved_median_seconds(
    calls: dict[str, Callable[[], object]], repeats: int, *, warmup: bool = True
) -> dict[str, float]:
    """Median wall time of each of ``calls`` over ``repeats`` rounds in which every call runs
    once, the order reversed every other round, so that drift in the machine's speed falls on
    all of them alike (after one warm-up call each unless ``warmup`` is False)."""
    if repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    if warmup:
        for fn in calls.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(repeats):
        for name in calls if r % 2 == 0 else reversed(calls):
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def loglog_slope(xs: Sequence[float], ys: Sequence[float | None]) -> float | None:
    """Least-squares slope of log(y) against log(x) over the points with y > 0 (how a cost grows
    with size: 1 linear, 2 quadratic); None with fewer than 2 such points."""
    points = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None and y > 0]
    if len(points) < 2:
        return None
    logs = np.log(np.array(points, dtype=float))
    return float(np.polyfit(logs[:, 0], logs[:, 1], 1)[0])
