"""Numerical checks of the theory on small graphs: sheaf effective resistance against Jacobian
sensitivity, and which sheaves can move resistance at all.

For each graph family this measures
- ``max|R^F − R·I|`` for a random orthogonal flat bundle, a random general invertible flat bundle,
  and, as a control, random per-edge orthogonal maps (NSD's non-flat bundle, edges only);
- Spearman's ρ between R_uv (all node pairs) and the sensitivity S_uv of linear sheaf diffusion
  Σ_{ℓ<L}(I − αL_F)^ℓ with L = 2·diameter, for the orthogonal flat bundle (whose block norms are
  √d times the graph's: the graph-level relation) and for the general invertible one (where the
  maps distort the diffusion while R^F stays R·I), and of a randomly initialised (nonlinear)
  FlatNSD stack of L layers through autograd Jacobians.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import networkx as nx
import numpy as np
import torch
from scipy.stats import spearmanr
from torch import Tensor
from torch_geometric.utils import from_networkx

from mixlab.graphs.flatnsd.layers import SheafDiffusionNet
from mixlab.graphs.flatnsd.maps import cayley, skew_symmetric
from mixlab.graphs.flatnsd.sheaf import (
    diffusion_sensitivity,
    jacobian_sensitivity,
    sheaf_effective_resistance,
    sheaf_laplacian,
)


def _connected_er(n: int, p: float, seed: int) -> nx.Graph:
    for attempt in range(1000):
        graph = nx.erdos_renyi_graph(n, p, seed=seed + attempt)
        if nx.is_connected(graph):
            return graph
    raise RuntimeError("no connected Erdős–Rényi graph found")  # pragma: no cover


GRAPH_FAMILIES: dict[str, Callable[[int], nx.Graph]] = {
    "ring": lambda seed: nx.cycle_graph(20),
    "barbell": lambda seed: nx.barbell_graph(8, 4),
    "tree": lambda seed: nx.balanced_tree(2, 4),
    "grid": lambda seed: nx.grid_2d_graph(5, 5),
    "random": lambda seed: _connected_er(30, 0.12, seed),
}


def random_orthogonal(n: int, d: int, generator: torch.Generator) -> Tensor:
    params = torch.randn(n, d * (d - 1) // 2, generator=generator, dtype=torch.float64)
    return cayley(skew_symmetric(2.0 * params, d))


def random_invertible(n: int, d: int, generator: torch.Generator) -> Tensor:
    return torch.linalg.matrix_exp(torch.randn(n, d, d, generator=generator, dtype=torch.float64))


def _spearman(resistance: Tensor, sensitivity: Tensor) -> float:
    upper = torch.triu_indices(resistance.size(0), resistance.size(0), offset=1)
    r = resistance[upper[0], upper[1]].numpy()
    s = sensitivity[upper[0], upper[1]].numpy()
    return float(spearmanr(r, s).statistic)


def check_graph(graph: nx.Graph, *, stalk_dim: int = 3, seed: int = 0) -> dict[str, Any]:
    """All the measurements above for one graph."""
    graph = nx.convert_node_labels_to_integers(graph)
    n = graph.number_of_nodes()
    edge_index = from_networkx(graph).edge_index
    generator = torch.Generator().manual_seed(seed)
    all_pairs = torch.cartesian_prod(torch.arange(n), torch.arange(n)).T
    graph_resistance = sheaf_effective_resistance(edge_index, num_nodes=n, pairs=all_pairs)
    graph_resistance = graph_resistance[:, 0, 0].view(n, n)
    eye = torch.eye(stalk_dim, dtype=torch.float64)

    def flat_deviation(node_maps: Tensor) -> float:
        resistance = sheaf_effective_resistance(edge_index, node_maps=node_maps, pairs=all_pairs)
        expected = graph_resistance.reshape(-1)[:, None, None] * eye
        return float((resistance - expected).abs().max())

    orthogonal = random_orthogonal(n, stalk_dim, generator)
    general = random_invertible(n, stalk_dim, generator)
    edge_maps = random_orthogonal(edge_index.size(1), stalk_dim, generator)
    edge_resistance = sheaf_effective_resistance(edge_index, edge_maps=edge_maps)
    graph_edge_resistance = graph_resistance[edge_index[1], edge_index[0]]
    non_flat_deviation = float(
        (edge_resistance - graph_edge_resistance[:, None, None] * eye).abs().max()
    )

    steps = 2 * nx.diameter(graph)
    laplacian = sheaf_laplacian(edge_index, node_maps=orthogonal).to_dense()
    linear = diffusion_sensitivity(laplacian, n, steps)
    general_laplacian = sheaf_laplacian(edge_index, node_maps=general).to_dense()
    linear_general = diffusion_sensitivity(general_laplacian, n, steps)

    torch.manual_seed(seed)
    model = SheafDiffusionNet(
        4, 4, sheaf="flat", stalk_dim=stalk_dim, channels=4, num_layers=steps, edge_weights=False
    ).double()
    model.eval()
    x = torch.randn(n, 4, generator=generator, dtype=torch.float64)
    nonlinear = jacobian_sensitivity(lambda inputs: model(inputs, edge_index), x)
    return {
        "nodes": n,
        "edges": graph.number_of_edges(),
        "steps": steps,
        "orthogonal_flat_deviation": flat_deviation(orthogonal),
        "general_flat_deviation": flat_deviation(general),
        "non_flat_deviation": non_flat_deviation,
        "spearman_linear": _spearman(graph_resistance, linear),
        "spearman_linear_general": _spearman(graph_resistance, linear_general),
        "spearman_nonlinear": _spearman(graph_resistance, nonlinear),
        "total_resistance": float(torch.triu(graph_resistance, 1).sum()),
    }


def theory_checks(*, stalk_dim: int = 3, seed: int = 0) -> dict[str, dict[str, Any]]:
    """:func:`check_graph` on every family of :data:`GRAPH_FAMILIES`."""
    return {
        name: check_graph(build(seed), stalk_dim=stalk_dim, seed=seed)
        for name, build in GRAPH_FAMILIES.items()
    }


def summary(checks: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Worst cases over the families."""
    values = {
        key: np.array([c[key] for c in checks.values()]) for key in next(iter(checks.values()))
    }
    return {
        "max_orthogonal_flat_deviation": float(values["orthogonal_flat_deviation"].max()),
        "max_general_flat_deviation": float(values["general_flat_deviation"].max()),
        "min_non_flat_deviation": float(values["non_flat_deviation"].min()),
        "worst_spearman_linear": float(values["spearman_linear"].max()),
        "worst_spearman_linear_general": float(values["spearman_linear_general"].max()),
        "worst_spearman_nonlinear": float(values["spearman_nonlinear"].max()),
    }


def json_ready(value: Any) -> Any:
    """``value`` with NaN and infinity as None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(item) for item in value]
    return value
