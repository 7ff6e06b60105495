"""PyTorch Geometric's contract for FlatNSD's layer (issue 17): :class:`FlatNSDConv` used the way a
PyG user uses ``GCNConv``.

- ``torch.autograd.gradcheck`` in float64 with respect to x, the edge weights and every parameter.
- A ``Batch`` of graphs gives each graph its own output (no message crosses graphs).
- ``conv(x, edge_index, edge_weight)`` positionally; weight 1 everywhere is no weight, weight 0 on
  an edge is the graph without it.
- int32 ``edge_index`` gives the int64 output; self-loops (``T.AddSelfLoops``) are dropped unless
  ``remove_self_loops=False``; bipartite input and sparse adjacency (``adj_t``) get a ValueError
  that says so.
- ``repr`` in PyG's style (``GATConv(16, 32, heads=2)``): widths, channels, stalk_dim, maps, update.
- ``torch.compile(conv, fullgraph=True)`` traces without a graph break and matches eager mode.

Each test fails if the fix it stands for is reverted.
"""

import pytest
import torch
import torch_geometric.transforms as T
from torch.func import functional_call
from torch_geometric.data import Batch, Data
from torch_geometric.utils import remove_self_loops, to_torch_coo_tensor, to_undirected

from mixlab.graphs.flatnsd import FlatNSDConv, SheafDiffusionNet, check_edge_index

STALK, CHANNELS = 2, 2
WIDTH = STALK * CHANNELS


def undirected(*pairs: tuple[int, int]) -> torch.Tensor:
    return to_undirected(torch.tensor(pairs).T)


