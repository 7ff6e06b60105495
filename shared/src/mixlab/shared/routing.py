"""What mixture-of-experts routers share: top-k selection and Switch's load-balancing loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def keep_top_k(weights: torch.Tensor, k: int, *, renormalise: bool = True) -> torch.Tensor:
    """``weights`` ``[..., n]`` with all but the ``k`` largest of each row set to 0; renormalised
    to sum to 1 unless ``renormalise`` is False (Switch's top-1 keeps the router's probability, so
    the router still gets a gradient)."""
    if k >= weights.shape[-1]:
        return weights
    kept = weights * torch.zeros_like(weights).scatter(-1, weights.topk(k, -1).indices, 1.0)
    return kept / kept.sum(-1, keepdim=True) if renormalise else kept


def switch_balance_loss(weights: torch.Tensor) -> torch.Tensor:
    """Switch Transformer's load-balancing loss n·Σ_i f_i·P_i over the rows of ``weights``
    ``[rows, n]`` (f_i: the share of rows whose largest weight is i; P_i: the mean weight of i);
    1 when balanced, n when one choice takes everything."""
    n = weights.shape[-1]
    share = F.one_hot(weights.argmax(-1), n).float().mean(0)
    return n * (share * weights.mean(0)).sum()
