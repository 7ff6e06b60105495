"""FlatNSD: sheaf Laplacians, resistance, layers, tasks, experiment and CLI."""

from __future__ import annotations

import json
import math

import networkx as nx
import pytest
import torch
from flatnsd_graphs import generator, graph
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.data import Data

from mixlab.graphs.cli import main as graphs_main
from mixlab.graphs.flatnsd import (
    AddSheafResistance,
    FlatNSDConv,
    MessagePassingNet,
    NSDConv,
    SheafDiffusionNet,
    check_disjoint,
    check_edge_index,
    diffusion_sensitivity,
    jacobian_sensitivity,
    learned_sheaf_statistics,
    load_trained,
    ring_transfer,
    sheaf_effective_resistance,
    sheaf_laplacian,
    split_graphs,
    total_sheaf_resistance,
    train_readout,
    tree_neighbors_match,
)
from mixlab.graphs.flatnsd.experiment import METHOD, Config
from mixlab.graphs.flatnsd.experiment import run as run_experiment
from mixlab.graphs.flatnsd.layers import SHEAVES, make_sheaf_conv
from mixlab.graphs.flatnsd.theory import check_graph, random_invertible, random_orthogonal

D = 3


def networkx_resistance(g: nx.Graph, u: int, v: int) -> float:
    return 0.0 if u == v else nx.resistance_distance(g, u, v)


# --- the sheaf Laplacian -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["flat", "flat_general", "diag", "bundle", "general"])
def test_laplacian_is_symmetric_psd(kind):
    edge_index, n = graph(nx.barbell_graph(4, 2))
    g = generator()
    if kind.startswith("flat"):
        maps = random_orthogonal(n, D, g) if kind == "flat" else random_invertible(n, D, g)
        laplacian = sheaf_laplacian(edge_index, node_maps=maps)
    else:
        edge_maps = {
            "diag": torch.randn(edge_index.size(1), D, generator=g, dtype=torch.float64),
            "bundle": random_orthogonal(edge_index.size(1), D, g),
            "general": torch.randn(edge_index.size(1), D, D, generator=g, dtype=torch.float64),
        }[kind]
        laplacian = sheaf_laplacian(edge_index, edge_maps=edge_maps)
    dense = laplacian.to_dense()
    assert dense.shape == (n * D, n * D)
    torch.testing.assert_close(dense, dense.T)
    assert torch.linalg.eigvalsh(dense).min() > -1e-9


def test_flat_bundle_kernel_is_the_transported_constants():
    """A connected flat O(d)-bundle has exactly d global sections: x_v = O_vᵀ c."""
    edge_index, n = graph(nx.cycle_graph(7))
    maps = random_orthogonal(n, D, generator())
    dense = sheaf_laplacian(edge_index, node_maps=maps).to_dense()
    values = torch.linalg.eigvalsh(dense)
    assert int((values < 1e-9).sum()) == D
    sections = maps.transpose(-1, -2).reshape(n * D, D)  # column i: O_vᵀ e_i stacked over v
    assert float((dense @ sections).abs().max()) < 1e-10


def test_non_flat_bundle_on_a_cycle_loses_its_sections():
    """Per-edge rotations around a cycle have holonomy: no global section survives."""
    edge_index, _ = graph(nx.cycle_graph(7))
    edge_maps = random_orthogonal(edge_index.size(1), D, generator(1))
    values = torch.linalg.eigvalsh(sheaf_laplacian(edge_index, edge_maps=edge_maps).to_dense())
    assert int((values < 1e-9).sum()) < D


def test_identity_maps_give_the_kronecker_graph_laplacian():
    g = nx.petersen_graph()
    edge_index, n = graph(g)
    eye = torch.eye(D, dtype=torch.float64).expand(n, D, D)
    expected = torch.kron(
        torch.as_tensor(nx.laplacian_matrix(g, nodelist=range(n)).toarray(), dtype=torch.float64),
        torch.eye(D, dtype=torch.float64),
    )
    torch.testing.assert_close(sheaf_laplacian(edge_index, node_maps=eye).to_dense(), expected)
    edge_eye = torch.ones(edge_index.size(1), D, dtype=torch.float64)  # diagonal identity maps
    torch.testing.assert_close(sheaf_laplacian(edge_index, edge_maps=edge_eye).to_dense(), expected)


def test_augmented_normalisation_matches_its_definition():
    edge_index, n = graph(nx.barbell_graph(4, 1))
    edge_maps = torch.randn(edge_index.size(1), D, D, generator=generator(), dtype=torch.float64)
    laplacian = sheaf_laplacian(edge_index, edge_maps=edge_maps).to_dense()
    blocks = laplacian.view(n, D, n, D).permute(0, 2, 1, 3)
    diagonal = torch.block_diag(
        *[blocks[i, i] + torch.eye(D, dtype=torch.float64) for i in range(n)]
    )
    values, vectors = torch.linalg.eigh(diagonal)
    scale = vectors @ torch.diag(values.rsqrt()) @ vectors.T
    normalised = sheaf_laplacian(edge_index, edge_maps=edge_maps, normalization="augmented")
    torch.testing.assert_close(normalised.to_dense(), scale @ laplacian @ scale)


