"""CurvDiff metrics: descriptors, both MMD protocols, V.U.N., autoencoder metrics."""

from __future__ import annotations

import math
from types import SimpleNamespace

import networkx as nx
import numpy as np
import pytest
import torch
from scipy.stats import wasserstein_distance

from mixlab.graphs.curvdiff.metrics import (
    KERNELS,
    GraphDescriptors,
    describe,
    distortion,
    emd_1d,
    exact_recovery,
    floor,
    hop_distances,
    is_valid_planar,
    is_valid_tree,
    mmd2,
    mmd_table,
    optimal_scale,
    orbit_counts,
    reconstruction_auroc,
    separating_kernels,
    vun,
)


def stub_curvature(graph: nx.Graph) -> np.ndarray:
    """Stands in for Ollivier–Ricci: (t − 1)/(t + 1) ∈ [−1, 1) for an edge on t triangles."""
    triangles = np.array([len(set(graph[u]) & set(graph[v])) for u, v in graph.edges()])
    return (triangles - 1.0) / (triangles + 1.0)


def as_data(graph: nx.Graph) -> SimpleNamespace:
    """What the metrics read from a PyG ``Data``: ``edge_index`` in both directions and
    ``num_nodes`` (duck-typed here; importing torch_geometric alone takes seconds)."""
    graph = nx.convert_node_labels_to_integers(graph)
    edges = torch.tensor(list(graph.edges()), dtype=torch.long).reshape(-1, 2).T
    return SimpleNamespace(
        edge_index=torch.cat([edges, edges.flip(0)], dim=1), num_nodes=graph.number_of_nodes()
    )


def mixed_set() -> list[nx.Graph]:
    return [
        nx.cycle_graph(6),
        nx.complete_graph(5),
        nx.path_graph(7),
        nx.star_graph(4),
        nx.erdos_renyi_graph(12, 0.3, seed=1),
        nx.grid_2d_graph(3, 3),
    ]


@pytest.mark.parametrize("protocol", ["emd", "tv"])
def test_mmd_of_a_set_with_itself_is_zero(protocol: str) -> None:
    descriptors = describe(mixed_set(), stub_curvature)
    table = mmd_table(descriptors, descriptors, protocol)  # type: ignore[arg-type]
    assert set(table) == {"degree", "clustering", "orbit", "spectral", "curvature", "mean"}
    for name, value in table.items():
        assert abs(value) < 1e-12, (name, value)


@pytest.mark.parametrize("protocol", ["emd", "tv"])
def test_mmd_separates_cycles_from_complete_graphs(protocol: str) -> None:
    cycles = [nx.cycle_graph(n) for n in range(5, 11)]
    cliques = [nx.complete_graph(n) for n in range(5, 11)]
    table = mmd_table(cycles, cliques, protocol, edge_curvature=stub_curvature)  # type: ignore[arg-type]
    for name, value in table.items():
        assert value > 0.05, (name, value)
    # the train–test floor between two halves of one family is far below
    low = floor(cycles[::2], cycles[1::2], protocol, stub_curvature)  # type: ignore[arg-type]
    assert low["degree"] < 1e-12
    assert low["clustering"] < 1e-12
    assert low["curvature"] < 1e-12
    assert low["mean"] < table["mean"]


def test_mmd_closed_forms_on_one_cycle_and_one_clique() -> None:
    # degree pmfs are point masses at 2 and 4: TV = 1, EMD = 2; MMD² = 2 − 2k(x, y)
    # mean orbit vectors (hand-counted): C5 [2,2,1,0,2,2,0,...], K5 [4,0,0,6,0,...,0,4]
    c5, k5 = [nx.cycle_graph(5)], [nx.complete_graph(5)]
    tv = mmd_table(c5, k5, "tv", stub_curvature)
    emd = mmd_table(c5, k5, "emd", stub_curvature)
    assert tv["degree"] == pytest.approx(2 - 2 * math.exp(-1 / 2))
    assert emd["degree"] == pytest.approx(2 - 2 * math.exp(-(2**2) / 2))
    assert tv["orbit"] == pytest.approx(2 - 2 * math.exp(-(9.5**2) / (2 * 30**2)))
    assert emd["orbit"] == pytest.approx(2 - 2 * math.exp(-69 / (2 * 30**2)))
    # clustering 0 vs 1: 99 bins apart, distance_scaling 100 → EMD 0.99, σ = 0.1
    assert emd["clustering"] == pytest.approx(2 - 2 * math.exp(-(0.99**2) / (2 * 0.01)))
    assert tv["clustering"] == pytest.approx(2 - 2 * math.exp(-1 / (2 * 0.01)))


