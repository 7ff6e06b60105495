"""What MiTA's routed experts select, and inference with the never-selected tokens dropped.

- :func:`selections`: per MiTA layer, the (B, H, N) mask of keys in the union ∪_m S_m of the
  landmarks' top-k sets, from one forward pass.
- :func:`coverage`: |∪_m S_m| / N per layer and head (the paper's coverage; it falls as MiTA
  trains, which is what makes pruning possible).
- :func:`pruned`: a context in which every attention module ignores the keys a (B, N) mask drops.
  A dropped token then influences no other token; :func:`pruned_logits` also leaves it out of the
  pooling, so the prediction equals that of the sequence with those tokens removed. We mask
  instead of cutting so that the landmark grid keeps its geometry.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from mixlab.attention_arch.mita.attention import MiTAAttention
from mixlab.attention_arch.mita.swap import attention_modules


def _mita_layers(model: nn.Module) -> list[MiTAAttention]:
    layers = [m for m in attention_modules(model) if isinstance(m, MiTAAttention) and m.routed]
    if not layers:
        raise ValueError("model has no MiTAAttention module with routed experts")
    return layers


@torch.no_grad()
def selections(model: nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
    """Per MiTA layer, a (B, H, N) bool mask: True where a key is in some landmark's top-k set."""
    layers = _mita_layers(model)
    for layer in layers:
        layer.record_selection = True
    try:
        model(images)
        return [layer.last_selection for layer in layers]
    finally:
        for layer in layers:
            layer.record_selection, layer.last_selection = False, None


def coverage(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """(layers, heads): the mean over images of |∪_m S_m| / N."""
    return torch.stack([mask.float().mean(dim=(0, 2)) for mask in selections(model, images)])


def selected_tokens(
    model: nn.Module, images: torch.Tensor, layers: list[int] | None = None
) -> torch.Tensor:
    """(B, N) bool: tokens selected by some landmark of some head in ``layers`` (default all)."""
    masks = selections(model, images)
    chosen = masks if layers is None else [masks[i] for i in layers]
    return torch.stack([mask.any(dim=1) for mask in chosen]).any(dim=0)


@contextmanager
def pruned(model: nn.Module, keep: torch.Tensor) -> Iterator[nn.Module]:
    """Inside the block, every attention module of ``model`` attends only to tokens where the
    (B, N) bool ``keep`` is True. Prefix tokens should be kept (a query with no key is NaN)."""
    if keep.dtype != torch.bool or keep.dim() != 2:
        raise ValueError(
            f"keep must be a (batch, tokens) bool tensor, got {keep.dtype} {tuple(keep.shape)}"
        )
    modules = attention_modules(model)
    if not modules:
        raise ValueError("model has no TokenAttention module: swap one in with replace_attention")
    for module in modules:
        module.key_mask = keep
    try:
        yield model
    finally:
        for module in modules:
            module.key_mask = None


def pruned_logits(model: nn.Module, images: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The outputs of a timm ``VisionTransformer`` with the tokens where ``keep`` is False
    dropped: attention ignores them (:func:`pruned`) and so does the pooling (max, avg; a token
    head reads the kept prefix)."""
    with pruned(model, keep):
        features = model.forward_features(images)
    pool = model.global_pool
    if pool == "token":
        return model.forward_head(features)
    if pool not in ("max", "avg"):
        raise ValueError(f"pruned_logits supports global_pool token, avg or max, got {pool!r}")
    start = 0 if getattr(model, "pool_include_prefix", False) else model.num_prefix_tokens
    patches, kept = features[:, start:], keep[:, start:, None]
    if pool == "max":
        pooled = patches.masked_fill(~kept, float("-inf")).amax(dim=1)
    else:
        pooled = (patches * kept).sum(dim=1) / kept.sum(dim=1).clamp_min(1)
    return model.head(model.head_drop(model.fc_norm(pooled)))


def random_keep_like(
    keep: torch.Tensor, num_prefix_tokens: int, generator: torch.Generator
) -> torch.Tensor:
    """A (B, N) mask that keeps the prefix and, per image, as many other tokens as ``keep``
    does, chosen uniformly at random: the control for pruning by selection."""
    batch, num_tokens = keep.shape
    counts = keep[:, num_prefix_tokens:].sum(dim=1).cpu()
    scores = torch.rand(batch, num_tokens - num_prefix_tokens, generator=generator)
    ranks = scores.argsort(dim=1).argsort(dim=1)
    patches = ranks < counts[:, None]
    prefix = torch.ones(batch, num_prefix_tokens, dtype=torch.bool)
    return torch.cat([prefix, patches], dim=1).to(keep.device)


def mask_precision_recall(
    selected: torch.Tensor, object_tokens: torch.Tensor
) -> tuple[float, float]:
    """Precision and recall of the selected patch tokens against the object's tokens, both
    (B, patches) bool, pooled over the batch."""
    hits = (selected & object_tokens).sum().item()
    precision = hits / max(selected.sum().item(), 1)
    recall = hits / max(object_tokens.sum().item(), 1)
    return precision, recall
