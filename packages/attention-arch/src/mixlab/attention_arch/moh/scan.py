"""The selective scan of Mamba (S6) with interchangeable backends, and the token orders a 2-D
grid is scanned in.

For each channel d and state n, with inputs in mamba-ssm's layout (u, Δ, z: ``[batch, D, L]``;
A: ``[D, N]``; B, C: ``[batch, N, L]``, or ``[batch, G, N, L]`` with the channels split into G
equal groups, each with its own B and C; D: ``[D]``)::

    Δ ← softplus(Δ + bias)                   (when asked, as mamba-ssm's ``delta_softplus``)
    x_t = exp(Δ_t A) ⊙ x_{t−1} + Δ_t B_t u_t    (zero-order-hold discretisation, x_0 = 0)
    y_t = ⟨C_t, x_t⟩ + D u_t,   y ← y · SiLU(z)

Backends: ``ref``, the recurrence above one step at a time (written from the equations, the
reference the others are tested against, and the fastest on a CPU at the lengths of the
experiments: about 3x mambapy's scan at 16 and 64 tokens); ``mambapy``, the Blelloch parallel scan of the
``mambapy`` package (pure PyTorch, any device); ``mamba_ssm``, the CUDA kernel
``selective_scan_fn`` when that package imports. On a CPU, turn denormals off around long scans
(``torch.set_flush_denormal(True)``): exp(Δ A) decays states into the denormal range, which is
many times slower there.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch
import torch.nn.functional as F

from mixlab.shared import require

__all__ = ["BACKENDS", "ORDERS", "inverse_order", "scan_order", "selective_scan"]

BACKENDS = ("auto", "ref", "mambapy", "mamba_ssm")
"""``auto``: mamba_ssm for CUDA tensors when it imports, else mambapy on an accelerator, else ref"""
ORDERS = ("raster", "raster_t", "zigzag", "zigzag_t")
"""row by row; column by column; rows alternating direction (a boustrophedon, ZigMa's
continuous path); columns alternating direction"""


def _check_shapes(u, delta, A, B, C, D, z) -> None:
    require(u.dim() == 3, "u", "a tensor [batch, channels, length]", tuple(u.shape))
    batch, channels, length = u.shape
    require(delta.shape == u.shape, "delta", f"the shape of u {tuple(u.shape)}", tuple(delta.shape))
    require(A.dim() == 2 and A.shape[0] == channels, "A", f"a tensor [{channels}, d_state]",
            tuple(A.shape))  # fmt: skip
    state = A.shape[1]
    for name, value in (("B", B), ("C", C)):
        grouped = value.dim() == 4 and channels % value.shape[1] == 0
        require(value.shape == (batch, state, length)
                or (grouped and (value.shape[0], value.shape[3]) == (batch, length) and value.shape[2] == state),
                name, f"a tensor [{batch}, {state}, {length}] or [{batch}, groups dividing "
                f"{channels}, {state}, {length}]", tuple(value.shape))  # fmt: skip
    require(D is None or D.shape == (channels,), "D", f"None or a tensor [{channels}]",
            None if D is None else tuple(D.shape))  # fmt: skip
    require(z is None or z.shape == u.shape, "z", f"None or the shape of u {tuple(u.shape)}",
            None if z is None else tuple(z.shape))  # fmt: skip


def _per_channel(value: torch.Tensor, channels: int) -> torch.Tensor:
    """B or C as ``[L, batch, channels or 1, state]``, contiguous in each step's slice."""
    if value.dim() == 3:  # shared by every channel
        return value.permute(2, 0, 1)[:, :, None].contiguous()
    return value.permute(3, 0, 1, 2).repeat_interleave(channels // value.shape[1], dim=2)


def _auto_backend(device: torch.device) -> str:
    if device.type == "cpu":
        return "ref"
    if device.type == "cuda" and importlib.util.find_spec("mamba_ssm") is not None:
        return "mamba_ssm"
    return "mambapy"


def selective_scan(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    *,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    backend: str = "ref",
) -> torch.Tensor:
    """``y`` ``[batch, D, L]`` of the selective scan (module docstring), differentiable in every
    input, by ``backend`` (one of :data:`BACKENDS`)."""
    require(backend in BACKENDS, "backend", f"one of {BACKENDS}", backend)
    _check_shapes(u, delta, A, B, C, D, z)
    if backend == "auto":
        backend = _auto_backend(u.device)
    if backend == "mamba_ssm":
        try:  # an optional CUDA extra, looked up at run time (not a declared dependency)
            kernels = importlib.import_module("mamba_ssm.ops.selective_scan_interface")
        except ImportError:
            raise ValueError(
                "backend='mamba_ssm' needs the mamba-ssm package (CUDA), which is not installed; "
                "use 'mambapy' or 'ref'"
            ) from None
        return kernels.selective_scan_fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    if delta_bias is not None:
        delta = delta + delta_bias[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    # [L, batch, channels or 1, state]: B and C of each channel (its group's when grouped)
    B, C = (_per_channel(value, u.shape[1]) for value in (B, C))
    if backend == "mambapy":
        from mambapy.pscan import pscan

        # [batch, L, channels, state]: the layout of mambapy's scan
        decay = torch.exp(delta.transpose(1, 2)[..., None] * A)
        drive = (delta * u).transpose(1, 2)[..., None] * B.transpose(0, 1)
        states = pscan(decay, drive)
        y = (states * C.transpose(0, 1)).sum(-1).transpose(1, 2)
    else:
        # one step at a time on [batch, channels, state] slices: these stay in cache, where the
        # whole [batch, L, channels, state] tensors of a parallel scan do not (3x faster on a CPU)
        # (unbind, not indexing: the backward of an index fills a zero tensor of the whole input
        # at every step, of unbind one stack)
        state = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
        outputs = []
        steps = zip(delta.unbind(-1), u.unbind(-1), B.unbind(0), C.unbind(0), strict=True)
        for delta_t, u_t, B_t, C_t in steps:
            step = delta_t[..., None]
            state = torch.exp(step * A) * state + (step * u_t[..., None]) * B_t
            outputs.append((state * C_t).sum(-1))
        y = torch.stack(outputs, dim=-1)
    if D is not None:
        y = y + D[:, None] * u
    if z is not None:
        y = y * F.silu(z)
    return y


def scan_order(height: int, width: int, order: str) -> torch.Tensor:
    """The permutation of the ``height x width`` raster token indices that visits the grid in
    ``order`` (one of :data:`ORDERS`): ``tokens[:, scan_order(...)]`` is the scanned sequence."""
    require(order in ORDERS, "order", f"one of {ORDERS}", order)
    for name, value in (("height", height), ("width", width)):
        require(isinstance(value, int) and value >= 1, name, "an integer >= 1", value)
    grid = torch.arange(height * width).view(height, width)
    if order.endswith("_t"):
        grid = grid.t()
    if order.startswith("zigzag"):
        grid = grid.clone()
        grid[1::2] = grid[1::2].flip(-1)
    return grid.flatten()


def inverse_order(order: torch.Tensor) -> torch.Tensor:
    """The permutation that undoes ``order``: ``scanned[:, inverse_order(order)]`` is raster."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    return inverse
