"""MoA³: Mixture of Attribute-Aware Attention (spec §5a, reconstructed).

Multi-head attention whose H heads form ``shared_heads`` always-on heads and G attribute groups
of (H − shared_heads)/G heads. A router on the modification text's pooled embedding (or, with
``per_token``, on each token) gives w = softmax(W_r·e / T) ∈ Δ^G, optionally keeping the top-k
groups; the output is

    y = Concat(shared heads)·W_O^s + Σ_g w_g · Concat(heads ∈ g)·W_O^g,

Mixture-of-Head attention's head routing (SkyworkAI/MoH) with softmax weights per group. W_O^g
are the row blocks of one output projection, so scaling each head by its group's weight before a
single W_O is the same sum. With one group, no shared heads and no router, MoA³ is standard
multi-head attention (``nn.MultiheadAttention``'s packed in-projection layout). Top-k zeroes the
other groups' heads but still computes them: the heads are batched into one SDPA call, and at
these sizes skipping them saves less than the gather would cost.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mixlab.shared.routing import keep_top_k, switch_balance_loss

__all__ = ["MoA3Attention", "MoA3Block", "balance_loss", "routing_statistics"]


class MoA3Attention(nn.Module):
    """Self-attention over ``[B, L, dim]`` tokens with heads routed in attribute groups.

    ``groups=1, shared_heads=0, routed=False`` is dense multi-head attention (the baseline);
    ``route_dim`` is the width of the router's input (default ``dim``; with ``per_token`` the
    router reads each token and ``route_dim`` must equal ``dim``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        groups: int = 4,
        shared_heads: int = 0,
        *,
        routed: bool = True,
        route_dim: int | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        per_token: bool = False,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"num_heads must divide dim = {dim}, got {num_heads}")
        if not 0 <= shared_heads < num_heads or (num_heads - shared_heads) % groups:
            raise ValueError(
                f"num_heads − shared_heads must split into groups = {groups} equal groups, got "
                f"num_heads = {num_heads}, shared_heads = {shared_heads}"
            )
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        if top_k is not None and not 1 <= top_k <= groups:
            raise ValueError(f"top_k must be in [1, groups = {groups}] or None, got {top_k!r}")
        if per_token and route_dim not in (None, dim):
            raise ValueError(f"route_dim must equal dim = {dim} with per_token, got {route_dim}")
        self.dim, self.num_heads, self.groups = dim, num_heads, groups
        self.shared_heads, self.temperature, self.top_k = shared_heads, temperature, top_k
        self.per_token = per_token
        self.in_proj = nn.Linear(dim, 3 * dim)  # q, k, v packed as nn.MultiheadAttention's
        self.out_proj = nn.Linear(dim, dim)
        self.router = nn.Linear(route_dim or dim, groups) if routed and groups > 1 else None

    def route(self, x: torch.Tensor, route: torch.Tensor | None) -> torch.Tensor:
        """Group weights, ``[B, G]`` (``[B, L, G]`` per token): each row sums to 1, or, with
        no router, every group at full weight 1."""
        batch, length, _ = x.shape
        if self.router is None:
            return x.new_ones(
                (batch, length, self.groups) if self.per_token else (batch, self.groups)
            )
        source = x if self.per_token else route
        if source is None:
            raise ValueError("route (the modification text's pooled embedding) is required")
        weights = torch.softmax(self.router(source) / self.temperature, -1)
        return weights if self.top_k is None else keep_top_k(weights, self.top_k)

    def forward(
        self,
        x: torch.Tensor,
        route: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(``[B, L, dim]`` output, group weights); ``key_padding_mask`` ``[B, L]`` is True
        where a key is padding."""
        batch, length, _ = x.shape
        head_dim = self.dim // self.num_heads
        q, k, v = self.in_proj(x).view(batch, length, 3, self.num_heads, head_dim).permute(2, 0, 3, 1, 4)  # fmt: skip
        mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, H, L, d_h]
        weights = self.route(x, route)
        per_head = weights.repeat_interleave(
            (self.num_heads - self.shared_heads) // self.groups, -1
        )
        per_head = torch.cat([per_head.new_ones(*per_head.shape[:-1], self.shared_heads), per_head], -1)  # fmt: skip
        scale = per_head[:, :, None, None] if per_head.ndim == 2 else per_head.transpose(1, 2)[..., None]  # fmt: skip
        y = (heads * scale).transpose(1, 2).reshape(batch, length, self.dim)
        return self.out_proj(y), weights


class MoA3Block(nn.Module):
    """Pre-norm transformer block with MoA³ attention and a GELU feed-forward."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 2.0, **attention) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention = MoA3Attention(dim, num_heads, **attention)
        hidden = math.ceil(mlp_ratio * dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x, route=None, key_padding_mask=None):
        y, weights = self.attention(self.norm1(x), route, key_padding_mask)
        x = x + y
        return x + self.mlp(self.norm2(x)), weights


def balance_loss(weights: torch.Tensor) -> torch.Tensor:
    """Switch's load balance over the router's rows (1 when balanced, G when one group takes
    every query)."""
    return switch_balance_loss(weights.reshape(-1, weights.shape[-1]))


@torch.no_grad()
def routing_statistics(weights: torch.Tensor) -> dict[str, list[float] | float]:
    """Mean weight per group, the share of rows whose top group is each group, and the mean
    entropy of the weights (nats)."""
    rows = weights.reshape(-1, weights.shape[-1]).float()
    groups = rows.shape[-1]
    top = torch.bincount(rows.argmax(-1), minlength=groups).float() / len(rows)
    entropy = -(rows.clamp_min(1e-12).log() * rows).sum(-1).mean()
    return {
        "mean_weight": rows.mean(0).tolist(),
        "top_share": top.tolist(),
        "entropy": float(entropy),
    }
