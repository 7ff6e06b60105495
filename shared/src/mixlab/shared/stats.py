"""Summaries over seeds."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1) of ``values``; the spread of one value is 0."""
    if len(values) == 0:
        raise ValueError("values must hold at least one number")
    spread = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return float(np.mean(values)), spread
