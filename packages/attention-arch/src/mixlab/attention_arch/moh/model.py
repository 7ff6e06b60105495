"""MoH: the timestep-routed block and the diffusion backbone, in diffusers' idiom.

The paper was not found; this is the spec's reconstruction (``shared/specs/attention-vision.md``
§2a) on published backbones: DiT's patchify, timestep embedder, adaLN-Zero and final layer; Vim/DiM
bidirectional Mamba in place of attention; ZigMa's zigzag scans. One router per block reads the
timestep embedding τ = emb(t) and routes over three axes:

- **levels** ℓ ∈ ``levels``: the mixer runs on the token grid average-pooled by ℓ and its output
  is upsampled back (nearest): y = Σ_ℓ g^lvl_ℓ(c) · Up_ℓ(E(Down_ℓ x)). The experts are shared
  across levels (a Mamba scan is resolution-agnostic), so this axis adds compute, not parameters.
- **transformations** e ∈ ``experts``: E(x) = Σ_e g^tf_e(c) · E_e(x) over raster/zigzag
  bidirectional Mamba, a 3×3 depthwise conv and a channel MLP.
- **depth**: a gate d(c) ∈ {0, 1} per block, a straight-through Gumbel-sigmoid while training
  (hard forwards, sigmoid gradient backwards), sigmoid(logit) ≥ 0.5 at inference; a closed gate
  makes the block the identity, and :attr:`MoHOutput.depth_cost` (mean sigmoid over blocks) is
  the compute penalty λ_d·E_t[Σ_l d_l(t)] of the spec.

Levels and transformations are soft (every level runs every expert: len(levels)·len(experts)
expert calls per block), or hard with ``top_k``: top-1 keeps the selected level's and expert's
probabilities as weights (Switch, so the router gets a gradient), top-2 renormalises. Hard routes
are dispatched: each (level, expert) runs on the rows of the batch routed to it only, so a top-1
block makes one expert call per sample, as a plain Mamba block does (issue 67: soft routing over
3 levels and 4 experts made 12 calls per block).

g = softmax(W₂·SiLU(W₁·τ)/T_r) per axis, on the timestep embedding τ only (the class or
caption embedding enters adaLN, not the routers, so routes stay a function of t for conditional
models too); :attr:`MoHOutput.balance_loss` is Switch's n·Σ fᵢPᵢ per
routed axis over the batch (its timesteps). Routes depend on c only, so for a sampling step (one
t for the batch) :meth:`MoHDiffusion.precompute_routes` fixes them once and the experts, levels
and blocks with weight 0 are not computed. ``routing="static"`` is the static-MoE baseline: the
router reads a learned constant instead of c (same experts and parameters, blind to t).

``levels=(1,)``, ``experts=("raster",)`` and no gate is the plain bidirectional Mamba block
(DiM-like); ``layer_orders`` cycles the scan order over layers (ZigMa's multi-scan);
``mixer="attention"`` is DiT (timm's SDPA attention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils import BaseOutput
from timm.layers import Mlp
from timm.models.vision_transformer import Attention
from torch import nn

from mixlab.attention_arch.moh.mamba import BiMamba
from mixlab.attention_arch.moh.scan import BACKENDS, ORDERS
from mixlab.shared import is_count, require
from mixlab.shared.diffusion import timestep_embedding
from mixlab.shared.routing import keep_top_k, switch_balance_loss

__all__ = ["EXPERT_KINDS", "MoHBlock", "MoHDiffusion", "MoHOutput", "Router", "Routes"]

EXPERT_KINDS = (*ORDERS, "conv", "mlp")
"""a bidirectional Mamba scanning in one of :data:`.scan.ORDERS`, a depthwise conv, a channel MLP"""
ROUTINGS = ("timestep", "static")
MIXERS = ("mamba", "attention")


class Routes(NamedTuple):
    """One block's routes for a batch (None: the axis is not routed)."""

    levels: torch.Tensor | None
    """``[batch, len(levels)]`` weights"""
    experts: torch.Tensor | None
    """``[batch, len(experts)]`` weights"""
    gate: torch.Tensor | None
    """``[batch]`` execution gate in {0, 1} (straight-through while training)"""


