"""Mamba blocks on token sequences: the causal block of mamba-ssm and the bidirectional one the
Mamba diffusion backbones use (Vim, DiM, ZigMa).

``Mamba(d_model, d_state=16, d_conv=4, expand=2)`` maps ``[batch, L, d_model]`` to the same, with
mamba-ssm's parameters and initialisation (``mamba_ssm/modules/mamba_simple.py``): an input
projection to the scan stream ``x`` and the gate ``z``; a causal depthwise conv and SiLU on ``x``;
input-dependent Δ, B, C from ``x`` (Δ through a rank-``dt_rank`` projection, softplus with a bias
initialised so that Δ starts log-uniform in [1e-3, 1e-1]); A = −exp(A_log) with A_log = log n
(S4D-real); the selective scan (:func:`.scan.selective_scan`) gated by SiLU(z); an output
projection.

``BiMamba`` scans a 2-D token grid in an order (:data:`.scan.ORDERS`) forwards and backwards. As in
Vim, both directions share the input and output projections and have their own conv, Δ/B/C
projections, A and D; the two outputs are averaged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mixlab.attention_arch.moh.scan import BACKENDS, ORDERS, inverse_order, scan_order
from mixlab.attention_arch.moh.scan import selective_scan as _selective_scan
from mixlab.shared import is_count, require

__all__ = ["BiMamba", "Mamba"]


class _Paths(nn.Module):
    """``paths`` scan paths stacked along the channels, run as one selective scan: a depthwise
    causal conv over all of them, and per path its projections to Δ, B, C (B and C grouped per
    path), A and D (mamba-ssm's initialisation). Stacking the two directions of a bidirectional
    block halves the steps of the scan loop, which is what a scan costs on a CPU."""

    def __init__(self, d_inner: int, d_state: int, d_conv: int, dt_rank: int, paths: int) -> None:
        super().__init__()
        self.d_inner, self.d_state, self.dt_rank, self.paths = d_inner, d_state, dt_rank, paths
        channels = paths * d_inner
        self.conv1d = nn.Conv1d(channels, channels, d_conv, groups=channels, padding=d_conv - 1)
        bound = d_inner**-0.5  # nn.Linear's default initialisation
        self.x_proj = nn.Parameter(
            torch.empty(paths, dt_rank + 2 * d_state, d_inner).uniform_(-bound, bound)
        )
        self.dt_proj = nn.Parameter(
            torch.empty(paths, d_inner, dt_rank).uniform_(-(dt_rank**-0.5), dt_rank**-0.5)
        )
        dt = torch.exp(torch.rand(channels) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(bias) = dt
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1.0)).repeat(channels, 1))
        self.D = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor, z: torch.Tensor, backend: str) -> torch.Tensor:
        """``x``, ``z``: ``[batch, paths * d_inner, L]`` -> the same."""
        batch, _, length = x.shape
        x = F.silu(self.conv1d(x)[..., :length])  # causal: drop the right padding
        per_path = x.view(batch, self.paths, self.d_inner, length)
        dt, B, C = torch.einsum("bpil,poi->bpol", per_path, self.x_proj).split(
            [self.dt_rank, self.d_state, self.d_state], dim=2
        )
        delta = torch.einsum("bprl,pir->bpil", dt, self.dt_proj).reshape_as(x)
        return _selective_scan(
            x,
            delta,
            -torch.exp(self.A_log.float()),
            B,
            C,
            self.D.float(),
            z,
            delta_bias=self.dt_bias.float(),
            delta_softplus=True,
            backend=backend,
        )


def _check(d_model: int, d_state: int, d_conv: int, expand: float, backend: str) -> tuple[int, int]:
    require(is_count(d_model), "d_model", "an integer >= 1", d_model)
    require(is_count(d_state), "d_state", "an integer >= 1", d_state)
    require(is_count(d_conv), "d_conv", "an integer >= 1", d_conv)
    require(
        isinstance(expand, int | float) and expand > 0 and round(expand * d_model) >= 1,
        "expand",
        "a number > 0 (d_inner = round(expand * d_model) >= 1)",
        expand,
    )
    require(backend in BACKENDS, "backend", f"one of {BACKENDS}", backend)
    d_inner = round(expand * d_model)
    return d_inner, math.ceil(d_model / 16)  # mamba-ssm's dt_rank="auto"


class Mamba(nn.Module):
    """The causal Mamba block of mamba-ssm on ``[batch, L, d_model]`` (module docstring)."""

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        d_conv: int = 4,
        expand: float = 2,
        *,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        d_inner, dt_rank = _check(d_model, d_state, d_conv, expand, backend)
        self.backend = backend
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=False)
        self.scan = _Paths(d_inner, d_state, d_conv, dt_rank, paths=self._paths)
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    _paths = 1

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x, z = self.in_proj(hidden).transpose(1, 2).chunk(2, dim=1)
        return self.out_proj(self.scan(x, z, self.backend).transpose(1, 2))


class BiMamba(Mamba):
    """Bidirectional Mamba over a token grid scanned in ``order`` (module docstring).

    ``forward(tokens, grid)``: ``tokens`` ``[batch, H*W, d_model]`` in raster order, ``grid`` =
    (H, W); the output is in raster order too.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        d_conv: int = 4,
        expand: float = 2,
        *,
        order: str = "raster",
        backend: str = "auto",
    ) -> None:
        require(order in ORDERS, "order", f"one of {ORDERS}", order)
        super().__init__(d_model, d_state, d_conv, expand, backend=backend)
        self.order = order

    _paths = 2  # forwards and backwards, stacked along the channels

    def forward(self, hidden: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:  # type: ignore[override]
        order = scan_order(*grid, self.order).to(hidden.device)
        x, z = self.in_proj(hidden[:, order]).transpose(1, 2).chunk(2, dim=1)
        both = self.scan(torch.cat([x, x.flip(-1)], 1), torch.cat([z, z.flip(-1)], 1), self.backend)
        forward, backward = both.chunk(2, dim=1)
        out = self.out_proj(((forward + backward.flip(-1)) / 2).transpose(1, 2))
        return out[:, inverse_order(order)]
