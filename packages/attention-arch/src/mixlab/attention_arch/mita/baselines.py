"""The baselines MiTA is compared with, under the same contract as :class:`MiTAAttention`.

- :class:`MoBAAttention`: MoBA's block routing (Lu et al. 2025, ``MoonshotAI/MoBA``
  ``moba_naive.py``), non-causal for vision: keys in contiguous blocks, gate q · mean(K_block), each
  query attends to its own block and the keys of its other top blocks.
- :class:`TopKAttention`: each query keeps its own top-k keys of the full q·Kᵀ row. Selection is
  O(N²) compute (in query chunks); attention is O(N·k).

Both take the attended keys through :func:`sparse_attention`: a masked SDPA call (explicit
weights when not ``fused_attn``) while the mask is small (``dense_limit``; O(N²) there, and fast),
a gather beyond it (O(N·k) memory).
``attention_flops`` counts the algorithm, not the masked products of the small-input path.
- :class:`AgentAttention`: Agent Attention (Han et al., ECCV 2024): pooled-query agents A,
  O = softmax(Q Aᵀ/√d) softmax(A Kᵀ/√d) V plus a depthwise convolution of V. The agent position
  biases of the paper are left out (they are resolution specific); so is MiTA's DWC zero init.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from mixlab.attention_arch.mita.attention import Grid, TokenAttention, pool_grid, sparse_attention


class MoBAAttention(TokenAttention):
    """Mixture of Block Attention, non-causal: ``top_blocks`` blocks of ``block_size`` keys per query.

    ``dense_limit`` (here and in :class:`TopKAttention`): see :func:`sparse_attention`.
    """

    dense_limit: int = 1 << 27

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        block_size: int = 16,
        top_blocks: int = 2,
        **kwargs: Any,
    ) -> None:
        super().__init__(dim, num_heads, **kwargs)
        for name, value in (("block_size", block_size), ("top_blocks", top_blocks)):
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.block_size, self.top_blocks = block_size, top_blocks

    def settings(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "top_blocks": self.top_blocks}

    def attend(self, q, k, v, attn_mask, is_causal):
        batch, heads, num_tokens, dim = q.shape
        blocks = math.ceil(num_tokens / self.block_size)
        if self.top_blocks > blocks:
            raise ValueError(
                f"top_blocks={self.top_blocks} is more than the {blocks} blocks of "
                f"{self.block_size} keys in N={num_tokens} tokens"
            )
        pad = blocks * self.block_size - num_tokens
        valid = torch.ones(batch, num_tokens, dtype=torch.bool, device=q.device)
        if self.key_mask is not None:
            valid = valid & self.key_mask.to(q.device)
        valid = nn.functional.pad(valid, (0, pad), value=False)
        k_pad = nn.functional.pad(k, (0, 0, 0, pad))
        v_pad = nn.functional.pad(v, (0, 0, 0, pad))
        # Block keys: the mean of each block's valid keys (MoBA's gate, Eq. 5 of the MoBA paper).
        weight = valid.reshape(batch, 1, blocks, self.block_size, 1).to(q.dtype)
        block_keys = (k_pad.reshape(batch, heads, blocks, self.block_size, dim) * weight).sum(3)
        counts = weight.sum(3)
        block_keys = block_keys / counts.clamp_min(1)
        gate = q @ block_keys.transpose(-1, -2)  # (B, H, N, blocks)
        # MoBA always attends to the query's own block (causally, its current chunk) ...
        own = torch.arange(num_tokens, device=q.device) // self.block_size
        gate = gate.scatter(3, own.expand(batch, heads, -1)[..., None], float("inf"))
        # ... unless every key in it was dropped.
        gate = gate.masked_fill((counts == 0).reshape(batch, 1, 1, blocks), float("-inf"))
        chosen = gate.topk(self.top_blocks, dim=-1).indices  # (B, H, N, top_blocks)
        offsets = torch.arange(self.block_size, device=q.device)
        index = (chosen[..., None] * self.block_size + offsets).flatten(-2)
        return sparse_attention(
            q,
            k_pad,
            v_pad,
            index,
            allowed=valid,
            fused=self.fused_attn,
            attn_drop=self.attn_drop,
            dense_limit=self.dense_limit,
        )

    def executed_flops(self, num_tokens: int, batch: int = 1) -> int:
        blocks = math.ceil(num_tokens / self.block_size)
        padded = blocks * self.block_size
        if batch * self.num_heads * num_tokens * padded > self.dense_limit:
            return self.attention_flops(num_tokens)
        gate = 2 * num_tokens * blocks * self.head_dim
        return self.num_heads * (gate + 4 * num_tokens * padded * self.head_dim)

    def attention_flops(self, num_tokens: int) -> int:
        blocks = math.ceil(num_tokens / self.block_size)
        keys = self.top_blocks * self.block_size
        per_head = 2 * num_tokens * blocks * self.head_dim + 4 * num_tokens * keys * self.head_dim
        return self.num_heads * per_head


class TopKAttention(TokenAttention):
    """Per-query top-k attention: exact selection from the full score row, sparse softmax."""

    dense_limit: int = 1 << 27

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        top_k: int = 32,
        chunk_elements: int = 1 << 24,
        **kwargs: Any,
    ) -> None:
        super().__init__(dim, num_heads, **kwargs)
        if not (isinstance(top_k, int) and top_k >= 1):
            raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")
        self.top_k, self.chunk_elements = top_k, chunk_elements

    def settings(self) -> dict[str, Any]:
        return {"top_k": self.top_k}

    def attend(self, q, k, v, attn_mask, is_causal):
        batch, heads, num_tokens, _ = q.shape
        if self.top_k > num_tokens:
            raise ValueError(
                f"top_k={self.top_k} is larger than the number of tokens N={num_tokens}"
            )
        dropped = self.masked_keys(batch, q.device)
        rows = max(1, self.chunk_elements // (batch * heads * num_tokens))
        with torch.no_grad():  # the selection is not differentiated (as in MiTA's top-k)
            picks = []
            for start in range(0, num_tokens, rows):
                scores = q[:, :, start : start + rows] @ k.transpose(-1, -2)
                if dropped is not None:
                    scores = scores.masked_fill(dropped, float("-inf"))
                picks.append(scores.topk(self.top_k, dim=-1).indices)
            index = torch.cat(picks, dim=2)
        allowed = None if dropped is None else ~dropped.reshape(batch, -1)
        return sparse_attention(
            q,
            k,
            v,
            index,
            allowed=allowed,
            fused=self.fused_attn,
            attn_drop=self.attn_drop,
            dense_limit=self.dense_limit,
        )

    def executed_flops(self, num_tokens: int, batch: int = 1) -> int:
        if batch * self.num_heads * num_tokens * num_tokens > self.dense_limit:
            return self.attention_flops(num_tokens)
        return self.num_heads * 6 * num_tokens * num_tokens * self.head_dim  # selection + SDPA

    def attention_flops(self, num_tokens: int) -> int:
        selection = 2 * num_tokens * num_tokens * self.head_dim
        return self.num_heads * (selection + 4 * num_tokens * self.top_k * self.head_dim)


class AgentAttention(TokenAttention):
    """Agent attention with ``pool_size`` pooled-query agents and a depthwise 3×3 conv on V."""

    def __init__(
        self, dim: int, num_heads: int = 8, *, pool_size: int | Grid = 5, **kwargs: Any
    ) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.pool_size = pool_grid(pool_size)
        self.dwc = nn.Conv2d(self.attn_dim, self.attn_dim, 3, padding=1, groups=self.attn_dim)

    def settings(self) -> dict[str, Any]:
        return {"pool_size": self.pool_size}

    def attend(self, q, k, v, attn_mask, is_causal):
        scale = q.shape[-1] ** -0.5
        agents, empty = self.pooled_queries(q, self.pool_size)
        aggregate = agents @ k.transpose(-1, -2) * scale  # (B, H, M, N)
        if (dropped := self.masked_keys(q.shape[0], q.device)) is not None:
            aggregate = aggregate.masked_fill(dropped, float("-inf"))
        agent_values = self.attn_drop(aggregate.softmax(dim=-1)) @ v
        broadcast = q @ agents.transpose(-1, -2) * scale
        if empty is not None:  # an agent pooled from no kept token is no agent
            broadcast = broadcast.masked_fill(empty, float("-inf"))
        return self.attn_drop(broadcast.softmax(dim=-1)) @ agent_values

    def attention_flops(self, num_tokens: int) -> int:
        m = self.pool_size[0] * self.pool_size[1]
        return self.num_heads * 8 * num_tokens * m * self.head_dim + self._dwc_flops(num_tokens)

    def executed_flops(self, num_tokens: int, batch: int = 1) -> int:
        return self.attention_flops(num_tokens) + self.pooling_flops(num_tokens, self.pool_size)


class WindowAttention(TokenAttention):
    """Local window attention, the reach control: the patch grid is cut into non-overlapping
    ``window`` tiles (Swin's windows, without the shift), and each patch query attends to the
    keys of its own tile and to the prefix tokens; prefix queries (CLS, registers) attend to
    every key, as MiTA's do (``full_prefix``). Nothing a patch query sees lies outside its
    window, so on a task where it loses to full attention, attention's reach matters."""

    def __init__(
        self, dim: int, num_heads: int = 8, *, window: int | Grid = 4, **kwargs: Any
    ) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.window = pool_grid(window)
        if (grid := self.current_grid) is not None:
            self._tiles(grid)

    def settings(self) -> dict[str, Any]:
        return {"window": self.window}

    def _tiles(self, grid: Grid) -> tuple[int, int]:
        """(tiles down, tiles across) of the ``grid``; the window must tile it."""
        (h, w), (wh, ww) = grid, self.window
        if h % wh or w % ww:
            raise ValueError(f"window={self.window} does not tile the patch grid {grid}")
        return h // wh, w // ww

    def attend(self, q, k, v, attn_mask, is_causal):
        batch, heads, num_tokens, dim = q.shape
        prefix = self.num_prefix_tokens
        grid = self.token_grid(num_tokens)
        down, across = self._tiles(grid)
        wh, ww = self.window

        def tiled(x: torch.Tensor) -> torch.Tensor:  # patches → (B, H, tiles, wh·ww, d)
            x = x[:, :, prefix:].reshape(*x.shape[:2], down, wh, across, ww, x.shape[-1])
            return x.transpose(3, 4).reshape(*x.shape[:2], down * across, wh * ww, -1)

        def with_prefix(x: torch.Tensor) -> torch.Tensor:  # every tile also holds the prefix
            shared = x[:, :, None, :prefix].expand(-1, -1, down * across, -1, -1)
            return torch.cat([shared, tiled(x)], dim=3)

        mask = None
        if (dropped := self.masked_keys(batch, q.device)) is not None:
            keep = ~dropped.reshape(batch, 1, num_tokens, 1)
            mask = with_prefix(keep).transpose(-1, -2)  # (B, 1, tiles, 1, prefix + wh·ww)
        out = self.softmax_attention(tiled(q), with_prefix(k), with_prefix(v), mask)
        out = out.reshape(batch, heads, down, across, wh, ww, dim).transpose(3, 4)
        out = out.reshape(batch, heads, grid[0] * grid[1], dim)
        if not prefix:
            return out
        head = self.softmax_attention(q[:, :, :prefix], k, v, None if dropped is None else ~dropped)
        return torch.cat([head, out], dim=2)

    def attention_flops(self, num_tokens: int) -> int:
        prefix = self.num_prefix_tokens
        patches = num_tokens - prefix
        keys = prefix + self.window[0] * self.window[1]
        return self.num_heads * 4 * self.head_dim * (patches * keys + prefix * num_tokens)
