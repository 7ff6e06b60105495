"""Tests of mixlab.attention_arch.mita.kernels: MiTA's grouped tiles (Eq. (5), top-1 routing).

The Triton kernel runs on CPU tensors under ``TRITON_INTERPRET=1``, which must be set before
triton is imported; so it runs in one subprocess (inputs and outputs pass through files) and
this process only compares the results against the PyTorch reference. bfloat16 is left out:
the interpreter's ``tl.dot`` gets bfloat16 wrong (a 16×16 product is off by ~1e10).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from mixlab.attention_arch.mita import attention
from mixlab.attention_arch.mita.kernels import (
    grouped_tiles_forward,
    grouped_tiles_reference,
    triton_available,
)
from mixlab.shared.interpreted import interpreted


def tile_layout(experts, selected, tile):
    """(slot_query, slot_of_entry, tile_keys_index) of the grouped path's top-1 layout."""
    layout = attention.tile_layout(experts, selected.shape[2], tile)
    tile_keys_index = attention.gather_tokens(selected, layout.tile_expert)
    return layout.slot_entry, layout.slot_of_entry, tile_keys_index


TOLERANCE = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    # the kernel feeds fp16 q, k and fp16-rounded weights to tl.dot; the reference is fp32
    # throughout and rounds once: outputs of ~1 differ by a few fp16 ulps
    torch.float16: {"atol": 4e-3, "rtol": 4e-3},
}


def operands(
    batch: int = 1,
    num_queries: int = 20,
    num_keys: int = 30,
    dim: int = 16,
    landmarks: int | None = 4,
    per_expert: int = 5,
    tile: int = 8,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    heads: int = 2,
) -> dict:
    """Random q, k, v, landmarks (None: routed only) and a random expert per query, laid out
    by :func:`tile_layout` as the grouped path does (so padding slots and empty tiles occur)."""
    g = torch.Generator().manual_seed(seed)
    experts_count = landmarks or 4

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(batch, heads, *shape, generator=g)

    selected = torch.rand(batch, heads, experts_count, num_keys, generator=g).argsort(-1)
    experts = torch.randint(0, experts_count, (batch, heads, num_queries), generator=g)
    slot_query, _, tile_keys_index = tile_layout(experts, selected[..., :per_expert], tile)
    shared = landmarks is not None
    return {
        "queries": randn(num_queries, dim).to(dtype),
        "k": randn(num_keys, dim).to(dtype),
        "v": randn(num_keys, dim).to(dtype),
        "slot_query": slot_query,
        "tile_keys_index": tile_keys_index,
        "tile": tile,
        "shared_keys": (randn(experts_count, dim) * dim**-0.5).to(dtype) if shared else None,
        "agent_values": randn(experts_count, dim).to(dtype) if shared else None,
    }


def triton_cases() -> dict[str, dict]:
    cases = {}
    for dtype in (torch.float32, torch.float16):
        tag = str(dtype).removeprefix("torch.")
        cases[f"d16-m4-k5-t8-{tag}"] = operands(dtype=dtype, seed=1)
        # d, M and k' past a power of two: 24 → 32, 9 → 16, and k' = 16 exactly; T = 16
        big = {"batch": 2, "num_queries": 40, "num_keys": 64, "dim": 24, "landmarks": 9}
        cases[f"d24-m9-k16-t16-{tag}"] = operands(
            **big, per_expert=16, tile=16, dtype=dtype, seed=2
        )
        cases[f"routed-only-{tag}"] = operands(dim=24, landmarks=None, dtype=dtype, seed=3)
    # queries a slice along N and k, v transposed views, as q[:, :, prefix:] and qkv.permute
    strided = operands(batch=2, num_queries=33, num_keys=41, dim=24, landmarks=9, seed=4)
    strided["queries"] = torch.cat([strided["queries"][:, :, :1], strided["queries"]], 2)[:, :, 1:]
    for name in ("k", "v"):
        strided[name] = strided[name].transpose(1, 2).contiguous().transpose(1, 2)
    cases["strided"] = strided
    return cases


CASES = triton_cases()

RUN_KERNEL = """
import os, sys, torch
assert os.environ["TRITON_INTERPRET"] == "1"
from mixlab.attention_arch.mita.kernels import grouped_tiles_forward, triton_available
assert triton_available("cpu")
cases = torch.load(sys.argv[1], weights_only=False)
out = {name: grouped_tiles_forward(**c) for name, c in cases.items()}
# the layer end to end, as users call it without gradients: the kernel path, then the torch path
import mixlab.attention_arch.mita.kernels as kernels
from mixlab.attention_arch.mita import MiTAAttention
calls = []
counted = kernels.grouped_tiles_forward
kernels.grouped_tiles_forward = lambda *a: calls.append(1) or counted(*a)
torch.manual_seed(0)
layer = MiTAAttention(32, 2, pool_size=2, top_k=8, num_prefix_tokens=1, grid_size=(6, 6)).eval()
x = torch.randn(2, 37, 32)
with torch.no_grad():
    out["layer-kernel"] = layer(x)
    assert len(calls) == 1, calls  # the kernel computed the grouped path
    layer.kernel = False
    out["layer-torch"] = layer(x)
    assert len(calls) == 1, calls
torch.save(out, sys.argv[2])
"""


@pytest.fixture(scope="module")
def kernel_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """Every case of CASES through the Triton kernel, interpreted on CPU in a subprocess."""
    return interpreted(RUN_KERNEL, CASES, tmp_path_factory.mktemp("kernel"))


@pytest.mark.parametrize("name", list(CASES))
def test_triton_matches_reference(kernel_outputs: dict[str, torch.Tensor], name: str) -> None:
    case = CASES[name]
    expected = grouped_tiles_reference(**case)
    got = kernel_outputs[name]
    assert got.dtype == case["queries"].dtype
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, **TOLERANCE[got.dtype])


