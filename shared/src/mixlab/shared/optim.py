"""Learning-rate schedules the methods' training loops share."""

from __future__ import annotations

import math

import torch


def warmup_cosine(
    optimizer: torch.optim.Optimizer, steps: int, warmup_divisor: int = 20
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over the first 1/``warmup_divisor`` of ``steps`` (at least one step),
    then cosine decay to 0; call ``.step()`` once per optimiser step."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    warmup = max(1, steps // warmup_divisor)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
