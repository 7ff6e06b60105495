"""Swapping the attention of a timm vision transformer (ViT family or EVA family) in place, and
the named attention kinds."""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn

from mixlab.attention_arch.mita.attention import (
    SWAPPABLE,
    FullAttention,
    MiTAAttention,
    PatchGrid,
    TokenAttention,
)
from mixlab.attention_arch.mita.baselines import (
    AgentAttention,
    MoBAAttention,
    TopKAttention,
    WindowAttention,
)
from mixlab.attention_arch.mita.config import ATTENTION_KIND_NAMES, budget_grid, matched_config

ATTENTION_KINDS: dict[str, Any] = {
    "full": FullAttention,
    "mita": MiTAAttention,
    "mita_dwc": partial(MiTAAttention, dwc=True),
    "mita_routed_only": partial(MiTAAttention, shared=False),
    "mita_shared_only": partial(MiTAAttention, routed=False),
    "moba": MoBAAttention,
    "topk": TopKAttention,
    "agent": AgentAttention,
    "window": WindowAttention,
}
"""Name → attention class (or a partial of one) accepted by :func:`replace_attention`."""
if tuple(ATTENTION_KINDS) != ATTENTION_KIND_NAMES:  # config.py names them without importing torch
    raise ImportError("mita.config.ATTENTION_KIND_NAMES differs from swap.ATTENTION_KINDS")

__all__ = [
    "ATTENTION_KINDS",
    "attention_class",
    "attention_modules",
    "budget_grid",
    "matched_config",
    "replace_attention",
]


def attention_class(kind: str | type[TokenAttention] | partial) -> Any:
    if isinstance(kind, str):
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {sorted(ATTENTION_KINDS)}, got {kind!r}")
        return ATTENTION_KINDS[kind]
    return kind


def _build(kind: Any, attention: nn.Module, config: dict[str, Any]) -> TokenAttention:
    if isinstance(kind, partial):
        return kind.func.from_attention(attention, **{**kind.keywords, **config})
    return kind.from_attention(attention, **config)


def replace_attention(
    model: nn.Module, attention: str | type[TokenAttention] | partial = "mita", **config: Any
) -> nn.Module:
    """Swap every timm attention module in ``model`` (ViT ``Attention``, ``EvaAttention``,
    ``AttentionRope``: :data:`~mixlab.attention_arch.mita.attention.SWAPPABLE`) for
    ``attention`` (a name from :data:`ATTENTION_KINDS` or a :class:`TokenAttention` subclass), in
    place, and return ``model``.

    The new modules reuse the old projections, so the state dict keeps its keys and tensors.
    ``num_prefix_tokens`` defaults to ``model.num_prefix_tokens``, and ``grid_size`` to a
    :class:`~mixlab.attention_arch.mita.attention.PatchGrid` that follows ``model.patch_embed``
    (so ``set_input_size`` and ``dynamic_img_size=True`` work); other ``config`` goes to the
    attention class::

        model = timm.create_model("vit_small_patch16_224", checkpoint_path="deit_s.pth")
        replace_attention(model, "mita", pool_size=5, top_k=25)
    """
    kind = attention_class(attention)
    if "num_prefix_tokens" not in config and hasattr(model, "num_prefix_tokens"):
        config["num_prefix_tokens"] = model.num_prefix_tokens
    if "grid_size" not in config:
        config["grid_size"] = _model_grid(model)
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, SWAPPABLE):
                setattr(parent, name, _build(kind, child, dict(config)))
                swapped += 1
    if swapped == 0:
        names = " / ".join(c.__name__ for c in SWAPPABLE)
        raise ValueError(f"model has no timm {names} module to replace ({type(model).__name__})")
    return model


def _model_grid(model: nn.Module) -> PatchGrid | tuple[int, int] | None:
    """The patch grid of ``model``: the :class:`PatchGrid` its swapped modules already follow,
    a new one on ``model.patch_embed``, its fixed ``grid_size`` (a patch embedding without
    ``dynamic_feat_size``), or None (no patch embedding: square grids inferred)."""
    for module in attention_modules(model):
        if isinstance(module.grid_size, PatchGrid):  # swapped before: one hook per model
            return module.grid_size
    patch_embed = getattr(model, "patch_embed", None)
    if hasattr(patch_embed, "dynamic_feat_size") and hasattr(patch_embed, "grid_size"):
        return PatchGrid(patch_embed)
    grid = getattr(patch_embed, "grid_size", None)
    return None if grid is None else tuple(grid)


def attention_modules(model: nn.Module) -> list[TokenAttention]:
    """The :class:`TokenAttention` modules of ``model`` in forward order."""
    return [module for module in model.modules() if isinstance(module, TokenAttention)]
