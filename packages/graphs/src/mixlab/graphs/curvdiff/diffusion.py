"""DDPM on the standardized shared tangent space of node latents (spec §1a).

x_v = concat_c log₀^c(z_v^c) ∈ R^d, standardized per dimension on the training set; the masked
node set X ∈ R^{N_max × d} is noised as q(x_t | x_0) = N(√ᾱ_t x_0, (1 − ᾱ_t) I) with the cosine
schedule (Nichol & Dhariwal, 2021), and a node transformer predicts ε (Ho et al., 2020). No
positional encoding: the denoiser is permutation equivariant over nodes. It is conditioned on the
time step, the node count and, optionally, the graph's curvature descriptor c(G) by FiLM, with
classifier-free guidance (Ho & Salimans, 2022): c is dropped with probability 0.1 in training and
ε̂ = (1 + w)·ε(x, c) − w·ε(x, ∅) at sampling.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixlab.shared.diffusion import timestep_embedding
from mixlab.shared.progress_report import progress


def cosine_alpha_bar(steps: int, s: float = 0.008) -> Tensor:
    """ᾱ_t for t = 0..steps (ᾱ_0 = 1), Nichol & Dhariwal's Eq. 17, clipped so β_t ≤ 0.999."""
    t = torch.linspace(0, steps, steps + 1, dtype=torch.float64) / steps
    f = torch.cos((t + s) / (1 + s) * math.pi / 2) ** 2
    alpha_bar = f / f[0]
    betas = (1 - alpha_bar[1:] / alpha_bar[:-1]).clamp(max=0.999)
    return torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(1 - betas, 0)]).float()