def tiny_graph(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A triangle with a tail (5 nodes, 5 edges) and float64 features."""
    edge_index = undirected((0, 1), (1, 2), (2, 0), (2, 3), (3, 4))
    x = torch.randn(5, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return x, edge_index


def edge(edge_index: torch.Tensor, u: int, v: int) -> torch.Tensor:
    """Mask [E] of the undirected edge {u, v} (both directions)."""
    source, target = edge_index
    return ((source == u) & (target == v)) | ((source == v) & (target == u))


def symmetric_weight(edge_index: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Random weights in [0.5, 1.5), equal on both directions of every edge."""
    weight = torch.rand(edge_index.size(1), generator=torch.Generator().manual_seed(seed)) + 0.5
    reverse = check_edge_index(edge_index, int(edge_index.max()) + 1)
    return ((weight + weight[reverse]) / 2).double()


def conv(**options) -> FlatNSDConv:
    torch.manual_seed(0)
    return FlatNSDConv(CHANNELS, STALK, **options).double()


VARIANTS = [{}, {"maps": "general", "update": "heat"}]


@pytest.mark.parametrize("options", VARIANTS, ids=["orthogonal-discrete", "general-heat"])
def test_gradcheck_wrt_x_edge_weight_and_parameters(options):
    layer = conv(**options)
    x, edge_index = tiny_graph()
    reverse = layer.check_edges(edge_index, x.size(0))
    names = [name for name, _ in layer.named_parameters()]
    weight = symmetric_weight(edge_index)

    def run(x, weight, *parameters):
        symmetric = (weight + weight[reverse]) / 2  # gradcheck nudges one direction at a time
        state = dict(zip(names, parameters, strict=True))
        return functional_call(layer, state, (x, edge_index, symmetric))

    inputs = [x, weight, *(p.detach().clone() for p in layer.parameters())]
    inputs = [tensor.requires_grad_() for tensor in inputs]
    assert torch.autograd.gradcheck(run, inputs)


@pytest.mark.parametrize("update", ["discrete", "heat"])
def test_a_batch_gives_every_graph_its_own_output(update):
    graphs = [
        Data(x=tiny_graph(seed)[0][:size], edge_index=edges)
        for seed, (size, edges) in enumerate(
            [
                (5, tiny_graph()[1]),
                (3, undirected((0, 1), (1, 2))),
                (4, undirected((0, 1), (1, 2), (2, 3), (3, 0))),
            ]
        )
    ]
    batch = Batch.from_data_list(graphs)
    layer = conv(update=update)
    alone = torch.cat([layer(g.x, g.edge_index) for g in graphs])
    torch.testing.assert_close(layer(batch.x, batch.edge_index), alone)


def test_edge_weight_is_the_third_positional_argument_and_scales_messages():
    layer = conv()
    x, edge_index = tiny_graph()
    torch.testing.assert_close(
        layer(x, edge_index, torch.ones(edge_index.size(1), dtype=torch.float64)),
        layer(x, edge_index),
        rtol=0,
        atol=0,
    )
    doubled = 1.0 + edge(edge_index, 2, 3).double()
    assert not torch.allclose(layer(x, edge_index, doubled), layer(x, edge_index))


@pytest.mark.parametrize("options", [{}, {"edge_weights": False}, {"update": "heat"}])
def test_weight_zero_on_an_edge_is_the_graph_without_it(options):
    layer = conv(**options)
    x, edge_index = tiny_graph()
    cut = edge(edge_index, 0, 1)
    weight = (~cut).double()
    torch.testing.assert_close(layer(x, edge_index, weight), layer(x, edge_index[:, ~cut]))


@pytest.mark.parametrize(
    ("weight", "match"),
    [
        (torch.ones(3), r"edge_weight must have shape \(10,\)"),
        (-torch.ones(10), "edge_weight must be non-negative"),
        (torch.arange(10.0), "edge_weight must be .* equal on both directions"),
    ],
)
def test_bad_edge_weight_is_named(weight, match):
    x, edge_index = tiny_graph()
    with pytest.raises(ValueError, match=match):
        conv()(x, edge_index, weight.double())


def test_int32_edge_index_gives_the_int64_output():
    """16 features: from there on torch's scatter_add_ refuses an int32 index."""
    torch.manual_seed(0)
    layer = FlatNSDConv(8, 2).double()
    x, edge_index = tiny_graph()
    x = x.repeat(1, 4)  # [5, 16]
    torch.testing.assert_close(layer(x, edge_index.int()), layer(x, edge_index))
    model = SheafDiffusionNet(16, 3, stalk_dim=2, channels=8).double()
    torch.testing.assert_close(model(x, edge_index.int()), model(x, edge_index))


def test_self_loops_are_dropped_so_add_self_loops_pipelines_work():
    layer = conv()
    x, edge_index = tiny_graph()
    weight = symmetric_weight(edge_index)
    data = T.AddSelfLoops(fill_value=3.0)(Data(x=x, edge_index=edge_index, edge_weight=weight))
    assert data.has_self_loops()
    torch.testing.assert_close(
        layer(data.x, data.edge_index, data.edge_weight), layer(x, edge_index, weight)
    )
    without = remove_self_loops(data.edge_index)[0]
    torch.testing.assert_close(layer(x, data.edge_index), layer(x, without))


def test_self_loops_are_refused_when_not_removed():
    x, edge_index = tiny_graph()
    with_loops = T.AddSelfLoops()(Data(x=x, edge_index=edge_index)).edge_index
    with pytest.raises(ValueError, match="self-loops"):
        conv(remove_self_loops=False)(x, with_loops)
    with pytest.raises(ValueError, match="remove_self_loops must be True or False"):
        conv(remove_self_loops="yes")


def test_bipartite_input_is_refused_by_name():
    x, edge_index = tiny_graph()
    with pytest.raises(ValueError, match="x must be one .*bipartite graphs .* not supported"):
        conv()((x, x[:3]), edge_index)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_adjacency_is_refused_by_name(layout):
    x, edge_index = tiny_graph()
    adj = to_torch_coo_tensor(edge_index, size=x.size(0))
    adj_t = adj if layout == "coo" else adj.to_sparse_csr()
    with pytest.raises(ValueError, match="SparseTensor or sparse adjacency .* not supported"):
        conv()(x, adj_t)


def test_repr_shows_widths_and_options():
    assert repr(FlatNSDConv(8, 2)) == (
        "FlatNSDConv(16, 16, channels=8, stalk_dim=2, maps='orthogonal', update='discrete')"
    )
    assert repr(FlatNSDConv(4, 3, maps="general", update="heat")) == (
        "FlatNSDConv(12, 12, channels=4, stalk_dim=3, maps='general', update='heat')"
    )
    model = SheafDiffusionNet(3, 2, stalk_dim=2, channels=8)
    assert "FlatNSDConv(16, 16, channels=8, stalk_dim=2" in repr(model)  # not hidden


def test_fullgraph_compile_matches_eager():
    """Dynamo with ``fullgraph=True`` fails on any graph break (a Python int or bool read from a
    tensor). ``backend="eager"`` runs the captured graph without code generation: 5-7 s here,
    where inductor took 150 s and ``aot_eager`` 20 s on 2 busy cores."""
    torch._dynamo.reset()
    layer = conv()
    x, edge_index = tiny_graph()
    weight = symmetric_weight(edge_index)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    x_compiled = x.clone().requires_grad_()
    out = compiled(x_compiled, edge_index, weight)
    out.square().sum().backward()
    x_eager = x.clone().requires_grad_()
    expected = layer(x_eager, edge_index, weight)
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x_compiled.grad, x_eager.grad)
