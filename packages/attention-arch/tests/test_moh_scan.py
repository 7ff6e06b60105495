"""MoH's selective scan (the reference against mambapy's parallel scan, values and gradients;
refusals) and the grid scan orders."""

from __future__ import annotations

import pytest
import torch

from mixlab.attention_arch.moh import inverse_order, scan_order, selective_scan

torch.set_num_threads(1)


def inputs(batch=2, channels=6, state=4, length=13, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    return {
        "u": randn(batch, channels, length),
        "delta": randn(batch, channels, length),
        "A": -torch.exp(randn(channels, state)),  # a stable, decaying state
        "B": randn(batch, state, length),
        "C": randn(batch, state, length),
        "D": randn(channels),
        "z": randn(batch, channels, length),
    }


def test_the_reference_follows_the_recurrence_on_one_channel():
    x = inputs(batch=1, channels=1, state=1, length=3)
    y = selective_scan(**x)
    u, dt, a, b, c = (x[k].flatten() for k in ("u", "delta", "A", "B", "C"))
    state, expected = 0.0, []
    for t in range(3):
        state = torch.exp(dt[t] * a[0]) * state + dt[t] * b[t] * u[t]
        expected.append(
            (c[t] * state + x["D"][0] * u[t]) * torch.nn.functional.silu(x["z"][0, 0, t])
        )
    torch.testing.assert_close(y.flatten(), torch.stack(expected))


@pytest.mark.parametrize("length", [1, 13, 32])
def test_mambapy_agrees_with_the_reference_in_values_and_gradients(length):
    x = {k: v.float().requires_grad_() for k, v in inputs(length=length).items()}
    bias = torch.randn(6)
    ref = selective_scan(**x, delta_bias=bias, delta_softplus=True, backend="ref")
    grads = torch.autograd.grad(ref.square().sum(), list(x.values()))
    fast = selective_scan(**x, delta_bias=bias, delta_softplus=True, backend="mambapy")
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    for g_ref, g_fast in zip(grads, torch.autograd.grad(fast.square().sum(), list(x.values())),
                             strict=True):  # fmt: skip
        torch.testing.assert_close(g_fast, g_ref, atol=1e-4, rtol=1e-4)


def test_the_scan_refuses_bad_backends_and_shapes():
    x = inputs()
    with pytest.raises(ValueError, match="backend must be one of"):
        selective_scan(**x, backend="cuda")
    try:
        import mamba_ssm  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="mamba-ssm package"):
            selective_scan(**x, backend="mamba_ssm")
    with pytest.raises(ValueError, match="A must be a tensor"):
        selective_scan(**(x | {"A": x["A"][:3]}))
    with pytest.raises(ValueError, match="C must be a tensor"):
        selective_scan(**(x | {"C": x["C"][:, :, :5]}))


@pytest.mark.parametrize("order", ["raster", "raster_t", "zigzag", "zigzag_t"])
def test_scan_orders_are_permutations_undone_by_their_inverse(order):
    perm = scan_order(3, 4, order)
    assert sorted(perm.tolist()) == list(range(12))
    tokens = torch.randn(2, 12, 5)
    scanned = tokens[:, perm]
    torch.testing.assert_close(scanned[:, inverse_order(perm)], tokens)
    if order.startswith("zigzag"):  # a continuous path: each step moves to a grid neighbour
        rows, cols = perm // 4, perm % 4
        assert ((rows.diff().abs() + cols.diff().abs()) == 1).all()
    assert scan_order(3, 4, "zigzag").tolist()[:8] == [0, 1, 2, 3, 7, 6, 5, 4]
    with pytest.raises(ValueError, match="order must be one of"):
        scan_order(3, 4, "spiral")


@pytest.mark.parametrize("backend", ["ref", "mambapy"])
def test_grouped_B_and_C_equal_one_scan_per_group(backend):
    x = inputs(channels=6, length=9)
    generator = torch.Generator().manual_seed(1)
    B2, C2 = (torch.randn(2, 2, 4, 9, generator=generator, dtype=torch.float64) for _ in range(2))
    grouped = selective_scan(**{**x, "B": B2, "C": C2}, backend=backend)
    for g, channels in enumerate((slice(0, 3), slice(3, 6))):
        part = {k: (v[:, channels] if k in ("u", "delta", "z") else v[channels])
                for k, v in x.items() if k not in ("B", "C")}  # fmt: skip
        alone = selective_scan(**part, B=B2[:, g], C=C2[:, g], backend="ref")
        torch.testing.assert_close(grouped[:, channels], alone)


def test_mamba_ssm_agrees_with_the_reference_where_it_imports():
    pytest.importorskip("mamba_ssm", reason="mamba-ssm (a CUDA extra) is not installed")
    if not torch.cuda.is_available():
        pytest.skip("mamba-ssm's kernel needs a CUDA device")
    x = {k: v.float().cuda() for k, v in inputs(length=32).items()}
    bias = torch.rand(6, device="cuda")
    fast = selective_scan(**x, delta_bias=bias, delta_softplus=True, backend="mamba_ssm")
    ref = selective_scan(**x, delta_bias=bias, delta_softplus=True, backend="ref")
    torch.testing.assert_close(fast, ref, atol=1e-4, rtol=1e-4)
