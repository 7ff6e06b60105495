"""CurvDiff curvature: Ollivier–Ricci and Forman against hand values and the spec's sanity values,
node means, the descriptor c(G) and the transform."""

from __future__ import annotations

import networkx as nx
import numpy as np
import ot
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import from_networkx

from mixlab.graphs.curvdiff.curvature import (
    DESCRIPTOR_DIM,
    AddRicciCurvature,
    curvature_descriptor,
    curvature_table,
    forman_curvature,
    node_curvature,
    ollivier_ricci,
)


def _graph(g: nx.Graph) -> Data:
    return Data(edge_index=from_networkx(g).edge_index, num_nodes=g.number_of_nodes())


def _paw() -> Data:
    """A triangle 0-1-2 with a pendant edge 2-3."""
    return _graph(nx.Graph([(0, 1), (0, 2), (1, 2), (2, 3)]))


def _value(data: Data, values: torch.Tensor, u: int, v: int) -> float:
    mask = (data.edge_index[0] == u) & (data.edge_index[1] == v)
    assert int(mask.sum()) == 1
    return float(values[mask])


def _orc_by_definition(g: nx.Graph, u: int, v: int, alpha: float = 0.5) -> float:
    """κ(u,v) from the definition, on the union support of m_u and m_v (spec §1a)."""
    dist = dict(nx.all_pairs_shortest_path_length(g))

    def walk(x):
        m = {x: alpha}
        for w in g[x]:
            m[w] = m.get(w, 0.0) + (1 - alpha) / g.degree(x)
        return m

    mu, mv = walk(u), walk(v)
    support = sorted(set(mu) | set(mv))
    a = np.array([mu.get(x, 0.0) for x in support])
    b = np.array([mv.get(x, 0.0) for x in support])
    cost = np.array([[dist[x][y] for y in support] for x in support], dtype=float)
    return 1.0 - ot.emd2(a, b, cost) / dist[u][v]


@pytest.mark.parametrize(
    ("graph", "expected"),
    [(nx.complete_graph(8), 0.571), (nx.grid_2d_graph(10, 10), 0.022)],
    ids=["K8", "grid10x10"],
)
def test_ollivier_ricci_spec_sanity_values(graph, expected):
    data = _graph(graph)
    kappa = ollivier_ricci(data.edge_index, data.num_nodes)
    assert kappa.shape == (data.edge_index.size(1),)
    assert float(kappa.mean()) == pytest.approx(expected, abs=1e-3)


def test_ollivier_ricci_hand_values():
    # 0-1 as in K3: move 1/4 from u to v at cost 1 → κ = 3/4. 0-2: 1/4 moves 1 hop and 1/6
    # moves 2 hops (to node 3) → W₁ = 7/12. Pendant edge to a degree-d node: κ = 1/d.
    data = _paw()
    kappa = ollivier_ricci(data.edge_index, data.num_nodes)
    assert _value(data, kappa, 0, 1) == pytest.approx(3 / 4, abs=1e-6)
    assert _value(data, kappa, 0, 2) == pytest.approx(5 / 12, abs=1e-6)
    assert _value(data, kappa, 2, 3) == pytest.approx(1 / 3, abs=1e-6)
    k3 = _graph(nx.complete_graph(3))
    assert torch.allclose(ollivier_ricci(k3.edge_index, 3), torch.full((6,), 0.75))


def test_ollivier_ricci_matches_definition_on_union_support():
    g = nx.gnp_random_graph(14, 0.3, seed=3)
    data = _graph(g)
    kappa = ollivier_ricci(data.edge_index, data.num_nodes)
    for u, v in g.edges:
        assert _value(data, kappa, u, v) == pytest.approx(_orc_by_definition(g, u, v), abs=1e-5)
    alpha = 0.2
    kappa = ollivier_ricci(data.edge_index, data.num_nodes, alpha=alpha)
    u, v = next(iter(g.edges))
    assert _value(data, kappa, u, v) == pytest.approx(_orc_by_definition(g, u, v, alpha), abs=1e-5)


def test_per_edge_values_are_symmetric():
    data = _graph(nx.powerlaw_cluster_graph(30, 2, 0.3, seed=1))
    row, col = data.edge_index
    for values in (
        ollivier_ricci(data.edge_index, data.num_nodes),
        forman_curvature(data.edge_index, data.num_nodes),
    ):
        lookup = {(int(u), int(v)): float(x) for u, v, x in zip(row, col, values, strict=True)}
        assert all(lookup[(v, u)] == x for (u, v), x in lookup.items())


def test_disconnected_graph_and_isolated_node():
    g = nx.disjoint_union(nx.complete_graph(3), nx.complete_graph(3))
    g.add_node(6)
    data = _graph(g)
    kappa = ollivier_ricci(data.edge_index, data.num_nodes)
    assert torch.allclose(kappa, torch.full((12,), 0.75))
    nodes = node_curvature(data.edge_index, data.num_nodes, kappa)
    assert nodes.shape == (7,)
    assert float(nodes[6]) == 0.0


