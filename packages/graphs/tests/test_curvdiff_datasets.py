"""CurvDiff graph sets: determinism, sizes and structure of every generator, graph6 I/O, checks."""

from __future__ import annotations

import networkx as nx
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import coalesce

from mixlab.graphs.curvdiff.datasets import (
    GENERATORS,
    from_networkx_graph,
    grid,
    hetero_across,
    hetero_within,
    make_graph_set,
    read_graph6,
    split,
    validate_graphs,
    write_graph6,
)
from mixlab.graphs.curvdiff.metrics import to_networkx

# name: (small options, node-count bounds they imply)
CASES = {
    "community-small": ({}, (12, 20)),
    "grid": ({"min_side": 2, "max_side": 4}, (4, 16)),
    "lobster": ({"mean_backbone": 8, "max_nodes": 40}, (10, 40)),
    "planar": ({"num_nodes": 16}, (16, 16)),
    "sbm": ({}, (16, 36)),
    "tree": ({"min_nodes": 8, "max_nodes": 12}, (8, 12)),
    "ego-synth": ({"base_nodes": 500}, (4, 18)),
    "hetero-within": ({"min_nodes": 12, "max_nodes": 20}, (12, 20)),
    "hetero-across": ({"min_nodes": 12, "max_nodes": 20}, (12, 20)),
}
CONNECTED = {"community-small", "grid", "lobster", "planar", "sbm", "tree", "ego-synth"}


def _nx(graphs):
    return [to_networkx(data) for data in graphs]


