"""Nested bit-slice matmul: each token reads the weight at its own depth.

    y[m] = x[m] @ W_{depth[m]}^T,    W_d = s * ((Q_d + 1/2) / 2^{b(d-1)} - z)

where ``Q_d`` concatenates the first ``d`` slices' codes (:mod:`.slices`). This is the decode-time
GEMV/GEMM of MoBiQuant with a router that picks a depth per token.

Why a kernel: at batch sizes of decoding the matmul is bound by weight traffic, and the point of
the bit-plane-major layout is that a token at depth ``d`` needs only ``d * bits`` bits per weight
(plus the shared group scale and zero), not the ``slices * bits`` of the full read. Dequantizing
``W_d`` to fp16 in memory first (what :func:`nested_matmul_reference` does, in fp32) writes and
reads 16 bits per weight again and gives the saving back.

Design of :func:`nested_matmul_triton` (spec §2(f)):

1. The host sorts the tokens by depth (stable ``argsort``) and cuts each depth's segment into
   tiles of at most ``block_m`` tokens, so every tile has ONE depth; the last tile of a segment
   is padded (masked rows). The kernel gets the permutation and per-tile (start, count, depth).
2. Grid ``(tiles, cdiv(N, block_n))``. A program gathers its tokens' rows of ``x`` through the
   permutation, walks ``K`` in ``block_k`` chunks, loads only the first ``depth`` bit planes of
   its weight tile (a runtime loop), shift-and-adds the codes into an int32 ``Q``, dequantizes
   once with the group scale and zero, and accumulates ``tl.dot(x, W^T)`` in fp32.
3. Rows are stored at their original (unsorted) positions, so no un-permute pass is needed.

The paper's kernel (§4.3) multiplies on the bit planes directly with binary tensor-core MMA
(BMMA); that is CUDA/PTX territory that Triton does not expose, so this kernel dequantizes in
registers and uses ordinary fp16/bf16 (or fp32) ``tl.dot``.

Triton is imported lazily: it has no macOS/Windows wheels, and the reference path must work
without it. On CPU the kernel runs under ``TRITON_INTERPRET=1`` (set before triton is imported),
which is how the tests check it.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch

from .slices import SliceSpec, affine_at, combine, dequantize, unpack

__all__ = [
    "fixed_matmul",
    "int4_applies",
    "nested_matmul",
    "nested_matmul_reference",
    "nested_matmul_triton",
    "pack_int4",
]

BACKENDS = ("auto", "triton", "reference")
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _check_inputs(
    x: torch.Tensor,
    planes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    depth: torch.Tensor,
    spec: SliceSpec,
) -> None:
    """Raise a ValueError naming the first argument that does not fit ``x`` [M, K] and ``spec``."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if x.dtype not in _FLOATS:
        raise ValueError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    m, k = x.shape
    spec.check_width(k, name="x")
    if planes.dtype != torch.uint8 or planes.dim() != 3:
        shape = tuple(planes.shape)
        raise ValueError(f"planes must be uint8 [slices, N, K*bits/8], got {planes.dtype} {shape}")
    n = planes.shape[1]
    expected = (spec.slices, n, k * spec.bits // 8)
    if tuple(planes.shape) != expected:
        raise ValueError(
            f"planes must have shape [slices, N, K*bits/8] = {expected} for K={k} and {spec}, "
            f"got {tuple(planes.shape)}"
        )
    for name, t in (("scale", scale), ("zero", zero)):
        if tuple(t.shape) != (n, k // spec.group_size):
            raise ValueError(
                f"{name} must have shape [N, K/group_size] = {(n, k // spec.group_size)}, "
                f"got {tuple(t.shape)}"
            )
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a float tensor, got {t.dtype}")
    if depth.shape != (m,):
        raise ValueError(f"depth must have shape [M] = {(m,)}, got {tuple(depth.shape)}")
    if depth.is_floating_point() or depth.is_complex() or depth.dtype == torch.bool:
        raise ValueError(f"depth must be an integer tensor, got {depth.dtype}")
    for name, t in (("planes", planes), ("scale", scale), ("zero", zero), ("depth", depth)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    if m and not torch.compiler.is_compiling():  # a compiled graph keeps no host sync
        low, high = torch.stack(torch.aminmax(depth)).tolist()  # one host sync
        if low < 1 or high > spec.slices:
            raise ValueError(
                f"depth values must be in 1..{spec.slices} (spec.slices), got min {low}, max {high}"
            )


def nested_matmul_reference(
    x: torch.Tensor,
    planes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    depth: torch.Tensor,
    spec: SliceSpec,
    depths: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """``y[m] = x[m] @ W_{depth[m]}^T`` in plain PyTorch (the CPU path and the kernel's oracle).

    Args:
        x: ``[M, K]`` float32, float16 or bfloat16 activations.
        planes: uint8 ``[slices, N, K * bits / 8]`` packed bit planes (:func:`.slices.pack`).
        scale, zero: ``[N, K / group_size]`` group scale and zero.
        depth: integer ``[M]``, each in ``1..spec.slices``.
        spec: the :class:`.slices.SliceSpec` the planes were made with.
        depths: the depths ``depth`` can hold (default all; a router at a budget reads two).

    Returns:
        ``[M, N]`` in ``x.dtype``, computed in float32, as ``sum_d (x * [depth == d]) @ W_d^T``:
        each row gets exactly one non-zero term, so it equals the per-depth matmul, and nothing
        reads the depths' values on the host (no sync: it compiles into one graph).
    """
    _check_inputs(x, planes, scale, zero, depth, spec)
    depths = tuple(range(1, spec.slices + 1)) if depths is None else depths
    codes = unpack(planes[: max(depths)], spec.bits)  # only the planes some token may read
    x32 = x.float()
    y = x32.new_zeros(x.shape[0], planes.shape[1])
    for d in depths:
        rows = (depth == d).unsqueeze(1).to(x32.dtype)
        y = y.addmm(x32 * rows, dequantize(codes[:d], scale, zero, spec, d).T)
    return y.to(x.dtype)


def int4_applies(spec: SliceSpec, depth: int, device: torch.device, out_features: int) -> bool:
    """Whether the read at ``depth`` goes to PyTorch's packed int4 CPU matmul: a 4-bit read (two
    2-bit slices, one 4-bit slice, ...) on the CPU, with what that kernel takes (groups of 32 to
    256 columns, outputs in multiples of 16)."""
    return (
        device.type == "cpu"
        and depth * spec.bits == 4
        and spec.group_size in (32, 64, 128, 256)
        and out_features % 16 == 0
    )


def pack_int4(
    planes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    spec: SliceSpec,
    depth: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The 4-bit read ``Q_d`` as operands of ``torch._weight_int4pack_mm_for_cpu``: the packed
    codes and the ``[groups, N, 2]`` scales and zeros in ``dtype``.

    That kernel reads ``W = (q - 8) * a + c`` per group; ours is ``W_d = slope * Q_d + offset``
    (:func:`.slices.affine_at`), so ``a = slope`` and ``c = offset + 8 slope``: the same weight,
    with the slope and offset rounded to ``dtype``."""
    codes = combine(unpack(planes[:depth], spec.bits), depth, spec.bits)  # [N, K] in 0..15
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    slope, offset = affine_at(scale, zero, spec, depth)
    scales_and_zeros = torch.stack([slope.T, (offset + 8 * slope).T], dim=-1)
    return packed, scales_and_zeros.to(dtype).contiguous()


def fixed_matmul(
    x: torch.Tensor,
    planes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    depth: int,
    spec: SliceSpec,
    *,
    int4: tuple[torch.Tensor, torch.Tensor] | None = None,
    backend: Literal["auto", "triton", "reference"] = "auto",
) -> torch.Tensor:
    """``x [M, K] @ W_depth^T``, every token at one depth, by the fastest path that applies:

    - ``int4`` given (:func:`pack_int4`, on the CPU): PyTorch's packed int4 matmul;
    - CUDA with triton (or ``backend="triton"``): the nested kernel with one depth, its tile
      table built from ``M`` alone (no host sync);
    - else unpack and dequantize ``W_d`` (vectorised) block by block and multiply (the whole
      weight at once, then ``F.linear``, under autograd or ``torch.compile``).
    """
    if int4 is not None:
        packed, scales_and_zeros = int4
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, packed, spec.group_size, scales_and_zeros.to(x.dtype)
        )
    if backend == "triton" or (backend == "auto" and x.is_cuda and _triton_available()):
        return _uniform_triton(x, planes, scale, zero, depth, spec)
    if x.requires_grad or torch.compiler.is_compiling():
        codes = unpack(planes[:depth], spec.bits)
        return torch.nn.functional.linear(x, dequantize(codes, scale, zero, spec, depth, x.dtype))
    return _dequantized_matmul(x, planes, scale, zero, depth, spec)


def _dequantized_matmul(
    x: torch.Tensor,
    planes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    depth: int,
    spec: SliceSpec,
    rows: int = 512,
) -> torch.Tensor:
    """``x @ W_depth^T`` dequantizing ``rows`` output rows at a time: the codes concatenated in
    uint8 while they fit, the weight made in ``x``'s dtype, so each block stays in cache and no
    full-size temporary is allocated (on a CPU those page faults cost more than the arithmetic)."""
    slope, offset = affine_at(scale, zero, spec, depth)
    code_dtype = torch.uint8 if depth * spec.bits <= 8 else torch.int32
    blocks = []
    for start in range(0, planes.shape[1], rows):
        end = min(start + rows, planes.shape[1])
        q = combine(unpack(planes[:depth, start:end], spec.bits), depth, spec.bits, code_dtype)
        q = q.view(end - start, -1, spec.group_size).to(torch.float32)
        w = torch.addcmul(offset[start:end, :, None], q, slope[start:end, :, None])
        blocks.append(torch.mm(x, w.flatten(1).to(x.dtype).T))
    return torch.cat(blocks, dim=1)


def _tile_table(
    depth: torch.Tensor, slices: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The depth-sorted token order and a ``[3, tiles]`` int32 table of (start, count, depth).

    Tile ``t`` covers sorted positions ``start .. start + count - 1``, all of one depth; each
    depth's segment is cut at ``block_m`` and its last tile is short (padded in the kernel).
    """
    order = torch.argsort(depth, stable=True).to(torch.int32)
    counts = torch.bincount(depth.long(), minlength=slices + 1)[1:].tolist()  # one host sync
    starts, sizes, depths = [], [], []
    offset = 0
    for d, count in enumerate(counts, start=1):
        for first in range(0, count, block_m):
            starts.append(offset + first)
            sizes.append(min(block_m, count - first))
            depths.append(d)
        offset += count
    table = torch.tensor([starts, sizes, depths], dtype=torch.int32).to(depth.device)
    return order, table, len(starts)


def _uniform_triton(
    x: torch.Tensor,
    planes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    depth: int,
    spec: SliceSpec,
    block_m: int = 16,
) -> torch.Tensor:
    """The kernel with every token at ``depth``: tiles of ``block_m`` tokens in their own order."""
    m = x.shape[0]
    y = torch.empty(m, planes.shape[1], dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    starts = list(range(0, m, block_m))
    table = [starts, [min(block_m, m - s) for s in starts], [depth] * len(starts)]
    order = torch.arange(m, dtype=torch.int32, device=x.device)
    table_t = torch.tensor(table, dtype=torch.int32).to(x.device, non_blocking=True)
    _launch(x, planes, scale, zero, y, order, table_t, len(starts), spec,
            block_m=block_m, block_n=32, block_k=64, num_warps=4)  # fmt: skip
    return y


@functools.cache
def _kernel():
    """Compile-on-first-use: define the @triton.jit kernel only when triton is wanted."""
    import triton
    import triton.language as tl

    @triton.jit
    def nested_matmul_kernel(
        x_ptr, planes_ptr, scale_ptr, zero_ptr, y_ptr, order_ptr, table_ptr,
        num_tiles, N, K,
        stride_xm, stride_xk, stride_ps, stride_pn, stride_sn, stride_zn, stride_ym,
        BITS: tl.constexpr, GROUP: tl.constexpr, FP32_DOT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        PER_BYTE: tl.constexpr = 8 // BITS
        MASK: tl.constexpr = (1 << BITS) - 1
        tile = tl.program_id(0)
        start = tl.load(table_ptr + tile)
        count = tl.load(table_ptr + num_tiles + tile)
        depth = tl.load(table_ptr + 2 * num_tiles + tile)

        offs_m = tl.arange(0, BLOCK_M)
        m_mask = offs_m < count  # the padded rows of a segment's last tile
        rows = tl.load(order_ptr + start + offs_m, mask=m_mask, other=0)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
        # W_d = s * ((Q + 1/2) * step - z) with step = 2^{-bits (d-1)}, exact in float32
        step = 1.0 / (1 << (BITS * (depth - 1))).to(tl.float32)

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < K
            x_tile = tl.load(
                x_ptr + rows[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                mask=m_mask[:, None] & k_mask[None, :],
                other=0.0,
            )
            # Code of column k: byte k // PER_BYTE, bits (k % PER_BYTE) * BITS. Neighbouring
            # columns load the same byte; the repeats hit L1, DRAM sees each byte once.
            w_mask = n_mask[:, None] & k_mask[None, :]
            plane_ptrs = planes_ptr + offs_n[:, None] * stride_pn + (offs_k // PER_BYTE)[None, :]
            shift = ((offs_k % PER_BYTE) * BITS)[None, :]
            q = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.int32)
            for e in range(0, depth):  # only the planes this tile's depth reads
                byte = tl.load(plane_ptrs + e * stride_ps, mask=w_mask, other=0)
                q = (q << BITS) | ((byte.to(tl.int32) >> shift) & MASK)
            groups = (offs_k // GROUP)[None, :]
            s = tl.load(scale_ptr + offs_n[:, None] * stride_sn + groups, mask=w_mask, other=0.0)
            z = tl.load(zero_ptr + offs_n[:, None] * stride_zn + groups, mask=w_mask, other=0.0)
            w = s.to(tl.float32) * ((q.to(tl.float32) + 0.5) * step - z.to(tl.float32))
            if FP32_DOT:  # float32 x: keep full precision (no TF32) so it matches the reference
                acc += tl.dot(x_tile, tl.trans(w), input_precision="ieee")
            else:  # fp16/bf16 x: W in x's dtype feeds the tensor cores, fp32 accumulation
                acc += tl.dot(x_tile, tl.trans(w.to(x_tile.dtype)))

        y_ptrs = y_ptr + rows[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])

    return triton, nested_matmul_kernel


def _check_block(name: str, value: int) -> None:
    # tl.arange needs powers of two; tl.dot needs every dimension >= 16
    if not isinstance(value, int) or value < 16 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= 16 (tl.dot), got {value!r}")


def nested_matmul_triton(
    x: torch.Tensor,
    planes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    depth: torch.Tensor,
    spec: SliceSpec,
    *,
    block_m: int = 16,
    block_n: int = 32,
    block_k: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """``y[m] = x[m] @ W_{depth[m]}^T`` with the Triton kernel (arguments as the reference).

    ``block_m`` tokens (all of one depth) by ``block_n`` output rows per program, ``block_k``
    input columns per step; each a power of two >= 16. Any ``block_k`` works with any group size
    (the group of each column is looked up). Accumulates in float32, returns ``x.dtype``. Runs
    on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1``.
    """
    _check_inputs(x, planes, scale, zero, depth, spec)
    for name, value in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        _check_block(name, value)
    y = torch.empty(x.shape[0], planes.shape[1], dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    order, table, num_tiles = _tile_table(depth, spec.slices, block_m)
    _launch(x, planes, scale, zero, y, order, table, num_tiles, spec,
            block_m=block_m, block_n=block_n, block_k=block_k, num_warps=num_warps)  # fmt: skip
    return y


def _launch(
    x: torch.Tensor,
    planes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    y: torch.Tensor,
    order: torch.Tensor,
    table: torch.Tensor,
    num_tiles: int,
    spec: SliceSpec,
    *,
    block_m: int,
    block_n: int,
    block_k: int,
    num_warps: int,
) -> None:
    """Run the kernel on a prepared tile table, writing ``y`` (no checks; the benchmark times
    this apart from the host-side sort)."""
    triton, kernel = _kernel()
    k, n = x.shape[1], planes.shape[1]
    # the kernel indexes bytes and groups with unit stride along K
    planes, scale, zero = planes.contiguous(), scale.contiguous(), zero.contiguous()
    grid = (num_tiles, triton.cdiv(n, block_n))
    kernel[grid](
        x, planes, scale, zero, y, order, table,
        num_tiles, n, k,
        x.stride(0), x.stride(1), planes.stride(0), planes.stride(1),
        scale.stride(0), zero.stride(0), y.stride(0),
        BITS=spec.bits, GROUP=spec.group_size, FP32_DOT=x.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
    )  # fmt: skip


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def nested_matmul(
    x: torch.Tensor,
    planes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    depth: torch.Tensor,
    spec: SliceSpec,
    backend: Literal["auto", "triton", "reference"] = "auto",
    depths: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """``y[..., n] = x[...] @ W_{depth[...]}^T``: x ``[..., K]``, depth ``x.shape[:-1]``.

    ``backend="auto"`` uses the Triton kernel for CUDA tensors when triton imports and the
    PyTorch reference otherwise; ``"triton"`` and ``"reference"`` force one. ``depths``: the
    depths ``depth`` can hold, when fewer than all (the reference then reads fewer).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension [..., K]")
    if depth.shape != x.shape[:-1]:
        raise ValueError(
            f"depth must have the leading shape of x {tuple(x.shape[:-1])}, "
            f"got {tuple(depth.shape)}"
        )
    if backend == "auto":
        backend = "triton" if x.is_cuda and _triton_available() else "reference"
    args = (x.reshape(-1, x.shape[-1]), planes, scale, zero, depth.reshape(-1), spec)
    if backend == "triton":
        y = nested_matmul_triton(*args)
    else:
        y = nested_matmul_reference(*args, depths)
    return y.reshape(*x.shape[:-1], y.shape[-1])
