"""A forward-only Triton kernel for MiTA's grouped execution (top-1 routing).

The grouped path (``MiTAAttention._grouped``, its layout from
:func:`~mixlab.attention_arch.mita.attention.tile_layout`) sorts the routed queries by expert
into tiles of T slots, so that a tile meets one expert's k' keys. Per slot s of tile t, with query
q = queries[slot_query[s]] and the expert's keys S = tile_keys_index[t], Eq. (5) of
:mod:`~mixlab.attention_arch.mita.attention` is one softmax over M + k' logits:

    ℓ_m = q · (r_m / √d) / √d   (m ≤ M: shared slots, q·r/d, MiTA's double scaling)
    ℓ_j = q · k_j / √d           (j ∈ S: routed keys)
    o_s = Σ_m α_m V_s[m] + Σ_{j∈S} β_j v_j,   (α, β) = softmax([ℓ_m ; ℓ_j])

Why a kernel: the torch path materialises each tile's keys and values ((B, H, tiles, k', d)
copies), its (tiles, T, k') logits and weights, and assembles the joint softmax from
log-sum-exps in several passes over memory. :func:`grouped_tiles_forward` runs one program per
(batch·head, tile) that gathers its T query rows and k' key/value rows straight from q, k, v,
holds the whole tile in registers (T, k', M and d ≤ :data:`MAX_BLOCK`: one softmax, no online
rescaling), and writes only the (T, d) outputs. That it is faster is the design's intent, not
yet a measurement: ``benchmarks/mita_gpu.py`` times it against the torch path on a GPU.

Design (one program per (b·h, tile)):

1. load the tile's slot → query indices and the expert's k' key indices, then gather the query,
   key and value rows (each block padded to a power of two ≥ 16 for ``tl.dot``, masked);
2. ``tl.dot`` for the T×k' routed and T×M shared logits, both scaled by 1/√d (the landmarks come
   in already multiplied by 1/√d, so the shared ones end up at q·r/d);
3. the joint softmax from one row maximum over both parts; padded keys and slots are −inf;
4. ``tl.dot`` of the weights with [V_s ; v_S] in float32 accumulation, divided by the row sum,
   stored in the input dtype.

Not covered (``MiTAAttention`` runs its PyTorch path there): top-2 routing, key masks
(``Routes.kept`` / ``Routes.empty``), attention dropout, and backward (the kernel refuses
inputs that require grad). Indices are not range-checked: that would sync with the host.

Triton is imported lazily, as in :mod:`mixlab.llm_efficiency.mobiquant.kernel`: the module
imports without it, and on CPU tensors the kernel runs under ``TRITON_INTERPRET=1`` (set
before triton is imported), which is how the tests check it.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from mixlab.attention_arch.mita.attention import gather_tokens

__all__ = [
    "grouped_tiles_forward",
    "grouped_tiles_reference",
    "triton_available",
]

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
MAX_BLOCK = 128
"""the largest padded T, k', M and d: one program holds its whole tile (queries, keys, values,
logits) in registers and shared memory, and much larger ones spill or exceed shared memory (a
bound, not a measured limit; MiTA's defaults are T ≤ 64, k' = 48, M = 16, d = 64)"""


def triton_available(device: torch.device | str) -> bool:
    """Whether :func:`grouped_tiles_forward` can run on ``device``: triton imports, and the
    device is CUDA, or CPU under ``TRITON_INTERPRET=1`` (slow: for tests)."""
    if not _triton_installed():
        return False
    kind = torch.device(device).type
    return kind == "cuda" or (kind == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")


@functools.cache
def _triton_installed() -> bool:  # asked on every grouped forward: look once
    return importlib.util.find_spec("triton") is not None


def _check_inputs(
    queries: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_query: torch.Tensor,
    tile_keys_index: torch.Tensor,
    tile: int,
    shared_keys: torch.Tensor | None,
    agent_values: torch.Tensor | None,
) -> None:
    """Raise a ValueError naming the first argument that does not fit ``queries`` (B, H, Nq, d)."""
    if queries.dim() != 4:
        raise ValueError(f"queries must be 4-D (B, H, Nq, d), got shape {tuple(queries.shape)}")
    if queries.dtype not in FLOATS:
        raise ValueError(f"queries must be float32, float16 or bfloat16, got {queries.dtype}")
    batch, heads, _, dim = queries.shape
    tensors = {"k": k, "v": v, "shared_keys": shared_keys, "agent_values": agent_values}
    if (shared_keys is None) != (agent_values is None):
        raise ValueError("shared_keys and agent_values must be both given or both None")
    for name, t in tensors.items():
        if t is None:
            continue
        if t.dim() != 4 or (t.shape[0], t.shape[1], t.shape[3]) != (batch, heads, dim):
            raise ValueError(
                f"{name} must have shape (B, H, *, d) = ({batch}, {heads}, *, {dim}) like "
                f"queries, got {tuple(t.shape)}"
            )
        if t.dtype != queries.dtype:
            raise ValueError(
                f"{name} must have the dtype of queries ({queries.dtype}), got {t.dtype}"
            )
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if shared_keys is not None and agent_values.shape != shared_keys.shape:
        raise ValueError(
            f"agent_values must have the shape of shared_keys {tuple(shared_keys.shape)}, "
            f"got {tuple(agent_values.shape)}"
        )
    if not isinstance(tile, int) or isinstance(tile, bool) or tile < 1:
        raise ValueError(f"tile must be a positive integer, got {tile!r}")
    for name, t in (("slot_query", slot_query), ("tile_keys_index", tile_keys_index)):
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
    if tile_keys_index.dim() != 4 or tuple(tile_keys_index.shape[:2]) != (batch, heads):
        raise ValueError(
            f"tile_keys_index must have shape (B, H, tiles, k') = ({batch}, {heads}, tiles, k'), "
            f"got {tuple(tile_keys_index.shape)}"
        )
    if tile_keys_index.shape[3] < 1:
        raise ValueError("tile_keys_index must hold at least one key per tile (k' >= 1)")
    slots = tile_keys_index.shape[2] * tile
    if tuple(slot_query.shape) != (batch, heads, slots):
        raise ValueError(
            f"slot_query must have shape (B, H, tiles·tile) = ({batch}, {heads}, {slots}), "
            f"got {tuple(slot_query.shape)}"
        )
    for name, t in {
        "slot_query": slot_query,
        "tile_keys_index": tile_keys_index,
        **tensors,
    }.items():
        if t is not None and t.device != queries.device:
            raise ValueError(f"{name} is on {t.device} but queries is on {queries.device}")


def grouped_tiles_reference(
    queries: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_query: torch.Tensor,
    tile_keys_index: torch.Tensor,
    tile: int,
    shared_keys: torch.Tensor | None,
    agent_values: torch.Tensor | None,
) -> torch.Tensor:
    """Eq. (5) per slot of the grouped layout in plain PyTorch, computed in float32: the kernel's
    test oracle (``MiTAAttention``'s own PyTorch path is ``_grouped``).

    Args:
        queries: (B, H, Nq, d) routed queries, float32, float16 or bfloat16.
        k, v: (B, H, N, d) keys and values.
        slot_query: (B, H, L) integer, L = tiles·T: the query each slot reads (a padding slot
            reads any valid query; its output is meaningless).
        tile_keys_index: (B, H, tiles, k') integer: the keys S_e of each tile's expert e.
        tile: T, slots per tile.
        shared_keys: (B, H, M, d) landmarks already multiplied by d^-1/2, or None (routed only).
        agent_values: (B, H, M, d) V_s, or None (with ``shared_keys``).

    Returns:
        (B, H, L, d) in ``queries.dtype``: slot s of tile t holds softmax([q·R'ᵀ ; q·K_Sᵀ]/√d)
        · [V_s ; V_S] with q = queries[slot_query[s]], R' = ``shared_keys``, S = the tile's keys.
    """
    _check_inputs(queries, k, v, slot_query, tile_keys_index, tile, shared_keys, agent_values)
    batch, heads, _, dim = queries.shape
    tiles = tile_keys_index.shape[2]
    scale = dim**-0.5
    slot_queries = gather_tokens(queries.float(), slot_query).view(batch, heads, tiles, tile, dim)
    keys = gather_tokens(k.float(), tile_keys_index)  # (B, H, tiles, k', d)
    values = gather_tokens(v.float(), tile_keys_index)
    logits = slot_queries @ keys.transpose(-1, -2) * scale  # (B, H, tiles, T, k')
    if shared_keys is None:
        out = logits.softmax(-1) @ values
    else:
        shared = torch.einsum("bhtsd,bhmd->bhtsm", slot_queries, shared_keys.float()) * scale
        weights = torch.cat([shared, logits], dim=-1).softmax(-1)  # one joint softmax, Eq. (5)
        slots = shared_keys.shape[2]
        out = weights[..., slots:] @ values
        out = out + torch.einsum("bhtsm,bhmd->bhtsd", weights[..., :slots], agent_values.float())
    return out.reshape(batch, heads, tiles * tile, dim).to(queries.dtype)


@functools.cache
def _kernel():
    """Compile-on-first-use: define the @triton.jit kernel only when triton is wanted."""
    import triton
    import triton.language as tl

    @triton.jit
    def grouped_tiles_kernel(
        q_ptr, k_ptr, v_ptr, sk_ptr, av_ptr, slot_ptr, index_ptr, out_ptr,
        heads, num_slots, num_tiles, tile, per_expert, landmarks, dim, scale,
        stride_qb, stride_qh, stride_qn, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_sb, stride_sh, stride_sm, stride_sd,
        stride_ab, stride_ah, stride_am, stride_ad,
        SHARED: tl.constexpr, FP32_DOT: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        # Programs of one head are adjacent, so its k and v stay in L2 while its tiles run;
        # int64 offsets: B·H·N·d passes 2^31 at large batches.
        program = tl.program_id(0).to(tl.int64)
        bh, t = program // num_tiles, program % num_tiles
        b, h = bh // heads, bh % heads
        offs_d = tl.arange(0, BLOCK_D)
        d_mask = offs_d < dim

        # 1. gather the tile's T queries and its expert's k' keys and values
        offs_t = tl.arange(0, BLOCK_T)
        t_mask = offs_t < tile  # rows past T pad the block to tl.dot's 16
        slots = bh * num_slots + t * tile + offs_t
        rows = tl.load(slot_ptr + slots, mask=t_mask, other=0)
        q = tl.load(
            q_ptr + b * stride_qb + h * stride_qh
            + rows[:, None] * stride_qn + offs_d[None, :] * stride_qd,
            mask=t_mask[:, None] & d_mask[None, :], other=0.0,
        )  # fmt: skip
        offs_k = tl.arange(0, BLOCK_K)
        k_mask = offs_k < per_expert
        keys = tl.load(index_ptr + (bh * num_tiles + t) * per_expert + offs_k, mask=k_mask, other=0)
        kv_mask = k_mask[:, None] & d_mask[None, :]
        k_tile = tl.load(
            k_ptr + b * stride_kb + h * stride_kh
            + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd,
            mask=kv_mask, other=0.0,
        )  # fmt: skip
        v_tile = tl.load(
            v_ptr + b * stride_vb + h * stride_vh
            + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            mask=kv_mask, other=0.0,
        )  # fmt: skip

        # 2. routed logits q·k_j/√d, (T, k'); padded keys are -inf (k' >= 1: a row max is finite)
        if FP32_DOT:  # float32 inputs: full precision (no TF32), to match the reference
            logits = tl.dot(q, tl.trans(k_tile), input_precision="ieee")
        else:
            logits = tl.dot(q, tl.trans(k_tile))
        logits = tl.where(k_mask[None, :], logits * scale, float("-inf"))
        top = tl.max(logits, 1)
        if SHARED:  # shared logits q·(r/√d)/√d = q·r/d, (T, M)
            offs_m = tl.arange(0, BLOCK_M)
            m_mask = offs_m < landmarks
            sm_mask = m_mask[:, None] & d_mask[None, :]
            shared_keys = tl.load(
                sk_ptr + b * stride_sb + h * stride_sh
                + offs_m[:, None] * stride_sm + offs_d[None, :] * stride_sd,
                mask=sm_mask, other=0.0,
            )  # fmt: skip
            if FP32_DOT:
                shared = tl.dot(q, tl.trans(shared_keys), input_precision="ieee")
            else:
                shared = tl.dot(q, tl.trans(shared_keys))
            shared = tl.where(m_mask[None, :], shared * scale, float("-inf"))
            top = tl.maximum(top, tl.max(shared, 1))

        # 3. one softmax over [shared ; routed], Eq. (5): exp against the joint row max
        weights = tl.exp(logits - top[:, None])
        total = tl.sum(weights, 1)
        # 4. weights · values, float32 accumulation (fp16/bf16 weights feed the tensor cores)
        if FP32_DOT:
            acc = tl.dot(weights, v_tile, input_precision="ieee")
        else:
            acc = tl.dot(weights.to(v_tile.dtype), v_tile)
        if SHARED:
            shared_weights = tl.exp(shared - top[:, None])
            total += tl.sum(shared_weights, 1)
            agent_values = tl.load(
                av_ptr + b * stride_ab + h * stride_ah
                + offs_m[:, None] * stride_am + offs_d[None, :] * stride_ad,
                mask=sm_mask, other=0.0,
            )  # fmt: skip
            if FP32_DOT:
                acc += tl.dot(shared_weights, agent_values, input_precision="ieee")
            else:
                acc += tl.dot(shared_weights.to(agent_values.dtype), agent_values)
        out = acc / total[:, None]
        tl.store(
            out_ptr + slots[:, None] * dim + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=t_mask[:, None] & d_mask[None, :],
        )

    return grouped_tiles_kernel


def _block(size: int) -> int:
    """``size`` padded to a power of two >= 16 (tl.arange needs powers of two, tl.dot >= 16)."""
    return max(16, 1 << (size - 1).bit_length())


def grouped_tiles_forward(
    queries: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_query: torch.Tensor,
    tile_keys_index: torch.Tensor,
    tile: int,
    shared_keys: torch.Tensor | None,
    agent_values: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`grouped_tiles_reference` with the Triton kernel (same arguments and result).

    One program per (batch·head, tile). Any strides for the float tensors (``queries`` may be a
    slice of q); float32 accumulation, the output in ``queries.dtype``. Runs on CUDA tensors, or
    on CPU tensors under ``TRITON_INTERPRET=1``. Forward only: raises if an input requires grad
    while grad is enabled (use the reference there). T, k', M and d up to :data:`MAX_BLOCK`.
    """
    _check_inputs(queries, k, v, slot_query, tile_keys_index, tile, shared_keys, agent_values)
    batch, heads, _, dim = queries.shape
    tiles, per_expert = tile_keys_index.shape[2:]
    landmarks = 0 if shared_keys is None else shared_keys.shape[2]
    sizes = {"tile": tile, "k'": per_expert, "M": landmarks, "d": dim}
    for name, size in sizes.items():
        if _block(size) > MAX_BLOCK:
            raise ValueError(
                f"{name}={size} is too large for grouped_tiles_forward (at most {MAX_BLOCK}: one "
                "program holds the whole tile); use MiTAAttention's torch path (kernel = False)"
            )
    named = {"queries": queries, "k": k, "v": v, "shared_keys": shared_keys}
    for name, t in {**named, "agent_values": agent_values}.items():
        if t is not None and t.requires_grad and torch.is_grad_enabled():
            raise ValueError(
                f"{name} requires grad, but grouped_tiles_forward has no backward: call it under "
                "torch.no_grad() / torch.inference_mode(), or MiTAAttention's torch path"
            )
    out = torch.empty(batch, heads, tiles * tile, dim, dtype=queries.dtype, device=queries.device)
    if out.numel() == 0:
        return out
    kernel = _kernel()
    shared = shared_keys is not None
    # without the shared expert the kernel never reads these: any valid tensor stands in
    shared_keys = shared_keys if shared else queries
    agent_values = agent_values if shared else queries
    kernel[(batch * heads * tiles,)](
        queries, k, v, shared_keys, agent_values,
        slot_query.contiguous(), tile_keys_index.contiguous(), out,
        heads, tiles * tile, tiles, tile, per_expert, landmarks, dim, dim**-0.5,
        *queries.stride(), *k.stride(), *v.stride(), *shared_keys.stride(), *agent_values.stride(),
        SHARED=shared, FP32_DOT=queries.dtype == torch.float32,
        BLOCK_T=_block(tile), BLOCK_K=_block(per_expert), BLOCK_M=_block(max(landmarks, 1)),
        BLOCK_D=_block(dim), num_warps=4,
    )  # fmt: skip
    return out