class ConvExpert(nn.Module):
    """A 3×3 depthwise conv on the token grid, then SiLU (local mixing, 10·width parameters)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(width, width, 3, padding=1, groups=width)

    def forward(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        image = tokens.transpose(1, 2).unflatten(2, grid)
        return F.silu(self.conv(image)).flatten(2).transpose(1, 2)


class MLPExpert(Mlp):
    """A channel MLP (no token mixing)."""

    def forward(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:  # type: ignore[override]
        return super().forward(tokens)


class AttentionMixer(Attention):
    """timm's multi-head self-attention (SDPA) with the mixers' call signature: DiT's mixer."""

    def forward(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:  # type: ignore[override]
        return super().forward(tokens)


class Router(nn.Module):
    """Routes of one block from the conditioning vector (module docstring)."""

    def __init__(
        self,
        width: int,
        hidden: int,
        n_levels: int,
        n_experts: int,
        *,
        depth_gate: bool,
        top_k: int | None,
        static: bool,
        temperature: float,
    ) -> None:
        super().__init__()
        self.sizes = (n_levels if n_levels > 1 else 0, n_experts if n_experts > 1 else 0)
        self.depth_gate, self.top_k, self.temperature = depth_gate, top_k, temperature
        outputs = sum(self.sizes) + int(depth_gate)
        self.net = self.constant = None
        if outputs == 0:  # one level, one expert, no gate: nothing to route (the plain block)
            return
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.SiLU(), nn.Linear(hidden, outputs))
        nn.init.zeros_(self.net[2].weight)  # uniform routes at init ...
        with torch.no_grad():
            self.net[2].bias.zero_()
            if depth_gate:
                self.net[2].bias[-1] = 3.0  # ... and every block open (sigmoid(3) = 0.95)
        if static:  # the static-MoE baseline reads this learned constant instead of c
            self.constant = nn.Parameter(torch.randn(width) * 0.02)

    def probabilities(self, c: torch.Tensor) -> dict[str, torch.Tensor]:
        """The soft routes: ``levels``/``experts`` softmax ``[batch, n]``, ``gate`` logit ``[batch]``."""
        if self.net is None:
            return {}
        if self.constant is not None:
            c = self.constant.expand(c.shape[0], -1)
        logits = self.net(c)
        out = {}
        start = 0
        for name, size in zip(("levels", "experts"), self.sizes, strict=True):
            if size:
                out[name] = torch.softmax(logits[:, start : start + size] / self.temperature, -1)
                start += size
        if self.depth_gate:
            out["gate"] = logits[:, -1]
        return out

    def forward(self, c: torch.Tensor) -> tuple[Routes, dict[str, torch.Tensor]]:
        probs = self.probabilities(c)
        levels, experts = probs.get("levels"), probs.get("experts")
        if self.top_k is not None:  # hard routes: top-2 renormalised; top-1 keeps its probability
            levels, experts = (
                None if p is None else keep_top_k(p, self.top_k, renormalise=self.top_k > 1)
                for p in (levels, experts)
            )
        gate = None
        if "gate" in probs:
            logit = probs["gate"]
            if self.training:  # straight-through Gumbel-sigmoid (logistic noise)
                uniform = torch.rand_like(logit).clamp(1e-6, 1 - 1e-6)
                soft = torch.sigmoid(logit + torch.log(uniform) - torch.log1p(-uniform))
                gate = (soft > 0.5).to(soft) + soft - soft.detach()
            else:
                gate = (logit >= 0).to(logit)
        return Routes(levels, experts, gate), probs


def _make_expert(kind: str, width: int, d_state: int, d_conv: int, expand: float, mlp_ratio: float,
                 backend: str) -> nn.Module:  # fmt: skip
    if kind == "conv":
        return ConvExpert(width)
    if kind == "mlp":
        return MLPExpert(width, max(1, round(width * mlp_ratio)), act_layer=nn.GELU)
    return BiMamba(width, d_state, d_conv, expand, order=kind, backend=backend)


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


