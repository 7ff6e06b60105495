"""Pieces every diffusion model here shares: the sinusoidal time-step embedding and the EMA of
weights with warm-up."""

from __future__ import annotations

import math

import torch


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10_000) -> torch.Tensor:
    """Sinusoidal embedding (Vaswani et al., 2017; DiT's order, cos then sin) of (possibly
    fractional) time steps ``[batch]`` -> ``[batch, dim]``."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


@torch.no_grad()
def ema_update(ema: torch.nn.Module, model: torch.nn.Module, decay: float, step: int) -> None:
    """ema ← decay·ema + (1 − decay)·model, with diffusers' warm-up decay
    min(decay, (1 + step) / (10 + step)): a fixed 0.999 over a few thousand steps would average
    in the untrained first weights."""
    decay = min(decay, (1 + step) / (10 + step))
    for e, p in zip(ema.parameters(), model.parameters(), strict=True):
        e.lerp_(p, 1 - decay)
