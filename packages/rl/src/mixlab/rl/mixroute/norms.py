"""Normalisations for node embeddings [B, N, d] of routing instances, and MixNorm.

POMO normalises over the nodes of each instance (instance norm), the Attention Model over the
batch (batch norm), RL4CO's "layer" option over the nodes × channels of each instance. MixNorm
(a reconstruction, Switchable-Normalization style; Luo et al. ICLR 2019) mixes the three
statistics with learned softmax weights per layer, means and variances separately:

    μ = Σ_k w_k μ_k,   σ² = Σ_k w′_k σ²_k,   k ∈ {instance, node (per-node layer), batch}
    MixNorm(H) = γ ⊙ (H − μ) / √(σ² + ε) + β

with w = softmax(λ), w′ = softmax(λ′), and running batch statistics at evaluation. The adaptive
variant conditions the weights on the instance: λ + g([mean_n H_b; std_n H_b]), g a 2-layer MLP
whose last layer starts at zero (so it starts as the static mix). The fixed variant
(``mixnorm-fixed``) keeps λ = λ′ = 0, an equal-weight blend of the three statistics: everything
MixNorm has but the learned mixing, the control of the claims about it.
"""

from __future__ import annotations

import torch
from torch import nn

from mixlab.shared.checks import check_count

NORMS = ("instance", "batch", "layer", "mixnorm", "mixnorm-adaptive", "mixnorm-fixed", "none")
SOURCES = ("instance", "node", "batch")
"""MixNorm's three statistics, in the order of its weights"""

__all__ = [
    "NORMS",
    "SOURCES",
    "BatchNorm",
    "InstanceNorm",
    "LayerNormRL4CO",
    "MixNorm",
    "make_norm",
]


def _check_input(h: torch.Tensor, dim: int) -> None:
    if h.ndim != 3 or h.shape[-1] != dim:
        raise ValueError(f"embeddings must have shape [batch, nodes, {dim}], got {list(h.shape)}")


class InstanceNorm(nn.Module):
    """POMO's: statistics over the nodes of each instance and channel, affine."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim, self.norm = dim, nn.InstanceNorm1d(dim, affine=True, track_running_stats=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        _check_input(h, self.dim)
        return self.norm(h.transpose(1, 2)).transpose(1, 2)


class BatchNorm(nn.Module):
    """The Attention Model's: statistics over batch × nodes per channel, running at evaluation."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim, self.norm = dim, nn.BatchNorm1d(dim, affine=True)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        _check_input(h, self.dim)
        return self.norm(h.reshape(-1, self.dim)).reshape(h.shape)


