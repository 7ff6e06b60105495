"""MiTA: Mixture-of-Top-k Attention as a drop-in for timm vision transformers.

- Attention modules, each a timm ``Attention`` with the same parameters: :class:`MiTAAttention`
  (``dwc=True``, ``router_top=2``, ``shared=False`` / ``routed=False`` for the variants and
  ablations), and the baselines :class:`FullAttention` (SDPA), :class:`MoBAAttention`,
  :class:`TopKAttention`, :class:`AgentAttention` and :class:`WindowAttention`. On CUDA without
  gradients MiTA's grouped path runs a Triton kernel (:mod:`~mixlab.attention_arch.mita.kernels`).
- :func:`replace_attention` swaps them into a timm ViT or EVA in place (``ATTENTION_KINDS`` names
  them); the patch grid follows the model's input (:class:`PatchGrid`), and timm's ``fused_attn``
  picks SDPA or explicit weights (:func:`softmax_attention`).
- Introspection: :func:`coverage`, :func:`selections`, :func:`selected_tokens`, :func:`pruned`,
  :func:`pruned_logits`.
- The experiment's pieces: :func:`counting_squares`, :func:`cluttered_digits`, :func:`build_vit`,
  :func:`train`.

    import timm
    from mixlab.attention_arch.mita import replace_attention
    model = timm.create_model("vit_small_patch16_224", checkpoint_path="deit_small.pth")
    replace_attention(model, "mita", pool_size=5, top_k=25)   # then fine-tune briefly
"""

from typing import TYPE_CHECKING

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "ATTENTION_KINDS": "swap",
    "AgentAttention": "baselines",
    "ClutteredDigits": "data",
    "FullAttention": "attention",
    "MiTAAttention": "attention",
    "MoBAAttention": "baselines",
    "PatchGrid": "attention",
    "TokenAttention": "attention",
    "TopKAttention": "baselines",
    "TrainSpec": "training",
    "WindowAttention": "baselines",
    "ViTShape": "config",
    "accuracy": "training",
    "attention_modules": "swap",
    "build_vit": "training",
    "cluttered_digits": "data",
    "counting_squares": "data",
    "coverage": "introspection",
    "gather_tokens": "attention",
    "gathered_attention": "attention",
    "mask_precision_recall": "introspection",
    "pruned": "introspection",
    "pruned_logits": "introspection",
    "random_keep_like": "introspection",
    "replace_attention": "swap",
    "selected_tokens": "introspection",
    "selections": "introspection",
    "softmax_attention": "attention",
    "sparse_attention": "attention",
    "train": "training",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = [
    "ATTENTION_KINDS",
    "AgentAttention",
    "ClutteredDigits",
    "FullAttention",
    "MiTAAttention",
    "MoBAAttention",
    "PatchGrid",
    "TokenAttention",
    "TopKAttention",
    "TrainSpec",
    "ViTShape",
    "WindowAttention",
    "accuracy",
    "attention_modules",
    "build_vit",
    "cluttered_digits",
    "counting_squares",
    "coverage",
    "gather_tokens",
    "gathered_attention",
    "mask_precision_recall",
    "pruned",
    "pruned_logits",
    "random_keep_like",
    "replace_attention",
    "selected_tokens",
    "selections",
    "softmax_attention",
    "sparse_attention",
    "train",
]

if TYPE_CHECKING:
    from mixlab.attention_arch.mita.attention import (
        FullAttention,
        MiTAAttention,
        PatchGrid,
        TokenAttention,
        gather_tokens,
        gathered_attention,
        softmax_attention,
        sparse_attention,
    )
    from mixlab.attention_arch.mita.baselines import (
        AgentAttention,
        MoBAAttention,
        TopKAttention,
        WindowAttention,
    )
    from mixlab.attention_arch.mita.config import ViTShape
    from mixlab.attention_arch.mita.data import (
        ClutteredDigits,
        cluttered_digits,
        counting_squares,
    )
    from mixlab.attention_arch.mita.introspection import (
        coverage,
        mask_precision_recall,
        pruned,
        pruned_logits,
        random_keep_like,
        selected_tokens,
        selections,
    )
    from mixlab.attention_arch.mita.swap import (
        ATTENTION_KINDS,
        attention_modules,
        replace_attention,
    )
    from mixlab.attention_arch.mita.training import (
        TrainSpec,
        accuracy,
        build_vit,
        train,
    )
