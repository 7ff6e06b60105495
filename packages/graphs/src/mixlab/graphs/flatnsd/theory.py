"""Numerical checks of the theory on small graphs: sheaf effective resistance against Jacobian
sensitivity, and which sheaves can move resistance at all.

Every family of :data:`GRAPH_FAMILIES` has several graphs; the first calibrates the bound, the
others are held out. For each graph this measures
- ``max|R^F − R·I|`` for a random orthogonal flat bundle, a random general invertible flat bundle,
  and, as a control, random per-edge orthogonal maps (NSD's non-flat bundle, edges only);
- the sensitivity S_uv of linear sheaf diffusion Σ_{ℓ<L}(I − αL_F)^ℓ with L = 2·diameter, for the
  orthogonal flat bundle (whose block norms are √d times the plain graph's: a graph-level check),
  for the general invertible one (where the maps distort the diffusion while R^F stays R·I) and,
  as the control, for the non-flat per-edge bundle above, and of a randomly initialised
  (nonlinear) FlatNSD stack of L layers through autograd Jacobians;
- Spearman's ρ between R_uv and each S_uv with ties handled (:func:`tied_spearman`), and the
  spread max/min of S·R, over all ordered pairs u ≠ v;
- the un-transported resistance R̃ (``sheaf_effective_resistance(..., transport=False)``), under
  which node maps do matter: ``max|R̃ − R·I|`` for each bundle and for identity maps, and ρ between
  tr R̃/d and the bundle's sensitivity.

The claim "resistance is inversely proportional to sensitivity" is checked as a bound
S_uv ≤ c/R_uv, with c fitted per family on the calibration graph (:func:`fit_bound`) and tested on
the held-out graphs (:func:`evaluate_bound`).

The output does not depend on the caller's thread count: each graph is measured on one thread
(:func:`one_thread`), and every reported float is rounded to :data:`SIGNIFICANT_DIGITS`
significant digits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import networkx as nx
import numpy as np
import torch
from scipy.stats import rankdata
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

SIGNIFICANT_DIGITS = 10
"""significant digits of every reported float (float64 sums differ across thread counts in the
last few of ~16)"""

TIE_TOLERANCE = 1e-9
"""relative gap below which two values are tied for Spearman's ρ"""

BOUND_TOLERANCE = 1e-9
"""relative slack of the bound: a pair violates it when S·R > c·(1 + BOUND_TOLERANCE)"""

SENSITIVITIES = ("linear", "linear_general", "nonlinear", "linear_non_flat")
"""the sensitivities S measured on every graph: linear diffusion on the orthogonal flat bundle
(graph-level), on the general invertible flat bundle, a nonlinear FlatNSD stack, and, as the
control, linear diffusion on the non-flat bundle (random per-edge orthogonal maps), each against
the same resistance R (a non-flat sheaf has no transport between non-adjacent stalks, so R, every
flat bundle's sheaf resistance on the graph, is the resistance the control is read against)"""


def _connected_er(n: int, p: float, seed: int) -> nx.Graph:
    for attempt in range(1000):
        graph = nx.erdos_renyi_graph(n, p, seed=seed + attempt)
        if nx.is_connected(graph):
            return graph
    raise RuntimeError("no connected Erdős–Rényi graph found")  # pragma: no cover


ER_SEED_STRIDE = 1000
"""the k-th random graph draws from seed + k·ER_SEED_STRIDE on: :func:`_connected_er` tries up to
1000 consecutive seeds, so the graphs of one family never share a draw"""

GRAPH_FAMILIES: dict[str, Callable[[int], dict[str, nx.Graph]]] = {
    "ring": lambda seed: {f"C{n}": nx.cycle_graph(n) for n in (12, 16, 20, 24)},
    "barbell": lambda seed: {
        f"barbell({m},{k})": nx.barbell_graph(m, k) for m, k in ((6, 2), (8, 4), (10, 3))
    },
    "tree": lambda seed: {
        f"tree({r},{h})": nx.balanced_tree(r, h) for r, h in ((2, 3), (2, 4), (3, 3))
    },
    "grid": lambda seed: {
        f"grid({a}x{b})": nx.grid_2d_graph(a, b) for a, b in ((4, 4), (5, 5), (4, 6))
    },
    "random": lambda seed: {
        f"ER(30,0.12)#{k}": _connected_er(30, 0.12, seed + k * ER_SEED_STRIDE) for k in range(4)
    },
}
"""family → (seed → named graphs); the first graph of a family calibrates its bound"""