def test_the_spectral_emd_kernel_measures_in_eigenvalues_and_tells_sets_apart() -> None:
    """In GDSS's bin units every pair of spectra is tens of bins apart: the MMD was 1/n + 1/m
    for any two sets (issue 68); in eigenvalue units it depends on the graphs."""
    cycles = [nx.cycle_graph(n) for n in range(6, 12)]
    paths = [nx.path_graph(n) for n in range(6, 12)]
    stars = [nx.star_graph(n) for n in range(5, 11)]
    constant = 1 / 6 + 1 / 6
    near = mmd_table(cycles, paths, "emd", stub_curvature)["spectral"]
    far = mmd_table(cycles, stars, "emd", stub_curvature)["spectral"]
    assert 10 * near < far  # cycles and paths have nearly the same spectra; stars do not
    cycle, path = (describe(g, stub_curvature).spectral for g in (cycles, paths))
    bins = mmd2(cycle, path, "gaussian_emd", 1.0, 1.0)  # the old kernel, in bin units
    assert bins == pytest.approx(constant, abs=1e-6)  # k = 0 off the diagonal: a constant


def test_separating_kernels_choose_the_sigma_that_tells_the_baseline_from_the_data() -> None:
    rng = np.random.default_rng(0)
    data = [nx.connected_watts_strogatz_graph(int(n), 4, 0.1, seed=int(n) + i)
            for i, n in enumerate(rng.integers(10, 16, 12))]  # fmt: skip
    baseline = [
        nx.gnp_random_graph(int(n), 0.3, seed=i) for i, n in enumerate(rng.integers(10, 16, 12))
    ]
    kernels = separating_kernels(data, baseline, "tv", seed=0)
    assert set(kernels) == {"degree", "clustering", "orbit", "spectral", "curvature"}
    for name, (kernel, sigma, scaling) in kernels.items():
        published = KERNELS["tv"][name]
        assert (kernel, scaling) == (published[0], published[2])
        assert any(sigma == pytest.approx(published[1] * f) for f in (0.1, 0.3, 1.0, 3.0, 10.0))
    # the chosen σ separates at least as well as the published one, on the training data
    chosen = mmd_table(baseline, data, "tv", kernels=kernels)
    assert chosen["clustering"] > mmd_table(data[:6], data[6:], "tv", kernels=kernels)["clustering"]
    with pytest.raises(ValueError, match="reference must be at least 4 graphs"):
        separating_kernels(data[:3], baseline, "tv")


def test_descriptor_rows_and_concat_keep_each_graph() -> None:
    a = describe([nx.path_graph(3), nx.star_graph(5)], stub_curvature)  # degrees up to 5
    b = describe([nx.cycle_graph(4)], stub_curvature)  # degree 2 only: a narrower histogram
    both = GraphDescriptors.concat(a, b)
    assert len(both) == 3
    assert both.degree.shape[1] == a.degree.shape[1] > b.degree.shape[1]
    np.testing.assert_array_equal(both.rows([2]).orbit, b.orbit)
    assert mmd_table(both.rows([0, 1]), both.rows([2]), "tv") == pytest.approx(
        mmd_table(a, b, "tv")
    )


def test_pyg_data_gives_the_same_table_as_networkx() -> None:
    graphs = mixed_set()[:4]
    datas = [as_data(g) for g in graphs]
    assert mmd_table(datas, graphs[::-1], "tv", stub_curvature) == pytest.approx(
        mmd_table(graphs, graphs[::-1], "tv", stub_curvature)
    )