def _weighted(weight: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    return value if weight is None else weight[:, None, None] * value


def _routed_rows(weight: torch.Tensor | None) -> torch.Tensor | None:
    """The rows of the batch whose route weight is not 0 (hard routes), or None for all rows.
    A 0 of top-k is structural (a masked probability), so rows without it take no gradient."""
    if weight is None or bool(weight.all()):
        return None
    return weight.nonzero().flatten()


def _scatter(out: torch.Tensor, rows: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    """``out`` plus ``value`` at ``rows`` (every row when None), out of place for autograd."""
    return out + value if rows is None else out.index_add(0, rows, value)


def _take(value: torch.Tensor | None, rows: torch.Tensor | None) -> torch.Tensor | None:
    return value if value is None or rows is None else value[rows]


class MoHBlock(nn.Module):
    """A DiT block (adaLN-Zero around a token mixer and an MLP) whose mixer is routed over
    levels and transformations, and whose execution is gated (module docstring)."""

    def __init__(
        self,
        width: int,
        *,
        levels: tuple[int, ...] = (1,),
        experts: tuple[str, ...] = ("raster",),
        mixer: str = "mamba",
        d_state: int = 16,
        d_conv: int = 4,
        expand: float = 2,
        expert_expand: float | None = None,
        expert_mlp_ratio: float = 1.0,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        top_k: int | None = None,
        routing: str = "timestep",
        depth_gate: bool = False,
        router_hidden: int = 32,
        router_temperature: float = 1.0,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.levels = tuple(levels)
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        if mixer == "attention":
            self.experts = nn.ModuleList([AttentionMixer(width, num_heads, qkv_bias=True)])
        else:
            scan_expand = expand if expert_expand is None else expert_expand
            self.experts = nn.ModuleList(
                _make_expert(kind, width, d_state, d_conv, scan_expand, expert_mlp_ratio, backend)
                for kind in experts
            )
        self.mlp = Mlp(width, round(width * mlp_ratio), act_layer=lambda: nn.GELU("tanh"))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 6 * width))
        nn.init.zeros_(self.adaLN_modulation[1].weight)  # adaLN-Zero: the block starts as identity
        nn.init.zeros_(self.adaLN_modulation[1].bias)
        self.router = Router(
            width,
            router_hidden,
            len(self.levels),
            len(self.experts),
            depth_gate=depth_gate,
            top_k=top_k,
            static=routing == "static",
            temperature=router_temperature,
        )

    def mix(self, tokens: torch.Tensor, grid: tuple[int, int], routes: Routes) -> torch.Tensor:
        """Σ_ℓ g^lvl_ℓ · Up_ℓ(Σ_e g^tf_e · E_e(Down_ℓ tokens)); each level and expert runs on
        the rows whose weight is not 0 only (hard routes)."""
        hard = self.router.top_k is not None  # soft weights are never 0 by design
        out = torch.zeros_like(tokens)
        for i, factor in enumerate(self.levels):
            level_weight = None if routes.levels is None else routes.levels[:, i]
            level_rows = _routed_rows(level_weight) if hard else None
            if level_rows is not None and len(level_rows) == 0:
                continue
            pooled, small = _pool(_take(tokens, level_rows), grid, factor)
            mixed = torch.zeros_like(pooled)
            for j, expert in enumerate(self.experts):
                weight = None if routes.experts is None else routes.experts[:, j]
                weight = _take(weight, level_rows)
                rows = _routed_rows(weight) if hard else None
                if rows is None or len(rows) > 0:
                    value = expert(_take(pooled, rows), small)
                    mixed = _scatter(mixed, rows, _weighted(_take(weight, rows), value))
            level_out = _unpool(mixed, small, factor)
            out = _scatter(out, level_rows, _weighted(_take(level_weight, level_rows), level_out))
        return out

    def expert_calls(self, routes: Routes, batch: int) -> torch.Tensor:
        """Expert evaluations per sample ``[batch]`` that :meth:`mix` makes under ``routes``
        (none behind a closed gate at inference)."""

        def chosen(weight: torch.Tensor | None, n: int) -> torch.Tensor:
            return torch.full((batch,), float(n)) if weight is None else (weight != 0).sum(-1).cpu()

        calls = chosen(routes.levels, len(self.levels)) * chosen(routes.experts, len(self.experts))
        return calls if routes.gate is None else calls * (routes.gate != 0).cpu()

    def forward(
        self,
        x: torch.Tensor,
        c: torch.Tensor,
        grid: tuple[int, int],
        routes: Routes | None = None,
    ) -> torch.Tensor:
        """``x`` ``[batch, H*W, width]``, ``c`` ``[batch, width]``; ``routes`` from
        :attr:`router` (computed here when None)."""
        if routes is None:
            routes = self.router(c)[0]
        if routes.gate is not None and not self.training:
            # inference: a closed gate makes the block the identity, so only open rows compute
            # (while training the straight-through gradient needs the update of every row)
            rows = _routed_rows(routes.gate)
            if rows is not None:
                if len(rows) == 0:
                    return x
                taken = Routes(*(_take(r, rows) for r in routes))
                return x.index_copy(0, rows, self(x[rows], c[rows], grid, taken))
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=1)
        update = gate1[:, None] * self.mix(_modulate(self.norm1(x), shift1, scale1), grid, routes)
        update = update + gate2[:, None] * self.mlp(
            _modulate(self.norm2(x + update), shift2, scale2)
        )
        return x + _weighted(routes.gate, update)


