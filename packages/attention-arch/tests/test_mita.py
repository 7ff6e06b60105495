"""Tests of mixlab.attention_arch.mita: attention modules, swap, introspection, CLI, experiment."""

from __future__ import annotations

import copy
import inspect
import json

import pytest
import torch
import torch.nn.functional as F
from timm.layers import AttentionRope
from timm.models.vision_transformer import Attention, VisionTransformer
from torch.utils._python_dispatch import TorchDispatchMode

from mixlab.attention_arch.mita import (
    ATTENTION_KINDS,
    FullAttention,
    MiTAAttention,
    MoBAAttention,
    TopKAttention,
    cluttered_digits,
    coverage,
    mask_precision_recall,
    pruned,
    random_keep_like,
    replace_attention,
    selected_tokens,
    selections,
)
from mixlab.attention_arch.mita.swap import matched_config


def vit(**kwargs) -> VisionTransformer:
    torch.manual_seed(0)
    options = dict(
        img_size=32, patch_size=4, in_chans=1, num_classes=10, embed_dim=32, depth=2, num_heads=2
    )
    return VisionTransformer(**{**options, **kwargs})


def qkv(batch=2, heads=2, tokens=65, dim=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, tokens, dim, generator=generator) for _ in range(3)]


def layer(kind, dim=16, heads=2, grid=(8, 8), prefix=1, **config):
    torch.manual_seed(0)
    return ATTENTION_KINDS[kind](dim, heads, num_prefix_tokens=prefix, grid_size=grid, **config)


# --- exactness ------------------------------------------------------------------------------