def test_protocols_follow_the_sources() -> None:
    assert KERNELS["emd"]["clustering"] == ("gaussian_emd", 0.1, 100.0)
    assert KERNELS["emd"]["orbit"] == ("gaussian", 30.0, 1.0)
    assert KERNELS["tv"]["orbit"] == ("gaussian_tv", 30.0, 1.0)  # GRAN/SPECTRE/DiGress source
    assert KERNELS["tv"]["curvature"][:2] == ("gaussian_tv", 0.1)
    with pytest.raises(ValueError, match="protocol must be"):
        mmd_table([nx.path_graph(3)], [nx.path_graph(3)], "l1")  # type: ignore[arg-type]


def test_emd_is_the_cdf_l1_distance() -> None:
    rng = np.random.default_rng(0)
    for length_x, length_y in [(5, 5), (3, 8), (12, 7)]:
        x, y = rng.random(length_x), rng.random(length_y)
        x, y = x / x.sum(), y / y.sum()
        for scaling in (1.0, 100.0):
            support_x, support_y = np.arange(length_x) / scaling, np.arange(length_y) / scaling
            expected = wasserstein_distance(support_x, support_y, x, y)
            assert emd_1d(x, y, scaling) == pytest.approx(expected, rel=1e-10)
    assert emd_1d(np.array([1.0, 0, 0]), np.array([0, 0, 1.0])) == pytest.approx(2.0)


def test_mmd2_is_the_biased_estimator() -> None:
    x = np.array([[1.0, 0.0], [0.0, 1.0]])
    y = np.array([[1.0, 0.0]])
    k = math.exp(-1 / 2)  # TV between the two point masses is 1
    expected = (2 + 2 * k) / 4 + 1 - 2 * (1 + k) / 2
    assert mmd2(x, y, "gaussian_tv", 1.0) == pytest.approx(expected)


def orbits(edges: list[tuple[int, int]], n: int) -> np.ndarray:
    graph = nx.empty_graph(n)
    graph.add_edges_from(edges)
    return orbit_counts(graph).astype(int)


