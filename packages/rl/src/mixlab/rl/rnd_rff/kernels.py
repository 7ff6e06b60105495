"""Kernel tools: the exact GP posterior variance a bonus should track, and how to score a bonus.

The kernel analysis (spec §2a): in the NTK regime, with the predictor's kernel ∝ the target's
k_ℓ, the expected RND error is the GP posterior variance
σ²_ℓ(x | X) = k_ℓ(x, x) − k_xX (K_XX + σ_n² I)⁻¹ k_Xx.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from scipy.stats import rankdata, spearmanr

__all__ = ["auroc", "count_correlation", "fpr_at_95", "gp_posterior_variance", "rbf_kernel"]


def rbf_kernel(bandwidth: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """k_ℓ(x, y) = exp(−‖x − y‖²/(2ℓ²)) as a function of two row sets."""
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth!r}")
    return lambda x, y: torch.exp(-torch.cdist(x, y).square() / (2 * bandwidth**2))


def gp_posterior_variance(
    kernel: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    train: np.ndarray | torch.Tensor,
    query: np.ndarray | torch.Tensor,
    noise: float = 1e-3,
) -> np.ndarray:
    """σ²(x | X) for each query row by a Cholesky solve of K_XX + ``noise``·I (float64).

    ``kernel`` takes two [n, d] tensors (an :class:`~.targets.RFFTarget`'s ``.kernel`` or
    :func:`rbf_kernel`). Cost O(n³): use at most a few thousand training rows."""
    if not noise > 0:
        raise ValueError(f"noise must be > 0 (it keeps K_XX invertible), got {noise!r}")
    x = torch.as_tensor(np.asarray(train), dtype=torch.float64).reshape(len(train), -1)
    q = torch.as_tensor(np.asarray(query), dtype=torch.float64).reshape(len(query), -1)
    gram = kernel(x, x).double() + noise * torch.eye(len(x), dtype=torch.float64)
    chol = torch.linalg.cholesky(gram)
    cross = kernel(x, q).double()  # [n, m]
    solved = torch.cholesky_solve(cross, chol)
    prior = torch.diagonal(kernel(q[:1], q[:1])).double()  # stationary kernels: k(x, x) constant
    variance = prior - (cross * solved).sum(0)
    return variance.clamp(min=0).numpy()


def auroc(inside: np.ndarray, outside: np.ndarray) -> float:
    """P(bonus(outside) > bonus(inside)), ties counting ½: the AUROC of the bonus as a detector
    of ``outside`` points (Mann–Whitney U)."""
    inside, outside = np.asarray(inside, np.float64), np.asarray(outside, np.float64)
    if not len(inside) or not len(outside):
        raise ValueError("inside and outside must both hold at least one score")
    ranks = rankdata(np.concatenate([inside, outside]))  # ties get their average rank
    u = ranks[len(inside) :].sum() - len(outside) * (len(outside) + 1) / 2
    return float(u / (len(inside) * len(outside)))


def fpr_at_95(inside: np.ndarray, outside: np.ndarray) -> float:
    """The share of ``inside`` points flagged when the threshold flags 95 % of ``outside``."""
    threshold = np.quantile(np.asarray(outside, np.float64), 0.05)
    return float((np.asarray(inside, np.float64) >= threshold).mean())


def count_correlation(bonus: np.ndarray, counts: np.ndarray) -> float:
    """Spearman correlation of a bonus with 1/√count over states seen at least once."""
    bonus, counts = np.asarray(bonus, np.float64), np.asarray(counts, np.float64)
    seen = counts > 0
    if seen.sum() < 3:
        raise ValueError("count_correlation needs at least 3 visited states")
    return float(spearmanr(bonus[seen], 1 / np.sqrt(counts[seen])).statistic)
