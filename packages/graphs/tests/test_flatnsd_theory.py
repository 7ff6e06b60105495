"""FlatNSD theory checks: tie-handled Spearman, the bound S ≤ c/R on held-out graphs, the
un-transported resistance, thread-count independence, and the cached edge-index validation."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch
from flatnsd_graphs import generator, graph
from scipy.stats import spearmanr

from mixlab.graphs.flatnsd import sheaf
from mixlab.graphs.flatnsd.layers import SheafDiffusionNet
from mixlab.graphs.flatnsd.sheaf import (
    EDGE_INDEX_CACHE_SIZE,
    check_edge_index,
    diffusion_sensitivity,
    jacobian_sensitivity,
    sheaf_effective_resistance,
    sheaf_laplacian,
)
from mixlab.graphs.flatnsd.theory import (
    SENSITIVITIES,
    check_graph,
    evaluate_bound,
    family_checks,
    fit_bound,
    one_thread,
    random_invertible,
    random_orthogonal,
    round_significant,
    summary,
    tied_ranks,
    tied_spearman,
)

D = 3


def all_pairs(n: int) -> torch.Tensor:
    return torch.cartesian_prod(torch.arange(n), torch.arange(n)).T


def graph_laplacian_pinv(g: nx.Graph) -> torch.Tensor:
    laplacian = nx.laplacian_matrix(g, nodelist=range(g.number_of_nodes())).toarray()
    return torch.linalg.pinv(torch.as_tensor(laplacian, dtype=torch.float64), hermitian=True)


# --- Spearman's ρ with ties -----------------------------------------------------------------


def test_tied_ranks_tie_values_equal_up_to_rounding_noise():
    values = np.array([2.0, 1.0, 1.0 + 1e-15, 3.0, 1.0 - 1e-15, 2.0 * (1 + 4e-16)])
    np.testing.assert_array_equal(tied_ranks(values), [4.5, 2.0, 2.0, 6.0, 2.0, 4.5])
    assert tied_ranks(np.array([])).size == 0


def test_tied_spearman_is_deterministic_where_plain_ranks_follow_the_noise():
    """On a ring R and S depend on the distance only: with ties ρ = −1 whatever the last bits."""
    g = nx.cycle_graph(12)
    edge_index, n = graph(g)
    off_diagonal = ~torch.eye(n, dtype=torch.bool)
    resistance = sheaf_effective_resistance(edge_index, num_nodes=n, pairs=all_pairs(n))
    resistance = resistance[:, 0, 0].view(n, n)[off_diagonal].numpy()
    laplacian = sheaf_laplacian(edge_index, node_maps=torch.ones(n, 1, 1, dtype=torch.float64))
    sensitivity = diffusion_sensitivity(laplacian, n, steps=12)[off_diagonal].numpy()
    plain, tied = set(), set()
    for seed in range(5):
        noise = np.random.default_rng(seed).uniform(-1e-14, 1e-14, size=(2, resistance.size))
        r, s = resistance * (1 + noise[0]), sensitivity * (1 + noise[1])
        plain.add(float(spearmanr(r, s).statistic))
        tied.add(tied_spearman(r, s))
    assert tied == {-1.0}
    assert len(plain) > 1
    assert max(plain) > -1.0
    assert check_graph(g, stalk_dim=2)["spearman_linear"] == -1.0


def test_tied_spearman_of_a_constant_is_nan():
    assert np.isnan(tied_spearman(np.ones(4), np.arange(4.0)))


# --- the bound S ≤ c/R ----------------------------------------------------------------------


def test_bound_fit_and_evaluation():
    products = np.array([0.5, 2.0, 1.0])
    c = fit_bound(products)
    assert c == 2.0
    held = evaluate_bound(c, products * (1 + 1e-12))  # within the tolerance: no violation
    assert held["pairs"] == 3
    assert held["violating_pairs"] == held["violation_share"] == 0
    assert held["worst_ratio"] == pytest.approx(1.0)
    broken = evaluate_bound(c, np.array([3.0, 1.0, 2.5, 0.1]))
    assert broken["violating_pairs"] == 2
    assert broken["violation_share"] == 0.5
    assert broken["worst_ratio"] == 1.5


@pytest.fixture(scope="module")
def ring_then_barbell() -> dict:
    """Calibrated on a ring, tested on a barbell, whose bridge path carries more S·R."""
    graphs = {"C12": nx.cycle_graph(12), "barbell(8,4)": nx.barbell_graph(8, 4)}
    return family_checks(graphs, stalk_dim=2, seed=0)


def test_a_held_out_graph_that_violates_the_bound_is_reported(ring_then_barbell):
    bound = ring_then_barbell["bound"]["linear"]
    assert bound["calibration"] == "C12"
    tested = bound["held_out"]["barbell(8,4)"]
    assert tested["violating_pairs"] > 0
    assert tested["worst_ratio"] > 1
    assert bound["violating"] == ["barbell(8,4)"]
    worst = summary({"mixed": ring_then_barbell})
    assert worst["bound_linear_violating"] == ["mixed/barbell(8,4)"]
    assert worst["bound_linear_violation_share"] == tested["violation_share"] > 0
    assert worst["bound_linear_worst_ratio"] == tested["worst_ratio"]
    spreads = [
        g["sensitivity_times_resistance"]["linear"]["spread"]
        for g in ring_then_barbell["graphs"].values()
    ]
    assert worst["bound_linear_max_spread"] == max(spreads) > 1


def test_the_calibration_graph_held_out_meets_its_own_bound():
    checks = family_checks({"a": nx.cycle_graph(8), "b": nx.cycle_graph(8)}, stalk_dim=2)
    for kind in SENSITIVITIES:
        tested = checks["bound"][kind]["held_out"]["b"]
        assert tested["violating_pairs"] == 0, kind
        assert tested["worst_ratio"] == 1.0, kind
        assert checks["bound"][kind]["violating"] == []


def test_summary_has_every_key(ring_then_barbell):
    worst = summary({"mixed": ring_then_barbell})
    expected = {
        "max_orthogonal_flat_deviation",
        "max_general_flat_deviation",
        "min_non_flat_deviation",
        "worst_spearman_linear",
        "worst_spearman_linear_general",
        "worst_spearman_nonlinear",
        "worst_spearman_linear_non_flat",
        "min_untransported_deviation",
        "max_untransported_identity_deviation",
        "worst_spearman_untransported",
    } | {
        f"bound_{kind}_{what}"
        for kind in ("linear", "linear_general", "nonlinear", "linear_non_flat")
        for what in ("violation_share", "worst_ratio", "max_spread", "violating")
    }
    assert set(worst) == expected
    assert worst["max_orthogonal_flat_deviation"] < 1e-9
    assert worst["max_untransported_identity_deviation"] < 1e-9
    assert worst["min_untransported_deviation"] > 1e-3  # orthogonal maps move R̃


def test_a_family_needs_a_held_out_graph():
    with pytest.raises(ValueError, match="graphs must hold a calibration graph"):
        family_checks({"C6": nx.cycle_graph(6)}, stalk_dim=1)


# --- the un-transported resistance -----------------------------------------------------------


def test_untransported_resistance_of_an_orthogonal_bundle_follows_its_formula():
    """R̃_uv = (L⁺_uu + L⁺_vv)·I − L⁺_uv (A_uᵀA_v + A_vᵀA_u), so
    tr R̃_uv = d (L⁺_uu + L⁺_vv) − 2 L⁺_uv tr(A_uᵀA_v)."""
    g = nx.convert_node_labels_to_integers(nx.barbell_graph(4, 2))
    edge_index, n = graph(g)
    maps = random_orthogonal(n, D, generator(1))
    u, v = all_pairs(n)
    untransported = sheaf_effective_resistance(
        edge_index, node_maps=maps, pairs=torch.stack([u, v]), transport=False
    )
    pinv = graph_laplacian_pinv(g)
    overlap = maps[u].mT @ maps[v]
    eye = torch.eye(D, dtype=torch.float64)
    expected = (pinv[u, u] + pinv[v, v])[:, None, None] * eye - pinv[u, v][:, None, None] * (
        overlap + overlap.mT
    )
    torch.testing.assert_close(untransported, expected)
    trace = D * (pinv[u, u] + pinv[v, v]) - 2 * pinv[u, v] * torch.einsum("pii->p", overlap)
    torch.testing.assert_close(torch.einsum("pii->p", untransported), trace)
    transported = sheaf_effective_resistance(edge_index, node_maps=maps, pairs=torch.stack([u, v]))
    resistance = (pinv[u, u] + pinv[v, v] - 2 * pinv[u, v])[:, None, None] * eye
    torch.testing.assert_close(transported, resistance)  # R^F = R·I ...
    assert float((untransported - resistance).abs().max()) > 0.1  # ... but the maps move R̃


def test_untransported_resistance_of_identity_maps_is_the_graphs():
    g = nx.cycle_graph(7)
    g.add_edge(0, 3)
    edge_index, n = graph(g)
    pairs = all_pairs(n)
    graph_resistance = sheaf_effective_resistance(edge_index, num_nodes=n, pairs=pairs)[:, 0, 0]
    eye = torch.eye(D, dtype=torch.float64)
    identity = eye.expand(n, D, D)
    untransported = sheaf_effective_resistance(
        edge_index, node_maps=identity, pairs=pairs, transport=False
    )
    torch.testing.assert_close(untransported, graph_resistance[:, None, None] * eye)
    edge_identity = eye.expand(edge_index.size(1), D, D)  # identity maps on every edge
    on_edges = sheaf_effective_resistance(edge_index, edge_maps=edge_identity, transport=False)
    edge_resistance = sheaf_effective_resistance(edge_index, num_nodes=n)[:, 0, 0]
    torch.testing.assert_close(on_edges, edge_resistance[:, None, None] * eye)
    # general invertible flat maps move R̃, not R^F
    general = random_invertible(n, D, generator(2))
    moved = sheaf_effective_resistance(edge_index, node_maps=general, pairs=pairs, transport=False)
    assert float((moved - graph_resistance[:, None, None] * eye).abs().max()) > 0.1


def test_untransported_pairs_work_for_edge_maps_and_transported_ones_do_not():
    edge_index, _ = graph(nx.cycle_graph(5))
    edge_maps = random_orthogonal(edge_index.size(1), 2, generator())
    pairs = torch.tensor([[0], [2]])
    with pytest.raises(ValueError, match="flat bundle"):
        sheaf_effective_resistance(edge_index, edge_maps=edge_maps, pairs=pairs)
    untransported = sheaf_effective_resistance(
        edge_index, edge_maps=edge_maps, pairs=pairs, transport=False
    )
    assert untransported.shape == (1, 2, 2)
    assert bool(torch.isfinite(untransported).all())


def test_untransported_pairs_across_components_are_infinite():
    edge_index, n = graph(nx.disjoint_union(nx.cycle_graph(4), nx.path_graph(3)))
    maps = random_orthogonal(n, 2, generator())
    pairs = torch.tensor([[0, 0], [2, 5]])
    resistance = sheaf_effective_resistance(
        edge_index, node_maps=maps, pairs=pairs, transport=False
    )
    assert bool(torch.isfinite(resistance[0]).all())
    assert bool(torch.isinf(resistance[1]).all())


# --- identical output across thread counts ---------------------------------------------------


def test_theory_output_is_identical_across_thread_counts():
    """tree(2,4) with d = 3 (n·d = 93) is large enough for threaded LAPACK to change the last
    digits of the flat deviations, were the checks not run on one thread."""
    graphs = {"tree(2,3)": nx.balanced_tree(2, 3), "tree(2,4)": nx.balanced_tree(2, 4)}
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = family_checks(graphs, stalk_dim=D, seed=0)
        torch.set_num_threads(2)
        two = family_checks(graphs, stalk_dim=D, seed=0)
        assert torch.get_num_threads() == 2  # one_thread restores the caller's count
    finally:
        torch.set_num_threads(threads)
    assert one == two


def test_one_thread_restores_the_thread_count_after_an_error():
    threads = torch.get_num_threads()
    inside = []

    def fails() -> None:
        with one_thread():
            inside.append(torch.get_num_threads())
            raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        fails()
    assert inside == [1]
    assert torch.get_num_threads() == threads


def test_round_significant_keeps_ten_digits_in_nested_values():
    rounded = round_significant({"a": [1.23456789012345, np.float64(2.0 / 3)], "b": 7, "c": "x"})
    assert rounded == {"a": [1.23456789, 0.6666666667], "b": 7, "c": "x"}
    assert round_significant(float("inf")) == float("inf")


def test_vectorised_jacobian_sensitivity_matches_the_loop():
    edge_index, n = graph(nx.cycle_graph(6))
    torch.manual_seed(0)
    model = SheafDiffusionNet(4, 4, sheaf="flat", stalk_dim=2, channels=2, num_layers=3).double()
    x = torch.randn(n, 4, generator=generator(), dtype=torch.float64)
    loop = jacobian_sensitivity(lambda inputs: model(inputs, edge_index), x)
    batched = jacobian_sensitivity(lambda inputs: model(inputs, edge_index), x, vectorize=True)
    torch.testing.assert_close(batched, loop)


# --- the cached edge-index validation -------------------------------------------------------


@pytest.fixture
def validations(monkeypatch) -> list[int]:
    """Counts the uncached validations (each sorts all edges)."""
    calls: list[int] = []
    validate = sheaf._validate_edge_index

    def counting(edge_index, *args):
        calls.append(edge_index.size(1))
        return validate(edge_index, *args)

    monkeypatch.setattr(sheaf, "_validate_edge_index", counting)
    return calls


def test_a_second_check_of_the_same_tensor_does_not_validate_again(validations):
    edge_index, n = graph(nx.cycle_graph(6))
    first = check_edge_index(edge_index, n)
    second = check_edge_index(edge_index, n)
    assert second is first
    assert len(validations) == 1
    torch.testing.assert_close(edge_index[:, first], edge_index.flip(0))
    check_edge_index(edge_index, n + 1)  # another num_nodes is another verdict
    check_edge_index(edge_index, n, self_loops=True)
    assert len(validations) == 3


def test_a_new_tensor_with_the_same_values_is_validated(validations):
    edge_index, n = graph(nx.cycle_graph(6))
    first = check_edge_index(edge_index, n)
    copy = edge_index.clone()
    torch.testing.assert_close(check_edge_index(copy, n), first)
    assert len(validations) == 2


def test_an_in_place_edit_invalidates_the_cached_validation(validations):
    edge_index, n = graph(nx.cycle_graph(6))
    check_edge_index(edge_index, n)
    edge_index[1, 0] = (int(edge_index[1, 0]) + 2) % n  # one direction of an edge moved
    with pytest.raises(ValueError, match="both directions"):
        check_edge_index(edge_index, n)
    edge_index[0, 0] = 99
    with pytest.raises(ValueError, match="outside"):
        check_edge_index(edge_index, n)
    assert len(validations) == 3


def test_the_cache_is_small_and_forgets_freed_tensors(validations):
    kept = [graph(nx.cycle_graph(k))[0] for k in range(3, 3 + 2 * EDGE_INDEX_CACHE_SIZE)]
    for edge_index in kept:
        check_edge_index(edge_index, edge_index.size(1))
    assert len(sheaf._validated_edge_indices) <= EDGE_INDEX_CACHE_SIZE
    before = len(sheaf._validated_edge_indices)
    del kept, edge_index
    assert len(sheaf._validated_edge_indices) < before


def test_inference_tensors_are_validated_every_time(validations):
    with torch.inference_mode():
        edge_index, n = graph(nx.cycle_graph(5))
        edge_index = edge_index.clone()
        check_edge_index(edge_index, n)
        check_edge_index(edge_index, n)
    assert len(validations) == 2


def test_the_plain_graph_control_has_the_orthogonal_flat_bundles_sensitivity():
    """The claims' "graph" control reads the orthogonal flat bundle's numbers: identity maps (the
    plain graph) give the same diffusion sensitivity on every pair."""
    g = nx.barbell_graph(5, 2)
    edge_index, n = graph(g)
    orthogonal = random_orthogonal(n, D, generator(0))
    identity = torch.eye(D, dtype=torch.float64).expand(n, -1, -1)
    steps = 2 * nx.diameter(g)
    flat = diffusion_sensitivity(sheaf_laplacian(edge_index, node_maps=orthogonal), n, steps)
    plain = diffusion_sensitivity(sheaf_laplacian(edge_index, node_maps=identity), n, steps)
    torch.testing.assert_close(flat, plain, rtol=1e-12, atol=1e-14)


def test_the_non_flat_control_diffuses_like_the_flat_bundle_on_a_tree_only():
    """The claims' "non_flat" control: per-edge orthogonal maps are a flat bundle on a tree (no
    cycle to carry holonomy), so their diffusion sensitivity is the orthogonal flat bundle's
    there; on a cycle the maps do not cancel and the sensitivity moves."""
    tree, cycle = check_graph(nx.balanced_tree(2, 3), stalk_dim=D), check_graph(nx.cycle_graph(7))
    flat, non_flat = (
        tree["sensitivity_times_resistance"][k] for k in ("linear", "linear_non_flat")
    )
    assert non_flat == pytest.approx(flat, rel=1e-9)
    assert tree["spearman_linear_non_flat"] == tree["spearman_linear"]
    products = cycle["sensitivity_times_resistance"]
    assert products["linear_non_flat"]["min"] < 0.99 * products["linear"]["min"]  # the far pairs
