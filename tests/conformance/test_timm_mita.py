"""timm's contract for MiTA's attention swap (issue 17): the architectures it claims, built from
config (``pretrained=False``, two blocks, 4×4 patch grids), each with every timm attention module
replaced in place by :func:`~mixlab.attention_arch.mita.replace_attention`.

- The timm weights load with ``strict=True`` into the swapped model and back, and routed-only MiTA
  with k = N (every query's expert holds all N keys: full attention) gives timm's own output, so
  every projection, bias, norm, prefix token and EVA's rotary embedding is used as timm uses it.
- ``set_input_size`` and ``dynamic_img_size=True`` work after the swap, on non-square grids whose
  orientation MiTA pools over correctly (the grid follows the patch embedding, not a fixed size),
  also in a deep copy of the model.
- ``fused_attn`` is honoured: SDPA when set, else the explicit weights through ``attn_drop``, where
  timm's ``AttentionExtract(method="hook")`` reads them.

Each test fails if the fix it stands for is reverted. The oldest timm all of this passes on is
1.0.18 (the first with ``Eva.set_input_size``).
"""

import copy

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.utils import AttentionExtract

from mixlab.attention_arch.mita import MiTAAttention, attention_modules, replace_attention

# name -> (timm model, kwargs); patch 16 on 64 px or patch 14 on 56 px: a 4×4 grid.
MODELS = {
    "vit": ("vit_tiny_patch16_224", {"img_size": 64}),
    "vit_qk_norm": ("vit_tiny_patch16_224", {"img_size": 64, "qk_norm": True}),
    "deit": ("deit_tiny_patch16_224", {"img_size": 64}),
    "deit_distilled": ("deit_tiny_distilled_patch16_224", {"img_size": 64}),  # CLS + distillation
    "dinov2_reg": ("vit_small_patch14_reg4_dinov2", {"img_size": 56}),  # CLS + 4 registers
    "eva02": ("eva02_tiny_patch14_224", {"img_size": 56}),  # rope, q/v biases (k_bias a buffer)
    "eva02_separate_qkv_inner_norm": (
        "eva02_tiny_patch14_224",
        {"img_size": 56, "qkv_fused": False, "scale_attn_inner": True},
    ),
    "pe_core": ("vit_pe_core_tiny_patch16_384", {"img_size": 64}),  # timm's AttentionRope
}
MITA = {"pool_size": 2, "top_k": 4}


def build(name: str, seed: int = 0, **kwargs) -> torch.nn.Module:
    """The timm model ``name`` with two blocks and random weights (biases and norms included)."""
    model_name, options = MODELS[name]
    torch.manual_seed(seed)
    model = timm.create_model(model_name, pretrained=False, depth=2, **{**options, **kwargs})
    with torch.no_grad():  # timm starts biases at 0 and norms at 1: make every tensor count
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval()


def images(height: int, width: int, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(1))


def pools_over(model: torch.nn.Module, x: torch.Tensor, grid: tuple[int, int]) -> None:
    """``model(x)`` equals its output with every MiTA layer told the patch grid is ``grid``."""
    out = model(x)
    for layer in attention_modules(model):
        layer.grid_size = grid
    torch.testing.assert_close(model(x), out)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_timm_weights_load_strictly_and_routed_mita_with_k_equal_n_is_timm(name):
    reference = build(name)
    size = reference.patch_embed.img_size
    tokens = reference.num_prefix_tokens + reference.patch_embed.num_patches
    swapped = replace_attention(build(name, seed=1), "mita_routed_only", pool_size=2, top_k=tokens)
    assert all(type(layer) is MiTAAttention for layer in attention_modules(swapped))
    swapped.load_state_dict(reference.state_dict(), strict=True)
    x = images(*size)
    with torch.no_grad():
        torch.testing.assert_close(swapped(x), reference(x), atol=1e-5, rtol=1e-4)
    # ... and the swapped weights go back into timm's model and into another swapped one.
    build(name, seed=2).load_state_dict(swapped.state_dict(), strict=True)
    again = replace_attention(build(name, seed=3), "mita", **MITA)
    again.load_state_dict(swapped.state_dict(), strict=True)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_set_input_size_after_the_swap(name):
    model = replace_attention(build(name), "mita", **MITA)
    patch = model.patch_embed.patch_size[0]
    model.set_input_size(img_size=(6 * patch, 4 * patch))
    x = images(6 * patch, 4 * patch)
    with torch.no_grad():
        assert model(x).shape == (2, model.num_classes or model.num_features)
        pools_over(model, x, (6, 4))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_dynamic_img_size_at_two_sizes(name):
    model = replace_attention(build(name, dynamic_img_size=True), "mita", **MITA)
    copied = copy.deepcopy(model)  # as timm's ModelEmaV3 copies a model
    patch = model.patch_embed.patch_size[0]
    wide, tall = images(4 * patch, 6 * patch), images(6 * patch, 4 * patch)
    with torch.no_grad():
        square = model(images(4 * patch, 4 * patch))
        assert model(wide).shape == square.shape
        pools_over(model, wide, (4, 6))
        assert copied(tall).shape == square.shape  # the copy follows its own input
        pools_over(copied, tall, (6, 4))


@pytest.mark.parametrize("name", ["vit", "eva02"])
def test_fused_attn_chooses_sdpa_or_weights_that_timm_can_extract(name, monkeypatch):
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    fused = replace_attention(build(name), "mita", **MITA)
    explicit = build(name)
    for block in explicit.blocks:
        block.attn.fused_attn = False  # what timm.layers.set_fused_attn(False) gives new modules
    replace_attention(explicit, "mita", **MITA)
    assert [layer.fused_attn for layer in attention_modules(explicit)] == [False, False]
    x = images(*fused.patch_embed.img_size)
    with torch.no_grad():
        expected = fused(x)
        assert len(calls) == 2  # one per block
        torch.testing.assert_close(explicit(x), expected)
        assert len(calls) == 2  # none more
        maps = AttentionExtract(explicit, method="hook")(x)
    assert sorted(maps) == ["blocks.0.attn.attn_drop", "blocks.1.attn.attn_drop"]
    tokens = explicit.num_prefix_tokens + explicit.patch_embed.num_patches
    assert attention_modules(explicit)[0].path(tokens) == "dense"  # M·(k' + 1) = 20 >= N
    for weights in maps.values():  # (B, H, N, M + N): the dense path's shared slots and keys
        assert weights.shape[:3] == (2, explicit.blocks[0].attn.num_heads, tokens)
        assert weights.shape[3] == 4 + tokens
        routed = weights[:, :, explicit.num_prefix_tokens :, 4:]
        assert ((routed > 0).sum(-1) <= 4).all()  # a patch query weighs its expert's k' keys
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:3]))