def test_routed_only_with_k_equal_n_is_full_attention():
    x = torch.randn(2, 65, 16)
    full = layer("full")
    routed = layer("mita_routed_only", pool_size=2, top_k=65)
    routed.load_state_dict(full.state_dict(), strict=True)
    torch.testing.assert_close(routed(x), full(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fused_attn", [True, False])
def test_full_attention_matches_timm_attention(fused_attn):
    torch.manual_seed(0)
    reference = Attention(16, 2, qkv_bias=True)
    reference.fused_attn = fused_attn  # timm's explicit path, and ours
    ours = FullAttention.from_attention(reference, num_prefix_tokens=1)
    x = torch.randn(2, 65, 16)
    torch.testing.assert_close(ours(x), reference(x))
    causal = ours(x, is_causal=True)  # the other path agrees (timm < 1.0.2x has no is_causal)
    ours.fused_attn = not fused_attn
    torch.testing.assert_close(ours(x, is_causal=True), causal)


def test_mita_equals_a_direct_joint_softmax():
    """Eq. (5): one softmax over M shared slots (logits q·r/d) and the k keys of e(i)."""
    q, k, v = qkv(batch=1, heads=1, tokens=17, dim=4)
    module = layer("mita", dim=4, heads=1, grid=(4, 4), pool_size=2, top_k=5)
    out = module.attend(q, k, v, None, False)[0, 0]
    q0, k0, v0 = q[0, 0], k[0, 0], v[0, 0]
    grid = q0[1:].T.reshape(4, 2, 2, 2, 2)  # d, p_h, 2, p_w, 2
    landmarks = grid.mean(dim=(2, 4)).reshape(4, 4).T  # (M, d)
    agent_values = (landmarks @ k0.T / 2).softmax(-1) @ v0
    torch.testing.assert_close(out[0], (k0 @ q0[0] / 2).softmax(-1) @ v0)  # the CLS query
    for i in range(1, 17):
        expert = int((landmarks @ q0[i]).argmax())
        keys = (landmarks[expert] @ k0.T).topk(5).indices
        logits = torch.cat([landmarks @ q0[i] / 4, k0[keys] @ q0[i] / 2])
        weights = logits.softmax(-1)
        expected = weights[:4] @ agent_values + weights[4:] @ v0[keys]
        torch.testing.assert_close(out[i], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["moba", "topk"])
def test_sparse_baselines_match_masked_attention(kind):
    """MoBA and top-k equal full attention restricted to their selected keys, on both paths."""
    q, k, v = qkv(tokens=33, dim=8)
    module = layer(
        kind,
        grid=(4, 8),
        **({"block_size": 4, "top_blocks": 2} if kind == "moba" else {"top_k": 8}),
    )
    dense = module.attend(q, k, v, None, False)
    scores = q @ k.transpose(-1, -2)
    if kind == "topk":
        allowed = torch.zeros_like(scores, dtype=torch.bool).scatter_(
            3, scores.topk(8).indices, True
        )
    else:
        k_pad = F.pad(k, (0, 0, 0, 3))
        block_keys = k_pad.reshape(2, 2, 9, 4, 8).sum(3) / torch.tensor([4.0] * 8 + [1.0])[:, None]
        gate = q @ block_keys.transpose(-1, -2)
        block_of = torch.arange(33) // 4
        gate[..., torch.arange(33), block_of] = float("inf")  # the own block is always in
        chosen = gate.topk(2).indices
        allowed = (block_of[None, None, None, :, None] == chosen[..., None, :]).any(-1)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    torch.testing.assert_close(dense, expected, atol=1e-5, rtol=1e-5)
    module.dense_limit = 0  # the gather path, taken on large inputs
    torch.testing.assert_close(module.attend(q, k, v, None, False), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["grouped", "dense"])
@pytest.mark.parametrize("router_top", [1, 2])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("full_prefix", [True, False])
def test_grouped_and_dense_paths_equal_the_gathered_reference(
    impl, router_top, shared, full_prefix
):
    """Every path computes Eq. (5), values and gradients, per batch element and head, also
    when a query's expert has fewer kept keys than k' and some pool cells are empty."""
    q, k, v = (t.double().requires_grad_() for t in qkv(batch=2, heads=3, tokens=65, dim=8))
    config = dict(dim=24, heads=3, pool_size=4, top_k=12, router_top=router_top, shared=shared,
                  full_prefix=full_prefix)  # fmt: skip
    ours, reference = layer("mita", impl=impl, **config), layer("mita", impl="gather", **config)
    out, expected = ours.attend(q, k, v, None, False), reference.attend(q, k, v, None, False)
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
    torch.testing.assert_close(grads, expected_grads)
    keep = torch.ones(2, 65, dtype=torch.bool)
    keep[0, 1:33] = False  # the top half of image 0: whole pool cells empty
    keep[1, 1:60] = False  # image 1 keeps 6 tokens: fewer than k' = 12 (top-1)
    with pruned(ours, keep), pruned(reference, keep):
        a, b = ours.attend(q, k, v, None, False), reference.attend(q, k, v, None, False)
        grads = torch.autograd.grad(a.square().sum(), (q, k, v))
        expected_grads = torch.autograd.grad(b.square().sum(), (q, k, v))
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(grads, expected_grads)
    assert torch.isfinite(a).all()
    assert all(torch.isfinite(g).all() for g in grads)


def test_auto_falls_back_to_the_dense_path_while_experts_cover_n():
    """M·k' + M >= N: the dense path (full attention's size), which with no shared expert and
    k' = N is full attention itself; beyond, the grouped path."""
    small = layer("mita", grid=(4, 4), pool_size=2, top_k=4)  # 2²·(4 + 1) = 20 >= 17 tokens
    assert small.path(17) == "dense"
    assert layer("mita", pool_size=2, top_k=4).path(65) == "grouped"  # 20 < 65
    x = torch.randn(2, 17, 16)
    full = layer("full", grid=(4, 4))
    everything = layer("mita_routed_only", grid=(4, 4), pool_size=2, top_k=17)
    everything.load_state_dict(full.state_dict())
    assert everything.path(17) == "dense"
    torch.testing.assert_close(everything(x), full(x), atol=1e-5, rtol=1e-5)


def test_executed_flops_are_counted_and_grouped_stays_within_10_percent_of_the_algorithm():
    """``executed_flops`` equals what torch's FLOP counter sees the path multiply; the grouped
    path's padding costs under 10 % beyond the algorithm's own count."""
    from torch.utils.flop_counter import FlopCounterMode

    for grid, prefix, options in (
        ((64, 64), 1, {}), ((64, 64), 0, {"shared": False}), ((64, 64), 1, {"router_top": 2}),
        ((64, 64), 1, {"full_prefix": False}), ((8, 8), 1, {}), ((8, 8), 1, {"shared": False}),
        ((8, 8), 2, {"router_top": 2}), ((16, 16), 0, {"impl": "gather"}),
    ):  # fmt: skip
        module = MiTAAttention(64, 2, num_prefix_tokens=prefix, grid_size=grid, pool_size=4,
                               top_k=16, **options)  # fmt: skip
        n = grid[0] * grid[1] + prefix
        q, k, v = qkv(batch=1, heads=2, tokens=n, dim=32)
        with FlopCounterMode(display=False) as counter:
            module.attend(q, k, v, None, False)
        assert counter.get_total_flops() == module.executed_flops(n), (grid, prefix, options)
        if module.path(n) == "grouped":  # the padding, beside the pooling's product
            padded = module.executed_flops(n) - module.pooling_flops(n, module.pool_size)
            assert padded <= 1.1 * module.attention_flops(n)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_grouped_path_on_cuda_matches_the_reference_and_compiles_whole():
    """On a GPU: the grouped path equals the gathered reference in fp32 and stays close in
    bf16, and ``torch.compile(fullgraph=True)`` runs it, forward and backward, to the eager
    values."""
    module = MiTAAttention(64, 4, num_prefix_tokens=1, grid_size=(32, 32), pool_size=4, top_k=32)
    module = module.cuda()
    x = torch.randn(2, 1025, 64, device="cuda", requires_grad=True)
    assert module.path(1025) == "grouped"
    out = module(x)
    module.impl = "gather"
    torch.testing.assert_close(out, module(x), atol=1e-4, rtol=1e-4)
    module.impl = "auto"
    # bf16: the grouped path against the gathered one at the same precision (a rounding can
    # change a routing decision, so fp32 is no reference for it)
    low = copy.deepcopy(module).to(torch.bfloat16)
    low_x = x.detach().bfloat16()
    low_out = low(low_x)
    low.impl = "gather"
    torch.testing.assert_close(low_out, low(low_x), atol=2e-2, rtol=2e-2)
    compiled = torch.compile(module, fullgraph=True)
    out_compiled = compiled(x)
    torch.testing.assert_close(out_compiled, out, atol=1e-4, rtol=1e-4)
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    (grad_compiled,) = torch.autograd.grad(out_compiled.square().sum(), x)
    torch.testing.assert_close(grad_compiled, grad, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("grid", [(16, 16), (4, 4)])
def test_mita_compiles_without_graph_breaks(grid):
    """No host sync (``.item()``, ``.tolist()``) or data-dependent shape on either path."""
    module = layer("mita", dim=32, grid=grid, pool_size=2, top_k=8)
    x = torch.randn(2, grid[0] * grid[1] + 1, 32)
    assert module.path(x.shape[1]) == ("grouped" if grid == (16, 16) else "dense")
    torch._dynamo.reset()
    explained = torch._dynamo.explain(module)(x)
    assert explained.graph_break_count == 0, explained.break_reasons


def test_top2_routing_differs_from_top1_and_uses_half_the_keys_per_expert():
    x = torch.randn(2, 65, 16)
    top1 = layer("mita", pool_size=2, top_k=12)
    top2 = layer("mita", pool_size=2, top_k=12, router_top=2)
    top2.load_state_dict(top1.state_dict())
    assert not torch.allclose(top1(x), top2(x))
    top2.record_selection = True
    top2(x)
    assert top2.last_selection.sum(-1).max() <= 4 * 6  # M experts × k/2 keys
    with pytest.raises(ValueError, match="router_top"):
        layer("mita", pool_size=2, top_k=12, router_top=3)


# --- the timm contract ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(ATTENTION_KINDS))
def test_replace_attention_keeps_the_state_dict_and_gradients_flow(kind):
    model = vit()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    replace_attention(model, kind, **matched_config(kind, 16, 2))
    assert all(type(b.attn) is not Attention for b in model.blocks)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert unexpected == []
    assert all(name.split(".")[-2] == "dwc" for name in missing)  # only DWC/Agent add weights
    if not missing:
        model.load_state_dict(state, strict=True)
    x = torch.randn(3, 1, 32, 32)
    out = model(x)
    assert out.shape == (3, 10)
    out.square().sum().backward()
    attn = model.blocks[0].attn
    assert attn.qkv.weight.grad.abs().sum() > 0
    assert attn.proj.weight.grad.abs().sum() > 0


def test_swap_reuses_the_trained_tensors_and_mita_dwc_starts_as_mita():
    model = vit()
    weight = model.blocks[0].attn.qkv.weight
    replace_attention(model, "mita", pool_size=2, top_k=12)
    assert model.blocks[0].attn.qkv.weight is weight
    x = torch.randn(2, 1, 32, 32)
    plain = model(x)
    replace_attention(model, "mita_dwc", pool_size=2, top_k=12)
    torch.testing.assert_close(model(x), plain)


def test_prefix_tokens_stay_out_of_the_grid_and_attend_normally():
    model = vit(reg_tokens=2)
    assert model.num_prefix_tokens == 3
    replace_attention(model, "mita", pool_size=2, top_k=12)
    assert model.blocks[0].attn.num_prefix_tokens == 3
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 10)
    # With full_prefix (default), a prefix query is plain softmax attention over every key ...
    q, k, v = qkv(batch=2, heads=2, tokens=66, dim=8)
    module = layer("mita", prefix=2, pool_size=2, top_k=12)
    out = module.attend(q, k, v, None, False)
    torch.testing.assert_close(
        out[:, :, :2], F.scaled_dot_product_attention(q[:, :, :2], k, v), atol=1e-6, rtol=1e-5
    )
    # ... and it moves no landmark: changing it leaves every patch token's output as it was.
    moved = q.clone()
    moved[:, :, :2] += 3.0
    changed = module.attend(moved, k, v, None, False)
    torch.testing.assert_close(changed[:, :, 2:], out[:, :, 2:])
    assert not torch.allclose(changed[:, :, :2], out[:, :, :2])
    # Routed like any query (full_prefix=False), it still never enters a landmark.
    routed = layer("mita", prefix=2, pool_size=2, top_k=12, full_prefix=False)
    changed = routed.attend(moved, k, v, None, False)
    torch.testing.assert_close(changed[:, :, 2:], routed.attend(q, k, v, None, False)[:, :, 2:])


def test_forward_accepts_timm_arguments_and_refuses_masks_it_cannot_honour():
    module = layer("mita", pool_size=2, top_k=12)
    x = torch.randn(1, 65, 16)
    assert module(x, attn_mask=None, is_causal=False).shape == x.shape
    with pytest.raises(ValueError, match="attn_mask and is_causal"):
        module(x, is_causal=True)
    full = layer("full")
    causal = full(x, is_causal=True)
    with pruned(full, torch.ones(1, 65, dtype=torch.bool)):
        torch.testing.assert_close(full(x, is_causal=True), causal)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: layer("mita", pool_size=2, top_k=80), "top_k=80"),
        (lambda: layer("mita", pool_size=9, top_k=4), "pool_size"),
        (
            lambda: layer("mita", grid=None, pool_size=2, top_k=4)(torch.randn(1, 51, 16)),
            "grid_size",
        ),
        (
            lambda: layer("mita", grid=(7, 7), pool_size=2, top_k=4)(torch.randn(1, 65, 16)),
            "grid_size",
        ),
        (lambda: layer("topk", top_k=66)(torch.randn(1, 65, 16)), "top_k=66"),
        (lambda: layer("moba", block_size=32, top_blocks=4)(torch.randn(1, 65, 16)), "top_blocks"),
        (lambda: layer("mita", shared=False, routed=False), "both be False"),
        (lambda: replace_attention(torch.nn.Linear(2, 2)), "no timm"),
        (lambda: MiTAAttention.from_attention(torch.nn.Linear(2, 2)), "attention must be a timm"),
        pytest.param(
            lambda: MiTAAttention.from_attention(
                AttentionRope(16, 4, qkv_fused=False, num_kv_heads=2)
            ),
            "num_kv_heads=2",
            marks=pytest.mark.skipif(
                "num_kv_heads" not in inspect.signature(AttentionRope).parameters,
                reason="this timm has no grouped-query AttentionRope",
            ),
        ),
        (lambda: layer("mita", pool_size=2, top_k=4, impl="flash"), "impl"),
        (
            lambda: pruned(torch.nn.Linear(2, 2), torch.ones(1, 2, dtype=torch.bool)).__enter__(),
            "TokenAttention",
        ),
        (lambda: replace_attention(vit(), "linear"), "attention must be one of"),
        (lambda: matched_config("mita", 4, 2), "key_budget"),
    ],
)
def test_bad_configurations_raise_clear_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_non_square_grid_with_explicit_size():
    module = layer("mita", grid=(4, 8), pool_size=(2, 4), top_k=8)
    assert module(torch.randn(2, 33, 16)).shape == (2, 33, 16)