def test_forman_closed_form_on_triangle_with_pendant():
    # degrees 2, 2, 3, 1; one triangle on 0-1, 0-2, 1-2
    data = _paw()
    forman = forman_curvature(data.edge_index, data.num_nodes)
    expected = {(0, 1): 4 - 2 - 2 + 3, (0, 2): 4 - 2 - 3 + 3, (1, 2): 4 - 2 - 3 + 3, (2, 3): 0}
    for (u, v), value in expected.items():
        assert _value(data, forman, u, v) == value
        assert _value(data, forman, v, u) == value


def test_node_curvature_is_incident_mean():
    data = _paw()
    forman = forman_curvature(data.edge_index, data.num_nodes)
    nodes = node_curvature(data.edge_index, data.num_nodes, forman)
    assert nodes.tolist() == pytest.approx([(3 + 2) / 2, (3 + 2) / 2, (2 + 2 + 0) / 3, 0.0])


def test_descriptor_shape_and_histogram():
    data = _graph(nx.grid_2d_graph(4, 5))
    orc = ollivier_ricci(data.edge_index, data.num_nodes)
    forman = forman_curvature(data.edge_index, data.num_nodes)
    c = curvature_descriptor(data.edge_index, data.num_nodes, orc, forman)
    assert c.shape == (1, DESCRIPTOR_DIM) == (1, 15)
    assert c.dtype == torch.float32
    assert float(c[0, :10].sum()) == pytest.approx(1.0)
    assert float(c[0, 10]) == pytest.approx(float(orc.mean()), abs=1e-6)
    assert float(c[0, 11]) == pytest.approx(float(orc.std(unbiased=False)), abs=1e-6)
    assert float(c[0, 12]) == pytest.approx(float(forman.mean()) / (2 * 4), abs=1e-6)
    assert c[0, 13:].tolist() == pytest.approx([20.0, 31 / 20])
    k3 = _graph(nx.complete_graph(3))  # κ = 0.75 falls in bin 8 of 10 on [−1, 1]
    c3 = curvature_descriptor(k3.edge_index, 3, torch.full((6,), 0.75), torch.ones(6))
    assert c3[0, :10].tolist() == [0.0] * 8 + [1.0, 0.0]


def test_descriptor_without_edges():
    empty = torch.zeros(2, 0, dtype=torch.long)
    c = curvature_descriptor(empty, 5, torch.zeros(0), torch.zeros(0))
    assert c[0, :13].abs().sum() == 0
    assert c[0, 13:].tolist() == [5.0, 0.0]


def test_transform_adds_attributes():
    data = _graph(nx.powerlaw_cluster_graph(20, 2, 0.3, seed=0))
    n, e = data.num_nodes, data.edge_index.size(1)
    transform = AddRicciCurvature(alpha=0.5)
    out = transform(data.clone())
    shapes = {
        "edge_curvature": (e,),
        "edge_forman": (e,),
        "node_curvature": (n,),
        "node_forman": (n,),
        "curvature_descriptor": (1, 15),
    }
    for name, shape in shapes.items():
        assert out[name].shape == shape, name
        assert out[name].dtype == torch.float32, name
    assert torch.equal(out.edge_index, data.edge_index)
    assert "alpha=0.5" in repr(transform)
    with pytest.raises(ValueError, match="alpha"):
        AddRicciCurvature(alpha=1.0)


def test_curvature_table_rows():
    graphs = [_paw(), _graph(nx.complete_graph(4))]
    rows = curvature_table(graphs)
    assert len(rows) == 4 + 6
    assert all(row["u"] < row["v"] for row in rows)
    assert [row["graph"] for row in rows] == [0] * 4 + [1] * 6
    pendant = next(r for r in rows if r["graph"] == 0 and (r["u"], r["v"]) == (2, 3))
    assert pendant["ollivier_ricci"] == pytest.approx(1 / 3, abs=1e-6)
    assert pendant["forman"] == 0


@pytest.mark.parametrize("curvature", [ollivier_ricci, forman_curvature])
def test_an_edge_index_outside_the_nodes_is_refused_by_name(curvature):
    """Issue 80: an index past num_nodes wrapped into another pair's key and gave values."""
    with pytest.raises(ValueError, match=r"edge_index must be node indices in \[0, num_nodes=3\)"):
        curvature(torch.tensor([[0, 1, 5], [1, 0, 1]]), 3)
    with pytest.raises(ValueError, match="edge_index must be node indices"):
        curvature(torch.tensor([[0, -1], [1, 0]]), 3)
    with pytest.raises(ValueError, match=r"edge_index must be a \[2, E\] tensor"):
        curvature(torch.tensor([0, 1, 1, 0]), 3)