def random_orthogonal(n: int, d: int, generator: torch.Generator) -> Tensor:
    params = torch.randn(n, d * (d - 1) // 2, generator=generator, dtype=torch.float64)
    return cayley(skew_symmetric(2.0 * params, d))


def random_invertible(n: int, d: int, generator: torch.Generator) -> Tensor:
    return torch.linalg.matrix_exp(torch.randn(n, d, d, generator=generator, dtype=torch.float64))


def round_significant(value: Any, digits: int = SIGNIFICANT_DIGITS) -> Any:
    """``value`` with every float (also inside dicts, lists and tuples) rounded to ``digits``
    significant digits; NaN and infinities stay as they are."""
    if isinstance(value, float | np.floating):
        return float(f"{float(value):.{digits - 1}e}")
    if isinstance(value, dict):
        return {key: round_significant(item, digits) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [round_significant(item, digits) for item in value]
    return value


def tied_ranks(values: np.ndarray, rtol: float = TIE_TOLERANCE) -> np.ndarray:
    """Average ranks (scipy's ``rankdata(..., "average")``) of ``values`` in which neighbours in
    sorted order closer than ``rtol`` (relative) are tied.

    On symmetric graphs many pairs have the same R or S in exact arithmetic but differ in the last
    bits of float64, so plain ranks order them by rounding noise, which changes with the thread
    count. Grouping by gaps rather than rounding to fixed digits keeps equal values together even
    where they straddle a rounding boundary; distinct values closer than ``rtol`` chain into one
    tie.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return values
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    scale = np.maximum(np.abs(ordered[1:]), np.abs(ordered[:-1]))
    new_group = np.diff(ordered) > rtol * scale
    group = np.empty(values.size, dtype=np.int64)
    group[order] = np.concatenate([[0], np.cumsum(new_group)])
    return rankdata(group, method="average")


def tied_spearman(x: np.ndarray, y: np.ndarray, rtol: float = TIE_TOLERANCE) -> float:
    """Spearman's ρ: Pearson's correlation of the :func:`tied_ranks` of ``x`` and ``y``. NaN when
    either is constant. Ranks, their mean and the centred products are multiples of 1/4, summed
    exactly in float64, so ρ does not depend on the order of the sums, and inputs that differ
    only below ``rtol`` give the same ρ."""
    x_ranks, y_ranks = tied_ranks(x, rtol), tied_ranks(y, rtol)
    if x_ranks.size < 2 or np.ptp(x_ranks) == 0 or np.ptp(y_ranks) == 0:
        return math.nan
    return float(np.corrcoef(x_ranks, y_ranks)[0, 1])


def fit_bound(products: np.ndarray) -> float:
    """The smallest c with S_uv ≤ c / R_uv on a calibration graph: max over its pairs of S·R."""
    return float(np.max(products))


def evaluate_bound(c: float, products: np.ndarray, tol: float = BOUND_TOLERANCE) -> dict[str, Any]:
    """How a graph's pairs (their S·R) meet S ≤ c/R: the pairs above c·(1 + tol), their share
    and the worst ratio max(S·R)/c (> 1 where the bound fails)."""
    violating = int(np.sum(products > c * (1.0 + tol)))
    return {
        "pairs": int(products.size),
        "violating_pairs": violating,
        "violation_share": violating / products.size,
        "worst_ratio": float(np.max(products)) / c,
    }


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch (and the BLAS/LAPACK it calls) on one thread, restoring the thread count after.

    The deviations max|R^F − R·I| are zero in exact arithmetic; what is measured is float64
    rounding noise (~1e-13), whose digits change with the order of the sums in the
    eigendecomposition, and so with the thread count from n·d ≈ 90 on. The theory's matrices
    (n·d ≤ 120) gain nothing from threads. The thread count is process-wide: torch work on other
    Python threads meanwhile runs on one thread too.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _product_statistics(products: np.ndarray) -> dict[str, float]:
    low, high = float(np.min(products)), float(np.max(products))
    return {"min": low, "max": high, "spread": high / low if low > 0 else math.inf}


def _measure(
    graph: nx.Graph, stalk_dim: int, seed: int
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The measurements of one graph (unrounded) and S·R over its ordered pairs u ≠ v for every
    kind of :data:`SENSITIVITIES`."""
    graph = nx.convert_node_labels_to_integers(graph)
    n = graph.number_of_nodes()
    edge_index = from_networkx(graph).edge_index
    generator = torch.Generator().manual_seed(seed)
    all_pairs = torch.cartesian_prod(torch.arange(n), torch.arange(n)).T
    off_diagonal = ~torch.eye(n, dtype=torch.bool)
    graph_resistance = sheaf_effective_resistance(edge_index, num_nodes=n, pairs=all_pairs)
    graph_resistance = graph_resistance[:, 0, 0].view(n, n)
    eye = torch.eye(stalk_dim, dtype=torch.float64)
    expected = graph_resistance.reshape(-1)[:, None, None] * eye

    def resistance(node_maps: Tensor, transport: bool = True) -> Tensor:
        return sheaf_effective_resistance(
            edge_index, node_maps=node_maps, pairs=all_pairs, transport=transport
        )

    def deviation(resistances: Tensor) -> float:
        return float((resistances - expected).abs().max())

    def spearman(x: Tensor, y: Tensor) -> float:
        return tied_spearman(x[off_diagonal].numpy(), y[off_diagonal].numpy())

    orthogonal = random_orthogonal(n, stalk_dim, generator)
    general = random_invertible(n, stalk_dim, generator)
    edge_maps = random_orthogonal(edge_index.size(1), stalk_dim, generator)
    edge_resistance = sheaf_effective_resistance(edge_index, edge_maps=edge_maps)
    graph_edge_resistance = graph_resistance[edge_index[1], edge_index[0]]
    non_flat_deviation = float(
        (edge_resistance - graph_edge_resistance[:, None, None] * eye).abs().max()
    )

    steps = 2 * nx.diameter(graph)
    sensitivity = {
        "linear": diffusion_sensitivity(
            sheaf_laplacian(edge_index, node_maps=orthogonal), n, steps
        ),
        "linear_general": diffusion_sensitivity(
            sheaf_laplacian(edge_index, node_maps=general), n, steps
        ),
        "nonlinear": _flatnsd_sensitivity(edge_index, n, stalk_dim, steps, seed, generator),
        "linear_non_flat": diffusion_sensitivity(
            sheaf_laplacian(edge_index, edge_maps=edge_maps), n, steps
        ),
    }
    untransported = resistance(orthogonal, transport=False)
    untransported_general = resistance(general, transport=False)

    def trace_per_dim(resistances: Tensor) -> Tensor:
        return torch.einsum("pii->p", resistances).view(n, n) / stalk_dim

    products = {
        kind: (s * graph_resistance)[off_diagonal].numpy() for kind, s in sensitivity.items()
    }
    measured = {
        "nodes": n,
        "edges": graph.number_of_edges(),
        "steps": steps,
        "orthogonal_flat_deviation": deviation(resistance(orthogonal)),
        "general_flat_deviation": deviation(resistance(general)),
        "non_flat_deviation": non_flat_deviation,
        **{f"spearman_{kind}": spearman(graph_resistance, s) for kind, s in sensitivity.items()},
        "untransported_deviation": deviation(untransported),
        "untransported_general_deviation": deviation(untransported_general),
        "untransported_identity_deviation": deviation(resistance(eye.expand(n, -1, -1), False)),
        "spearman_untransported_linear": spearman(
            trace_per_dim(untransported), sensitivity["linear"]
        ),
        "spearman_untransported_linear_general": spearman(
            trace_per_dim(untransported_general), sensitivity["linear_general"]
        ),
        "sensitivity_times_resistance": {
            kind: _product_statistics(p) for kind, p in products.items()
        },
        "total_resistance": float(torch.triu(graph_resistance, 1).sum()),
    }
    return measured, products


def _flatnsd_sensitivity(
    edge_index: Tensor, n: int, stalk_dim: int, steps: int, seed: int, generator: torch.Generator
) -> Tensor:
    """Jacobian sensitivity of a randomly initialised FlatNSD stack of ``steps`` layers (weights
    from ``seed``, without touching the global random state)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SheafDiffusionNet(
            4,
            4,
            sheaf="flat",
            stalk_dim=stalk_dim,
            channels=4,
            num_layers=steps,
            edge_weights=False,
        ).double()
    model.eval()
    x = torch.randn(n, 4, generator=generator, dtype=torch.float64)
    return jacobian_sensitivity(lambda inputs: model(inputs, edge_index), x, vectorize=True)


def check_graph(graph: nx.Graph, *, stalk_dim: int = 3, seed: int = 0) -> dict[str, Any]:
    """All the measurements above for one graph, rounded (:func:`round_significant`).

    ``sensitivity_times_resistance[kind]`` holds min, max and spread (max/min) of S·R over the
    ordered pairs u ≠ v; the other entries are numbers (see the module docstring)."""
    with one_thread():
        measured, _ = _measure(graph, stalk_dim, seed)
    return round_significant(measured)


def family_checks(
    graphs: dict[str, nx.Graph], *, stalk_dim: int = 3, seed: int = 0
) -> dict[str, Any]:
    """:func:`check_graph` on every graph, and the bound S ≤ c/R fitted on the first graph and
    tested on the others:

        {"graphs": {name: check_graph dict},
         "bound": {kind: {"calibration": name, "c": c,
                          "held_out": {name: evaluate_bound dict}, "violating": [names]}}}

    for every kind of :data:`SENSITIVITIES`.

    The fit takes c from one graph, so c absorbs every overall scale of S there: the step size
    α = 1/(2·max block degree), the number of steps L = 2·diameter (S grows with L), the random
    bundle's maps (a general invertible bundle's singular values stretch S; an orthogonal one
    only multiplies it by √d) and the nonlinear stack's random weights (drawn anew per graph, as
    its depth L differs). The spread max/min of S·R and Spearman's ρ are blind to such a scale
    within one graph; the held-out violation share and worst ratio are not: they compare S·R
    across graphs, so a held-out graph with a larger L, α or bundle gain fails the bound even
    where S ∝ 1/R holds within every graph.
    """
    if len(graphs) < 2:
        raise ValueError(
            f"graphs must hold a calibration graph and at least one held-out graph, got "
            f"{len(graphs)}"
        )
    with one_thread():
        measured = {name: _measure(graph, stalk_dim, seed) for name, graph in graphs.items()}
    calibration, *held_out = measured
    bound = {}
    for kind in SENSITIVITIES:
        c = fit_bound(measured[calibration][1][kind])
        tested = {name: evaluate_bound(c, measured[name][1][kind]) for name in held_out}
        bound[kind] = {
            "calibration": calibration,
            "c": c,
            "held_out": tested,
            "violating": [name for name, t in tested.items() if t["violating_pairs"]],
        }
    checks = {"graphs": {name: m[0] for name, m in measured.items()}, "bound": bound}
    return round_significant(checks)


def theory_checks(*, stalk_dim: int = 3, seed: int = 0) -> dict[str, dict[str, Any]]:
    """:func:`family_checks` on every family of :data:`GRAPH_FAMILIES`:
    ``{family: {"graphs": {name: {...}}, "bound": {kind: {...}}}}``."""
    return {
        family: family_checks(build(seed), stalk_dim=stalk_dim, seed=seed)
        for family, build in GRAPH_FAMILIES.items()
    }


def summary(checks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Worst cases over all graphs of all families of :func:`theory_checks`' output.

    Deviations and Spearman's ρ are the worst over every graph (ρ: the largest, the weakest
    anti-correlation); ``min_non_flat_deviation`` runs over graphs with a cycle (on a tree every
    sheaf is flat). For each kind k of :data:`SENSITIVITIES`, ``bound_{k}_violation_share`` is
    violating held-out pairs over all held-out pairs, ``bound_{k}_worst_ratio`` the largest
    max(S·R)/c of a held-out graph, ``bound_{k}_max_spread`` the largest max(S·R)/min(S·R) of any
    graph and ``bound_{k}_violating`` the held-out graphs with a violation, as "family/graph".
    """
    graphs = [g for family in checks.values() for g in family["graphs"].values()]

    def values(key: str, among: list[dict[str, Any]] = graphs) -> np.ndarray:
        return np.array([g[key] for g in among], dtype=np.float64)

    cyclic = [g for g in graphs if g["edges"] >= g["nodes"]]
    worst: dict[str, Any] = {
        "max_orthogonal_flat_deviation": float(values("orthogonal_flat_deviation").max()),
        "max_general_flat_deviation": float(values("general_flat_deviation").max()),
        "min_non_flat_deviation": float(values("non_flat_deviation", cyclic).min())
        if cyclic
        else math.nan,
        **{f"worst_spearman_{k}": float(values(f"spearman_{k}").max()) for k in SENSITIVITIES},
    }
    for kind in SENSITIVITIES:
        bounds = {family: checks[family]["bound"][kind] for family in checks}
        tested = [t for b in bounds.values() for t in b["held_out"].values()]
        pairs = sum(t["pairs"] for t in tested)
        worst[f"bound_{kind}_violation_share"] = (
            sum(t["violating_pairs"] for t in tested) / pairs if pairs else math.nan
        )
        worst[f"bound_{kind}_worst_ratio"] = max(
            (t["worst_ratio"] for t in tested), default=math.nan
        )
        worst[f"bound_{kind}_max_spread"] = max(
            g["sensitivity_times_resistance"][kind]["spread"] for g in graphs
        )
        worst[f"bound_{kind}_violating"] = [
            f"{family}/{name}" for family, b in bounds.items() for name in b["violating"]
        ]
    worst["min_untransported_deviation"] = float(values("untransported_deviation").min())
    worst["max_untransported_identity_deviation"] = float(
        values("untransported_identity_deviation").max()
    )
    worst["worst_spearman_untransported"] = float(
        np.concatenate(
            [
                values("spearman_untransported_linear"),
                values("spearman_untransported_linear_general"),
            ]
        ).max()
    )
    return round_significant(worst)


def json_ready(value: Any) -> Any:
    """``value`` with NaN and infinity as None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(item) for item in value]
    return value