# --- linear memory ----------------------------------------------------------------------------


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operator produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, tuple | list) else [out]:
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


def test_mita_never_allocates_n_squared_or_n_k_d_elements():
    """The grouped path, forward and backward: nothing of N² (67 M) or N·k·d (2.1 M) elements;
    the largest tensors are the projections' (N·3·C) and the gate's (M·N)."""
    n, k, d = 8192, 16, 16
    module = MiTAAttention(d, 1, num_prefix_tokens=0, grid_size=(64, 128), pool_size=4, top_k=k)
    assert module.path(n) == "grouped"
    x = torch.randn(1, n, d, requires_grad=True)
    with LargestTensor() as probe:
        module(x).sum().backward()
    assert probe.largest <= n * 3 * d < n * k * d // 4
    module.impl = "gather"  # the probe does see the gathered N·k·d keys ...
    with LargestTensor() as control:
        module(x)
    assert control.largest == n * k * d
    with LargestTensor() as control:  # ... and a quadratic score matrix
        _ = x[0] @ x[0].T
    assert control.largest == n * n


def test_topk_and_moba_gather_path_stays_linear():
    n, side = 4096, 64
    for module in (
        TopKAttention(
            16, 1, num_prefix_tokens=0, grid_size=(side, side), top_k=16, chunk_elements=1 << 18
        ),
        MoBAAttention(
            16, 1, num_prefix_tokens=0, grid_size=(side, side), block_size=8, top_blocks=2
        ),
    ):
        module.dense_limit = 0  # the path taken beyond 2^27 mask entries
        x = torch.randn(1, n, 16)
        with LargestTensor() as probe:
            module(x)
        assert probe.largest < n * n // 4


