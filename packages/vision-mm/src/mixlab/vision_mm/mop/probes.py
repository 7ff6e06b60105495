"""Mixture of Probes (reconstruction, spec §4a) and the resampler baselines.

A probe is T learnable queries cross-attending (``nn.MultiheadAttention(batch_first=True)``, a
Q-Former/Perceiver-resampler block) to one hidden layer of a shared encoder, or to a soft mix of
its layers. K probes read K layers; a router on the pooled last layer weighs them:

    z_k = CrossAttn(Q_k, H_{l_k}),   w = softmax(MLP(mean_n H_L)),   prefix = Σ_k w_k · z_k

:class:`Resampler` is the single-probe baseline on the last layer (current MLLMs' final-layer
alignment); :class:`RoutedResamplers` is OneLLM's universal projection: E resampler experts on
the last layer mixed by sigmoid router weights normalised to sum to 1.

Hidden states come as HF's ``output_hidden_states`` tuple (the embeddings first, then every
layer), so layer indices follow HF: 0 is the embedding output, -1 the last layer.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from mixlab.shared.checks import check_count

__all__ = [
    "CONNECTOR_KINDS",
    "MixtureOfProbes",
    "ProbeOutput",
    "Resampler",
    "RoutedResamplers",
    "build_connector",
    "connector_kind",
    "grid_positions",
]


@dataclass
class ProbeOutput:
    """``prefix`` [B, T, D] for the projector, every probe's output ``probes`` [B, K, T, D] and the
    router ``weights`` [B, K]."""

    prefix: torch.Tensor
    probes: torch.Tensor
    weights: torch.Tensor


@functools.cache
def grid_positions(tokens: int, dim: int) -> torch.Tensor:
    """Fixed 2D sine–cosine positions [tokens, dim] of a ViT sequence: a class token (zeros) and a
    g × g patch grid when ``tokens`` − 1 or ``tokens`` is a square, else 1D positions. Added to
    the probes' keys as in Qwen-VL's position-aware adapter, so a query can ask for a place even
    when the frozen encoder's own position embeddings are faint."""
    grid = math.isqrt(tokens - 1)
    has_cls = grid * grid == tokens - 1
    if not has_cls:
        grid = math.isqrt(tokens)
    quarter = dim // 4
    frequencies = 1.0 / 100.0 ** (torch.arange(quarter) / max(quarter, 1))
    if grid * grid == tokens - has_cls and quarter:
        ys, xs = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
        parts = [
            f(c.flatten()[:, None].float() * frequencies)
            for c in (xs, ys)
            for f in (torch.sin, torch.cos)
        ]
        table = torch.cat(parts, 1)
    else:
        angle = torch.arange(tokens - has_cls)[:, None].float() * frequencies
        table = torch.cat([angle.sin(), angle.cos()] * 2, 1)
    table = torch.nn.functional.pad(table, (0, dim - table.shape[1]))
    return torch.cat([torch.zeros(int(has_cls), dim), table]) if has_cls else table


class CrossAttentionBlock(nn.Module):
    """Queries [B, T, D] attend to a [B, N, D] sequence (pre-norm; fixed grid positions added to
    the keys), then a residual feed-forward."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.feed_forward = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(),
                                          nn.Linear(2 * dim, dim))  # fmt: skip

    def forward(self, queries: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        values = self.norm(states)
        keys = values + grid_positions(states.shape[1], states.shape[2]).to(values)
        z = queries + self.attention(queries, keys, values, need_weights=False)[0]
        return z + self.feed_forward(z)


class CrossAttentionProbe(nn.Module):
    """T learnable queries read a [B, N, D] sequence through ``depth`` cross-attention blocks."""

    def __init__(self, dim: int, queries: int, heads: int, depth: int = 1) -> None:
        super().__init__()
        self.queries = nn.Parameter(torch.randn(queries, dim) * dim**-0.5)
        self.blocks = nn.ModuleList(CrossAttentionBlock(dim, heads) for _ in range(depth))

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        z = self.queries.expand(len(states), -1, -1)
        for block in self.blocks:
            z = block(z, states)
        return z


def _stack(hidden_states: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """[L + 1, B, N, D] from HF's tuple (or an already stacked tensor)."""
    if isinstance(hidden_states, torch.Tensor):
        if hidden_states.dim() != 4:
            raise ValueError(
                f"hidden_states must be [layers, batch, tokens, dim], got {list(hidden_states.shape)}"
            )
        return hidden_states
    return torch.stack(tuple(hidden_states))


