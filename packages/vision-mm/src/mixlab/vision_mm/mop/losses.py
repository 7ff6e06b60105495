"""MoP-X's training losses and the probe-collapse diagnostics (reconstruction, spec §4a, §4c).

With z_k^{(m)} the output of probe k on modality m and z̄_k its mean over the T query tokens:

- alignment (cross-modal transfer): L_x = mean_k [1 − cos(z̄_k^{(a)}, sg(z̄_k^{(b)}))], the paired
  privileged modality b as a stop-gradient target;
- disentanglement: L_dis = 1/(K(K−1)) Σ_{k≠k'} cos²(z̄_k, z̄_k') (per sample, then averaged) plus
  the variance hinge Σ_k mean_d max(0, γ − std_batch(z̄_k)) (VICReg's), so probes neither copy
  each other nor collapse to constants;
- MoP-X's loss: Σ_m L_task(m alone) + λ_x·L_x + λ_d·L_dis.

Diagnostics: the mean pairwise probe cosine, the effective rank (participation ratio
(Σσ²)²/Σσ⁴ of the K × D matrix of batch-mean probe outputs: K for orthogonal probes of equal norm,
1 for rank one) and the router's entropy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mixlab.shared.checks import check_number

__all__ = [
    "MoPXLoss",
    "alignment_loss",
    "disentanglement_loss",
    "participation_ratio",
    "probe_cosine",
    "probe_diagnostics",
    "variance_hinge",
]


def _pooled(probes: torch.Tensor) -> torch.Tensor:
    """[B, K, D] from probe outputs [B, K, T, D] (already pooled inputs pass through)."""
    if probes.dim() == 4:
        return probes.mean(2)
    if probes.dim() != 3:
        raise ValueError(
            f"probe outputs must be [batch, probes, tokens, dim] or [batch, probes, dim], got {list(probes.shape)}"
        )
    return probes


def probe_cosine(probes: torch.Tensor, *, squared: bool = False) -> torch.Tensor:
    """Mean over samples and probe pairs k ≠ k' of cos(z̄_k, z̄_k') (or cos²)."""
    z = F.normalize(_pooled(probes), dim=-1)
    k = z.shape[1]
    if k < 2:
        return z.new_zeros(())
    cos = z @ z.transpose(1, 2)  # [B, K, K]
    off = ~torch.eye(k, dtype=torch.bool, device=z.device)
    values = cos[:, off]
    return (values.square() if squared else values).mean()


def variance_hinge(probes: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Σ_k mean_d max(0, γ − std over the batch of z̄_k) (0 for a batch of one)."""
    z = _pooled(probes)
    if len(z) < 2:
        return z.new_zeros(())
    std = torch.sqrt(z.var(0) + 1e-4)  # [K, D]
    return F.relu(gamma - std).mean(-1).sum()


def disentanglement_loss(
    probes: torch.Tensor, gamma: float = 1.0, hinge: bool = True
) -> torch.Tensor:
    """L_dis: mean cos² between different probes, plus the variance hinge when ``hinge``."""
    loss = probe_cosine(probes, squared=True)
    return loss + variance_hinge(probes, gamma) if hinge else loss


def alignment_loss(
    probes: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """mean_k [1 − cos(z̄_k, sg(target z̄_k))] over the samples of ``mask`` (default all):
    ``target`` (the paired modality's probes) gets no gradient."""
    z, t = _pooled(probes), _pooled(target).detach()
    distance = 1 - F.cosine_similarity(z, t, dim=-1)  # [B, K]
    if mask is None:
        return distance.mean()
    return distance[mask].mean() if mask.any() else distance.sum() * 0


def participation_ratio(matrix: torch.Tensor) -> torch.Tensor:
    """(Σσ²)² / Σσ⁴ of ``matrix``'s singular values: K for K orthonormal rows, 1 for rank one."""
    s2 = torch.linalg.svdvals(matrix.double()).square()
    return (s2.sum().square() / s2.square().sum().clamp_min(1e-30)).to(matrix.dtype)


@torch.no_grad()
def probe_diagnostics(
    probes: torch.Tensor, weights: torch.Tensor | None = None
) -> dict[str, float]:
    """Mean pairwise probe cosine, the effective rank of the batch-mean probe outputs [K, D]
    (centred across probes, so a shared offset does not count as a direction) and the router's
    mean entropy in nats."""
    z = _pooled(probes)
    means = z.mean(0)
    out = {
        "probe_cosine": float(probe_cosine(z)),
        "effective_rank": float(participation_ratio(means - means.mean(0))),
    }
    if weights is not None:
        p = weights.clamp_min(1e-12)
        out["router_entropy"] = float(-(p * p.log()).sum(-1).mean())
    return out


@dataclass
class MoPXLoss:
    """λ_x·alignment of each modality's probes to its paired modality's (stop-gradient) and
    λ_d·L_dis, added to the task losses of every modality alone."""

    lambda_x: float = 1.0
    lambda_d: float = 0.1
    gamma: float = 1.0
    aligned: tuple[int, ...] | None = None
    """the probes aligned (indices; ``None``: all). Aligning every probe to a modality that
    lacks something (depth has no colour) pulls that information out of the deployed one's
    probes; leaving some probes free keeps it."""

    def __post_init__(self) -> None:
        for name in ("lambda_x", "lambda_d", "gamma"):
            value = getattr(self, name)
            check_number(
                value, name, isinstance(value, int | float) and value >= 0, "a finite number >= 0"
            )

    def __call__(
        self, task_losses: dict[str, torch.Tensor], probes: dict[str, torch.Tensor],
        pairs: tuple[tuple[str, str], ...] = (), present: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
        """``task_losses`` and ``probes`` per modality (paired samples in the same order);
        ``pairs``: (student, teacher) modalities aligned, e.g. (("rgb", "depth"),); ``present``:
        per modality, the samples that have it (default all)."""
        total = sum(task_losses.values())
        logs = {f"task/{m}": float(v.detach()) for m, v in task_losses.items()}
        pairs = tuple((a, b) for a, b in pairs if a in probes and b in probes)
        if self.lambda_x and pairs:
            keep = slice(None) if self.aligned is None else list(self.aligned)
            both = {(a, b): None if present is None else present[a] & present[b] for a, b in pairs}
            align = sum(
                alignment_loss(probes[a][:, keep], probes[b][:, keep], both[(a, b)])
                for a, b in pairs
            ) / len(pairs)
            total = total + self.lambda_x * align
            logs["align"] = float(align.detach())
        if self.lambda_d:
            dis = sum(
                disentanglement_loss(z if present is None else z[present[m]], self.gamma)
                for m, z in probes.items()
            ) / len(probes)
            total = total + self.lambda_d * dis
            logs["dis"] = float(dis.detach())
        return total, logs