# --- introspection and pruning ----------------------------------------------------------------


def test_pruning_by_key_mask_equals_removing_the_tokens():
    module = layer("full")
    x = torch.randn(1, 65, 16)
    keep = torch.ones(1, 65, dtype=torch.bool)
    keep[0, 10:40] = False
    with pruned(module, keep):
        masked = module(x)
    removed = module(x[:, keep[0]])
    torch.testing.assert_close(masked[:, keep[0]], removed, atol=1e-5, rtol=1e-5)
    assert module.key_mask is None


@pytest.mark.parametrize("kind", ["mita", "moba", "topk", "agent"])
def test_dropped_tokens_do_not_influence_kept_ones(kind):
    module = layer(kind, **matched_config(kind, 16, 2))
    x = torch.randn(1, 65, 16)
    keep = torch.ones(1, 65, dtype=torch.bool)
    keep[0, 20:30] = False
    y = x.clone()
    y[0, 20:30] = torch.randn(10, 16) * 5
    with pruned(module, keep):
        torch.testing.assert_close(
            module(x)[:, keep[0]], module(y)[:, keep[0]], atol=1e-5, rtol=1e-5
        )


def test_coverage_selections_and_random_control():
    model = replace_attention(vit(), "mita", pool_size=2, top_k=8)
    images = torch.randn(4, 1, 32, 32)
    masks = selections(model, images)
    assert len(masks) == 2
    assert masks[0].shape == (4, 2, 65)
    cover = coverage(model, images)
    assert cover.shape == (2, 2)
    assert ((cover > 0) & (cover <= 4 * 8 / 65 + 1e-6)).all()  # at most M·k distinct keys
    union = selected_tokens(model, images)
    assert union.shape == (4, 65)
    assert union.any(dim=1).all()
    generator = torch.Generator().manual_seed(0)
    control = random_keep_like(union, 1, generator)
    assert control[:, 0].all()
    assert torch.equal(control[:, 1:].sum(1), union[:, 1:].sum(1))
    assert mask_precision_recall(union, union) == (1.0, 1.0)
    with pytest.raises(ValueError, match="MiTAAttention"):
        selections(vit(), images)