# --- effective resistance ------------------------------------------------------------------


@pytest.mark.parametrize(
    "g",
    [nx.cycle_graph(9), nx.barbell_graph(4, 2), nx.balanced_tree(2, 3), nx.grid_2d_graph(3, 4)],
    ids=["ring", "barbell", "tree", "grid"],
)
def test_graph_resistance_matches_networkx(g):
    g = nx.convert_node_labels_to_integers(g)
    edge_index, n = graph(g)
    resistance = sheaf_effective_resistance(edge_index, num_nodes=n)[:, 0, 0]
    expected = [networkx_resistance(g, int(u), int(v)) for v, u in edge_index.T.tolist()]
    torch.testing.assert_close(resistance, torch.tensor(expected, dtype=torch.float64))
    total = sum(networkx_resistance(g, u, v) for u in g for v in g if u < v)
    assert math.isclose(float(total_sheaf_resistance(edge_index, num_nodes=n)), total, rel_tol=1e-9)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), d=st.integers(1, 4))
def test_flat_bundles_leave_resistance_unchanged(seed, d):
    """R^F_uv = R_uv·I for orthogonal and general invertible flat bundles, for all node pairs."""
    g = nx.barbell_graph(4, 2)
    edge_index, n = graph(g)
    pairs = torch.cartesian_prod(torch.arange(n), torch.arange(n)).T
    expected = torch.tensor(
        [networkx_resistance(g, int(u), int(v)) for u, v in pairs.T.tolist()], dtype=torch.float64
    )[:, None, None] * torch.eye(d, dtype=torch.float64)
    for maps in (
        random_orthogonal(n, d, generator(seed)),
        random_invertible(n, d, generator(seed)),
    ):
        resistance = sheaf_effective_resistance(edge_index, node_maps=maps, pairs=pairs)
        torch.testing.assert_close(resistance, expected, atol=1e-7, rtol=1e-7)
        total = total_sheaf_resistance(edge_index, node_maps=maps)
        assert math.isclose(float(total), d * float(expected[:, 0, 0].sum()) / 2, rel_tol=1e-7)


def test_edge_weights_and_non_flat_maps_move_resistance():
    edge_index, n = graph(nx.cycle_graph(6))
    base = sheaf_effective_resistance(edge_index, num_nodes=n)[:, 0, 0]
    doubled = sheaf_effective_resistance(
        edge_index,
        num_nodes=n,
        edge_weight=torch.full((edge_index.size(1),), 2.0, dtype=torch.float64),
    )[:, 0, 0]
    torch.testing.assert_close(doubled, base / 2)  # Rayleigh: R scales as 1/w
    edge_maps = random_orthogonal(edge_index.size(1), D, generator(3))
    moved = sheaf_effective_resistance(edge_index, edge_maps=edge_maps)
    assert float((moved - base[:, None, None] * torch.eye(D)).abs().max()) > 1e-3
    # Foster's theorem for sheaves: Σ_e tr R_e = rank L_F (each edge is listed twice).
    rank = torch.linalg.matrix_rank(sheaf_laplacian(edge_index, edge_maps=edge_maps).to_dense())
    assert math.isclose(float(torch.einsum("epp->", moved)) / 2, int(rank), rel_tol=1e-8)


def test_disconnected_graphs_sum_within_components():
    g = nx.disjoint_union(nx.cycle_graph(4), nx.path_graph(3))
    edge_index, n = graph(g)
    pairs = torch.tensor([[0, 0, 4], [2, 5, 6]])
    resistance = sheaf_effective_resistance(edge_index, num_nodes=n, pairs=pairs)[:, 0, 0]
    assert resistance[1] == math.inf
    torch.testing.assert_close(resistance[[0, 2]], torch.tensor([1.0, 2.0], dtype=torch.float64))
    parts = [g.subgraph(c) for c in nx.connected_components(g)]
    within = sum(networkx_resistance(p, u, v) for p in parts for u in p for v in p if u < v)
    assert math.isclose(float(total_sheaf_resistance(edge_index, num_nodes=n)), within)


def test_empty_stalks_are_rejected():
    edge_index, n = graph(nx.cycle_graph(4))
    with pytest.raises(ValueError, match="d >= 1"):
        sheaf_laplacian(edge_index, node_maps=torch.zeros(n, 0, 0))
    with pytest.raises(ValueError, match="d >= 1"):
        sheaf_laplacian(edge_index, edge_maps=torch.zeros(edge_index.size(1), 0))


def test_pairs_need_a_flat_bundle():
    edge_index, _ = graph(nx.cycle_graph(5))
    edge_maps = torch.ones(edge_index.size(1), 2)
    with pytest.raises(ValueError, match="flat bundle"):
        sheaf_effective_resistance(edge_index, edge_maps=edge_maps, pairs=torch.tensor([[0], [2]]))


# --- sensitivity ---------------------------------------------------------------------------


