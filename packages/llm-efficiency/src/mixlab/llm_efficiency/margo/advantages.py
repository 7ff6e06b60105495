"""MARGO's advantage (reconstructed from the abstract; see the seed card): GRPO inside a mixed
group of thinking and direct rollouts, plus a same-model reference term for thinking rollouts.

For a group of G rollouts of one prompt with rewards r, mean μ and std σ over the whole group,
and μ_d the mean reward of its direct rollouts::

    direct i:              A_i = (r_i − μ) / σ                                  (GRPO)
    thinking i:            A_i = (r_i − μ) / σ + λ (r_i − μ_d) / σ              (two-sided)
    thinking i, one-sided: A_i = (r_i − μ) / σ + λ min(0, r_i − μ_d) / σ

A thinking rollout that is wrong where the same model answers right without thinking is
penalised beyond GRPO (thinking overturned a correct answer); where the direct answers fail too,
the extra term vanishes (one-sided) or rewards the thinking that recovered the answer
(two-sided). With λ = 0 this is GRPO on the mixed group, exactly as TRL computes it.
"""

from __future__ import annotations

import math
import numbers

import torch

from mixlab.shared import require

__all__ = ["SCALES", "margo_advantages", "nanstd"]

SCALES = ("group", "batch", "none")
"""how rewards are scaled, as TRL's ``scale_rewards``"""
EPS = 1e-4
"""added to σ, as TRL does"""


def nanstd(values: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """The standard deviation with Bessel's correction, NaNs left out (TRL's definition: NaN
    where fewer than two values)."""
    mean = torch.nanmean(values, dim=dim, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(values)).sum(dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, math.nan))
    std = (variance * correction).sqrt()
    return std if keepdim else (std.squeeze(dim) if dim is not None else std.reshape(()))


def margo_advantages(
    rewards: torch.Tensor,
    direct: torch.Tensor,
    num_generations: int,
    lam: float,
    one_sided: bool = False,
    *,
    scale: str = "group",
    missing_direct: str = "grpo",
) -> torch.Tensor:
    """MARGO advantages of ``rewards`` ``[N]`` (N a multiple of ``num_generations``; each run of
    ``num_generations`` consecutive rows is one prompt's group). ``direct``: ``[N]`` bool, which
    rows are direct rollouts. NaN rewards (unscorable) stay out of every mean and get advantage
    0, as in TRL. ``scale``: σ per ``group`` (TRL's default), over the ``batch``, or ``none``.
    A group without a scored direct rollout gets GRPO advantages (``missing_direct="grpo"``) or
    raises (``"error"``) when λ ≠ 0."""
    require(
        isinstance(num_generations, int) and not isinstance(num_generations, bool)
        and num_generations >= 1,
        "num_generations",
        "an integer >= 1",
        num_generations,
    )  # fmt: skip
    require(
        isinstance(lam, numbers.Real) and math.isfinite(lam) and lam >= 0,
        "lam",
        "a finite number >= 0",
        lam,
    )
    require(scale in SCALES, "scale", f"one of {SCALES}", scale)
    require(
        missing_direct in ("grpo", "error"), "missing_direct", "'grpo' or 'error'", missing_direct
    )
    require(
        rewards.dim() == 1 and len(rewards) % num_generations == 0,
        "rewards",
        f"a 1-D tensor whose length is a multiple of num_generations ({num_generations})",
        tuple(rewards.shape),
    )
    require(
        direct.shape == rewards.shape, "direct", f"a mask of shape {tuple(rewards.shape)}",
        tuple(direct.shape),
    )  # fmt: skip
    r = rewards.float().view(-1, num_generations)
    is_direct = direct.bool().view(-1, num_generations)
    mean = torch.nanmean(r, dim=1, keepdim=True)
    if scale == "group":
        std = nanstd(r, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean)
    elif scale == "batch":
        std = nanstd(r.flatten()).expand_as(mean) if r.numel() > 1 else torch.zeros_like(mean)
    advantages = r - mean
    scored_direct = is_direct & ~torch.isnan(r)
    count = scored_direct.sum(dim=1, keepdim=True)
    if lam != 0:
        if missing_direct == "error" and bool((count == 0).any()):
            raise ValueError(
                f"{int((count == 0).sum())} group(s) have no scored direct rollout to take the "
                "reference mean from (missing_direct='error'; 'grpo' falls back to GRPO there)"
            )
        mean_direct = torch.where(scored_direct, r, 0.0).sum(1, keepdim=True) / count.clamp(min=1)
        extra = r - mean_direct
        if one_sided:
            extra = extra.clamp(max=0.0)
        advantages = advantages + lam * torch.where(~is_direct & (count > 0), extra, 0.0)
    if scale != "none":
        advantages = advantages / (std + EPS)
    return torch.nan_to_num(advantages, nan=0.0).flatten()
