"""A DiGress-style discrete diffusion baseline on edges (Vignac et al., ICLR 2023).

Each node pair carries a class e ∈ {no edge, edge}. The forward process uses DiGress's marginal
transitions: Q̄_t = ᾱ_t I + (1 − ᾱ_t) 1 mᵀ, with m the training edge density, so
q(e_t | e_0) = ᾱ_t e_0 + (1 − ᾱ_t) m. A graph transformer predicts p(e_0 | G_t) and sampling draws
e_{t−1} from Σ_{e_0} q(e_{t−1} | e_t, e_0) p̂(e_0 | G_t) (their Eq. 4), symmetrically. Node input
is the noisy degree and random-walk encoding (DiGress's "extra features" are cycle counts and
spectra; the random-walk returns carry the same cycle information). Plain graphs only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixlab.graphs.curvdiff.diffusion import cosine_alpha_bar
from mixlab.graphs.curvdiff.latent import WALK_STEPS, random_walk_encoding
from mixlab.shared.diffusion import timestep_embedding
from mixlab.shared.progress_report import progress


class EdgeTransformerLayer(nn.Module):
    """Node attention with an additive edge bias per head, then an edge update from both ends
    (the node-edge coupling of DiGress's graph transformer, simplified)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.edge_bias = nn.Linear(width, heads)
        self.out = nn.Linear(width, width)
        self.node_mlp = nn.Sequential(
            nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.SiLU(), nn.Linear(2 * width, width)
        )
        self.edge_mlp = nn.Sequential(
            nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.SiLU(), nn.Linear(2 * width, width)
        )

    def forward(self, h: Tensor, e: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        B, N, W = h.shape
        q, k, v = self.qkv(self.norm(h)).view(B, N, 3, self.heads, W // self.heads).unbind(2)
        scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(W // self.heads)
        scores = scores + self.edge_bias(e).permute(0, 3, 1, 2)  # (B, heads, N, N)
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        attention = scores.softmax(-1)
        h = h + self.out(torch.einsum("bhij,bjhd->bihd", attention, v).reshape(B, N, W))
        h = h + self.node_mlp(h)
        e = e + self.edge_mlp(e + h.unsqueeze(1) + h.unsqueeze(2))
        return h, e


class EdgeDenoiser(nn.Module):
    """G_t → logits of p(e_0 = edge | G_t), [B, N, N], symmetric."""

    def __init__(self, width: int = 32, layers: int = 3, heads: int = 4) -> None:
        super().__init__()
        self.width = width
        self.node_input = nn.Linear(1 + WALK_STEPS, width)
        self.edge_input = nn.Embedding(2, width)
        self.time = nn.Sequential(nn.Linear(width + 1, width), nn.SiLU(), nn.Linear(width, width))
        self.layers = nn.ModuleList(EdgeTransformerLayer(width, heads) for _ in range(layers))
        self.output = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 1))

    def forward(self, adjacency: Tensor, t: Tensor, mask: Tensor) -> Tensor:
        degree = adjacency.sum(-1, keepdim=True) / mask.shape[-1]
        nodes = torch.cat([degree, random_walk_encoding(adjacency)], dim=-1)
        size = mask.sum(-1, keepdim=True).float() / mask.shape[-1]
        time = self.time(torch.cat([timestep_embedding(t, self.width), size], dim=-1))
        h = self.node_input(nodes) + time.unsqueeze(1)
        e = self.edge_input(adjacency.long())
        for layer in self.layers:
            h, e = layer(h, e, mask)
        logits = self.output(e).squeeze(-1)
        return (logits + logits.transpose(1, 2)) / 2


class DiscreteEdgeDiffusion(nn.Module):
    """Marginal-transition discrete diffusion over the edges of masked dense graphs."""

    def __init__(self, denoiser: EdgeDenoiser, density: float, steps: int = 500) -> None:
        super().__init__()
        self.denoiser = denoiser
        self.steps = steps
        self.register_buffer("alpha_bar", cosine_alpha_bar(steps))
        self.register_buffer("density", torch.tensor(float(density)))

    def _pairs(self, mask: Tensor) -> Tensor:
        n = mask.shape[-1]
        pairs = mask.unsqueeze(-1) & mask.unsqueeze(-2)
        return pairs & torch.triu(torch.ones(n, n, dtype=torch.bool, device=mask.device), 1)

    def _symmetric_bernoulli(self, p: Tensor, mask: Tensor, generator=None) -> Tensor:
        upper = (torch.rand(p.shape, generator=generator, device=p.device) < p).float()
        upper = upper * self._pairs(mask)
        return upper + upper.transpose(1, 2)

    def loss(self, adjacency: Tensor, mask: Tensor) -> Tensor:
        """Cross-entropy of p̂(e_0 | G_t) on the real node pairs, t uniform in {1..T}."""
        batch = adjacency.shape[0]
        t = torch.randint(1, self.steps + 1, (batch,), device=adjacency.device)
        a = self.alpha_bar[t].view(batch, 1, 1)
        noisy = self._symmetric_bernoulli(a * adjacency + (1 - a) * self.density, mask)
        logits = self.denoiser(noisy, t, mask)
        pairs = self._pairs(mask)
        return F.binary_cross_entropy_with_logits(logits[pairs], adjacency[pairs])

    @torch.no_grad()
    def sample(self, mask: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Ancestral sampling from the marginal prior → [B, N, N] symmetric 0/1, empty diagonal."""
        batch = mask.shape[0]
        m = self.density
        e = self._symmetric_bernoulli(m.expand(mask.shape + mask.shape[-1:]), mask, generator)
        with progress(self.steps, "sampling steps") as bar:
            for step in range(self.steps, 0, -1):
                t = torch.full((batch,), step, device=mask.device, dtype=torch.long)
                p0 = self.denoiser(e, t, mask).sigmoid()
                a_t, a_prev = self.alpha_bar[step], self.alpha_bar[step - 1]
                alpha = a_t / a_prev  # the one-step Q_t = α I + (1 − α) 1 mᵀ
                # q(e_t | e_{t−1} = k) for the observed e_t, k ∈ {0, 1}
                like1 = torch.where(e > 0, alpha + (1 - alpha) * m, (1 - alpha) * (1 - m))
                like0 = torch.where(e > 0, (1 - alpha) * m, alpha + (1 - alpha) * (1 - m))
                # q(e_{t−1} = 1 | e_0) marginalised over p̂(e_0): ᾱ_{t−1} p̂ + (1 − ᾱ_{t−1}) m
                prior1 = a_prev * p0 + (1 - a_prev) * m
                posterior1 = (
                    like1 * prior1 / (like1 * prior1 + like0 * (1 - prior1)).clamp_min(1e-12)
                )
                e = self._symmetric_bernoulli(posterior1, mask, generator)
                bar.advance()
        return e