def test_jacobian_sensitivity_of_linear_diffusion_is_diffusion_sensitivity():
    edge_index, n = graph(nx.path_graph(5))
    laplacian = sheaf_laplacian(edge_index, num_nodes=n, node_maps=torch.ones(n, 1, 1)).to_dense()
    alpha, steps = 0.25, 4
    step = torch.eye(n, dtype=torch.float64) - alpha * laplacian.double()
    operator = sum(torch.linalg.matrix_power(step, k) for k in range(steps))
    jacobian = jacobian_sensitivity(lambda x: operator @ x, torch.randn(n, 1, dtype=torch.float64))
    torch.testing.assert_close(jacobian, diffusion_sensitivity(laplacian, n, steps, alpha))


def test_resistance_and_sensitivity_are_strongly_anti_correlated_on_a_ring():
    checks = check_graph(nx.cycle_graph(10), stalk_dim=2)
    assert checks["spearman_linear"] < -0.9
    assert checks["orthogonal_flat_deviation"] < 1e-9


# --- layers --------------------------------------------------------------------------------


def _conv(sheaf: str, update: str = "discrete") -> torch.nn.Module:
    torch.manual_seed(0)
    return make_sheaf_conv(sheaf, 4, 2, update=update).double()


@pytest.mark.parametrize("update", ["discrete", "heat"])
@pytest.mark.parametrize("sheaf", SHEAVES)
def test_layer_operator_is_the_normalised_sheaf_laplacian(sheaf, update):
    edge_index, n = graph(nx.barbell_graph(4, 1))
    conv = _conv(sheaf, update)
    x = torch.randn(n, 8, dtype=torch.float64)
    reverse = check_edge_index(edge_index, n)
    maps = conv.sheaf(x, edge_index)
    if isinstance(conv, FlatNSDConv):
        node_maps, weight = maps
        dense = sheaf_laplacian(
            edge_index, node_maps=node_maps, edge_weight=weight, normalization="augmented"
        ).to_dense()
    else:
        dense = sheaf_laplacian(edge_index, edge_maps=maps, normalization="augmented").to_dense()
    y = torch.randn(n, 2, 4, dtype=torch.float64)
    ones = torch.ones(edge_index.size(1), dtype=torch.float64)
    applied = conv.operator(x, edge_index, reverse, ones)(y)
    torch.testing.assert_close(applied.reshape(n * 2, 4), dense @ y.reshape(n * 2, 4))


def test_heat_update_is_the_matrix_exponential():
    """With W_left = W_right = I and enough Taylor terms, the heat layer is ELU(exp(−tΔ_F) x)."""
    edge_index, n = graph(nx.cycle_graph(6))
    torch.manual_seed(0)
    conv = FlatNSDConv(3, 2, update="heat", taylor_terms=30, edge_weights=False).double()
    with torch.no_grad():
        conv.right.copy_(torch.eye(3))
    x = torch.randn(n, 6, dtype=torch.float64)
    node_maps, _ = conv.sheaf(x, edge_index)
    delta = sheaf_laplacian(edge_index, node_maps=node_maps, normalization="augmented").to_dense()
    heat = torch.linalg.matrix_exp(-1.0 * delta)  # t = 1 at initialisation
    diffused = (heat @ x.view(n * 2, 3)).view(n, 2, 3)
    both = torch.cat([x.view(n, 2, 3), diffused], dim=-1)  # BuNN: [x ‖ H(t)x] → FFN
    expected = torch.nn.functional.elu(conv.ffn(both)).reshape(n, 6)
    torch.testing.assert_close(conv(x, edge_index), expected)


@pytest.mark.parametrize("update", ["discrete", "heat"])
@pytest.mark.parametrize("sheaf", SHEAVES)
def test_layer_is_permutation_equivariant(sheaf, update):
    edge_index, n = graph(nx.barbell_graph(4, 2))
    conv = _conv(sheaf, update)
    x = torch.randn(n, 8, dtype=torch.float64)
    perm = torch.randperm(n, generator=generator(5))
    inverse = torch.argsort(perm)
    permuted_edges = inverse[edge_index]  # node perm[i] of the old graph is node i of the new
    torch.testing.assert_close(conv(x[perm], permuted_edges), conv(x, edge_index)[perm])


def test_heat_series_is_accurate_at_the_largest_time():
    """The default 12 Taylor terms stay within 0.011 of exp(−tλ) up to t = 2 (tλ < 4)."""
    edge_index, n = graph(nx.complete_bipartite_graph(3, 4))  # λ(Δ_F) close to 2
    torch.manual_seed(0)
    conv = FlatNSDConv(3, 2, update="heat", edge_weights=False).double()
    with torch.no_grad():
        conv.right.copy_(torch.eye(3))
        conv.time_logit.fill_(30.0)  # t = 2
    x = torch.randn(n, 6, dtype=torch.float64)
    node_maps, _ = conv.sheaf(x, edge_index)
    delta = sheaf_laplacian(edge_index, node_maps=node_maps.detach(), normalization="augmented")
    delta = delta.to_dense()
    assert float(torch.linalg.eigvalsh(delta).max()) > 1.5
    assert math.isclose(float(conv.diffusion_time.detach()[0]), 2.0)
    exact = (torch.linalg.matrix_exp(-2.0 * delta) @ x.view(n * 2, 3)).view(n, 2, 3)
    with torch.no_grad():  # the FFN reads only the diffused half: compare the series alone
        conv.ffn[0].weight.copy_(torch.cat([torch.zeros(3, 3), torch.eye(3)], dim=1))
        conv.ffn[0].bias.zero_()
        conv.ffn[2].weight.copy_(torch.eye(3))
        conv.ffn[2].bias.zero_()
    elu = torch.nn.functional.elu
    expected = elu(elu(exact)).reshape(n, 6)
    torch.testing.assert_close(
        conv(x, edge_index), expected, atol=0.011 * float(x.abs().max()) * 2, rtol=0
    )