def test_every_generator_has_a_case():
    assert set(CASES) == set(GENERATORS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_generator_is_seeded_sized_and_undirected(name):
    options, (low, high) = CASES[name]
    graphs = make_graph_set(name, 12, seed=7, **options)
    again = make_graph_set(name, 12, seed=7, **options)
    other = make_graph_set(name, 12, seed=8, **options)
    assert len(graphs) == 12
    assert all(torch.equal(a.edge_index, b.edge_index) for a, b in zip(graphs, again, strict=True))
    assert any(
        a.num_nodes != b.num_nodes or not torch.equal(a.edge_index, b.edge_index)
        for a, b in zip(graphs, other, strict=True)
    )
    validate_graphs(graphs, max_nodes=high)
    for data in graphs:
        assert low <= data.num_nodes <= high
        assert data.edge_index.dtype == torch.int64
        assert data.x is None
        assert torch.equal(data.edge_index, coalesce(data.edge_index, num_nodes=data.num_nodes))
        assert nx.is_connected(to_networkx(data))


def test_generator_structure():
    assert all(nx.is_tree(g) for g in _nx(make_graph_set("tree", 8, seed=0)))
    planar_graphs = _nx(make_graph_set("planar", 8, seed=0))
    assert all(nx.check_planarity(g)[0] for g in planar_graphs)
    communities = _nx(make_graph_set("community-small", 8, seed=0))
    assert all(g.number_of_nodes() % 2 == 0 for g in communities)
    assert all(nx.transitivity(g) > 0.4 for g in communities)
    gdss = make_graph_set("community-small", 20, seed=0, gdss_seeds=True)
    assert len({d.num_nodes for d in gdss}) < 20  # sizes repeat; with GDSS seeds, so do halves


def test_grid_covers_gran_range_exactly():
    graphs = grid(100, seed=0, min_side=10, max_side=19)
    sizes = sorted(
        tuple(sorted((d.num_nodes, d.edge_index.size(1) // 2))) for d in graphs
    )  # (n, |E|) identifies an i×j grid up to transpose
    expected = sorted(
        tuple(sorted((i * j, i * (j - 1) + j * (i - 1))))
        for i in range(10, 20)
        for j in range(10, 20)
    )
    assert sizes == expected


def test_hetero_within_has_tree_cyclic_and_dense_parts():
    graphs = hetero_within(24, seed=3, with_parts=True)
    densities = []
    for data in graphs:
        g = to_networkx(data)
        assert nx.is_connected(g)
        assert 12 <= data.num_nodes <= 24
        assert min(dict(g.degree).values()) == 1  # a tree leaf survives the bridges
        assert sum(nx.triangles(g).values()) > 0  # the dense part
        assert len(nx.cycle_basis(g)) >= 2  # the cycle or grid patch, and the community
        assert data.part.shape == (data.num_nodes,)
        assert set(data.part.tolist()) == {0, 1, 2}
        tree_part = g.subgraph([v for v, p in enumerate(data.part.tolist()) if p == 0])
        assert nx.is_tree(tree_part)
        dense = g.subgraph([v for v, p in enumerate(data.part.tolist()) if p == 2])
        densities.append(nx.density(dense))
    assert 0.65 < sum(densities) / len(densities) < 0.9  # G(k, p ∈ [0.7, 0.8]), kept if connected
    with pytest.raises(ValueError, match="min_nodes"):
        hetero_within(2, seed=0, min_nodes=8)


def test_hetero_across_mixes_families():
    graphs = hetero_across(30, seed=1, with_family=True)
    families = [int(d.family) for d in graphs]
    assert sorted(families) == [0] * 10 + [1] * 10 + [2] * 10
    assert families != sorted(families)  # shuffled
    for data, family in zip(graphs, families, strict=True):
        g = to_networkx(data)
        assert nx.is_connected(g)
        assert 12 <= data.num_nodes <= 24
        if family == 0:
            assert nx.is_tree(g)
        elif family == 1:
            assert nx.is_bipartite(g)
            assert max(dict(g.degree).values()) <= 4
            assert not nx.is_tree(g)
        else:
            assert nx.transitivity(g) > 0.4


def test_networkx_round_trip_keeps_isolated_nodes():
    g = nx.Graph([("a", "b"), ("b", "c")])
    g.add_node("z")
    data = from_networkx_graph(g)
    assert data.num_nodes == 4
    assert data.edge_index.tolist() == [[0, 1, 1, 2], [1, 0, 2, 1]]
    back = to_networkx(data)
    assert sorted(back.nodes) == [0, 1, 2, 3]
    assert sorted(back.edges) == [(0, 1), (1, 2)]


def test_graph6_round_trip(tmp_path):
    graphs = [*make_graph_set("hetero-within", 6, seed=0), from_networkx_graph(nx.empty_graph(3))]
    path = tmp_path / "graphs.g6"
    write_graph6(graphs, path)
    back = read_graph6(path)
    assert len(back) == len(graphs)
    for a, b in zip(graphs, back, strict=True):
        assert a.num_nodes == b.num_nodes
        assert torch.equal(a.edge_index, b.edge_index)


def test_graph6_header_and_blank_lines(tmp_path):
    path = tmp_path / "graphs.g6"
    path.write_text(">>graph6<<A_\n\nBw\n   \n")
    graphs = read_graph6(path)
    assert [(d.num_nodes, d.edge_index.size(1)) for d in graphs] == [(2, 2), (3, 6)]


def test_graph6_bad_line_names_path_and_line(tmp_path):
    path = tmp_path / "bad.g6"
    path.write_text("A_\n\n!!!\n")
    with pytest.raises(ValueError, match=r"bad\.g6: line 3"):
        read_graph6(path)


def _raw(edges, num_nodes):
    return Data(edge_index=torch.tensor(edges, dtype=torch.long).t(), num_nodes=num_nodes)


GOOD = _raw([(0, 1), (1, 0)], 2)


@pytest.mark.parametrize(
    ("graphs", "max_nodes", "message"),
    [
        ([], None, "non-empty"),
        ([GOOD, _raw([(0, 1), (1, 0), (1, 1)], 2)], None, "graph 1 with a self-loop"),
        ([GOOD, _raw([(0, 1), (1, 2), (2, 1)], 3)], None, "graph 1 with a directed"),
        ([GOOD, _raw([(0, 1), (1, 0)], 5)], 4, "graph 1 with 5 nodes"),
        (
            [GOOD, Data(edge_index=torch.zeros(2, 0, dtype=torch.long), num_nodes=0)],
            None,
            "0 nodes",
        ),
        ([GOOD, _raw([(0, 3), (3, 0)], 2)], None, "graph 1 with an edge to a node outside"),
    ],
    ids=["empty", "self-loop", "directed", "too-large", "no-nodes", "out-of-range"],
)
def test_validate_graphs_errors(graphs, max_nodes, message):
    with pytest.raises(ValueError, match="^graphs must be") as error:
        validate_graphs(graphs, max_nodes=max_nodes)
    assert message in str(error.value)


def test_validate_graphs_accepts_good_sets():
    graphs = (GOOD, _raw([(0, 1), (1, 0)], 3))  # a tuple; an isolated node is fine
    assert validate_graphs(graphs, max_nodes=3) == list(graphs)


def test_unknown_generator_lists_the_names():
    with pytest.raises(ValueError, match="name must be one of") as error:
        make_graph_set("ego-small", 4, seed=0)
    assert all(name in str(error.value) for name in GENERATORS)


def test_split_is_seeded_and_disjoint():
    graphs = hetero_across(10, seed=0)
    train, test = split(graphs, 0.2, seed=4)
    assert (len(train), len(test)) == (8, 2)
    again = split(graphs, 0.2, seed=4)
    assert [id(g) for g in again[1]] == [id(g) for g in test]
    assert {id(g) for g in train} | {id(g) for g in test} == {id(g) for g in graphs}
    assert [id(g) for g in split(graphs, 0.2, seed=5)[0]] != [id(g) for g in train]
    with pytest.raises(ValueError, match="test_fraction"):
        split(graphs, 1.0, seed=0)
