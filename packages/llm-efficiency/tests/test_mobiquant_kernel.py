"""Tests of mixlab.llm_efficiency.mobiquant.kernel: the nested bit-slice matmul.

The Triton kernel runs on CPU tensors under ``TRITON_INTERPRET=1``, which must be set before
triton is imported; so it runs in one subprocess (inputs and outputs pass through files) and
this process only compares the results against the PyTorch reference.
"""

from __future__ import annotations

import pytest
import torch

from mixlab.llm_efficiency.mobiquant.kernel import (
    nested_matmul,
    nested_matmul_reference,
    nested_matmul_triton,
)
from mixlab.llm_efficiency.mobiquant.slices import SliceSpec, dequantize, unpack
from mixlab.shared.interpreted import interpreted

SPEC = SliceSpec(bits=2, slices=4, group_size=64)
M, N, K = 37, 48, 128  # M and N are not multiples of the default block_m=16, block_n=32
TOLERANCE = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-5},
    # the kernel feeds W rounded to fp16 to tl.dot; outputs of ~5 differ by about one fp16 ulp
    torch.float16: {"atol": 1e-2, "rtol": 2e-3},
}


def operands(
    spec: SliceSpec = SPEC,
    m: int = M,
    n: int = N,
    k: int = K,
    dtype: torch.dtype = torch.float32,
    depth: int | None = None,
    seed: int = 0,
) -> dict:
    """Random planes (any byte is a valid code), scales, zeros, x, and depths (random if None)."""
    g = torch.Generator().manual_seed(seed)
    planes = torch.randint(0, 256, (spec.slices, n, k * spec.bits // 8), generator=g)
    groups = k // spec.group_size
    depths = (
        torch.randint(1, spec.slices + 1, (m,), generator=g)
        if depth is None
        else torch.full((m,), depth)
    )
    return {
        "x": torch.randn(m, k, generator=g).to(dtype),
        "planes": planes.to(torch.uint8),
        "scale": (torch.rand(n, groups, generator=g) * 0.1 + 0.01).half(),
        "zero": (torch.rand(n, groups, generator=g) * 2**spec.bits).half(),
        "depth": depths,
        "spec": spec,
    }


def triton_cases() -> dict[str, dict]:
    cases = {}
    for dtype in (torch.float32, torch.float16):
        tag = str(dtype).removeprefix("torch.")
        for d in range(1, SPEC.slices + 1):
            cases[f"uniform{d}-{tag}"] = operands(dtype=dtype, depth=d, seed=d)
        cases[f"mixed-{tag}"] = operands(dtype=dtype, seed=10)
    # 4-bit slices, group 32 < block_k = 64 (two groups per step), K = 96 masks half a step
    cases["bits4-k96"] = {
        **operands(SliceSpec(4, 2, 32), m=21, k=96, seed=11),
        "blocks": {"block_m": 32, "block_n": 16, "block_k": 64},
    }
    # 1-bit slices, eight of them, group 16 < block_k = 32
    cases["bits1-depth8"] = {
        **operands(SliceSpec(1, 8, 16), m=19, k=64, seed=12),
        "blocks": {"block_k": 32},
    }
    strided = operands(seed=13)  # x is a transposed view: its rows are not contiguous
    strided["x"] = strided["x"].T.contiguous().T
    cases["strided-x"] = strided
    batched = operands(m=15, seed=14)  # leading dims [3, 5] through nested_matmul
    batched["x"], batched["depth"] = batched["x"].reshape(3, 5, K), batched["depth"].reshape(3, 5)
    cases["batched"] = batched
    return cases


CASES = triton_cases()

RUN_KERNEL = """
import os, sys, torch
assert os.environ["TRITON_INTERPRET"] == "1"
from mixlab.llm_efficiency.mobiquant.kernel import nested_matmul, nested_matmul_triton
cases, out = torch.load(sys.argv[1], weights_only=False), {}
for name, c in cases.items():
    args = (c["x"], c["planes"], c["scale"], c["zero"], c["depth"], c["spec"])
    if c["x"].dim() > 2:
        out[name] = nested_matmul(*args, backend="triton")
    else:
        out[name] = nested_matmul_triton(*args, **c.get("blocks", {}))
torch.save(out, sys.argv[2])
"""


@pytest.fixture(scope="module")
def kernel_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """Every case of CASES through the Triton kernel, interpreted on CPU in a subprocess."""
    return interpreted(RUN_KERNEL, CASES, tmp_path_factory.mktemp("kernel"))


@pytest.mark.parametrize("name", list(CASES))
def test_triton_matches_reference(kernel_outputs: dict[str, torch.Tensor], name: str) -> None:
    case = CASES[name]
    args = (case["x"], case["planes"], case["scale"], case["zero"], case["depth"], case["spec"])
    expected = nested_matmul(*args, backend="reference")
    got = kernel_outputs[name]
    assert got.dtype == case["x"].dtype
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, **TOLERANCE[case["x"].dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reference_matches_dense_per_token(dtype: torch.dtype) -> None:
    case = operands(dtype=dtype, seed=20)
    x, depth = case["x"], case["depth"]
    assert len(depth.unique()) == SPEC.slices  # every depth is exercised
    codes = unpack(case["planes"], SPEC.bits)
    dense = torch.stack(
        [
            x[m].float() @ dequantize(codes, case["scale"], case["zero"], SPEC, int(d)).T
            for m, d in enumerate(depth)
        ]
    )
    got = nested_matmul_reference(**case)
    assert got.dtype == dtype
    # fp16: both round the same fp32 sums, which may differ in the last bits (summation order)
    tolerance = (
        {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-3, "atol": 1e-4}
    )
    torch.testing.assert_close(got, dense.to(dtype), **tolerance)


def test_reference_depths_differ() -> None:
    """Guards the tests above against depth being ignored: each depth gives another output."""
    case = operands(m=4, seed=21)
    case["depth"] = torch.arange(1, 5)
    case["x"] = case["x"][:1].expand(4, -1)  # one token read at four depths
    y = nested_matmul_reference(**case)
    for a in range(4):
        for b in range(a):
            assert (y[a] - y[b]).abs().max() > 1e-3


def test_auto_backend_on_cpu_is_reference_and_keeps_leading_dims() -> None:
    case = operands(m=6, seed=22)
    x, depth = case["x"].reshape(2, 3, K), case["depth"].reshape(2, 3)
    args = (case["planes"], case["scale"], case["zero"])
    y = nested_matmul(x, *args, depth, SPEC)  # CPU tensors: must not try the compiled kernel
    assert y.shape == (2, 3, N)
    torch.testing.assert_close(y.reshape(6, N), nested_matmul_reference(**case))


def test_empty_batch() -> None:
    case = operands(m=0, seed=23)
    assert nested_matmul_reference(**case).shape == (0, N)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"depth": torch.tensor([0, 1, 2])}, "depth values must be in 1..4"),
        ({"depth": torch.tensor([1, 5, 2])}, "depth values must be in 1..4"),
        ({"depth": torch.tensor([1.0, 2.0, 3.0])}, "depth must be an integer"),
        ({"depth": torch.tensor([1, 2])}, r"depth must have shape \[M\]"),
        ({"x": torch.randn(3, 2 * K)}, "planes must have shape"),
        ({"x": torch.randn(3, 96)}, "group_size=64 must divide the input width of x"),
        ({"x": torch.randn(3, K).double()}, "x must be float32"),
        ({"scale": torch.ones(N, 1)}, "scale must have shape"),
        ({"zero": torch.ones(N, 2, dtype=torch.int32)}, "zero must be a float tensor"),
        ({"planes": torch.zeros(4, N, K // 4, dtype=torch.int32)}, "planes must be uint8"),
        ({"spec": SliceSpec(2, 3, 64)}, "planes must have shape"),
    ],
)
@pytest.mark.parametrize("function", [nested_matmul_reference, nested_matmul_triton])
def test_bad_inputs_raise(function, change: dict, match: str) -> None:
    """Both paths validate before any triton import, so this runs without the interpreter."""
    case = {**operands(m=3, seed=24), **change}
    with pytest.raises(ValueError, match=match):
        function(**case)


def test_bad_backend_and_blocks_raise() -> None:
    case = operands(m=3, seed=25)
    with pytest.raises(ValueError, match="backend must be one of"):
        nested_matmul(**case, backend="cuda")
    with pytest.raises(ValueError, match="block_m must be a power of two >= 16"):
        nested_matmul_triton(**case, block_m=8)
    with pytest.raises(ValueError, match="block_k must be a power of two >= 16"):
        nested_matmul_triton(**case, block_k=48)
    with pytest.raises(ValueError, match="depth must have the leading shape of x"):
        nested_matmul(case["x"], case["planes"], case["scale"], case["zero"], case["depth"][:2],
                      SPEC)  # fmt: skip
