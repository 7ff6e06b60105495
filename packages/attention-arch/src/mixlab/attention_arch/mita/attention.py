"""MiTA attention and full attention as drop-ins for timm's ViT and EVA attention modules.

Every module here *is* a timm ``Attention`` and, once swapped in by :meth:`TokenAttention.
from_attention`, holds the swapped module's own projections: ``qkv`` / ``q_norm`` / ``k_norm`` /
``norm`` / ``gate`` / ``proj`` of a ViT ``Attention``, and for the EVA family (``EvaAttention``,
``AttentionRope``) also ``q_bias`` / ``k_bias`` / ``v_bias`` or ``q_proj`` / ``k_proj`` / ``v_proj``
and the rotary embedding ``rope`` the block passes in. A standard checkpoint therefore loads with
``strict=True``, and no weight is copied. Only how queries meet keys differs: subclasses implement
:meth:`TokenAttention.attend`. Where a kind computes a dense softmax it follows timm's
``fused_attn``: one SDPA call, or the explicit weights through ``attn_drop`` (:func:`softmax_attention`).

MiTA (Wen et al., arXiv 2602.01219, read from the authors' ``mita/mita_attention.py``), per head,
with q, k, v ∈ ℝ^{N×d}:

1. landmarks R = AdaptiveAvgPool_{p×p}(q over the patch grid) ∈ ℝ^{M×d}, M = p²;
2. shared expert: keys R, values V_s = softmax(R Kᵀ/√d) V (agent values);
3. routed experts: S_m = top-k_j (r_m · k_j), a query-aware, non-contiguous key set per landmark;
4. each query goes to e(i) = argmax_m r_m · q_i (top-1; top-2 splits k between two experts);
5. one joint softmax over the M shared slots (logits q·r/d, the code's double scaling) and the k
   routed keys (logits q·k/√d):  o_i = Σ_m α_im V_s[m] + Σ_{j∈S_e(i)} β_ij v_j.

The algorithm costs O(N·(M + k)·d) per head, and that is what runs: beyond N = M·k' + M the
default path groups the queries by expert (static-shape tiles, no N·k·d copy of the keys, no
host sync); below it one dense softmax with MiTA's routing as a mask runs faster on a CPU,
though it multiplies more (``executed_flops``). Prefix queries (CLS, registers) get plain full
attention by default (``full_prefix``).

The patch grid the landmarks pool over is read per forward pass: from a :class:`PatchGrid` that
follows the model's patch embedding (``set_input_size``, ``dynamic_img_size=True``), a fixed
``grid_size``, or a square grid inferred from the token count.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, NamedTuple, Self

import torch
import torch.nn.functional as F
from timm.layers import AttentionRope, apply_rot_embed_cat
from timm.models.eva import EvaAttention
from timm.models.vision_transformer import Attention
from torch import nn

Grid = tuple[int, int]
SWAPPABLE = (Attention, EvaAttention, AttentionRope)
"""the timm attention modules :meth:`TokenAttention.from_attention` (and so ``replace_attention``)
swaps: ViT ``Attention`` (ViT, DeiT, DINOv2, ...) and the EVA family's (EVA-02, PE, RoPE-ViT)"""
_ADOPTED = (
    *("qkv", "q_proj", "k_proj", "v_proj", "q_bias", "k_bias", "v_bias"),
    *("q_norm", "k_norm", "attn_drop", "norm", "gate", "proj", "proj_drop"),
)
"""what a swapped module takes over from the one it replaces (those it has)"""


def pool_grid(pool_size: int | Grid) -> Grid:
    """``pool_size`` as (p_h, p_w), checked positive."""
    grid = (pool_size, pool_size) if isinstance(pool_size, int) else tuple(pool_size)
    if len(grid) != 2 or min(grid) < 1:
        raise ValueError(f"pool_size must be a positive integer or pair, got {pool_size!r}")
    return int(grid[0]), int(grid[1])


