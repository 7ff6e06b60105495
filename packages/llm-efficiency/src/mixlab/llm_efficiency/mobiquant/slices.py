"""MoBiSlice: many-in-one recursive residual quantization with floor-aligned bit slices.

One weight group (``group_size`` input columns of one output row) has ONE scale ``s`` and ONE
zero ``z`` (a float, in units of ``s``). The base slice quantizes ``u = W/s + z`` with floor;
every further slice quantizes the remaining residual at a ``2^bits`` times finer step
(paper §4.1, App. B):

    q_1 = clamp(floor(u), 0, 2^b - 1)                r_1 = u - q_1
    q_e = clamp(floor(r_{e-1} * 2^b), 0, 2^b - 1)    r_e = r_{e-1} * 2^b - q_e

Reading the first ``d`` slices concatenates their bits, ``Q_d = sum_e q_e << b(d - e)``, so a
lower precision is the higher one with its least significant bits dropped, exactly
(``Q_{d-1} == Q_d >> b``). Each read is reconstructed at the middle of its bin,

    W_d = s * ((Q_d + 1/2) / 2^{b(d-1)} - z),

so the error at depth ``d`` is at most half of its step ``s / 2^{b(d-1)}`` for values inside the
group's range: each added slice divides the error bound by ``2^b``.

Storage: ``planes`` is uint8 ``[slices, out, in * bits / 8]``, bit-plane major (slice ``e`` is one
contiguous tensor, so a read of depth ``d`` touches only the first ``d`` of them); code of column
``k`` sits in byte ``k // (8 / bits)`` at bit offset ``(k % (8 / bits)) * bits``. Scales and zeros
are float16 ``[out, in / group_size]``.

The clipping question (spec §2(a)): a range clipped for the 2-bit read saturates every deeper
read, because the recursion above equals ``clamp(floor(u * 2^{b(E-1)}))`` at the finest step.
:func:`group_range` therefore takes one clip ratio per group chosen by :func:`search_clip` to
minimise the error averaged over ALL depths (the measured choice; ``tests/test_mobiquant.py``
shows the per-depth errors of clipped and unclipped ranges).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

__all__ = [
    "SliceSpec",
    "affine_at",
    "combine",
    "dequantize",
    "group_range",
    "group_view",
    "pack",
    "scale_zero",
    "search_clip",
    "slice_codes",
    "unpack",
]


@dataclass(frozen=True)
class SliceSpec:
    """How a weight is sliced: ``slices`` slices of ``bits`` bits, one scale/zero per group."""

    bits: int = 2
    slices: int = 4
    group_size: int = 64

    def __post_init__(self) -> None:
        if (
            isinstance(self.bits, bool)
            or self.bits not in (1, 2, 4, 8)
            or not isinstance(self.bits, int)
        ):
            raise ValueError(f"bits must divide 8 (1, 2, 4 or 8), got {self.bits!r}")
        if not isinstance(self.slices, int) or not self.slices >= 1 or self.bits * self.slices > 16:
            raise ValueError(
                f"slices must be an integer >= 1 with bits * slices <= 16, got {self.slices!r}"
            )
        if not isinstance(self.group_size, int) or self.group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {self.group_size!r}")

    @property
    def max_bits(self) -> int:
        return self.bits * self.slices

    def check_width(self, in_features: int, name: str = "layer") -> None:
        """Raise if the group size or the packing does not divide the input width."""
        if in_features % self.group_size:
            raise ValueError(
                f"group_size={self.group_size} must divide the input width of {name} "
                f"({in_features})"
            )
        if (in_features * self.bits) % 8:
            raise ValueError(f"{name}: in_features * bits must be a multiple of 8")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def group_view(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[out, in]`` as ``[out, groups, group_size]`` (a view where it can be)."""
    out_features, in_features = weight.shape
    return weight.reshape(out_features, in_features // group_size, group_size)


def group_range(
    weight: torch.Tensor, spec: SliceSpec, clip: torch.Tensor | float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero ``[out, groups]`` whose ``2^bits`` base bins cover each group's range.

    ``clip`` (a number or one ratio per group) shrinks the range towards the middle of the group,
    as OmniQuant's learnable weight clipping does (there towards zero: the same for ``clip=1``).
    """
    grouped = group_view(weight.float(), spec.group_size)
    low, high = grouped.amin(-1), grouped.amax(-1)
    middle, half = (high + low) / 2, (high - low) / 2 * clip
    return scale_zero(middle - half, middle + half, spec.bits, grouped.abs().amax(-1))


def scale_zero(
    low: torch.Tensor, high: torch.Tensor, bits: int, magnitude: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Base step and zero of the range ``[low, high]`` split into ``2^bits`` bins.

    The step is kept at least 1e-3 of the group's largest magnitude (and a normal float16), so a
    constant group gets a finite scale and a zero ``|z| <= 1000`` that float16 stores.
    """
    floor = torch.clamp_min(magnitude * 1e-3, 6.2e-5)
    scale = torch.maximum((high - low) / 2**bits, floor)
    return scale, -low / scale


def slice_codes(
    weight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, spec: SliceSpec
) -> torch.Tensor:
    """The recursive residual codes ``[slices, out, in]`` (uint8) of ``weight``."""
    levels = 2**spec.bits
    scale_full = scale.float().repeat_interleave(spec.group_size, dim=1)
    zero_full = zero.float().repeat_interleave(spec.group_size, dim=1)
    residual = weight.float() / scale_full + zero_full  # u, in units of the base step
    codes = []
    for e in range(spec.slices):
        if e:
            residual = residual * levels
        code = residual.floor().clamp(0, levels - 1)
        residual = residual - code
        codes.append(code.to(torch.uint8))
    return torch.stack(codes)


def combine(
    codes: torch.Tensor, depth: int, bits: int, dtype: torch.dtype = torch.int32
) -> torch.Tensor:
    """``Q_d``: the first ``depth`` slices' codes concatenated most significant first (int32, or
    ``dtype`` when ``depth * bits`` fit in it)."""
    total = codes[0].to(dtype)
    for e in range(1, depth):
        total = (total << bits) | codes[e].to(dtype)
    return total


def dequantize(
    codes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    spec: SliceSpec,
    depth: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``W_d``, the weight read at ``depth`` slices (``depth * bits`` bits), from unpacked codes."""
    if not 1 <= depth <= spec.slices:
        raise ValueError(f"depth must be in 1..{spec.slices}, got {depth!r}")
    slope, offset = affine_at(scale, zero, spec, depth)
    q = group_view(combine(codes, depth, spec.bits).float(), spec.group_size)
    # one multiply-add per weight, the group's slope and offset broadcast (no [out, in] copies)
    return torch.addcmul(offset.unsqueeze(-1), q, slope.unsqueeze(-1)).flatten(1).to(dtype)


def affine_at(
    scale: torch.Tensor, zero: torch.Tensor, spec: SliceSpec, depth: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``W_d = slope * Q_d + offset`` per group (float32 ``[out, groups]``): the read at ``depth``
    is an ordinary asymmetric ``d * bits``-bit group code, ``slope = s step`` and
    ``offset = s (step / 2 - z)`` with ``step = 2^{-b(d-1)}``."""
    step = 2.0 ** (-spec.bits * (depth - 1))
    scale = scale.float()
    return scale * step, scale * (step / 2 - zero.float())


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``[..., in]`` codes of ``bits`` bits into uint8 ``[..., in * bits / 8]``."""
    per_byte = 8 // bits
    grouped = codes.to(torch.uint8).reshape(*codes.shape[:-1], -1, per_byte)
    packed = torch.zeros(grouped.shape[:-1], dtype=torch.uint8, device=codes.device)
    for j in range(per_byte):
        packed |= grouped[..., j] << (j * bits)
    return packed


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack`: uint8 ``[..., in * bits / 8]`` to codes ``[..., in]``."""
    per_byte, mask = 8 // bits, (1 << bits) - 1
    parts = [(packed >> (j * bits)) & mask for j in range(per_byte)]
    return torch.stack(parts, dim=-1).reshape(*packed.shape[:-1], -1)


def search_clip(
    weight: torch.Tensor,
    spec: SliceSpec,
    ratios: tuple[float, ...] = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75),
    depth_weights: tuple[float, ...] | None = None,
) -> torch.Tensor:
    """Per-group clip ratio minimising the error averaged over depths.

    Each depth's squared error is divided by that depth's unclipped error first, so the 2-bit
    read (large error) cannot buy its gain with a many-fold loss at 8 bits. ``depth_weights``
    (default all ones) weights the depths.
    """
    weights = depth_weights or (1.0,) * spec.slices
    grouped = group_view(weight.float(), spec.group_size)
    errors = []
    for ratio in ratios:
        scale, zero = group_range(weight, spec, ratio)
        codes = slice_codes(weight, scale, zero, spec)
        per_depth = []
        for depth in range(1, spec.slices + 1):
            approx = group_view(dequantize(codes, scale, zero, spec, depth), spec.group_size)
            per_depth.append((approx - grouped).pow(2).sum(-1))
        errors.append(torch.stack(per_depth))  # [depth, out, groups]
    errors_t = torch.stack(errors)  # [ratio, depth, out, groups]
    relative = errors_t / errors_t[0].clamp_min(1e-20)
    score = (relative * torch.tensor(weights, device=weight.device).view(1, -1, 1, 1)).sum(1)
    return torch.tensor(ratios, device=weight.device)[score.argmin(0)]