def test_orca_orbit_counts_by_hand() -> None:
    # orbits: 0 degree; 1/2 end/middle of a path of 3; 3 triangle; 4/5 end/inner of a path of 4;
    # 6/7 leaf/centre of a 3-star; 8 four-cycle; 14 K4. Counts are of induced subgraphs.
    k4 = orbits([(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)], 4)
    assert (k4 == [3, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]).all()
    c4 = orbits([(0, 1), (1, 2), (2, 3), (3, 0)], 4)
    assert (c4 == [2, 2, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]).all()
    p4 = orbits([(0, 1), (1, 2), (2, 3)], 4)
    end = [1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    inner = [2, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert (p4 == [end, inner, inner, end]).all()
    star = orbits([(0, 1), (0, 2), (0, 3)], 4)
    assert (star[0] == [3, 0, 3, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]).all()
    assert (star[1:] == [1, 2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]).all()


def test_vun_on_trees() -> None:
    star = nx.star_graph(4)
    star_relabelled = nx.relabel_nodes(star, {i: (i * 3) % 5 for i in range(5)})
    fork = nx.Graph([(0, 1), (1, 2), (2, 3), (1, 4)])
    path = nx.relabel_nodes(nx.path_graph(5), {0: 4, 4: 0})
    generated = [star, star_relabelled, path, nx.cycle_graph(5), fork]
    result = vun(generated, [nx.path_graph(5)], "tree")
    assert result == pytest.approx(
        {"valid": 0.8, "unique": 0.8, "novel": 0.8, "unique_novel": 0.6, "vun": 0.4}
    )
    assert vun(generated, [], None)["vun"] == pytest.approx(0.8)  # only the duplicate fails
    assert is_valid_tree(as_data(fork))
    assert not is_valid_tree(nx.cycle_graph(5))
    assert not is_valid_tree(nx.empty_graph(0))


def test_planar_validity() -> None:
    assert is_valid_planar(nx.complete_graph(4))
    assert not is_valid_planar(nx.complete_graph(5))
    assert not is_valid_planar(nx.disjoint_union(nx.path_graph(3), nx.path_graph(3)))


def toy_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    adjacency = torch.zeros(2, 3, 3)
    adjacency[0, 0, 1] = adjacency[0, 1, 0] = 1  # graph 0: 3 nodes, edge 0–1
    adjacency[1, 0, 1] = adjacency[1, 1, 0] = 1  # graph 1: 2 real nodes, edge 0–1
    probabilities = torch.tensor(
        [
            [[0.0, 0.9, 0.2], [0.9, 0.0, 0.3], [0.2, 0.3, 0.0]],
            [[0.0, 0.4, 0.99], [0.4, 0.0, 0.99], [0.99, 0.99, 0.0]],  # node 2 is padding
        ]
    )
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return probabilities, adjacency, mask


def test_reconstruction_auroc_and_exact_recovery() -> None:
    probabilities, adjacency, mask = toy_batch()
    # real pairs: (0.9, edge) (0.2, no) (0.3, no) | (0.4, edge) → every edge outranks every non-edge
    assert reconstruction_auroc(probabilities, adjacency, mask) == pytest.approx(1.0)
    assert reconstruction_auroc(probabilities, adjacency) < 1.0  # padding pairs would count
    assert reconstruction_auroc(1 - probabilities.numpy(), adjacency.numpy(), mask) == 0.0
    assert exact_recovery(probabilities, adjacency, mask) == 0.5  # graph 1 decodes 0.4 → no edge
    assert exact_recovery(probabilities, adjacency, mask, threshold=0.35) == 1.0


def test_distortion_is_zero_for_a_scaled_isometry() -> None:
    path = nx.path_graph(6)
    hops = hop_distances(path)
    line = 3.0 * np.arange(6, dtype=float)
    latent = np.abs(line[:, None] - line[None, :])
    assert distortion([latent], [hops]) == pytest.approx(0.0, abs=1e-12)
    assert distortion([latent], [hops], rescale=False) == pytest.approx(2.0)
    # a padded batch with a node mask; the padding would otherwise add distorted pairs
    batch_latent = torch.zeros(2, 7, 7)
    batch_hops = torch.full((2, 7, 7), float("inf"))
    for b in range(2):
        batch_latent[b, :6, :6] = torch.from_numpy(latent)
        batch_hops[b, :6, :6] = torch.from_numpy(hops)
        batch_hops[b, 6, 6] = 0
    batch_hops[:, 0, 6] = batch_hops[:, 6, 0] = 1.0
    node_mask = torch.arange(7).expand(2, 7) < 6
    assert distortion(batch_latent, batch_hops, node_mask) == pytest.approx(0.0, abs=1e-12)
    assert distortion(batch_latent, batch_hops) > 0.0


def test_optimal_scale_minimises_the_l1_distortion() -> None:
    rng = np.random.default_rng(1)
    ratios = rng.lognormal(size=9)
    grid = np.linspace(0.01, 5.0, 20001)
    losses = np.abs(grid[:, None] * ratios[None, :] - 1).sum(1)
    best = np.abs(optimal_scale(ratios) * ratios - 1).sum()
    assert best <= losses.min() + 1e-9


def test_hop_distances() -> None:
    graph = nx.disjoint_union(nx.path_graph(3), nx.path_graph(2))
    hops = hop_distances(graph)
    assert hops[0, 2] == 2
    assert hops[3, 4] == 1
    assert np.isinf(hops[0, 3])


def test_default_curvature_is_ollivier_ricci() -> None:
    # K8 has κ = 0.571 on every edge (spec §1a sanity value): all mass in the bin [0.5, 0.6);
    # each of the 28 edges is counted in both directions
    histogram = describe([nx.complete_graph(8)]).curvature
    assert histogram is not None
    assert histogram[0, 15] == 56
    assert histogram.sum() == 56