class LayerNormRL4CO(nn.Module):
    """RL4CO's "layer": statistics over nodes × channels of each instance, no affine (not
    ``nn.LayerNorm``, which normalises each node on its own)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        _check_input(h, self.dim)
        mean = h.mean(dim=(1, 2), keepdim=True)
        var = h.var(dim=(1, 2), keepdim=True, unbiased=False)
        return (h - mean) / torch.sqrt(var + self.eps)


class MixNorm(nn.Module):
    """Mix Normalization (see the module docstring). ``adaptive=True`` gives instance-conditioned
    weights; ``learn_weights=False`` freezes the mixing logits at zero (weights 1/3: the
    equal-weight blend). :meth:`weights` returns the current mixing weights for logging."""

    LOGITS = ("mean_logits", "var_logits")
    """the names of the static mixing logits λ, λ′ (an optimiser may give them their own step)"""

    def __init__(
        self,
        dim: int,
        *,
        adaptive: bool = False,
        learn_weights: bool = True,
        momentum: float = 0.1,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        check_count(dim, "dim")
        if not 0 < momentum <= 1:
            raise ValueError(f"momentum must be a number in (0, 1], got {momentum!r}")
        if adaptive and not learn_weights:
            raise ValueError("adaptive=True needs learn_weights=True (the gate learns the mix)")
        self.dim, self.momentum, self.eps = dim, momentum, eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        for name in self.LOGITS:
            logits = torch.zeros(len(SOURCES))
            if learn_weights:
                self.register_parameter(name, nn.Parameter(logits))
            else:  # a buffer: saved with the model, never trained
                self.register_buffer(name, logits)
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))
        self.gate = None
        if adaptive:
            self.gate = nn.Sequential(
                nn.Linear(2 * dim, dim), nn.ReLU(), nn.Linear(dim, 2 * len(SOURCES))
            )
            nn.init.zeros_(self.gate[-1].weight)
            nn.init.zeros_(self.gate[-1].bias)

    def _logits(self, h: torch.Tensor, mean_in: torch.Tensor, var_in: torch.Tensor):
        """Mean and variance logits, [B, 3] each (the static ones broadcast)."""
        mean_logits = self.mean_logits.expand(len(h), -1)
        var_logits = self.var_logits.expand(len(h), -1)
        if self.gate is not None:
            shift = self.gate(torch.cat([mean_in[:, 0], var_in[:, 0].add(self.eps).sqrt()], dim=-1))
            mean_logits = mean_logits + shift[:, : len(SOURCES)]
            var_logits = var_logits + shift[:, len(SOURCES) :]
        return mean_logits, var_logits

    def weights(self, h: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """``{"mean": [.., 3], "var": [.., 3]}`` softmax weights over ``SOURCES`` (per instance
        of ``h`` for the adaptive variant)."""
        if self.gate is None or h is None:
            return {"mean": self.mean_logits.softmax(-1), "var": self.var_logits.softmax(-1)}
        mean_in, var_in = h.mean(1, keepdim=True), h.var(1, keepdim=True, unbiased=False)
        mean_logits, var_logits = self._logits(h, mean_in, var_in)
        return {"mean": mean_logits.softmax(-1), "var": var_logits.softmax(-1)}

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        _check_input(h, self.dim)
        mean_in = h.mean(1, keepdim=True)  # [B, 1, d]: over nodes
        var_in = h.var(1, keepdim=True, unbiased=False)
        mean_node = h.mean(2, keepdim=True)  # [B, N, 1]: over channels
        var_node = h.var(2, keepdim=True, unbiased=False)
        if self.training:
            mean_batch = h.mean(dim=(0, 1))  # [d]: over batch × nodes
            var_batch = h.var(dim=(0, 1), unbiased=False)
            with torch.no_grad():
                count = h.shape[0] * h.shape[1]
                unbiased = var_batch * count / max(count - 1, 1)
                self.running_mean.lerp_(mean_batch, self.momentum)
                self.running_var.lerp_(unbiased, self.momentum)
        else:
            mean_batch, var_batch = self.running_mean, self.running_var
        mean_logits, var_logits = self._logits(h, mean_in, var_in)
        w, v = mean_logits.softmax(-1)[:, None, None, :], var_logits.softmax(-1)[:, None, None, :]
        mean = w[..., 0] * mean_in + w[..., 1] * mean_node + w[..., 2] * mean_batch
        var = v[..., 0] * var_in + v[..., 1] * var_node + v[..., 2] * var_batch
        return (h - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias

    def extra_repr(self) -> str:
        learned = isinstance(self.mean_logits, nn.Parameter)
        return (
            f"{self.dim}, adaptive={self.gate is not None}, learn_weights={learned}, "
            f"sources={list(SOURCES)}"
        )


def make_norm(kind: str, dim: int) -> nn.Module:
    """A normalisation of :data:`NORMS` for [B, N, ``dim``] embeddings."""
    if kind not in NORMS:
        raise ValueError(f"norm must be one of {list(NORMS)}, got {kind!r}")
    if kind == "none":
        return nn.Identity()
    if kind.startswith("mixnorm"):
        return MixNorm(
            dim, adaptive=kind == "mixnorm-adaptive", learn_weights=kind != "mixnorm-fixed"
        )
    return {"instance": InstanceNorm, "batch": BatchNorm, "layer": LayerNormRL4CO}[kind](dim)
