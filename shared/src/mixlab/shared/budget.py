"""Matching baselines to a parameter budget: same budget, fair comparison."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn


def parameter_count(model: nn.Module) -> int:
    """Trainable parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def width_for_budget(build: Callable[[int], nn.Module], budget: int, widths: Sequence[int]) -> int:
    """The width in ``widths`` whose model's parameter count is closest to ``budget`` (counts grow
    with width, so a bisection finds it with a few builds)."""
    low, high = 0, len(widths) - 1
    while low < high:  # the first width whose count reaches the budget
        middle = (low + high) // 2
        if parameter_count(build(widths[middle])) < budget:
            low = middle + 1
        else:
            high = middle
    candidates = [widths[i] for i in (low - 1, low) if 0 <= i < len(widths)]
    return min(candidates, key=lambda width: abs(parameter_count(build(width)) - budget))