def test_cluttered_digits_are_reproducible_and_split_by_source():
    a = cluttered_digits(20, canvas=32, seed=1)
    b = cluttered_digits(20, canvas=32, seed=1)
    assert torch.equal(a.images, b.images)
    assert torch.equal(a.labels, b.labels)
    assert a.images.shape == (20, 1, 32, 32)
    assert a.masks.shape == (20, 32, 32)
    assert a.masks.any(dim=(1, 2)).all()
    tokens = a.token_masks(4)
    assert tokens.shape == (20, 64)
    assert 0 < tokens.float().mean() < 0.6
    test = cluttered_digits(20, canvas=32, split="test", seed=1)
    assert not torch.equal(test.images, a.images)
    with pytest.raises(ValueError, match="canvas"):
        cluttered_digits(2, canvas=12)


# --- CLI and experiment -----------------------------------------------------------------------


def test_cli_swap_bench_and_errors(tmp_path, capsys):
    from mixlab.attention_arch.cli import main
    from mixlab.shared.files import read_sidecar

    out = tmp_path / "swapped.safetensors"
    assert main(["mita", "swap", "--model", "vit_tiny_patch16_224", "--img-size", "64", "--pool-size", "2",
                 "--top-k", "8", "--out", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "state dict keys unchanged" in printed
    assert out.exists()
    sidecar = read_sidecar(out.with_suffix(".json"), expect={"format": str, "attention": str})
    assert sidecar["attention_config"] == {"pool_size": 2, "top_k": 8}
    assert main(["mita", "bench", "--tokens", "256", "--repeats", "1"]) == 0
    assert "relative to mita" in capsys.readouterr().out
    assert main(["mita", "swap", "--model", "vit_tiny_patch16_224", "--attention", "linear"]) == 2
    assert main(["mita", "bench", "--tokens", "300"]) == 2
    assert (
        main(
            [
                "mita",
                "swap",
                "--model",
                "vit_tiny_patch16_224",
                "--checkpoint",
                str(tmp_path / "x.pth"),
            ]
        )
        == 2
    )
    assert "does not exist" in capsys.readouterr().err


def test_experiment_runs_and_resumes(tmp_path, monkeypatch):
    from mixlab.attention_arch.mita.config import SWAPPED
    from mixlab.attention_arch.mita.experiment import METHOD, Config, run

    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    config = Config(
        canvas=16, steps=6, finetune_steps=3, train_size=64, test_size=32, coverage_every=3,
        batch_size=8, key_budget=16, pool_size=2, n_seeds=1, class_token=True, workers=1,
    )  # fmt: skip
    assert config.shape.num_tokens == 257  # the CLS-token ViT: MiTA's prefix path in every cell
    result = METHOD.execute(config, tmp_path / "run")  # refuses a claim without its control
    assert set(result.metrics) == {*config.systems, "topk"}  # top-k: swapped in only
    assert result.metrics["topk"]["accuracy"] is None
    assert result.metrics["topk"]["swap_finetuned"] is not None
    assert len(result.claims) == 3
    # the regime check is computed from the measured full-attention accuracy (6 steps: it fails)
    assert [check.holds for check in result.regime] == [result.metrics["full"]["accuracy"] >= 0.6]
    assert "full-attention accuracy" in result.regime[0].evidence
    assert all(claim.state == "untested" for claim in result.claims)
    assert [claim.key for claim in result.claims] == [spec.key for spec in Config.CLAIMS]
    assert all(claim.control is not None for claim in result.claims)
    assert (
        result.metrics["mita"]["flops_vs_full"] < result.metrics["mita"]["executed_flops_vs_full"]
    )
    assert result.metrics["mita"]["pruned_fraction"] is not None
    assert (tmp_path / "run" / "accuracy.png").exists()
    assert (tmp_path / "run" / "coverage.png").exists()
    cells = json.loads((tmp_path / "run" / "cells.json").read_text())
    assert any(c["part"] == "memory" for c in cells)
    (full,) = [c for c in cells if c.get("system") == "full"]
    assert set(full["swaps"]) == {"full", "mita", "moba", "topk", "mita_shared_only"}
    again = run(config, tmp_path / "run", resume=True)
    assert again.metrics == result.metrics

    # Killed during the third training cell, then resumed: the same accuracies as uninterrupted.
    import mixlab.attention_arch.mita.experiment as experiment

    real, calls = experiment.run_scratch, []
    real_train = experiment.train

    def dies_on_third(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "run_scratch", dies_on_third)
    # the memory cell (a fresh process) was measured above: spare a second one here
    monkeypatch.setattr(
        experiment, "run_memory", lambda config: {"peak_bytes": dict.fromkeys(config.systems, 1)}
    )
    with pytest.raises(KeyboardInterrupt):
        METHOD.execute(config, tmp_path / "killed")
    monkeypatch.setattr(experiment, "run_scratch", real)
    resumed = METHOD.execute(config, tmp_path / "killed", resume=True)
    for system, row in result.metrics.items():
        assert resumed.metrics[system]["accuracy"] == row["accuracy"]
        assert resumed.metrics[system]["swap_finetuned"] == row["swap_finetuned"]

    # Killed during full attention's second swap: resumed, it trains full attention no more.
    real_swap, swaps = experiment.run_swap, []

    def dies_on_second(*args, **kwargs):
        swaps.append(args[1])
        if len(swaps) == 2:
            raise KeyboardInterrupt
        return real_swap(*args, **kwargs)

    monkeypatch.setattr(experiment, "run_swap", dies_on_second)
    with pytest.raises(KeyboardInterrupt):
        METHOD.execute(config, tmp_path / "killed-swap")
    assert (tmp_path / "killed-swap" / "checkpoints" / "trained-full-seed0.json").is_file()
    monkeypatch.setattr(experiment, "run_swap", real_swap)
    trained_again = []
    monkeypatch.setattr(
        experiment, "train", lambda *a, **k: trained_again.append(a) or real_train(*a, **k)
    )
    resumed = METHOD.execute(config, tmp_path / "killed-swap", resume=True)
    assert len(trained_again) == len(SWAPPED) - 1 + len(config.systems) - 1  # not full's training
    for system, row in result.metrics.items():
        assert resumed.metrics[system]["swap_finetuned"] == row["swap_finetuned"]
        assert resumed.metrics[system]["accuracy"] == row["accuracy"]
    with pytest.raises(ValueError, match="key_budget"):
        Config(key_budget=16, pool_size=4)  # MiTA's 16 landmarks leave no routed key
    with pytest.raises(ValueError, match="systems"):
        Config(systems=("full", "mita", "moba"))
    with pytest.raises(ValueError, match="key_budget"):
        Config(key_budget=22)  # the window's 2×11 tiles do not fit the 32×32 grid
    with pytest.raises(ValueError, match="task"):
        Config(task="parity")


def test_counting_squares_are_labelled_by_their_count_and_split():
    from mixlab.attention_arch.mita.data import counting_squares

    data = counting_squares(50, canvas=16, size=2, max_count=9, seed=3)
    objects = data.masks.sum((1, 2)) // 4
    assert torch.equal(objects, data.labels)  # squares never overlap
    assert len(set(data.labels.tolist())) > 5
    assert set(data.labels.tolist()) <= set(range(10))
    assert torch.equal(data.images[data.masks[:, None]], torch.ones(int(data.masks.sum())))
    assert data.images[~data.masks[:, None]].max() < 0.2  # the noise stays below the squares
    again = counting_squares(50, canvas=16, size=2, max_count=9, seed=3)
    assert torch.equal(again.images, data.images)
    test = counting_squares(50, canvas=16, size=2, max_count=9, seed=3, split="test")
    assert not torch.equal(test.images, data.images)
    assert data.token_masks(2).sum(1).tolist() == objects.tolist()  # one token a square
    with pytest.raises(ValueError, match="max_count"):
        counting_squares(2, canvas=4, size=2, max_count=5)


def _claim_cells(accuracy: dict[str, list[float]], swaps: dict[str, list[float]], pruning: dict):
    """From-scratch cells as the experiment writes them (the swaps inside full attention's),
    with the given numbers."""
    return [
        {"part": "scratch", "system": system, "seed": seed, "accuracy": value}
        | (pruning if system == "mita" else {})
        | (
            {"swaps": {k: {"finetuned": v[seed]} for k, v in swaps.items()}}
            if system == "full"
            else {}
        )
        for system, values in accuracy.items()
        for seed, value in enumerate(values)
    ]


def test_claims_are_judged_per_seed_against_their_controls():
    from mixlab.attention_arch.mita.experiment import Config, claims

    config = Config(n_seeds=2)
    flops = {"full": 1.0, "mita": 0.3125, "moba": 0.3125, "mita_shared_only": 0.5, "window": 0.3}
    metrics = {system: {"flops_vs_full": value} for system, value in flops.items()}
    swaps = {
        "full": [0.91, 0.9],
        "mita": [0.92, 0.9],
        "moba": [0.89, 0.88],
        "topk": [0.90, 0.89],
        "mita_shared_only": [0.85, 0.85],
    }
    pruning = {"pruned_fraction": 0.2, "pruned_accuracy": 0.85, "random_pruned_accuracy": 0.7}
    accuracy = {
        "full": [0.90, 0.88],
        "mita": [0.895, 0.875],
        "moba": [0.80, 0.79],  # MoBA falls more than a point behind: MiTA's match holds
        "mita_shared_only": [0.7, 0.7],
        "window": [0.5, 0.6],  # the window loses: attention's reach matters (the premise)
    }

    def judged() -> dict:
        cells = _claim_cells(accuracy, swaps, pruning)
        return {c.key: c for c in claims(config, cells, metrics)}

    assert {key: c.state for key, c in judged().items()} == {
        "matches_full_attention": "holds",
        "swap_recovers_most": "holds",
        "selection_prunes_tokens": "holds",
    }
    assert judged()["matches_full_attention"].control.system == "moba"
    assert "worst of 2 seeds" in judged()["matches_full_attention"].evidence
    swap = judged()["swap_recovers_most"]  # judged seed by seed, against the shared-only swap
    assert swap.per_seed
    assert "worst of 2 seeds" in swap.evidence
    assert swap.control.system == "mita_shared_only"
    assert not swap.control.holds
    # the shared-only swap beats MoBA and top-k too: the routed part is not what recovers
    swaps["mita_shared_only"] = [0.95, 0.95]
    assert judged()["swap_recovers_most"].state == "vacuous"
    # one seed where MiTA's swap falls behind top-k's fails the claim
    swaps["mita"] = [0.95, 0.88]
    assert judged()["swap_recovers_most"].state == "fails"

    # MoBA within a point of full attention too: the match does not measure MiTA's idea
    accuracy["moba"] = [0.895, 0.879]
    assert judged()["matches_full_attention"].state == "vacuous"
    # one seed where MiTA falls behind fails the claim, whatever the mean says
    accuracy["mita"] = [0.95, 0.86]
    assert judged()["matches_full_attention"].state == "fails"
    # the window within 0.1 of full attention on one seed: reach does not matter, untested
    accuracy["mita"], accuracy["window"] = [0.895, 0.875], [0.5, 0.8]
    assert judged()["matches_full_attention"].state == "untested"
    assert "reach matters" in judged()["matches_full_attention"].evidence


def test_pooling_matrix_is_adaptive_average_pooling():
    from mixlab.attention_arch.mita.attention import pooling_matrix

    for grid, pool in (((14, 14), (4, 4)), ((7, 5), (3, 2)), ((16, 32), (4, 4)), ((5, 5), (5, 5))):
        x = torch.randn(2, 3, grid[0] * grid[1], 5, dtype=torch.float64)
        matrix = pooling_matrix(grid, pool, torch.device("cpu"), torch.float64)
        pooled = torch.nn.functional.adaptive_avg_pool2d(
            x.transpose(-1, -2).reshape(-1, 5, *grid), pool
        )
        expected = pooled.reshape(2, 3, 5, -1).transpose(-1, -2)
        torch.testing.assert_close(matrix @ x, expected, rtol=0, atol=1e-12)


def test_window_attention_is_full_attention_masked_to_its_tile():
    """Patch queries see their own window and the prefix; prefix queries see every key; a key
    mask removes keys everywhere."""
    from mixlab.attention_arch.mita.baselines import WindowAttention

    torch.manual_seed(0)
    layer = WindowAttention(32, 2, window=(2, 4), num_prefix_tokens=1, grid_size=(4, 8))
    x = torch.randn(2, 33, 32)
    q, k, v = layer.project(x)
    rows, cols = torch.arange(32) // 8, torch.arange(32) % 8
    same_tile = (rows[:, None] // 2 == rows // 2) & (cols[:, None] // 4 == cols // 4)
    allowed = torch.ones(33, 33, dtype=torch.bool)
    allowed[1:, 1:] = same_tile
    for key_mask in (None, torch.rand(2, 33, generator=torch.Generator().manual_seed(1)) > 0.3):
        layer.key_mask = key_mask
        mask = allowed[None, None] if key_mask is None else allowed & key_mask[:, None, None, :]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        expected = layer.proj(out.transpose(1, 2).reshape(2, 33, -1))
        torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    assert layer.attention_flops(33) == 2 * 4 * 16 * (32 * 9 + 33)
    with pytest.raises(ValueError, match="does not tile"):
        WindowAttention(32, 2, window=3, grid_size=(4, 8))


def test_repr_shows_each_kinds_settings():
    from mixlab.attention_arch.mita.swap import ATTENTION_KINDS

    mita = repr(MiTAAttention(64, 2, pool_size=2, top_k=4, grid_size=(4, 4)))
    assert "num_heads=2, num_prefix_tokens=1, pool_size=(2, 2), top_k=4, router_top=1" in mita
    assert "impl='auto'" in mita
    for kind, setting in (("moba", "block_size=8"), ("topk", "top_k=16"), ("window", "window=(4, 4)"),
                          ("agent", "pool_size=(2, 2)")):  # fmt: skip
        options = {"moba": {"block_size": 8}, "topk": {"top_k": 16}, "window": {"window": 4},
                   "agent": {"pool_size": 2}}[kind]  # fmt: skip
        layer = ATTENTION_KINDS[kind](64, 2, num_prefix_tokens=0, grid_size=(4, 4), **options)
        assert setting in repr(layer), kind