def test_isolated_nodes_keep_gradients_finite():
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])  # node 3 is isolated
    for sheaf in SHEAVES:
        conv = _conv(sheaf)
        x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
        conv(x, edge_index).sum().backward()
        assert torch.isfinite(x.grad).all(), sheaf
        for name, parameter in conv.named_parameters():
            assert torch.isfinite(parameter.grad).all(), (sheaf, name)


@pytest.mark.parametrize("sheaf", SHEAVES)
def test_gradients_reach_the_map_learner(sheaf):
    edge_index, n = graph(nx.cycle_graph(6))
    conv = _conv(sheaf, "heat" if sheaf == "flat" else "discrete")
    conv(torch.randn(n, 8, dtype=torch.float64), edge_index).square().sum().backward()
    for name, parameter in conv.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name
    assert any(name.startswith("map_learner") for name, _ in conv.named_parameters())


def test_gnn_map_learner_reads_the_neighbourhood_and_gets_gradients():
    """BuNN's φ: a node's map depends on its neighbours' features, and every GraphSAGE weight
    gets a gradient through the diffusion."""
    edge_index, n = graph(nx.path_graph(5))
    torch.manual_seed(0)
    conv = FlatNSDConv(4, 2, map_gnn_layers=2).double()
    x = torch.randn(n, 8, dtype=torch.float64)
    maps, _ = conv.sheaf(x, edge_index)
    moved = x.clone()
    moved[3] += 1.0  # two hops from node 1, three from node 0
    moved_maps, _ = conv.sheaf(moved, edge_index)
    assert not torch.allclose(moved_maps[1], maps[1])
    torch.testing.assert_close(moved_maps[0], maps[0])  # two GraphSAGE layers see two hops
    linear_only = FlatNSDConv(4, 2).double()
    linear_maps, _ = linear_only.sheaf(x, edge_index)
    torch.testing.assert_close(linear_only.sheaf(moved, edge_index)[0][1], linear_maps[1])
    conv(x, edge_index).square().sum().backward()
    sage = [p for name, p in conv.named_parameters() if name.startswith("map_learner.gnn")]
    assert len(sage) >= 4
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in sage)


def test_bundles_diffuse_each_channel_group_on_its_own_bundle():
    edge_index, n = graph(nx.barbell_graph(3, 1))
    torch.manual_seed(0)
    conv = FlatNSDConv(6, 2, bundles=3, edge_weights=False).double()
    x = torch.randn(n, 12, dtype=torch.float64)
    reverse = check_edge_index(edge_index, n)
    maps, _ = conv.sheaf(x, edge_index)
    assert maps.shape == (n, 3, 2, 2)
    y = torch.randn(n, 2, 6, dtype=torch.float64)
    ones = torch.ones(edge_index.size(1), dtype=torch.float64)
    applied = conv.operator(x, edge_index, reverse, ones)(y)
    for bundle in range(3):
        delta = sheaf_laplacian(
            edge_index, node_maps=maps[:, bundle], normalization="augmented"
        ).to_dense()
        group = y[:, :, 2 * bundle : 2 * bundle + 2]  # channels split evenly, in order
        torch.testing.assert_close(
            applied[:, :, 2 * bundle : 2 * bundle + 2].reshape(n * 2, 2),
            delta @ group.reshape(n * 2, 2),
        )
    with pytest.raises(ValueError, match="bundles must divide channels"):
        FlatNSDConv(4, 2, bundles=3)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda c, x: c(x, torch.tensor([[0, 9], [9, 0]])), "outside"),
        (lambda c, x: c(x, torch.tensor([[0, 1], [1, 2]])), "both directions"),
        (
            lambda c, x: FlatNSDConv(4, 2, remove_self_loops=False)(
                x, torch.tensor([[0, 1, 1], [1, 0, 1]])
            ),
            "self-loops",
        ),
        (lambda c, x: c(x, torch.tensor([[0, 1, 0], [1, 0, 1]])), "duplicate"),
        (lambda c, x: c(x, torch.tensor([[0.0, 1.0], [1.0, 0.0]])), "integer"),
        (lambda c, x: c(x[:, :3], torch.tensor([[0, 1], [1, 0]])), "stalk_dim"),
        (lambda c, x: c((x, x), torch.tensor([[0, 1], [1, 0]])), "bipartite"),
        (lambda c, x: c(x, torch.tensor([[0, 1], [1, 0]]), torch.ones(3)), "edge_weight"),
        (lambda c, x: c(x, torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0])), "both"),
    ],
)
def test_bad_input_is_named(call, match):
    conv = FlatNSDConv(4, 2)
    with pytest.raises(ValueError, match=match):
        call(conv, torch.randn(5, 8))