class MixtureOfProbes(nn.Module):
    """K probes of T queries over an encoder with ``num_layers`` hidden states (embeddings + blocks).

    ``layers``: one HF-style index per probe (negative from the end), or ``"soft"`` for a learned
    softmax mix over every layer per probe. Default: K layers spread evenly over the second half.
    ``combine``: the prefix is the router-weighted sum of the probes (T tokens) or, ``"concat"``,
    every probe's tokens scaled by its weight (K·T tokens, spec §4a's concatenation).
    """

    def __init__(
        self, dim: int, num_layers: int, *, num_probes: int = 4, queries: int = 8, heads: int = 4,
        layers: Sequence[int] | str | None = None, router_hidden: int = 64, combine: str = "sum",
    ) -> None:  # fmt: skip
        super().__init__()
        self.config = {"dim": dim, "num_layers": num_layers, "num_probes": num_probes,
                       "queries": queries, "heads": heads, "router_hidden": router_hidden,
                       "combine": combine, "layers": layers if isinstance(layers, str | None) else list(layers)}  # fmt: skip
        if combine not in ("sum", "concat"):
            raise ValueError(f"combine must be 'sum' or 'concat', got {combine!r}")
        self.combine = combine
        for name, value in (("dim", dim), ("num_layers", num_layers), ("num_probes", num_probes),
                            ("queries", queries), ("heads", heads)):  # fmt: skip
            check_count(value, name)
        if dim % heads:
            raise ValueError(f"dim must be a multiple of heads = {heads}, got {dim}")
        self.num_layers, self.num_probes = num_layers, num_probes
        self.soft = layers == "soft"
        if isinstance(layers, str) and not self.soft:
            raise ValueError(f"layers must be indices or 'soft', got {layers!r}")
        if layers is None:
            start = num_layers // 2
            layers = [
                round(start + (num_layers - 1 - start) * (k + 1) / num_probes)
                for k in range(num_probes)
            ]
        if self.soft:
            self.layer_logits = nn.Parameter(torch.zeros(num_probes, num_layers))
            self.layers: tuple[int, ...] = ()
        else:
            layers = list(layers)
            if len(layers) != num_probes:
                raise ValueError(
                    f"layers must name one layer per probe ({num_probes}), got {layers}"
                )
            bad = [l for l in layers if not -num_layers <= l < num_layers]  # noqa: E741
            if bad:
                raise ValueError(f"layers must be in [{-num_layers}, {num_layers - 1}] (the encoder's "
                                 f"{num_layers} hidden states), got {bad}")  # fmt: skip
            self.layers = tuple(l % num_layers for l in layers)  # noqa: E741
        self.probes = nn.ModuleList(
            CrossAttentionProbe(dim, queries, heads) for _ in range(num_probes)
        )
        self.router = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, router_hidden), nn.GELU(),
                                    nn.Linear(router_hidden, num_probes))  # fmt: skip

    def forward(self, hidden_states: Sequence[torch.Tensor] | torch.Tensor) -> ProbeOutput:
        states = _stack(hidden_states)
        if len(states) != self.num_layers:
            raise ValueError(f"expected {self.num_layers} hidden states, got {len(states)}")
        if self.soft:
            mix = self.layer_logits.softmax(-1)  # [K, L]
            inputs = torch.einsum("kl,lbnd->kbnd", mix, states)
        else:
            inputs = states[list(self.layers)]
        probes = torch.stack([probe(x) for probe, x in zip(self.probes, inputs, strict=True)], 1)
        weights = self.router(states[-1].mean(1)).softmax(-1)  # [B, K]
        if self.combine == "sum":
            prefix = torch.einsum("bk,bktd->btd", weights, probes)
        else:  # every probe's tokens, each scaled by K·w_k (1 for a uniform router)
            prefix = (probes * (self.num_probes * weights)[:, :, None, None]).flatten(1, 2)
        return ProbeOutput(prefix, probes, weights)


class Resampler(nn.Module):
    """One probe on the last layer: the K = 1 baseline (final-layer alignment)."""

    def __init__(self, dim: int, *, queries: int = 8, heads: int = 4) -> None:
        super().__init__()
        self.config = {"dim": dim, "queries": queries, "heads": heads}
        self.probe = CrossAttentionProbe(dim, queries, heads)

    def forward(self, hidden_states: Sequence[torch.Tensor] | torch.Tensor) -> ProbeOutput:
        z = self.probe(_stack(hidden_states)[-1])
        return ProbeOutput(z, z[:, None], torch.ones(len(z), 1, device=z.device))


class RoutedResamplers(nn.Module):
    """OneLLM's universal projection at our size: ``experts`` resamplers on the last layer, each
    ``depth`` probe blocks deep, mixed by sigmoid router weights normalised to sum to 1."""

    def __init__(self, dim: int, *, experts: int = 3, queries: int = 8, heads: int = 4, depth: int = 2,
                 router_hidden: int = 64) -> None:  # fmt: skip
        super().__init__()
        self.config = {"dim": dim, "experts": experts, "queries": queries, "heads": heads,
                       "depth": depth, "router_hidden": router_hidden}  # fmt: skip
        check_count(experts, "experts")
        check_count(depth, "depth")
        self.experts = nn.ModuleList(
            CrossAttentionProbe(dim, queries, heads, depth) for _ in range(experts)
        )
        self.router = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, router_hidden), nn.GELU(),
                                    nn.Linear(router_hidden, experts))  # fmt: skip

    def forward(self, hidden_states: Sequence[torch.Tensor] | torch.Tensor) -> ProbeOutput:
        last = _stack(hidden_states)[-1]
        probes = torch.stack([expert(last) for expert in self.experts], 1)
        gates = torch.sigmoid(self.router(last.mean(1)))
        weights = gates / gates.sum(-1, keepdim=True)
        return ProbeOutput(torch.einsum("bk,bktd->btd", weights, probes), probes, weights)


CONNECTOR_KINDS = {"mop": MixtureOfProbes, "resampler": Resampler, "routed": RoutedResamplers}


def connector_kind(connector: nn.Module) -> str:
    """The :data:`CONNECTOR_KINDS` name of ``connector``."""
    for kind, cls in CONNECTOR_KINDS.items():
        if type(connector) is cls:
            return kind
    raise ValueError(f"connector must be one of {[c.__name__ for c in CONNECTOR_KINDS.values()]}, "
                     f"got {type(connector).__name__}")  # fmt: skip


def build_connector(kind: str, config: dict) -> nn.Module:
    """A fresh connector of ``kind`` from its ``.config`` (as :meth:`PrivilegedMLLM.save_pretrained`
    stores it)."""
    if kind not in CONNECTOR_KINDS:
        raise ValueError(f"connector kind must be one of {list(CONNECTOR_KINDS)}, got {kind!r}")
    config = dict(config)
    return CONNECTOR_KINDS[kind](
        config.pop("dim"), *([config.pop("num_layers")] if kind == "mop" else []), **config
    )
