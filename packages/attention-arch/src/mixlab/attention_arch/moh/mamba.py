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


class _Direction(nn.Module):
    """One scan direction: causal conv, the projections to Δ, B, C, and A, D (mamba-ssm init)."""

    def __init__(self, d_inner: int, d_state: int, d_conv: int, dt_rank: int) -> None:
        super().__init__()
        self.d_state, self.dt_rank = d_state, dt_rank
        self.conv1d = nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, padding=d_conv - 1)
        self.x_proj = nn.Linear(d_inner, dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(dt_rank, d_inner)
        nn.init.uniform_(self.dt_proj.weight, -(dt_rank**-0.5), dt_rank**-0.5)
        dt = torch.exp(torch.rand(d_inner) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        with torch.no_grad():  # softplus(bias) = dt: the inverse of softplus
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1.0)).repeat(d_inner, 1))
        self.D = nn.Parameter(torch.ones(d_inner))

    def forward(self, x: torch.Tensor, z: torch.Tensor, backend: str) -> torch.Tensor:
        """``x``, ``z``: ``[batch, d_inner, L]`` -> ``[batch, d_inner, L]``."""
        length = x.shape[-1]
        x = F.silu(self.conv1d(x)[..., :length])  # causal: drop the right padding
        dt, B, C = self.x_proj(x.transpose(1, 2)).split(
            [self.dt_rank, self.d_state, self.d_state], dim=-1
        )
        delta = (dt @ self.dt_proj.weight.t()).transpose(1, 2)
        return _selective_scan(
            x,
            delta,
            -torch.exp(self.A_log.float()),
            B.transpose(1, 2),
            C.transpose(1, 2),
            self.D.float(),
            z,
            delta_bias=self.dt_proj.bias.float(),
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
        self.forward_scan = _Direction(d_inner, d_state, d_conv, dt_rank)
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x, z = self.in_proj(hidden).transpose(1, 2).chunk(2, dim=1)
        return self.out_proj(self.forward_scan(x, z, self.backend).transpose(1, 2))


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
        super().__init__(d_model, d_state, d_conv, expand, backend=backend)
        require(order in ORDERS, "order", f"one of {ORDERS}", order)
        self.order = order
        d_inner, dt_rank = _check(d_model, d_state, d_conv, expand, backend)
        self.backward_scan = _Direction(d_inner, d_state, d_conv, dt_rank)

    def forward(self, hidden: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:  # type: ignore[override]
        order = scan_order(*grid, self.order).to(hidden.device)
        x, z = self.in_proj(hidden[:, order]).transpose(1, 2).chunk(2, dim=1)
        forward = self.forward_scan(x, z, self.backend)
        backward = self.backward_scan(x.flip(-1), z.flip(-1), self.backend).flip(-1)
        out = self.out_proj(((forward + backward) / 2).transpose(1, 2))
        return out[:, inverse_order(order)]