@pytest.mark.parametrize("sheaf", SHEAVES)
def test_edge_weight_zero_removes_the_edge_and_self_loops_are_dropped(sheaf):
    """A weight scales an edge's term of L_F (w = 0: the graph without it); a self-loop's
    coboundary is zero, so removing it leaves L_F and its normalisation as they were."""
    edge_index, n = graph(nx.barbell_graph(4, 1))
    conv = _conv(sheaf, "heat")
    x = torch.randn(n, 8, dtype=torch.float64)
    source, target = edge_index
    cut = ((source == 0) & (target == 1)) | ((source == 1) & (target == 0))
    expected = conv(x, edge_index[:, ~cut])
    torch.testing.assert_close(conv(x, edge_index, (~cut).double()), expected)
    loops = torch.arange(n).repeat(2, 1)
    with_loops = torch.cat([edge_index[:, ~cut], loops], dim=1)
    torch.testing.assert_close(conv(x, with_loops), expected)


def test_flat_sheaf_weights_are_the_learned_ones_times_edge_weight():
    edge_index, n = graph(nx.cycle_graph(5))
    conv = _conv("flat")
    x = torch.randn(n, 8, dtype=torch.float64)
    maps, learned = conv.sheaf(x, edge_index)
    _, weighted = conv.sheaf(x, edge_index, torch.full((edge_index.size(1),), 0.5).double())
    torch.testing.assert_close(weighted, learned / 2)
    assert maps.shape == (n, 2, 2)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: FlatNSDConv(4, 0), "stalk_dim"),
        (lambda: FlatNSDConv(0, 2), "channels"),
        (lambda: FlatNSDConv(4, 2, maps="diag"), "maps"),
        (lambda: NSDConv(4, 2, maps="flat"), "maps"),
        (lambda: FlatNSDConv(4, 2, update="euler"), "update"),
        (lambda: SheafDiffusionNet(3, 2, sheaf="cellular"), "sheaf"),
        (lambda: SheafDiffusionNet(3, 2, pool="sum"), "pool"),
        (lambda: MessagePassingNet(3, 2, conv="sage"), "conv"),
    ],
)
def test_bad_configuration_is_named(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_models_run_node_and_graph_tasks():
    graphs = ring_transfer(3, 6, noise_features=0)
    batch = next(iter(__import__("torch_geometric.loader").loader.DataLoader(graphs, batch_size=3)))
    for model in (
        SheafDiffusionNet(5, 4, sheaf="flat", num_layers=2),
        SheafDiffusionNet(5, 4, sheaf="bundle", num_layers=2, pool="mean"),
        MessagePassingNet(5, 4, conv="gat", num_layers=2, pool="add"),
    ):
        out = model(batch.x, batch.edge_index, batch.batch)
        assert out.shape == ((3, 4) if model.pool else (18, 4))


def test_layer_handles_a_large_sparse_graph():
    """2·10^4 nodes, 10^5 directed edges: no N×N or N·d×N·d tensor is formed."""
    g = torch.Generator().manual_seed(0)
    n = 20_000
    source = torch.randint(0, n, (50_000,), generator=g)
    target = (source + torch.randint(1, n, (50_000,), generator=g)) % n
    from torch_geometric.utils import coalesce, to_undirected

    edge_index = coalesce(to_undirected(torch.stack([source, target])))
    model = SheafDiffusionNet(8, 3, sheaf="flat", num_layers=2)
    model(torch.randn(n, 8), edge_index).sum().backward()


# --- tasks and diagnostics -----------------------------------------------------------------


def test_ring_transfer_puts_the_label_at_the_far_node():
    graphs = ring_transfer(20, 8, seed=3)
    for data in graphs:
        assert data.x.shape == (8, 5 + 2)  # the signal and 2 random features
        assert data.edge_index.shape == (2, 16)
        assert int(data.x[4, :5].argmax()) == int(data.y)
        assert float(data.x[4, :5].sum()) == 1.0
        assert float(data.x[0, :5].abs().sum()) == 0.0
        assert bool(data.target_mask[0])
    assert ring_transfer(20, 8, seed=3)[5].y == graphs[5].y
    assert ring_transfer(4, 8, noise_features=0)[0].x.shape == (8, 5)


def test_ring_test_graphs_are_held_out():
    """Without the random features a ring has 5 distinct graphs and every test graph is a copy
    of a training graph; with them none is."""
    check_disjoint(ring_transfer(200, 6, seed=0), ring_transfer(100, 6, seed=1))
    with pytest.raises(ValueError, match="100 of 100 test graphs equal a training graph"):
        check_disjoint(
            ring_transfer(200, 6, noise_features=0, seed=0),
            ring_transfer(100, 6, noise_features=0, seed=1),
        )


def test_tree_split_holds_out_distinct_examples():
    graphs = tree_neighbors_match(2, max_graphs=10_000)
    train, test = split_graphs(graphs, 0.2, seed=2)
    assert (len(train), len(test)) == (77, 19)
    examples = {(int(g.x[0].argmax()), tuple(g.x[3:, 5:].argmax(1).tolist())) for g in train}
    assert not any(
        (int(g.x[0].argmax()), tuple(g.x[3:, 5:].argmax(1).tolist())) in examples for g in test
    )
    with pytest.raises(ValueError, match="test graphs equal a training graph"):
        check_disjoint(train, [*test, train[0]])
    with pytest.raises(ValueError, match="test_fraction"):
        split_graphs(graphs, 1.0)


def test_tree_neighbors_match_label_is_the_value_under_the_root_key():
    graphs = tree_neighbors_match(3, max_graphs=50, seed=0)
    assert len(graphs) == 50
    for data in graphs:
        leaves = 8
        key = int(data.x[0, : leaves + 1].argmax()) - 1
        leaf = leaves - 1 + key  # leaf with key k holds key slot k + 1
        assert int(data.x[leaf, leaves + 1 :].argmax()) - 1 == int(data.y)
        assert data.num_nodes == 15
        assert data.edge_index.size(1) == 28 + 15  # both directions and a self-loop per node
    assert len(tree_neighbors_match(2, max_graphs=10_000)) == 24 * 4  # all permutations × keys
    assert tree_neighbors_match(2, self_loops=False)[0].edge_index.size(1) == 12


def test_tree_examples_are_distinct_where_permutations_are_sampled():
    """Depth 3 samples 1000 of 8! permutations: a repeat would put one example on both sides of
    a split (seed 3 drew one before permutations were deduplicated)."""
    graphs = tree_neighbors_match(3, max_graphs=8000, seed=3)
    examples = {(int(g.x[0].argmax()), tuple(g.x[7:, 9:].argmax(1).tolist())) for g in graphs}
    assert len(examples) == len(graphs) == 8000
    split_graphs(tree_neighbors_match(3, max_graphs=1250, seed=3), 0.2, seed=3)  # no overlap


def test_transform_annotates_resistance():
    g = nx.barbell_graph(3, 1)
    edge_index, n = graph(g)
    data = AddSheafResistance()(Data(edge_index=edge_index, num_nodes=n))
    bridge = max(range(edge_index.size(1)), key=lambda k: float(data.edge_resistance[k]))
    assert math.isclose(float(data.edge_resistance[bridge]), 1.0)  # a bridge has resistance 1
    data.node_maps = random_orthogonal(n, 2, generator())
    annotated = AddSheafResistance()(data)
    assert math.isclose(
        float(annotated.total_resistance),
        2 * float(total_sheaf_resistance(edge_index, num_nodes=n)),
    )


def test_learned_resistance_is_one_without_edge_weights():
    data = ring_transfer(1, 6, noise_features=0)[0]
    model = SheafDiffusionNet(5, 5, sheaf="flat", num_layers=2, edge_weights=False)
    statistics = learned_sheaf_statistics(model, data.x, data.edge_index)
    assert math.isclose(statistics["resistance"], 1.0, rel_tol=1e-9)
    assert statistics["mean_edge_weight"] == 1.0
    weighted = SheafDiffusionNet(5, 5, sheaf="flat", num_layers=2)
    weighted_statistics = learned_sheaf_statistics(weighted, data.x, data.edge_index)
    assert weighted_statistics["resistance"] > 1.0  # σ(·) < 1 weights
    assert weighted_statistics["mean_edge_weight"] < 1.0


def test_training_is_seeded_and_learns_a_short_ring():
    train, test = ring_transfer(200, 4, seed=0), ring_transfer(50, 4, seed=1)
    features = train[0].num_features

    def fit():
        torch.manual_seed(0)
        model = SheafDiffusionNet(features, 5, sheaf="flat", num_layers=2)
        return train_readout(model, train, test, epochs=15, seed=0)

    first, second = fit(), fit()
    assert first == second
    assert first.test_accuracy > 0.6  # chance is 0.2


# --- experiment and CLI --------------------------------------------------------------------

TINY = {
    "ring_sizes": (4,),
    "tree_depths": (2,),
    "ring_train": 40,
    "ring_test": 20,
    "tree_graphs": 40,
    "n_seeds": 2,
    "epochs": 1,
    "tree_epochs": 1,
    "systems": ("gcn", "nsd_bundle", "flatnsd"),
    "channels": 4,
}


def test_experiment_writes_every_system_and_resumes(tmp_path):
    config = Config(**TINY)
    result = METHOD.execute(config, tmp_path)  # refuses a claim judged without its control
    assert set(result.metrics) == {"gcn", "nsd_bundle", "flatnsd"}
    assert result.cache["state"] == "none"  # flatnsd caches nothing
    assert [claim.key for claim in result.claims] == [spec.key for spec in Config.CLAIMS]
    assert all(claim.control is not None and claim.control.tested for claim in result.claims)
    regime_texts = [check.text for check in result.regime]
    assert len(regime_texts) == 2
    assert "smallest ring" in regime_texts[0]
    assert "smallest tree" in regime_texts[1]
    gcn = result.metrics["gcn"]
    assert f"{gcn['ring4_test_accuracy_min']:.4g}" in result.regime[0].evidence
    assert f"{gcn['tree2_train_accuracy_min']:.4g}" in result.regime[1].evidence
    for check in result.regime:  # one epoch: a check that failed leaves its claims untested
        gated = [claim for claim in result.claims if claim.text in check.gates]
        assert gated
        assert check.holds or all(claim.state == "untested" for claim in gated)
    theory = [
        claim for claim in result.claims if not any(claim.text in c.gates for c in result.regime)
    ]
    assert len(theory) == 6
    assert all(claim.tested for claim in theory)  # exact computations: never gated
    assert result.metrics["gcn"]["resistance_start"] is None
    assert result.metrics["flatnsd"]["resistance_start"] is not None
    ring = json.loads((tmp_path / "theory.json").read_text())["ring"]
    assert ring["graphs"]["C12"]["spearman_linear"] == -1.0  # ties handled
    assert (tmp_path / "ring_accuracy.png").exists()
    resumed = run_experiment(config, tmp_path, resume=True)
    assert resumed.metrics == result.metrics
    with pytest.raises(ValueError, match="another config"):
        run_experiment(Config(**{**TINY, "epochs": 2}), tmp_path, resume=True)


def test_killed_experiment_resumes_where_it_stopped(tmp_path, monkeypatch):
    from mixlab.graphs.flatnsd import experiment

    config = Config(**{**TINY, "systems": ("gcn", "flatnsd")})
    uninterrupted = run_experiment(config, tmp_path / "whole")
    calls = []
    real_run_cell = experiment.run_cell

    def dies_after_three(*args, **kwargs):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(args[1:5])
        return real_run_cell(*args, **kwargs)

    monkeypatch.setattr(experiment, "run_cell", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path / "killed")
    monkeypatch.setattr(
        experiment, "run_cell", lambda *a, **k: calls.append(a[1:5]) or real_run_cell(*a, **k)
    )
    resumed = run_experiment(config, tmp_path / "killed", resume=True)
    assert len(calls) == 8  # 3 before the kill, the other 5 of 8 cells after it
    for system, row in uninterrupted.metrics.items():
        for key, value in row.items():
            if key != "train_seconds":
                assert resumed.metrics[system][key] == value, (system, key)


def _cells(nsd_at_largest: float) -> list[dict]:
    """Ring and tree cells of three seeds: GCN fits the smallest size and collapses at the
    largest, FlatNSD keeps 1.0 and lowers its resistance, Bundle-NSD scores ``nsd_at_largest``
    at the largest size."""
    cells = []
    for seed in (0, 1, 2):
        for task, sizes in (("ring", (4, 8)), ("tree", (2, 3))):
            for system, largest in (("gcn", 0.2), ("nsd_bundle", nsd_at_largest), ("flatnsd", 1.0)):
                for size in sizes:
                    accuracy = largest if size == max(sizes) else 1.0
                    traced = system == "flatnsd" and (task, size) == ("ring", 8)
                    cells.append({
                        "task": task, "size": size, "seed": seed, "system": system,
                        "train_accuracy": accuracy, "test_accuracy": accuracy,
                        "resistance": [2.0, 1.5 - 0.1 * seed] if traced else [],
                        "mean_edge_weight": [0.5, 0.7] if traced else [],
                    })  # fmt: skip
    return cells


def test_a_claim_bundle_nsd_also_passes_is_vacuous():
    from mixlab.graphs.flatnsd.experiment import claims
    from mixlab.graphs.flatnsd.theory import family_checks

    theory = {"ring": family_checks({"a": nx.cycle_graph(8), "b": nx.cycle_graph(8)}, stalk_dim=2)}
    config = Config(ring_sizes=(4, 8), tree_depths=(2, 3), systems=("gcn", "nsd_bundle", "flatnsd"))
    found = {claim.key: claim for claim in claims(_cells(nsd_at_largest=0.2), theory, config)}
    assert found["keeps_accuracy_ring"].state == "holds"  # Bundle-NSD collapses with GCN
    assert found["keeps_accuracy_tree"].premises[0].holds  # GCN fits the smallest depth
    assert found["lowers_resistance"].state == "holds"  # the untrained sheaf never lowers it
    assert found["flat_leaves_resistance"].control.system == "non_flat"
    assert not found["flat_leaves_resistance"].control.holds  # non-flat maps move resistance
    both = {claim.key: claim for claim in claims(_cells(nsd_at_largest=1.0), theory, config)}
    assert both["keeps_accuracy_ring"].state == "vacuous"  # a non-flat sheaf keeps it too
    assert "nsd_bundle at 8 1 >= 0.9" in both["keeps_accuracy_ring"].control.evidence
    assert both["keeps_accuracy_tree"].state == "vacuous"


def test_the_linear_theory_claims_hold_where_flat_bundles_pass_and_non_flat_maps_fail():
    """bound_linear and spearman_linear can hold: their control, non-flat maps, reads its own
    sensitivity (not the flat bundle's numbers). Two equal rings pass for every bundle (vacuous);
    edited so that non-flat diffusion violates the bound and ranks weakly, the claims hold."""
    from mixlab.graphs.flatnsd.experiment import claims
    from mixlab.graphs.flatnsd.theory import family_checks

    theory = {"ring": family_checks({"a": nx.cycle_graph(8), "b": nx.cycle_graph(8)}, stalk_dim=2)}
    config = Config(ring_sizes=(4, 8), tree_depths=(2, 3), systems=("gcn", "nsd_bundle", "flatnsd"))
    keys = ("bound_linear", "spearman_linear")
    same = {claim.key: claim for claim in claims(_cells(0.2), theory, config)}
    for key in keys:
        assert same[key].control.system == "non_flat"
        assert same[key].state == "vacuous", same[key].control.evidence
        assert same[key].not_per_seed  # one random draw, judged on the worst graph
        assert not same[key].per_seed
    theory["ring"]["graphs"]["b"]["spearman_linear_non_flat"] = -0.3
    theory["ring"]["bound"]["linear_non_flat"]["held_out"]["b"] |= {
        "violating_pairs": 5, "violation_share": 5 / 56, "worst_ratio": 1.5,
    }  # fmt: skip
    theory["ring"]["bound"]["linear_non_flat"]["violating"] = ["b"]
    found = {claim.key: claim for claim in claims(_cells(0.2), theory, config)}
    for key in keys:
        assert found[key].state == "holds", found[key].control.evidence
        assert found[key].control.tested
        assert not found[key].control.holds
    assert "-0.3" in found["spearman_linear"].control.evidence
    assert "ring/b" in found["bound_linear"].control.evidence


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ring_sizes", (3,)),
        ("tree_depths", (1,)),
        ("systems", ("gcn",)),
        ("systems", ("flatnsd", "mlp")),
        ("epochs", 0),
        ("lr", 0.0),
        ("tree_lr", float("inf")),
        ("tree_epochs", 0),
        ("ring_noise", 0),
        ("tree_test_fraction", 1.0),
    ],
)
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        Config(**{field: value})


