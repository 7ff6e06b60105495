"""The FlatNSD benchmark's NSD reference (``nsd_authors``): it computes general NSD exactly, it
never materialises the (N·d)² Laplacian or its gradient, and its worker runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mixlab.graphs.flatnsd import sheaf_laplacian

BENCHMARK = Path(__file__).parents[3] / "benchmarks" / "flatnsd.py"


@pytest.fixture(scope="module")
def bench():
    """benchmarks/flatnsd.py as a module (benchmarks/ is not a package); registered in
    sys.modules, where PyG's MessagePassing looks up the module of every conv class."""
    spec = importlib.util.spec_from_file_location("flatnsd_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def randomised(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter drawn at random: at initialisation W_left = I and ε = 0, which would let
    a wrong operator agree on those parts."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    return model


def nsd_pair(bench, nodes: int, edges: int):
    """``nsd_general`` and ``nsd_authors`` in float64 with the same parameters, and the graph."""
    with torch.random.fork_rng():
        x, edge_index, y = bench.random_graph(nodes, edges)
        general = randomised(bench.build("nsd_general", edge_index, nodes).double(), seed=1)
        authors = bench.build("nsd_authors", edge_index, nodes).double()
    authors.load_state_dict(general.state_dict())
    return general, authors, x.double(), edge_index, y


def gradients(model: torch.nn.Module, x, edge_index, y) -> tuple[torch.Tensor, dict]:
    logits = model(x, edge_index)
    torch.nn.functional.cross_entropy(logits, y).backward()
    return logits, {name: p.grad for name, p in model.named_parameters()}


def test_nsd_authors_computes_general_nsd(bench):
    general, authors, x, edge_index, y = nsd_pair(bench, nodes=60, edges=300)
    expected_logits, expected_grads = gradients(general, x, edge_index, y)
    logits, grads = gradients(authors, x, edge_index, y)
    torch.testing.assert_close(logits, expected_logits, rtol=1e-10, atol=1e-12)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-9, atol=1e-12, msg=name)


def test_nsd_authors_values_are_the_normalised_sheaf_laplacian(bench):
    _, authors, x, edge_index, _ = nsd_pair(bench, nodes=40, edges=160)
    conv = authors.convs[0]
    h = torch.randn(x.size(0), conv.in_channels, dtype=torch.float64)
    weight = torch.ones(edge_index.size(1), dtype=torch.float64)
    values = conv.laplacian_values(h, edge_index, weight)
    size = x.size(0) * conv.stalk_dim
    ours = torch.zeros(size, size, dtype=torch.float64).index_put_(
        (conv.rows, conv.cols), values, accumulate=True
    )
    library = sheaf_laplacian(
        edge_index, edge_maps=conv.sheaf(h, edge_index), normalization="augmented"
    )
    torch.testing.assert_close(ours, library.to_dense())
    with pytest.raises(ValueError, match="graph it was built with"):
        conv(h, edge_index.flip(1))  # same edges, another order: the index no longer matches


class LargestDenseTensor(TorchDispatchMode):
    """Records the largest strided (dense) tensor any op makes, forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.layout == torch.strided:
                self.numel = max(self.numel, tensor.numel())
        return out


def test_nsd_authors_never_makes_a_dense_laplacian_or_gradient(bench):
    nodes, edges = 300, 1000
    _, authors, x, edge_index, y = nsd_pair(bench, nodes, edges)
    dense_size = (nodes * bench.STALK) ** 2
    with LargestDenseTensor() as largest:
        gradients(authors, x, edge_index, y)
    assert largest.numel < dense_size / 2

    # the check can fail: torch.sparse.mm's backward makes the dense (N·d)² gradient
    conv = authors.convs[0]
    values = torch.randn(conv.rows.numel(), dtype=torch.float64, requires_grad=True)
    stalks = torch.randn(nodes * bench.STALK, 4, dtype=torch.float64)
    with LargestDenseTensor() as largest:
        matrix = torch.sparse_coo_tensor(
            torch.stack([conv.rows, conv.cols]),
            values,
            (nodes * bench.STALK,) * 2,
            check_invariants=False,
        ).coalesce()
        torch.sparse.mm(matrix, stalks).sum().backward()
    assert largest.numel == dense_size


@pytest.mark.parametrize("system", ["nsd_authors", "flatnsd"])
def test_worker_runs_at_a_tiny_size(bench, system):
    with torch.random.fork_rng():
        row = bench.worker(system, nodes=200, edges=1000)
    torch.set_flush_denormal(False)  # the worker sets it for its own process
    assert row.keys() == {"epoch_s", "peak_mb", "edges", "parameters"}
    assert row["edges"] == 1000
    assert row["epoch_s"] > 0
    assert row["peak_mb"] >= 0
    assert row["parameters"] > 0
