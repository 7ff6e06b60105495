"""Swapping the attention of a timm vision transformer in place, and the named attention kinds."""

from __future__ import annotations

from functools import partial
from typing import Any

from timm.models.vision_transformer import Attention
from torch import nn

from mixlab.attention_arch.mita.attention import FullAttention, MiTAAttention, TokenAttention
from mixlab.attention_arch.mita.baselines import AgentAttention, MoBAAttention, TopKAttention
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


def _build(kind: Any, attention: Attention, config: dict[str, Any]) -> TokenAttention:
    if isinstance(kind, partial):
        return kind.func.from_attention(attention, **{**kind.keywords, **config})
    return kind.from_attention(attention, **config)


def replace_attention(
    model: nn.Module, attention: str | type[TokenAttention] | partial = "mita", **config: Any
) -> nn.Module:
    """Swap every timm ``Attention`` in ``model`` for ``attention`` (a name from
    :data:`ATTENTION_KINDS` or a :class:`TokenAttention` subclass), in place, and return ``model``.

    The new modules reuse the old projections, so the state dict keeps its keys and tensors.
    ``num_prefix_tokens`` and ``grid_size`` default to the model's (``model.num_prefix_tokens``,
    ``model.patch_embed.grid_size``); other ``config`` goes to the attention class::

        model = timm.create_model("vit_small_patch16_224", checkpoint_path="deit_s.pth")
        replace_attention(model, "mita", pool_size=5, top_k=25)
    """
    kind = attention_class(attention)
    if "num_prefix_tokens" not in config and hasattr(model, "num_prefix_tokens"):
        config["num_prefix_tokens"] = model.num_prefix_tokens
    patch_embed = getattr(model, "patch_embed", None)
    if "grid_size" not in config and getattr(patch_embed, "grid_size", None) is not None:
        config["grid_size"] = tuple(patch_embed.grid_size)
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Attention):
                setattr(parent, name, _build(kind, child, dict(config)))
                swapped += 1
    if swapped == 0:
        raise ValueError(
            f"model has no timm.models.vision_transformer.Attention module to replace "
            f"({type(model).__name__})"
        )
    return model


def attention_modules(model: nn.Module) -> list[TokenAttention]:
    """The :class:`TokenAttention` modules of ``model`` in forward order."""
    return [module for module in model.modules() if isinstance(module, TokenAttention)]