def test_cli_resistance_finds_the_bridge(tmp_path, capsys):
    edges = tmp_path / "edges.csv"
    g = nx.barbell_graph(3, 1)
    edges.write_text("u,v\n" + "\n".join(f"{u},{v}" for u, v in g.edges()) + "\n")
    out = tmp_path / "r.csv"
    assert graphs_main(["flatnsd", "resistance", str(edges), "--out", str(out), "--top", "2"]) == 0
    printed = capsys.readouterr().out
    assert "7 nodes, 8 edges" in printed
    assert out.read_text().splitlines()[1].endswith(",1")  # the bridges come first, R = 1


def test_cli_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "edges.json"
    bad.write_text("{}")
    assert graphs_main(["flatnsd", "resistance", str(bad)]) == 2
    assert graphs_main(["flatnsd", "resistance", str(tmp_path / "missing.csv")]) == 2
    assert (
        graphs_main(["flatnsd", "train", "--task", "grid", "--size", "4", "--out", str(tmp_path)])
        == 2
    )
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3
    assert all(line.startswith("mixlab-graphs: error:") for line in errors)


def test_cli_train_saves_a_loadable_model(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["flatnsd", "train", "--task", "ring", "--size", "4", "--out", str(out)]
    assert graphs_main([*args, "--epochs", "1", "--graphs", "30", "--width", "4"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert "integrity" in metrics  # the sidecar records the weights' SHA-256
    from safetensors.torch import load_file

    model = SheafDiffusionNet(
        7, 5, sheaf="flat", channels=4, num_layers=metrics["layers"], map_gnn_layers=1
    )  # the flatnsd system: 5 signal + 2 random features, BuNN's one-layer GNN φ
    model.load_state_dict(load_file(str(out / "model.safetensors")))
    loaded, info = load_trained(out)
    assert info["train_accuracy"] == metrics["train_accuracy"]
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)
    assert graphs_main(["flatnsd", "evaluate", str(out), "--graphs", "10"]) == 0
    assert "flatnsd on ring 4: accuracy" in capsys.readouterr().out


def test_cli_evaluate_scores_only_graphs_unseen_in_training(tmp_path, capsys):
    """Depth 2 has 96 distinct examples: 40 trained on, so evaluating all 96 scores 56."""
    out = tmp_path / "tree"
    args = ["flatnsd", "train", "--task", "tree", "--size", "2", "--out", str(out)]
    assert graphs_main([*args, "--epochs", "1", "--graphs", "40", "--model", "gcn"]) == 0
    capsys.readouterr()
    assert graphs_main(["flatnsd", "evaluate", str(out), "--graphs", "96", "--seed", "0"]) == 0
    assert "on 56 graphs not seen in training (40 seen ones dropped)" in capsys.readouterr().out