class DistanceBiasedLayer(nn.Module):
    """A pre-norm transformer layer whose attention logits get a per-head bias from the pairwise
    squared distance of the noisy latents: the graph lives in those distances (the decoder reads
    nothing else), and plain dot-product attention resolves them poorly. Permutation equivariant."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.distance = nn.Sequential(
            nn.Linear(1, 2 * heads), nn.SiLU(), nn.Linear(2 * heads, heads)
        )
        self.out = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, h: Tensor, squared_distance: Tensor, mask: Tensor) -> Tensor:
        B, N, W = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(B, N, 3, self.heads, W // self.heads).unbind(2)
        bias = self.distance(squared_distance.log1p().unsqueeze(-1)).permute(0, 3, 1, 2)
        bias = bias.masked_fill(~mask[:, None, None, :], float("-inf"))  # (B, heads, N, N)
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias
        )
        h = h + self.out(attended.transpose(1, 2).reshape(B, N, W))
        return h + self.mlp(self.norm2(h))


class NodeDenoiser(nn.Module):
    """ε-prediction over the node set: pre-norm transformer layers, each followed by FiLM
    (γ, β) from the time, node-count and descriptor embedding."""

    def __init__(
        self, dim: int, width: int = 64, layers: int = 3, heads: int = 4, cond_dim: int = 0
    ) -> None:
        super().__init__()
        self.width = width
        self.cond_dim = cond_dim
        self.input = nn.Linear(dim, width)
        self.time = nn.Sequential(nn.Linear(width + 1, width), nn.SiLU(), nn.Linear(width, width))
        self.cond = nn.Linear(cond_dim, width) if cond_dim else None
        self.null_cond = nn.Parameter(torch.zeros(width)) if cond_dim else None
        self.layers = nn.ModuleList(DistanceBiasedLayer(width, heads) for _ in range(layers))
        self.film = nn.ModuleList(nn.Linear(width, 2 * width) for _ in range(layers))
        self.output = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, dim))

    def forward(
        self,
        x: Tensor,
        t: Tensor,
        mask: Tensor,
        cond: Tensor | None = None,
        drop_cond: Tensor | None = None,
    ) -> Tensor:
        """x [B, N, d], t [B] steps, mask [B, N], cond [B, cond_dim] → ε̂ [B, N, d] (0 off mask).

        ``drop_cond`` [B] bool: use the null condition for those graphs (classifier-free)."""
        size = mask.sum(-1, keepdim=True).float() / mask.shape[-1]
        embedding = self.time(torch.cat([timestep_embedding(t, self.width), size], dim=-1))
        if self.cond is not None:
            c = self.cond(cond) if cond is not None else self.null_cond.expand(x.shape[0], -1)
            if drop_cond is not None:
                c = torch.where(drop_cond.unsqueeze(-1), self.null_cond.expand_as(c), c)
            embedding = embedding + c
        h = self.input(x)
        squared_distance = (x.unsqueeze(2) - x.unsqueeze(1)).pow(2).sum(-1)
        for layer, film in zip(self.layers, self.film, strict=True):
            h = layer(h, squared_distance, mask)
            gamma, beta = film(F.silu(embedding)).unsqueeze(1).chunk(2, dim=-1)
            h = h * (1 + gamma) + beta
        return self.output(h) * mask.unsqueeze(-1)


class GaussianDiffusion(nn.Module):
    """The DDPM wrapper: training loss and ancestral sampling over masked node sets."""

    def __init__(self, denoiser: NodeDenoiser, steps: int = 500, cond_dropout: float = 0.1):
        super().__init__()
        self.denoiser = denoiser
        self.steps = steps
        self.cond_dropout = cond_dropout
        self.register_buffer("alpha_bar", cosine_alpha_bar(steps))

    def loss(self, x0: Tensor, mask: Tensor, cond: Tensor | None = None) -> Tensor:
        """Masked ε-MSE at a uniform step t ∈ {1..T}."""
        batch = x0.shape[0]
        t = torch.randint(1, self.steps + 1, (batch,), device=x0.device)
        a = self.alpha_bar[t].view(batch, 1, 1)
        noise = torch.randn_like(x0) * mask.unsqueeze(-1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        drop = None
        if cond is not None:
            drop = torch.rand(batch, device=x0.device) < self.cond_dropout
        predicted = self.denoiser(xt, t, mask, cond, drop)
        error = (predicted - noise).pow(2).sum(-1) * mask
        return error.sum() / (mask.sum() * x0.shape[-1])

    @torch.no_grad()
    def sample(
        self,
        mask: Tensor,
        dim: int,
        cond: Tensor | None = None,
        guidance: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Ancestral DDPM sampling (Ho et al., Eq. 11 with σ_t² = β̃_t) → x_0 [B, N, d]."""
        batch, n = mask.shape
        device = mask.device

        def noise() -> Tensor:
            return torch.randn(batch, n, dim, generator=generator, device=device)

        x = noise() * mask.unsqueeze(-1)
        with progress(self.steps, "sampling steps") as bar:
            for step in range(self.steps, 0, -1):
                t = torch.full((batch,), step, device=device, dtype=torch.long)
                eps = self.denoiser(x, t, mask, cond)
                if cond is not None and guidance != 0:
                    unconditional = self.denoiser(
                        x, t, mask, cond, torch.ones(batch, dtype=torch.bool, device=device)
                    )
                    eps = (1 + guidance) * eps - guidance * unconditional
                a_t, a_prev = self.alpha_bar[step], self.alpha_bar[step - 1]
                alpha = a_t / a_prev
                x0 = ((x - (1 - a_t).sqrt() * eps) / a_t.sqrt()).clamp(-5, 5)
                # the posterior mean q(x_{t-1} | x_t, x_0) (Ho et al., Eq. 7)
                mean = (a_prev.sqrt() * (1 - alpha) * x0 + alpha.sqrt() * (1 - a_prev) * x) / (
                    1 - a_t
                )
                if step > 1:
                    variance = (1 - a_prev) / (1 - a_t) * (1 - alpha)
                    x = mean + variance.sqrt() * noise()
                else:
                    x = mean
                x = x * mask.unsqueeze(-1)
                bar.advance()
        return x