def _pool(tokens: torch.Tensor, grid: tuple[int, int], factor: int):
    if factor == 1:
        return tokens, grid
    image = tokens.transpose(1, 2).unflatten(2, grid)
    pooled = F.avg_pool2d(image, factor)
    return pooled.flatten(2).transpose(1, 2), (grid[0] // factor, grid[1] // factor)


def _unpool(tokens: torch.Tensor, small: tuple[int, int], factor: int) -> torch.Tensor:
    if factor == 1:
        return tokens
    image = tokens.transpose(1, 2).unflatten(2, small)
    image = image.repeat_interleave(factor, 2).repeat_interleave(factor, 3)
    return image.flatten(2).transpose(1, 2)


def _sincos_2d(width: int, grid: int) -> torch.Tensor:
    """DiT's fixed 2-D sin-cos position embedding ``[grid*grid, width]``."""
    coords = torch.arange(grid, dtype=torch.float64)
    omega = 1.0 / 10_000 ** (torch.arange(width // 4, dtype=torch.float64) / (width / 4))
    rows, cols = torch.meshgrid(coords, coords, indexing="ij")
    parts = []
    for axis in (cols, rows):
        angles = axis.flatten()[:, None] * omega[None]
        parts += [torch.sin(angles), torch.cos(angles)]
    return torch.cat(parts, dim=1).float()


@dataclass
class MoHOutput(BaseOutput):
    """``sample``: the prediction (ε or v); the two auxiliary losses of the routing."""

    sample: torch.Tensor
    balance_loss: torch.Tensor | None = None
    depth_cost: torch.Tensor | None = None


class MoHDiffusion(ModelMixin, ConfigMixin):
    """A DiT-style diffusion backbone of :class:`MoHBlock` s (module docstring).

    ``forward(sample, timestep, class_labels=None, encoder_hidden_states=None).sample`` predicts
    the noise (or v) of ``sample`` ``[batch, in_channels, sample_size, sample_size]`` at integer
    or fractional ``timestep`` in [0, num_train_timesteps); ``class_labels`` may hold
    ``num_classes`` (the null class of classifier-free guidance); ``encoder_hidden_states``
    ``[batch, S, caption_dim]`` are attention-pooled into the conditioning.
    """

    config_name = "config.json"

    @register_to_config
    def __init__(
        self,
        sample_size: int = 8,
        in_channels: int = 1,
        patch_size: int = 2,
        width: int = 64,
        depth: int = 4,
        mixer: str = "mamba",
        levels: tuple[int, ...] = (1,),
        experts: tuple[str, ...] = ("raster",),
        layer_orders: tuple[str, ...] | None = None,
        d_state: int = 16,
        d_conv: int = 4,
        expand: float = 2.0,
        expert_expand: float | None = None,
        expert_mlp_ratio: float = 1.0,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        top_k: int | None = None,
        routing: str = "timestep",
        depth_gate: bool = False,
        router_hidden: int = 32,
        router_temperature: float = 1.0,
        num_classes: int | None = None,
        caption_dim: int | None = None,
        num_train_timesteps: int = 1000,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        levels, experts = tuple(levels), tuple(experts)
        orders = None if layer_orders is None else tuple(layer_orders)
        _check_architecture(sample_size, in_channels, patch_size, width, depth, mixer, levels,
                            experts, orders, d_state, num_heads, top_k, routing, num_classes,
                            caption_dim, num_train_timesteps, backend)  # fmt: skip
        self.grid = (sample_size // patch_size, sample_size // patch_size)
        self.x_embedder = nn.Conv2d(in_channels, width, patch_size, stride=patch_size)
        self.register_buffer("pos_embed", _sincos_2d(width, self.grid[0]), persistent=False)
        self.t_embedder = nn.Sequential(nn.Linear(256, width), nn.SiLU(), nn.Linear(width, width))
        self.y_embedder = None if num_classes is None else nn.Embedding(num_classes + 1, width)
        if caption_dim is not None:  # attention pooling of the caption tokens (U-ViT/DiS style)
            self.caption_query = nn.Parameter(torch.randn(caption_dim) * 0.02)
            self.caption_proj = nn.Linear(caption_dim, width)
        block = {
            "levels": levels, "mixer": mixer, "d_state": d_state, "d_conv": d_conv,
            "expand": expand, "expert_expand": expert_expand, "expert_mlp_ratio": expert_mlp_ratio,
            "num_heads": num_heads, "mlp_ratio": mlp_ratio, "top_k": top_k, "routing": routing,
            "depth_gate": depth_gate, "router_hidden": router_hidden,
            "router_temperature": router_temperature, "backend": backend,
        }  # fmt: skip
        self.blocks = nn.ModuleList(
            MoHBlock(
                width, experts=experts if orders is None else (orders[i % len(orders)],), **block
            )
            for i in range(depth)
        )
        self.final_norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.final_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))
        self.final_linear = nn.Linear(width, patch_size * patch_size * in_channels)
        for layer in (self.final_modulation[1], self.final_linear):  # zero output at init (DiT)
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        self.route_table: dict[float, list[Routes]] | None = None

    # -- conditioning and routes ------------------------------------------------------------
    def _check_timesteps(self, timestep: torch.Tensor | float | int, batch: int) -> torch.Tensor:
        t = torch.as_tensor(timestep, device=self.pos_embed.device)
        if t.dim() == 0:
            t = t.expand(batch)
        total = self.config.num_train_timesteps
        require(
            t.shape == (batch,) and bool(((t >= 0) & (t < total)).all()),
            "timestep",
            f"a number or a [batch={batch}] tensor in [0, num_train_timesteps={total})",
            t.tolist() if t.numel() <= 8 else f"tensor of shape {tuple(t.shape)}",
        )
        return t

    def time_embedding(self, timestep: torch.Tensor | float | int, batch: int) -> torch.Tensor:
        """τ = emb(t) ``[batch, width]`` (DiT's embedder): what the routers read."""
        t = self._check_timesteps(timestep, batch)
        return self.t_embedder(timestep_embedding(t, 256).to(self.pos_embed.dtype))

    def condition(
        self,
        tau: torch.Tensor,
        class_labels: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """c = τ (+ class embedding, + attention-pooled caption): what adaLN reads."""
        c = tau
        if self.y_embedder is not None:
            if class_labels is None:  # unconditional: the null class
                class_labels = torch.full((len(c),), self.config.num_classes, device=c.device)
            c = c + self.y_embedder(class_labels)
        if encoder_hidden_states is not None:
            require(self.config.caption_dim is not None, "encoder_hidden_states",
                    "None (the model was built without caption_dim)", "a tensor")  # fmt: skip
            scores = encoder_hidden_states @ self.caption_query / math.sqrt(self.config.caption_dim)
            pooled = (scores.softmax(-1)[..., None] * encoder_hidden_states).sum(1)
            c = c + self.caption_proj(pooled)
        return c

    @torch.no_grad()
    def route_probabilities(self, timesteps: torch.Tensor) -> dict[str, torch.Tensor]:
        """The soft routes g(t) of every block: ``levels``/``experts`` ``[T, depth, n]`` and the
        gate's open probability ``gate`` ``[T, depth]`` (the axes that are routed)."""
        tau = self.time_embedding(timesteps, len(timesteps))
        rows = [block.router.probabilities(tau) for block in self.blocks]
        out = {k: torch.stack([r[k] for r in rows], 1) for k in rows[0]}
        if "gate" in out:
            out["gate"] = torch.sigmoid(out["gate"])
        return out

    @torch.no_grad()
    def precompute_routes(self, timesteps: torch.Tensor) -> None:
        """Fix the (inference) routes of each sampling timestep, e.g. ``scheduler.timesteps``:
        while the model is in eval mode, a forward at one of them with one timestep for the
        batch (any labels or captions: routes read t only) uses the table and runs no router.
        ``clear_routes()`` undoes it."""
        was_training = self.training
        self.eval()
        t = torch.as_tensor(timesteps, device=self.pos_embed.device).flatten()
        tau = self.time_embedding(t, len(t))
        routes = [block.router(tau)[0] for block in self.blocks]
        self.route_table = {
            float(value): [Routes(*(None if part is None else part[i : i + 1] for part in r))
                           for r in routes]
            for i, value in enumerate(t.tolist())
        }  # fmt: skip
        self.train(was_training)

    @torch.no_grad()
    def expert_calls(self, timesteps: torch.Tensor) -> float:
        """Mean expert evaluations per sample and forward at ``timesteps`` under the inference
        routes: ``depth`` for plain Mamba, depth·levels·experts for soft routing, at most
        ``depth`` for top-1 routing (fewer where gates close)."""
        was_training = self.training
        self.eval()
        t = torch.as_tensor(timesteps, device=self.pos_embed.device).flatten()
        tau = self.time_embedding(t, len(t))
        calls = sum(block.expert_calls(block.router(tau)[0], len(t)) for block in self.blocks)
        self.train(was_training)
        return float(calls.float().mean())

    def clear_routes(self) -> None:
        self.route_table = None

    def _table_routes(self, t: torch.Tensor, batch: int) -> list[Routes] | None:
        if self.route_table is None or self.training or not bool((t == t[0]).all()):
            return None
        rows = self.route_table.get(float(t[0]))
        if rows is None:
            return None
        return [Routes(*(None if p is None else p.expand(batch, *p.shape[1:]) for p in r))
                for r in rows]  # fmt: skip

    # -- forward -------------------------------------------------------------------------------
    def forward(
        self,
        sample: torch.Tensor,
        timestep: torch.Tensor | float | int,
        class_labels: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        return_dict: bool = True,
    ) -> MoHOutput | tuple[torch.Tensor]:
        batch, channels, height, width = sample.shape
        patch = self.config.patch_size
        require(
            channels == self.config.in_channels and height % patch == 0 and width % patch == 0,
            "sample",
            f"[batch, {self.config.in_channels}, H, W] with H and W multiples of patch_size={patch}",
            tuple(sample.shape),
        )
        grid = (height // patch, width // patch)
        if grid != self.grid:
            _check_levels(self.blocks[0].levels, grid)
        t = self._check_timesteps(timestep, batch)
        tau = self.time_embedding(t, batch)
        c = self.condition(tau, class_labels, encoder_hidden_states)
        routes = self._table_routes(t, batch)
        x = self.x_embedder(sample).flatten(2).transpose(1, 2)
        x = x + (self.pos_embed if grid == self.grid else _sincos_2d(x.shape[-1], grid[0]).to(x))
        balance, depth_cost = [], []
        for i, block in enumerate(self.blocks):
            if routes is None:
                block_routes, probs = block.router(tau)
                balance += [
                    switch_balance_loss(probs[k]) for k in ("levels", "experts") if k in probs
                ]
                if "gate" in probs:
                    depth_cost.append(torch.sigmoid(probs["gate"]).mean())
            else:
                block_routes = routes[i]
            x = block(x, c, grid, block_routes)
        shift, scale = self.final_modulation(c).chunk(2, dim=1)
        x = self.final_linear(_modulate(self.final_norm(x), shift, scale))
        x = x.view(batch, *grid, patch, patch, channels).permute(0, 5, 1, 3, 2, 4)
        out = x.reshape(batch, channels, height, width)
        if not return_dict:
            return (out,)
        return MoHOutput(
            sample=out,
            balance_loss=torch.stack(balance).mean() if balance else None,
            depth_cost=torch.stack(depth_cost).mean() if depth_cost else None,
        )


def _check_levels(levels: tuple[int, ...], grid: tuple[int, int]) -> None:
    for factor in levels:
        require(
            grid[0] % factor == 0 and grid[1] % factor == 0,
            "levels",
            f"pooling factors that divide the token grid {grid[0]}x{grid[1]}",
            levels,
        )


def _check_architecture(sample_size, in_channels, patch_size, width, depth, mixer, levels,
                        experts, orders, d_state, num_heads, top_k, routing, num_classes,
                        caption_dim, num_train_timesteps, backend) -> None:  # fmt: skip
    for name, value in (("sample_size", sample_size), ("in_channels", in_channels),
                        ("patch_size", patch_size), ("width", width), ("depth", depth),
                        ("num_train_timesteps", num_train_timesteps)):  # fmt: skip
        require(is_count(value), name, "an integer >= 1", value)
    require(sample_size % patch_size == 0, "patch_size",
            f"a divisor of sample_size={sample_size}", patch_size)  # fmt: skip
    require(width % 4 == 0, "width", "a multiple of 4 (the 2-D sin-cos position embedding)", width)
    require(mixer in MIXERS, "mixer", f"one of {MIXERS}", mixer)
    require(len(levels) > 0 and all(is_count(f) for f in levels) and len(set(levels)) == len(levels),
            "levels", "distinct integers >= 1", levels)  # fmt: skip
    _check_levels(levels, (sample_size // patch_size,) * 2)
    require(len(experts) > 0 and all(k in EXPERT_KINDS for k in experts)
            and len(set(experts)) == len(experts),
            "experts", f"distinct kinds from {EXPERT_KINDS}", experts)  # fmt: skip
    if orders is not None:
        require(len(orders) > 0 and all(o in ORDERS for o in orders), "layer_orders",
                f"None or scan orders from {ORDERS}", orders)  # fmt: skip
        require(len(experts) == 1 and experts[0] in ORDERS, "layer_orders",
                "None unless there is a single Mamba expert (ZigMa's multi-scan)", orders)  # fmt: skip
    require(is_count(d_state), "d_state", "an integer >= 1", d_state)
    require(mixer != "attention" or (experts == ("raster",) and width % num_heads == 0),
            "num_heads", "a divisor of width with the default experts (DiT)", num_heads)  # fmt: skip
    require(top_k is None or (is_count(top_k) and top_k <= 2), "top_k",
            "None (soft), 1 or 2", top_k)  # fmt: skip
    require(routing in ROUTINGS, "routing", f"one of {ROUTINGS}", routing)
    require(num_classes is None or is_count(num_classes), "num_classes",
            "None or an integer >= 1", num_classes)  # fmt: skip
    require(caption_dim is None or is_count(caption_dim), "caption_dim",
            "None or an integer >= 1", caption_dim)  # fmt: skip
    require(backend in BACKENDS, "backend", f"one of {BACKENDS}", backend)