@functools.lru_cache(maxsize=64)
def pooling_matrix(
    grid: Grid, pool_size: Grid, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """(p_h·p_w, h·w): ``F.adaptive_avg_pool2d`` from the (h, w) grid to ``pool_size`` as one
    matrix (cell i spans rows ⌊i·h/p⌋ … ⌈(i+1)·h/p⌉ − 1, each token weighted 1/area). A product
    with it costs a few microseconds where the pooling op costs a fifth of a small layer's time
    on a CPU (N = 197)."""

    def spans(size: int, cells: int) -> torch.Tensor:  # (cells, size) row-normalised
        index = torch.arange(size)
        start = torch.arange(cells) * size // cells
        end = -(-(torch.arange(cells) + 1) * size // cells)
        inside = (index >= start[:, None]) & (index < end[:, None])
        return inside.double() / inside.sum(1, keepdim=True)

    with torch.inference_mode(False):  # cached: it must serve autograd calls too
        matrix = torch.kron(spans(grid[0], pool_size[0]), spans(grid[1], pool_size[1]))
        return matrix.to(device=device, dtype=dtype)


class PatchGrid:
    """The (h, w) patch grid of the image a timm model embeds now, shared by its swapped attention.

    A forward pre-hook on ``patch_embed`` records ``patch_embed.dynamic_feat_size`` of each input
    image, so the grid follows ``set_input_size`` and, with ``dynamic_img_size=True``, every
    batch's own size, non-square ones included (a token count alone cannot tell 4×6 from 6×4).
    Before the first forward it is ``patch_embed.grid_size``.
    """

    def __init__(self, patch_embed: nn.Module) -> None:
        self.size: Grid = tuple(int(s) for s in patch_embed.grid_size)
        patch_embed.register_forward_pre_hook(self._record)

    def _record(self, patch_embed: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        self.size = tuple(int(s) for s in patch_embed.dynamic_feat_size(args[0].shape[-2:]))


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    fused: bool = True,
    attn_drop: nn.Module | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """softmax(q·kᵀ/√d + mask)·v as timm's ``Attention`` computes it, (B, H, N, d) queries over
    (B, H, Nk, d) keys and values. ``fused`` (timm's ``fused_attn``): one
    ``F.scaled_dot_product_attention`` call; else the explicit (B, H, N, Nk) weights, passed
    through ``attn_drop`` like timm's unfused path (so a hook there, e.g. timm's
    ``AttentionExtract(method="hook")``, sees them). ``mask``: bool (True attends) or additive.
    """
    if fused:
        dropout_p = attn_drop.p if attn_drop is not None and attn_drop.training else 0.0
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
        )
    logits = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if is_causal:
        future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
        logits = logits.masked_fill(future, float("-inf"))
    if mask is not None:
        logits = (
            logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
        )
    weights = logits.softmax(dim=-1)
    return (weights if attn_drop is None else attn_drop(weights)) @ v


class TokenAttention(Attention, ABC):
    """timm ``Attention`` with a pluggable :meth:`attend` and the token layout sparse kinds need.

    Args:
        num_prefix_tokens: leading tokens (CLS, registers) that sit outside the patch grid. They
            are keyed like any token but never pooled into landmarks (nor rotated by EVA's
            rotary embedding); how they query is the kind's (MiTA: full attention by default).
        grid_size: the patch grid: a fixed ``(h, w)``; a :class:`PatchGrid` that follows the
            model's input (what :func:`~mixlab.attention_arch.mita.replace_attention` passes);
            or ``None``, a square grid inferred from N.
        **attention_kwargs: timm ``Attention`` arguments (``qkv_bias``, ``qk_norm``, ...).

    ``key_mask`` (``(B, N)`` bool, set by :func:`~mixlab.attention_arch.mita.pruned`) removes keys:
    a masked token then influences no other token (it is neither a key, a value, a pooled query
    nor a convolution neighbour).
    """

    supports_masks = False

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        num_prefix_tokens: int = 1,
        grid_size: int | Grid | PatchGrid | None = None,
        **attention_kwargs: Any,
    ) -> None:
        super().__init__(dim, num_heads, **attention_kwargs)
        if not hasattr(self, "attn_dim"):  # timm 1.0.18 to 1.0.22 at least has neither
            self.attn_dim = self.num_heads * self.head_dim
        if not hasattr(self, "gate"):
            self.gate = None
        # The EVA family's projections, set by from_attention when it swaps one of theirs.
        self.q_proj = self.k_proj = self.v_proj = None
        self.q_bias = self.k_bias = self.v_bias = None
        self.qkv_bias_separate = self.rotate_half = False
        if not (isinstance(num_prefix_tokens, int) and num_prefix_tokens >= 0):
            raise ValueError(
                f"num_prefix_tokens must be an integer >= 0, got {num_prefix_tokens!r}"
            )
        self.num_prefix_tokens = num_prefix_tokens
        if grid_size is not None and not isinstance(grid_size, PatchGrid):
            grid_size = (grid_size, grid_size) if isinstance(grid_size, int) else tuple(grid_size)
            if len(grid_size) != 2 or min(grid_size) < 1:
                raise ValueError(f"grid_size must be a positive (h, w), got {grid_size!r}")
        self.grid_size = grid_size
        self.dwc: nn.Conv2d | None = None
        self.key_mask: torch.Tensor | None = None
        self.record_selection = False
        self.last_selection: torch.Tensor | None = None

    @classmethod
    def from_attention(cls, attention: nn.Module, **config: Any) -> Self:
        """A ``cls`` that takes over ``attention``'s projections, norms and dropouts (the same
        tensors, not copies) and its ``fused_attn``; ``attention`` is one of :data:`SWAPPABLE`."""
        if not isinstance(attention, SWAPPABLE):
            raise ValueError(
                f"attention must be a timm {' / '.join(c.__name__ for c in SWAPPABLE)}, got "
                f"{type(attention).__name__}"
            )
        if getattr(attention, "num_kv_heads", attention.num_heads) != attention.num_heads:
            raise ValueError(
                f"grouped-query attention (num_kv_heads={attention.num_kv_heads} < num_heads="
                f"{attention.num_heads}) is not supported"
            )
        proj = attention.proj
        with torch.random.fork_rng(devices=[]):  # the throw-away init must not move the RNG
            # Built at the inner width heads·head_dim: every projection is replaced below.
            module = cls(proj.in_features, attention.num_heads, **config)
        saved = attention.state_dict(keep_vars=True)
        for name in _ADOPTED:
            if not hasattr(attention, name):
                continue
            value = getattr(attention, name)
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                delattr(module, name)  # EVA's k_bias: a buffer, not saved in the state dict
                module.register_buffer(name, value, persistent=name in saved)
            else:
                setattr(module, name, value)
        module.fused_attn = attention.fused_attn
        module.qkv_bias_separate = getattr(attention, "qkv_bias_separate", False)
        module.rotate_half = getattr(attention, "rotate_half", False)
        return module.to(proj.weight.device, proj.weight.dtype).train(attention.training)

    def settings(self) -> dict[str, Any]:
        """The kind's own settings, shown by ``repr`` (subclasses add theirs)."""
        return {}

    def extra_repr(self) -> str:
        shown = {"num_heads": self.num_heads, "num_prefix_tokens": self.num_prefix_tokens}
        return ", ".join(
            f"{name}={value!r}" for name, value in {**shown, **self.settings()}.items()
        )

    # --- token grid ------------------------------------------------------------------------
    @property
    def current_grid(self) -> Grid | None:
        """The patch grid ``(h, w)`` now (a :class:`PatchGrid`'s latest), or None: inferred."""
        return self.grid_size.size if isinstance(self.grid_size, PatchGrid) else self.grid_size

    def token_grid(self, num_tokens: int) -> Grid:
        """``(h, w)`` of the patch grid behind ``num_tokens`` tokens (prefix included)."""
        patches = num_tokens - self.num_prefix_tokens
        if (grid := self.current_grid) is not None:
            if grid[0] * grid[1] != patches:
                follows = isinstance(self.grid_size, PatchGrid)
                source = " (the patch grid of the model's last input image)" if follows else ""
                raise ValueError(
                    f"grid_size={grid}{source} holds {grid[0] * grid[1]} patches, but the input "
                    f"has {patches} ({num_tokens} tokens minus {self.num_prefix_tokens} prefix)"
                )
            return grid
        side = math.isqrt(max(patches, 0))
        if side * side != patches or patches == 0:
            raise ValueError(
                f"{patches} patch tokens do not form a square grid: pass grid_size=(h, w) "
                f"(and num_prefix_tokens, now {self.num_prefix_tokens})"
            )
        return side, side

    def pooled_queries(
        self, q: torch.Tensor, pool_size: Grid
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Landmarks: the patch queries average-pooled to ``pool_size`` (B, H, M, d), over kept
        tokens only when a key mask is set; and then also the (B, 1, 1, M) cells with no kept
        token (their landmark is meaningless and must be ignored), else None."""
        batch, num_tokens = q.shape[0], q.shape[2]
        h, w = self.token_grid(num_tokens)
        if pool_size[0] > h or pool_size[1] > w:
            raise ValueError(f"pool_size={pool_size} is larger than the token grid {(h, w)}")
        # traced whole under torch.compile (its cache is the host's business)
        build = pooling_matrix.__wrapped__ if torch.compiler.is_compiling() else pooling_matrix
        pool = build((h, w), pool_size, q.device, q.dtype)  # (M, h·w)
        patches = q[:, :, self.num_prefix_tokens :]
        if self.key_mask is None:
            return pool @ patches, None
        keep = self.key_mask.to(q.device)[:, self.num_prefix_tokens :].to(q.dtype)
        share = pool @ keep[:, None, :, None]  # (B, 1, M, 1): kept share of each cell
        pooled = (pool @ (patches * keep[:, None, :, None])) / share.clamp_min(1e-6)
        return pooled, (share == 0).reshape(batch, 1, 1, -1)

    def patch_grid_map(self, v: torch.Tensor) -> torch.Tensor:
        """(B, H, N, d) values → (B, H·d, h, w) over the patch grid, for depthwise convolutions."""
        batch, heads, num_tokens, dim = v.shape
        h, w = self.token_grid(num_tokens)
        grid = v[:, :, self.num_prefix_tokens :].permute(0, 1, 3, 2)
        return grid.reshape(batch, heads * dim, h, w)

    def masked_keys(self, batch: int, device: torch.device) -> torch.Tensor | None:
        """``(B, 1, 1, N)`` True where a key is dropped, or None."""
        if self.key_mask is None:
            return None
        return ~self.key_mask.to(device).reshape(batch, 1, 1, -1)

    # --- forward ---------------------------------------------------------------------------
    @abstractmethod
    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
    ) -> torch.Tensor:
        """(B, H, N, d) queries, keys, values → (B, H, N, d) outputs."""

    def local_term(self, v: torch.Tensor) -> torch.Tensor | None:
        """The depthwise convolution of V over the patch grid, (B, N, H·d), added before ``proj``
        by the DWC variants (zero on prefix tokens); None without ``self.dwc``."""
        if self.dwc is None:
            return None
        batch, heads, _, dim = v.shape
        if self.key_mask is not None:  # dropped tokens are no one's neighbours either
            v = v * self.key_mask.to(v.device)[:, None, :, None]
        local = self.dwc(self.patch_grid_map(v)).flatten(2).transpose(1, 2)  # (B, h·w, C)
        prefix = local.new_zeros(batch, self.num_prefix_tokens, heads * dim)
        return torch.cat([prefix, local], dim=1)

    def project(
        self, x: torch.Tensor, rope: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, N, C) tokens → q, k, v (B, H, N, d), as the swapped timm module computed them: the
        fused ``qkv`` (plus EVA's ``q_bias`` / ``k_bias`` / ``v_bias``) or EVA's separate
        ``q_proj`` / ``k_proj`` / ``v_proj``, then ``q_norm`` / ``k_norm``, then the rotary
        embedding ``rope`` (EVA) on the patch tokens of q and k."""
        batch, num_tokens, _ = x.shape
        if self.qkv is None:
            q, k, v = (
                proj(x).reshape(batch, num_tokens, self.num_heads, -1).transpose(1, 2)
                for proj in (self.q_proj, self.k_proj, self.v_proj)
            )
        else:
            if self.q_bias is None:
                qkv = self.qkv(x)
            else:
                bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
                separate = self.qkv_bias_separate
                qkv = self.qkv(x) + bias if separate else F.linear(x, self.qkv.weight, bias)
            qkv = qkv.reshape(batch, num_tokens, 3, self.num_heads, self.head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = self.rotate(q, rope).type_as(v), self.rotate(k, rope).type_as(v)
        return q, k, v

    def rotate(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        """EVA's rotary embedding on the patch tokens of (B, H, N, d) ``x``; prefix tokens as
        they are."""
        prefix = self.num_prefix_tokens
        half = {"half": True} if self.rotate_half else {}  # timm < 1.0.20 has no half layout
        rotated = apply_rot_embed_cat(x[:, :, prefix:], rope, **half)
        return torch.cat([x[:, :, :prefix], rotated], dim=2)

    def softmax_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """:func:`softmax_attention` with this module's ``fused_attn`` and ``attn_drop``."""
        return softmax_attention(
            q, k, v, mask, fused=self.fused_attn, attn_drop=self.attn_drop, is_causal=is_causal
        )

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        *,
        rope: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """timm's ``Attention.forward`` (ViT blocks) and ``EvaAttention.forward`` (EVA blocks pass
        ``rope=``): (B, N, C) → (B, N, C_out)."""
        if not self.supports_masks and (attn_mask is not None or is_causal):
            raise ValueError(
                f"{type(self).__name__} routes tokens bidirectionally: attn_mask and is_causal "
                "are not supported (use FullAttention for masked attention)"
            )
        batch, num_tokens, _ = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        q, k, v = self.project(x, rope)
        out = self.attend(q, k, v, attn_mask, is_causal)
        out = out.transpose(1, 2).reshape(batch, num_tokens, -1)
        if (local := self.local_term(v)) is not None:
            out = out + local
        out = self.norm(out)
        if gate is not None:
            out = out * gate
        return self.proj_drop(self.proj(out))

    @abstractmethod
    def attention_flops(self, num_tokens: int) -> int:
        """Floating-point operations (2 per multiply-add) of the query-key and weight-value
        products for one image, as the algorithm defines them: the part that differs between
        attention kinds (``qkv`` and ``proj`` are the same for all)."""

    def executed_flops(self, num_tokens: int, batch: int = 1) -> int:
        """FLOPs of the path this implementation takes for ``batch`` images of ``num_tokens``
        tokens, per image (masked products included); the algorithm's by default."""
        return self.attention_flops(num_tokens)

    def pooling_flops(self, num_tokens: int, pool_size: Grid) -> int:
        """The landmark pooling as it executes: one (M, h·w) × (h·w, d) product per head
        (:func:`pooling_matrix`)."""
        patches = num_tokens - self.num_prefix_tokens
        return 2 * self.num_heads * pool_size[0] * pool_size[1] * patches * self.head_dim

    def _dwc_flops(self, num_tokens: int) -> int:
        patches = num_tokens - self.num_prefix_tokens
        return 0 if self.dwc is None else 2 * 9 * patches * self.attn_dim


class FullAttention(TokenAttention):
    """Full softmax attention, as timm's ``Attention`` (SDPA, or explicit when not ``fused_attn``)."""

    supports_masks = True

    def attend(self, q, k, v, attn_mask, is_causal):
        if (dropped := self.masked_keys(q.shape[0], q.device)) is not None:
            # Fold the dropped keys into one additive mask beside the caller's.
            bias = torch.zeros(dropped.shape, dtype=q.dtype, device=q.device)
            bias = bias.masked_fill(dropped, float("-inf"))
            if is_causal:
                future = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
                bias = bias.masked_fill(future.triu(1), float("-inf"))
                is_causal = False
            if attn_mask is None:
                attn_mask = bias
            elif attn_mask.dtype == torch.bool:
                attn_mask = bias.masked_fill(~attn_mask, float("-inf"))
            else:
                attn_mask = attn_mask + bias
        return self.softmax_attention(q, k, v, attn_mask, is_causal)

    def attention_flops(self, num_tokens: int) -> int:
        return 4 * self.num_heads * num_tokens * num_tokens * self.head_dim


def gather_tokens(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[b, h, index[b, h, i, j]]``: (B, H, N, d) and (B, H, Q, K) → (B, H, Q, K, d).

    One flat ``index_select`` (its backward is an ``index_add``), linear in Q·K·d.
    """
    batch, heads, num_tokens, dim = x.shape
    offsets = torch.arange(batch * heads, device=x.device).mul_(num_tokens)
    flat = index.reshape(batch * heads, -1) + offsets[:, None]
    picked = x.reshape(-1, dim).index_select(0, flat.reshape(-1))
    return picked.reshape(*index.shape, dim)


def sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    index: torch.Tensor,
    *,
    allowed: torch.Tensor | None = None,
    fused: bool = True,
    attn_drop: nn.Module | None = None,
    dense_limit: int = 1 << 27,
) -> torch.Tensor:
    """Each query attends to its own K keys ``index`` (B, H, N, K); ``allowed`` (B, Nk) bool, if
    given, forbids some keys.

    Two exact paths: up to ``dense_limit`` mask entries (B·H·N·Nk), one :func:`softmax_attention`
    (``fused``: SDPA) with an additive N×Nk mask in q's dtype (fast on small inputs; 512 MiB of
    float32 at the limit); beyond it,
    :func:`gathered_attention`. ``attn_drop`` (none: no dropout) drops attention weights.
    """
    batch, heads, num_queries, _ = q.shape
    num_keys = k.shape[2]
    if batch * heads * num_queries * num_keys <= dense_limit:
        # additive, not boolean: SDPA on a CPU takes a float mask 1.5× faster (N = 1,024)
        shape = (batch, heads, num_queries, num_keys)
        mask = torch.full(shape, float("-inf"), dtype=q.dtype, device=q.device)
        mask.scatter_(3, index, 0.0)
        if allowed is not None:
            mask.masked_fill_(~allowed[:, None, None, :], float("-inf"))
        return softmax_attention(q, k, v, mask, fused=fused, attn_drop=attn_drop)
    return gathered_attention(q, k, v, index, allowed=allowed, attn_drop=attn_drop)


def gathered_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    index: torch.Tensor,
    *,
    allowed: torch.Tensor | None = None,
    extra_logits: torch.Tensor | None = None,
    extra_values: torch.Tensor | None = None,
    attn_drop: nn.Module | None = None,
) -> torch.Tensor:
    """Each query attends to its own K keys ``index`` (B, H, N, K), gathered (O(N·K·d) memory,
    never N×N), and to optional extra slots (logits (B, H, N, S) over values (B, H, S, d)) in
    the same softmax; ``allowed`` (B, Nk) bool forbids keys. The explicit weights go through
    ``attn_drop`` (none: no dropout)."""
    logits = torch.einsum("bhnd,bhnkd->bhnk", q, gather_tokens(k, index)) * q.shape[-1] ** -0.5
    if allowed is not None:
        per_head = allowed[:, None, :, None].expand(-1, q.shape[1], -1, 1)
        logits = logits.masked_fill(~gather_tokens(per_head, index).squeeze(-1), float("-inf"))
    slots = 0 if extra_logits is None else extra_logits.shape[-1]
    if extra_logits is not None:
        logits = torch.cat([extra_logits, logits], dim=-1)
    weights = logits.softmax(dim=-1)
    weights = weights if attn_drop is None else attn_drop(weights)
    out = torch.einsum("bhnk,bhnkd->bhnd", weights[..., slots:], gather_tokens(v, index))
    return out if extra_logits is None else out + weights[..., :slots] @ extra_values


class TileLayout(NamedTuple):
    """The grouped path's layout (:func:`tile_layout`): ``slot_entry`` (B, H, L) the entry each
    of the L = tiles·T slots reads (padding slots read the last entry), ``slot_of_entry``
    (B, H, E) each entry's slot (to read its output back), ``padding`` (B, H, L) bool, and
    ``tile_expert`` (B, H, tiles) the expert of each tile."""

    slot_entry: torch.Tensor
    slot_of_entry: torch.Tensor
    padding: torch.Tensor
    tile_expert: torch.Tensor


def tile_layout(entry_expert: torch.Tensor, num_experts: int, tile: int) -> TileLayout:
    """Entries (B, H, E) sorted by their expert (stably) into tiles of ``tile`` slots, each
    expert's run padded to whole tiles, in a static ⌈E/T⌉ + M ≥ Σ_m ⌈count_m/T⌉ tiles: no
    host sync, so ``torch.compile`` traces it whole."""
    batch, heads, entries = entry_expert.shape
    device = entry_expert.device
    num_tiles = -(-entries // tile) + num_experts
    count = torch.zeros(batch, heads, num_experts, dtype=torch.long, device=device)
    count = count.scatter_add_(2, entry_expert, torch.ones_like(entry_expert))
    tiles = (count + tile - 1) // tile
    tile_end = tiles.cumsum(-1)  # (B, H, M): the tile after each expert's last
    first_slot = (tile_end - tiles) * tile
    first_entry = count.cumsum(-1) - count  # where each expert's run starts, unpadded
    order = entry_expert.argsort(dim=-1, stable=True)
    sorted_expert = entry_expert.gather(2, order)
    rank = torch.arange(entries, device=device) - first_entry.gather(2, sorted_expert)
    slot_of_entry = torch.empty_like(order).scatter_(
        2, order, first_slot.gather(2, sorted_expert) + rank
    )
    slot_entry = torch.full((batch, heads, num_tiles * tile), entries, device=device)
    slot_entry = slot_entry.scatter_(
        2, slot_of_entry, torch.arange(entries, device=device).expand_as(order)
    )
    padding = slot_entry == entries
    tile_ids = torch.arange(num_tiles, device=device)[:, None]
    tile_expert = (tile_ids >= tile_end[..., None, :]).sum(-1)  # (B, H, tiles)
    tile_expert = tile_expert.clamp_max(num_experts - 1)  # trailing empty tiles
    return TileLayout(slot_entry.clamp_max(entries - 1), slot_of_entry, padding, tile_expert)


IMPLEMENTATIONS = ("auto", "grouped", "dense", "gather")
"""the execution paths of :class:`MiTAAttention` (``impl``)"""


@dataclass
class Routes:
    """What MiTA's routing decided for one forward, for the path that executes Eq. (5):
    ``selected`` (B, H, M, k') keys of each expert S_m, ``experts`` (B, H, Nq, r) e(i) of each
    routed query, ``kept`` (B, H, M, k', 1) bool or None (which selected keys survive a key
    mask), ``empty`` (B, 1, 1, M) bool or None (pool cells with no kept token: no expert),
    ``shared_logits`` (B, H, Nq, M) q·r/d, ``landmarks`` (B, H, M, d), ``agent_values``
    (B, H, M, d) V_s or None without the shared expert."""

    selected: torch.Tensor
    experts: torch.Tensor
    kept: torch.Tensor | None
    empty: torch.Tensor | None
    shared_logits: torch.Tensor
    landmarks: torch.Tensor
    agent_values: torch.Tensor | None


class MiTAAttention(TokenAttention):
    """Mixture-of-Top-k Attention (module docstring), a drop-in for timm's ``Attention``.

    Args:
        pool_size: landmark grid p (or (p_h, p_w)); M = p_h·p_w landmarks per head.
        top_k: routed keys each query attends to (k; the authors' ``kv_topk²``).
        router_top: experts per query, 1 (MiTA) or 2 (``_mita_attention.py``: k/2 keys each; a
            key both experts selected then appears twice in the query's softmax).
        shared: keep the shared expert (False: the routed-only ablation).
        routed: keep the routed experts (False: the shared-only ablation).
        dwc: add a depthwise 3×3 convolution of V over the patch grid before ``proj`` (the DWC
            variant). Its weights are new and start at zero, so a swapped-in module starts as
            plain MiTA; a standard checkpoint then loads with ``strict=False`` (only ``dwc.*``
            missing).
        full_prefix: prefix queries (CLS, registers) attend to every key with plain softmax
            attention, so a CLS token summarises the whole image (default); False routes them
            like patch queries. Either way they are never pooled into landmarks.
        impl: how Eq. (5) is executed; every path computes it exactly (:meth:`path`).
            ``"auto"`` (default): ``"dense"`` while the M·k' expert keys and M slots number at
            least N, else ``"grouped"`` (a rule of thumb: below it the grouped path's gathers
            and small products cost more time than one dense softmax on a CPU, though the
            dense one multiplies more; ``executed_flops`` counts what runs).
            ``"grouped"``: the queries sorted by expert into tiles of T (padded per expert);
            a tile meets its expert's k' keys and the M shared slots only. The algorithm's
            O(N·(M + k)·d) FLOPs plus at most T·(M + 1) padded rows (:meth:`tile_size`; under
            10 % more from N ≈ 1000 at M = 16), memory linear in N and no
            N·k·d copy of the keys; static shapes and no host sync (``torch.compile`` traces
            it whole). ``"dense"``: one softmax over the M slots and all N keys with MiTA's
            routing as an additive mask (full attention's cost, plus M slots).
            ``"gather"``: each query gathers its own k keys, O(N·k·d) memory, the explicit
            normalised weights through ``attn_drop``: the reference.
    """

    kernel = True
    """run the grouped path's Eq. (5) through the Triton kernel where it applies
    (:meth:`_kernel_runs`: CUDA, or a CPU under ``TRITON_INTERPRET=1``; no gradient, top-1, no
    key mask or dropout); False: always the torch path"""

    min_tile, max_tile = 8, 64
    """queries per tile of the grouped path, at least and at most; in between a tile is 1/16 of
    the mean queries per expert (``tile_size``), so that padding adds about 1/16 of the routed
    work at large N. Below 8 a CPU spends more time on many tiny matrix products than padding
    costs (measured at N = 64, batch 32: T = 1, 4, 8 took 36, 16, 14 ms per forward + backward)"""

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        pool_size: int | Grid = 5,
        top_k: int = 25,
        router_top: int = 1,
        shared: bool = True,
        routed: bool = True,
        dwc: bool = False,
        full_prefix: bool = True,
        impl: str = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(dim, num_heads, **kwargs)
        if impl not in IMPLEMENTATIONS:
            raise ValueError(f"impl must be one of {IMPLEMENTATIONS}, got {impl!r}")
        self.impl = impl
        self.full_prefix = bool(full_prefix)
        self.pool_size = pool_grid(pool_size)
        if not shared and not routed:
            raise ValueError("shared and routed cannot both be False: nothing would be attended")
        if router_top not in (1, 2):
            raise ValueError(f"router_top must be 1 or 2, got {router_top!r}")
        if not (isinstance(top_k, int) and top_k >= router_top):
            raise ValueError(
                f"top_k must be an integer >= router_top ({router_top}), got {top_k!r}"
            )
        if top_k % router_top:
            raise ValueError(f"top_k must be divisible by router_top={router_top}, got {top_k}")
        self.top_k, self.router_top = top_k, router_top
        self.shared, self.routed = shared, routed
        if (grid := self.current_grid) is not None:  # the grid it is built for; checked per input
            self._check_sizes(self.num_prefix_tokens + grid[0] * grid[1])
            if self.pool_size[0] > grid[0] or self.pool_size[1] > grid[1]:
                raise ValueError(f"pool_size={self.pool_size} is larger than the token grid {grid}")
        if dwc:
            self.dwc = nn.Conv2d(self.attn_dim, self.attn_dim, 3, padding=1, groups=self.attn_dim)
            nn.init.zeros_(self.dwc.weight)
            nn.init.zeros_(self.dwc.bias)

    def settings(self) -> dict[str, Any]:
        return {
            "pool_size": self.pool_size,
            "top_k": self.top_k,
            "router_top": self.router_top,
            "shared": self.shared,
            "routed": self.routed,
            "dwc": self.dwc is not None,
            "full_prefix": self.full_prefix,
            "impl": self.impl,
        }

    @property
    def num_landmarks(self) -> int:
        return self.pool_size[0] * self.pool_size[1]

    @property
    def per_expert(self) -> int:
        """k': the keys each routed expert selects."""
        return self.top_k // self.router_top

    def _check_sizes(self, num_tokens: int) -> None:
        self.token_grid(num_tokens)
        if self.routed and self.per_expert > num_tokens:
            raise ValueError(
                f"top_k={self.top_k} per expert ({self.per_expert}) is larger "
                f"than the number of tokens N={num_tokens}"
            )

    def path(self, num_tokens: int) -> str:
        """The execution path for ``num_tokens`` tokens: ``impl``, or for ``"auto"`` ``"dense"``
        while M·k' + M >= N and ``"grouped"`` beyond."""
        if self.impl != "auto":
            return self.impl
        slots = self.num_landmarks * (self.per_expert + 1)
        return "dense" if slots >= num_tokens else "grouped"

    def tile_size(self, entries: int) -> int:
        """T, queries per tile of the grouped path for ``entries`` (query, expert) pairs: 1/16 of
        the mean pairs per expert, within [``min_tile``, ``max_tile``]."""
        return max(self.min_tile, min(self.max_tile, entries // (16 * self.num_landmarks)))

    def routed_queries(self, num_tokens: int) -> int:
        """Queries that go through the experts (all but the prefix with ``full_prefix``)."""
        return num_tokens - (self.num_prefix_tokens if self.full_prefix else 0)

    def attend(self, q, k, v, attn_mask, is_causal):
        self._check_sizes(q.shape[2])
        scale = q.shape[-1] ** -0.5
        landmarks, empty = self.pooled_queries(q, self.pool_size)  # R: (B, H, M, d)
        dropped = self.masked_keys(q.shape[0], q.device)
        prefix = q.shape[2] - self.routed_queries(q.shape[2])
        queries = q[:, :, prefix:]
        gate = landmarks @ k.transpose(-1, -2) * scale  # r_m·k_j/√d: (B, H, M, N)
        if dropped is not None:
            gate = gate.masked_fill(dropped, float("-inf"))
        # q·r/d: the code passes `router * scale` as key and the kernel scales by 1/√d again.
        shared_logits = queries @ landmarks.transpose(-1, -2) * (scale * scale)  # (B, H, Nq, M)
        if empty is not None:  # a pool cell with no kept token is no expert
            shared_logits = shared_logits.masked_fill(empty, float("-inf"))
        agent_values = gate.softmax(dim=-1) @ v if self.shared else None  # V_s: (B, H, M, d)
        if not self.routed:
            out = self.attn_drop(shared_logits.softmax(dim=-1)) @ agent_values
        else:
            # S_m: (B, H, M, k'), a set: unsorted is 1.6× faster on a CPU (N = 197)
            selected = gate.topk(self.per_expert, dim=-1, sorted=False).indices
            if self.record_selection:  # the union ∪_m S_m per head, for coverage and pruning
                union = q.new_zeros(q.shape[:3], dtype=torch.bool)
                self.last_selection = union.scatter_(2, selected.detach().flatten(2), True)
                if dropped is not None:
                    self.last_selection &= ~dropped.reshape(q.shape[0], 1, -1)
            if self.router_top == 1:  # e(i): (B, H, Nq, r)
                experts = shared_logits.max(dim=-1, keepdim=True).indices  # 2× argmax's speed
            else:
                experts = shared_logits.topk(self.router_top, dim=-1).indices
            kept = None  # (B, H, M, k', 1): which selected keys are kept (fewer than k' kept)
            if dropped is not None:
                keep = (~dropped).reshape(k.shape[0], 1, -1, 1).expand_as(k[..., :1])
                kept = gather_tokens(keep, selected)
            routes = Routes(selected, experts, kept, empty, shared_logits, landmarks, agent_values)
            if self.path(q.shape[2]) == "dense":  # one softmax, prefix rows included
                return self._dense(q, k, v, routes, dropped)
            execute = {"grouped": self._grouped, "gather": self._gathered}
            out = execute[self.path(q.shape[2])](queries, k, v, routes)
        if not prefix:
            return out
        # Prefix queries: plain softmax attention over every (kept) key.
        head = self.softmax_attention(q[:, :, :prefix], k, v, None if dropped is None else ~dropped)
        return torch.cat([head, out], dim=2)

    def _gathered(self, queries, k, v, routes: Routes) -> torch.Tensor:
        """Eq. (5) per query: the k keys of e(i) gathered, O(N·(M + k)·d)."""
        per_query = routes.selected[:, :, None].expand(-1, -1, queries.shape[2], -1, -1)
        pick = routes.experts[..., None].expand(-1, -1, -1, -1, self.per_expert)
        index = torch.gather(per_query, 3, pick).flatten(-2)  # (B, H, Nq, r·k')
        allowed = None
        if self.key_mask is not None:
            allowed = self.key_mask.to(queries.device).reshape(queries.shape[0], -1)
        return gathered_attention(
            queries,
            k,
            v,
            index,
            allowed=allowed,
            extra_logits=routes.shared_logits if self.shared else None,
            extra_values=routes.agent_values,
            attn_drop=self.attn_drop,
        )

    def _dense(self, q, k, v, routes: Routes, dropped: torch.Tensor | None) -> torch.Tensor:
        """One softmax over the M slots and all N keys, for every query (one SDPA call, or one
        (N, M + N) weight matrix through ``attn_drop``), with MiTA's routing as an additive
        mask. For N <= M·k' + M, where no gather is cheaper.

        The mask is gathered whole from M + 1 rows over [M slots | N keys]: one per expert (0
        at its k' kept keys, −inf elsewhere) and one for prefix queries (every kept key, no
        slot). A top-2 query takes the log-sum-exp of its two rows: log 2 at a key both experts
        picked (it counts twice in Eq. (5)), and each row carries the slots at −log 2 so that
        they count once.
        """
        batch, heads, num_tokens, _ = q.shape
        experts, r = routes.experts, self.router_top
        landmarks, slots = self.num_landmarks, self.num_landmarks if self.shared else 0
        rows = q.new_full((batch, heads, landmarks + 1, slots + num_tokens), float("-inf"))
        picked = torch.zeros_like(routes.selected, dtype=q.dtype)
        if routes.kept is not None:
            picked = picked.masked_fill(~routes.kept.squeeze(-1), float("-inf"))
        rows[:, :, :landmarks, slots:].scatter_(3, routes.selected, picked)
        if self.shared:
            slot_bias = torch.full_like(routes.shared_logits[:, :, :1], -math.log(r))
            if routes.empty is not None:
                slot_bias = slot_bias.masked_fill(routes.empty, float("-inf"))
            rows[:, :, :landmarks, :slots] = slot_bias
        rows[:, :, landmarks, slots:] = 0.0
        if dropped is not None:
            rows[:, :, landmarks, slots:].masked_fill_(dropped.reshape(batch, 1, -1), float("-inf"))
        prefix = num_tokens - experts.shape[2]
        index = torch.cat([experts.new_full((batch, heads, prefix, r), landmarks), experts], dim=2)
        bias = gather_tokens(rows, index[..., 0])  # whole rows: a copy each, (B, H, N, M + N)
        if r == 2:
            bias = torch.logaddexp(bias, gather_tokens(rows, index[..., 1]))
        if self.shared:
            k = torch.cat([routes.landmarks * q.shape[-1] ** -0.5, k], dim=2)
            v = torch.cat([routes.agent_values, v], dim=2)
        return self.softmax_attention(q, k, v, bias)

    def _grouped(self, queries, k, v, routes: Routes) -> torch.Tensor:
        """Queries grouped by expert: Eq. (5) at the algorithm's cost with static shapes.

        Each (query, expert) pair is an entry; the entries are sorted by expert and laid out in
        tiles of T slots, each expert's run padded to whole tiles, so a tile belongs to one
        expert and meets only its k' keys: (tiles, T, d) × (tiles, k', d) products. The joint
        softmax with the M shared slots (and, for top-2, the other expert's keys) is assembled
        from each part's log-sum-exp, so every weight is the normalised one of Eq. (5).
        """
        batch, heads, num_queries, dim = queries.shape
        experts_per_query = self.router_top
        tile, layout, slot_query, tile_keys_index = self.grouped_layout(routes)
        if self._kernel_runs(queries, k, v, routes):
            from mixlab.attention_arch.mita.kernels import grouped_tiles_forward

            shared_keys = routes.landmarks * dim**-0.5 if self.shared else None
            slot_out = grouped_tiles_forward(
                queries, k, v, slot_query, tile_keys_index, tile, shared_keys, routes.agent_values
            )
            return gather_tokens(slot_out, layout.slot_of_entry)
        num_tiles = tile_keys_index.shape[2]
        slot_of_entry, padding = layout.slot_of_entry, layout.padding
        # Row gathers (index_select, whose backward is an index_add) throughout; a padding
        # slot's output is never read back.
        slot_queries = gather_tokens(queries, slot_query)
        tile_keys = gather_tokens(k, tile_keys_index)  # (B, H, tiles, k', d)
        tile_values = gather_tokens(v, tile_keys_index)
        # In-place edits of fresh tensors from here on (autograd allows them: no backward
        # needs what they overwrite): at N = 16,384 they keep the peak near SDPA's.
        logits = slot_queries.view(batch, heads, num_tiles, tile, dim) @ tile_keys.transpose(-1, -2)
        logits = logits.mul_(dim**-0.5)  # (B, H, tiles, T, k')
        if routes.kept is not None:
            tile_kept = gather_tokens(routes.kept.squeeze(-1), layout.tile_expert)
            logits = logits.masked_fill_(~tile_kept[..., None, :], float("-inf"))
        # Padding rows get the most negative finite logit: their weights come out 0, and their
        # log-sum-exp stays finite, so no 0·NaN reaches a gradient.
        padding = padding.view(batch, heads, num_tiles, tile, 1)
        logits = logits.masked_fill_(padding, torch.finfo(logits.dtype).min)
        slot_lse = logits.logsumexp(-1).flatten(2)  # (B, H, L): each entry's part, in slots
        parts = slot_lse.gather(2, slot_of_entry).view(batch, heads, num_queries, -1)
        if self.shared:
            parts = torch.cat([routes.shared_logits.logsumexp(-1, keepdim=True), parts], dim=-1)
        total = parts.logsumexp(-1)  # (B, H, Nq): log of Eq. (5)'s softmax denominator
        slot_total = total.gather(2, slot_query)
        weights = self.attn_drop((logits - slot_total.view_as(padding)).exp_())
        slot_out = weights @ tile_values  # (B, H, tiles, T, d)
        out = gather_tokens(slot_out.flatten(2, 3), slot_of_entry)
        out = out.view(batch, heads, num_queries, experts_per_query, dim)
        out = out[..., 0, :] if experts_per_query == 1 else out.sum(3)
        if self.shared:
            shared_weights = self.attn_drop((routes.shared_logits - total[..., None]).exp_())
            out = out.add_(shared_weights @ routes.agent_values)
        return out

    def grouped_layout(self, routes: Routes) -> tuple[int, TileLayout, torch.Tensor, torch.Tensor]:
        """The grouped path's tiles for ``routes``: (T, :func:`tile_layout` of the (query,
        expert) entries, the query each slot reads (B, H, L), each tile's keys (B, H, tiles, k'))."""
        entries = routes.experts.shape[2] * self.router_top
        tile = self.tile_size(entries)
        layout = tile_layout(routes.experts.flatten(2), self.num_landmarks, tile)
        slot_query = layout.slot_entry.div(self.router_top, rounding_mode="floor")
        return tile, layout, slot_query, gather_tokens(routes.selected, layout.tile_expert)

    def _kernel_runs(self, queries, k, v, routes: Routes) -> bool:
        """Whether :func:`~.kernels.grouped_tiles_forward` computes the grouped path: it is
        forward-only (no input may need a gradient), top-1, float32/16, without key masks or
        attention dropout, and runs where :func:`~.kernels.triton_available` (CUDA; a CPU only
        under the interpreter, for tests)."""
        from mixlab.attention_arch.mita.kernels import FLOATS, MAX_BLOCK, triton_available

        if not self.kernel or self.router_top != 1 or queries.dtype not in FLOATS:
            return False
        if routes.kept is not None or routes.empty is not None:
            return False
        if self.attn_drop.training and getattr(self.attn_drop, "p", 0.0) > 0:
            return False
        inputs = (queries, k, v, routes.landmarks, routes.agent_values)
        if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs):
            return False
        sizes = (self.max_tile, self.per_expert, self.num_landmarks, queries.shape[-1])
        return max(sizes) <= MAX_BLOCK and triton_available(queries.device)

    def attention_flops(self, num_tokens: int) -> int:
        """The algorithm's FLOPs (what the authors' varlen kernel, ``"grouped"`` up to padding,
        and ``"gather"`` run): gate R·Kᵀ, routing q·R, agent values and their use, k routed
        keys per query; and full attention for prefix queries with ``full_prefix``."""
        n, m, d = num_tokens, self.num_landmarks, self.head_dim
        queries = self.routed_queries(n)
        per_head = 2 * n * m * d  # gate R·Kᵀ (routing needs it even without the shared expert)
        per_head += 2 * queries * m * d  # routing / shared logits q·R
        if self.shared:
            per_head += 2 * m * n * d + 2 * queries * m * d  # V_s = softmax(RKᵀ)V and α·V_s
        if self.routed:
            per_head += 4 * queries * self.top_k * d  # q·k_j and β·v_j over the routed keys
        per_head += 4 * (n - queries) * n * d  # prefix queries over every key
        return self.num_heads * per_head + self._dwc_flops(n)

    def executed_flops(self, num_tokens: int, batch: int = 1) -> int:
        """FLOPs of the path :meth:`path` takes: the grouped one also multiplies its padded
        slots, the dense one every key (and the M slots) for every query; each pools the
        landmarks by a product (:func:`pooling_matrix`)."""
        pooling = self.pooling_flops(num_tokens, self.pool_size)
        path = self.path(num_tokens)
        if path == "gather" or not self.routed:
            return self.attention_flops(num_tokens) + pooling
        n, m, d = num_tokens, self.num_landmarks, self.head_dim
        queries = self.routed_queries(n)
        routed = 4 * queries * self.top_k * d
        if path == "grouped":
            entries = queries * self.router_top
            tile = self.tile_size(entries)
            slots = (-(-entries // tile) + m) * tile
            return (
                self.attention_flops(n)
                + self.num_heads * 4 * (slots - entries) * self.per_expert * d
                + pooling
            )
        # dense: every query (prefix ones too) over N keys and the M slots in one softmax, which
        # computes the routing logits q·R a second time
        shared_use = 2 * queries * m * d if self.shared else 0
        prefix = 4 * (n - queries) * n * d
        dense = 4 * n * (n + (m if self.shared else 0)) * d
        extra = self.num_heads * (dense - routed - shared_use - prefix)
        return self.attention_flops(n) + extra + pooling