def test_layer_uses_the_kernel_and_agrees(kernel_outputs: dict[str, torch.Tensor]) -> None:
    """MiTAAttention (grouped path at N = 37 > M·k' + M = 36) without gradients runs the kernel
    when triton is available, and gives the torch path's outputs."""
    layer = attention.MiTAAttention(32, 2, pool_size=2, top_k=8, grid_size=(6, 6))
    assert layer.path(37) == "grouped"
    torch.testing.assert_close(
        kernel_outputs["layer-kernel"], kernel_outputs["layer-torch"], atol=1e-5, rtol=1e-5
    )


def test_kernel_is_not_used_without_the_interpreter_on_a_cpu(monkeypatch) -> None:
    import mixlab.attention_arch.mita.kernels as kernels

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    calls = []
    monkeypatch.setattr(kernels, "grouped_tiles_forward", lambda *a: calls.append(a))
    layer = attention.MiTAAttention(32, 2, pool_size=2, top_k=8, grid_size=(6, 6))
    with torch.no_grad():
        layer(torch.randn(1, 37, 32))  # the grouped path
    assert calls == []


def per_query_mita(queries, k, v, experts, selected, landmarks, agent_values) -> torch.Tensor:
    """Eq. (5) written from the paper, one query at a time: softmax over [q·r/d ; q·k_j/√d]."""
    dim = queries.shape[-1]
    out = torch.empty_like(queries)
    for b, h, i in itertools.product(*map(range, queries.shape[:3])):
        q, keys = queries[b, h, i], selected[b, h, experts[b, h, i]]
        logits = k[b, h, keys] @ q / dim**0.5
        values = v[b, h, keys]
        if landmarks is not None:
            logits = torch.cat([landmarks[b, h] @ q / dim, logits])
            values = torch.cat([agent_values[b, h], values])
        out[b, h, i] = logits.softmax(0) @ values
    return out


@pytest.mark.parametrize("shared", [True, False])
def test_layout_and_reference_equal_per_query_loop(shared: bool) -> None:
    """tile_layout + grouped_tiles_reference, read back at each query's slot, is Eq. (5)."""
    g = torch.Generator().manual_seed(5)
    batch, heads, nq, n, dim, m, per_expert, tile = 2, 2, 37, 45, 24, 9, 6, 8
    queries, k, v = (torch.randn(batch, heads, size, dim, generator=g) for size in (nq, n, n))
    landmarks = torch.randn(batch, heads, m, dim, generator=g) if shared else None
    agent_values = torch.randn(batch, heads, m, dim, generator=g) if shared else None
    selected = torch.rand(batch, heads, m, n, generator=g).argsort(-1)[..., :per_expert]
    experts = torch.randint(0, m, (batch, heads, nq), generator=g)
    experts[0, 0] = 3  # one expert takes every query of a head: ⌈Nq/T⌉ tiles for it alone
    slot_query, slot_of_entry, tile_keys_index = tile_layout(experts, selected, tile)
    assert slot_query.shape == (batch, heads, (-(-nq // tile) + m) * tile)
    assert torch.equal(slot_query.gather(2, slot_of_entry), torch.arange(nq).expand_as(experts))
    shared_keys = landmarks * dim**-0.5 if shared else None
    slots = grouped_tiles_reference(
        queries, k, v, slot_query, tile_keys_index, tile, shared_keys, agent_values
    )
    got = slots.gather(2, slot_of_entry[..., None].expand(-1, -1, -1, dim))
    expected = per_query_mita(queries, k, v, experts, selected, landmarks, agent_values)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_triton_available_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not triton_available("cpu")
    assert not triton_available(torch.device("meta"))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"queries": torch.randn(2, 20, 16)}, r"queries must be 4-D"),
        ({"queries": torch.randn(1, 2, 20, 16).double()}, "queries must be float32"),
        ({"k": torch.randn(1, 2, 30, 8)}, r"k must have shape \(B, H, \*, d\)"),
        ({"v": torch.randn(1, 2, 31, 16)}, "v must have the shape of k"),
        ({"v": torch.randn(1, 2, 30, 16).half()}, "v must have the dtype of queries"),
        ({"shared_keys": None}, "shared_keys and agent_values must be both given or both None"),
        ({"agent_values": torch.randn(1, 2, 5, 16)}, "agent_values must have the shape"),
        ({"tile": 0}, "tile must be a positive integer"),
        ({"tile": 4}, r"slot_query must have shape \(B, H, tiles·tile\)"),
        ({"slot_query": torch.zeros(1, 2, 64)}, "slot_query must be an integer tensor"),
        ({"tile_keys_index": torch.zeros(1, 2, 8, 0, dtype=torch.long)}, "at least one key"),
        ({"tile_keys_index": torch.zeros(2, 2, 8, 5, dtype=torch.long)}, "tile_keys_index must"),
    ],
)
@pytest.mark.parametrize("function", [grouped_tiles_reference, grouped_tiles_forward])
def test_bad_inputs_raise(function, change: dict, match: str) -> None:
    """Both paths validate before any triton import, so this runs without the interpreter."""
    case = {**operands(seed=6), **change}
    with pytest.raises(ValueError, match=match):
        function(**case)


def test_forward_refuses_what_it_cannot_run() -> None:
    case = operands(seed=7)
    with pytest.raises(ValueError, match="queries requires grad"):
        grouped_tiles_forward(**{**case, "queries": case["queries"].requires_grad_()})
    big = operands(dim=160, seed=8)
    with pytest.raises(ValueError, match="d=160 is too large"):
        grouped_tiles_forward(**big)
