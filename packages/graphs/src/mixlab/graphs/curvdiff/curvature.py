"""Ricci curvature of graph edges and the per-graph descriptor c(G) (spec §1a, "Structural signals").

CurvDiff reads a graph's geometry from two discrete Ricci curvatures, computed once per graph:

- Ollivier–Ricci, κ(u,v) = 1 − W₁(m_u, m_v) / d(u,v), with the lazy walk
  m_u = α·δ_u + (1−α)/deg(u)·Σ_{w∼u} δ_w, d the hop distance and W₁ solved exactly by POT's
  ``ot.emd2``. α = 0.5 is GraphRicciCurvature's default; with it K8 has mean κ = 0.571 and the
  10×10 grid 0.022 (the spec's sanity values, checked in the tests). κ < 0 marks tree-like,
  bottleneck edges (hyperbolic), κ > 0 dense communities (spherical), κ ≈ 0 grids (flat): the
  signal the encoder's H/S/E gating is trained on.
- augmented Forman (triangles as 2-cells, unweighted), F(u,v) = 4 − d_u − d_v + 3·t_uv: a cheap
  combinatorial companion, exact from degrees and triangle counts.

Node curvature is the mean over incident edges; c(G) (:func:`curvature_descriptor`) conditions the
denoiser. Values are per *directed* entry of a PyG ``edge_index`` that holds both directions; each
undirected edge is solved once and its value copied to both entries.

    >>> data = AddRicciCurvature()(data)   # edge_curvature, edge_forman, node_curvature, ...
    >>> graphs = with_curvature(graphs)    # the same, on every graph not yet annotated
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

from mixlab.shared.config import require
from mixlab.shared.progress_report import progress

DESCRIPTOR_DIM = 15
"""length of c(G): 10 histogram bins, mean κ, std κ, mean F/(2·d_max), n, |E|/n"""
HISTOGRAM_BINS = 10
CURVATURE_KEYS = ("edge_curvature", "edge_forman", "node_curvature", "node_forman")
"""the attributes whose presence marks a graph as annotated (:func:`with_curvature`)"""


def _undirected(edge_index: Tensor, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """The undirected edges (u < v) [M, 2] and, for each directed entry, its row in them [E].
    An index outside [0, num_nodes) is refused (it used to wrap into another node's edge)."""
    require(
        edge_index.dim() == 2 and edge_index.shape[0] == 2, "edge_index", "a [2, E] tensor",
        tuple(edge_index.shape),
    )  # fmt: skip
    ei = edge_index.detach().cpu().numpy().astype(np.int64, copy=False)
    require(
        ei.size == 0 or (ei.min() >= 0 and ei.max() < num_nodes), "edge_index",
        f"node indices in [0, num_nodes={num_nodes})",
        f"indices from {ei.min()} to {ei.max()}" if ei.size else "none",
    )  # fmt: skip
    lo, hi = np.minimum(ei[0], ei[1]), np.maximum(ei[0], ei[1])
    keys, inverse = np.unique(lo * max(num_nodes, 1) + hi, return_inverse=True)
    pairs = np.stack([keys // max(num_nodes, 1), keys % max(num_nodes, 1)], axis=1)
    return pairs, inverse.reshape(-1)


def _adjacency(pairs: np.ndarray, num_nodes: int) -> csr_matrix:
    """Binary symmetric adjacency (self-loops dropped) as CSR, from undirected pairs."""
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    rows = np.concatenate([pairs[:, 0], pairs[:, 1]])
    cols = np.concatenate([pairs[:, 1], pairs[:, 0]])
    ones = np.ones(len(rows), dtype=np.float64)
    adj = csr_matrix((ones, (rows, cols)), shape=(num_nodes, num_nodes))
    adj.data[:] = 1.0  # duplicates summed above
    return adj


def ollivier_ricci(edge_index: Tensor, num_nodes: int, alpha: float = 0.5) -> Tensor:
    """Ollivier–Ricci curvature κ(u,v) = 1 − W₁(m_u, m_v)/d(u,v) of every edge entry (spec §1a).

    m_u puts α on u and (1−α)/deg(u) on each neighbour. Hop distances come from one all-pairs
    BFS per graph; W₁ is the exact transport (``ot.emd2``) from the support of m_u to that of m_v,
    which is the union-support problem with the zero-mass rows and columns left out. Nodes in
    other components never enter a cost matrix, so disconnected graphs are fine.

    Args:
        edge_index: [2, E] with both directions of each edge.
        num_nodes: n (isolated nodes allowed).
        alpha: laziness α ∈ [0, 1) of the walk (default: 0.5, GraphRicciCurvature's).

    Returns:
        [E] float32, equal on (u, v) and (v, u).
    """
    import ot  # here, not at the top: POT pulls in scikit-learn and pandas (seconds)

    require(0.0 <= alpha < 1.0, "alpha", "a number in [0, 1)", alpha)
    if edge_index.numel() == 0:
        return torch.zeros(0)
    pairs, inverse = _undirected(edge_index, num_nodes)
    adj = _adjacency(pairs, num_nodes)
    dist = shortest_path(adj, method="D", directed=False, unweighted=True)
    indptr, indices = adj.indptr, adj.indices
    closed = [np.concatenate([[u], indices[indptr[u] : indptr[u + 1]]]) for u in range(num_nodes)]
    walk = [
        np.concatenate([[alpha], np.full(len(c) - 1, (1.0 - alpha) / max(len(c) - 1, 1))])
        for c in closed
    ]
    kappa = np.zeros(len(pairs))
    for k, (u, v) in enumerate(pairs):
        if u == v:  # a self-loop entry: no curvature
            continue
        cost = dist[np.ix_(closed[u], closed[v])]
        kappa[k] = 1.0 - ot.emd2(walk[u], walk[v], cost) / dist[u, v]
    return torch.from_numpy(kappa[inverse]).float()


def forman_curvature(edge_index: Tensor, num_nodes: int) -> Tensor:
    """Augmented Forman curvature F(u,v) = 4 − d_u − d_v + 3·t_uv of every edge entry (spec §1a).

    t_uv = (A²)_uv counts the triangles on the edge. Returns [E] float32.
    """
    if edge_index.numel() == 0:
        return torch.zeros(0)
    pairs, inverse = _undirected(edge_index, num_nodes)
    adj = _adjacency(pairs, num_nodes)
    deg = np.asarray(adj.sum(axis=1)).ravel()
    u, v = pairs[:, 0], pairs[:, 1]
    triangles = np.asarray((adj @ adj)[u, v]).ravel()
    forman = 4.0 - deg[u] - deg[v] + 3.0 * triangles
    forman[u == v] = 0.0
    return torch.from_numpy(forman[inverse]).float()


def node_curvature(edge_index: Tensor, num_nodes: int, edge_values: Tensor) -> Tensor:
    """κ(v) = mean of the values on v's incident edge entries (spec §1a); 0 on isolated nodes.

    Args:
        edge_index: [2, E], both directions present (each edge counts once per endpoint).
        edge_values: [E].

    Returns:
        [n], the dtype of ``edge_values``.
    """
    row = edge_index[0]
    total = torch.zeros(num_nodes, dtype=edge_values.dtype).index_add_(0, row, edge_values)
    count = torch.zeros(num_nodes, dtype=edge_values.dtype).index_add_(
        0, row, torch.ones_like(edge_values)
    )
    return total / count.clamp(min=1)


def curvature_descriptor(edge_index: Tensor, num_nodes: int, orc: Tensor, forman: Tensor) -> Tensor:
    """c(G) ∈ R^15 (spec §1a), the denoiser's FiLM condition.

    [0:10] histogram of κ on [−1, 1] (values outside clamped to the end bins; a pmf, zeros if the
    graph has no edges), [10] mean κ, [11] std κ (population), [12] mean F/(2·d_max) (0 without
    edges), [13] n, [14] |E|/n with |E| the undirected edge count. Directed entries count every
    edge twice, which leaves the pmf, mean and std unchanged.

    Returns:
        [1, 15] float32, one row per graph so that PyG batches them to [B, 15].
    """
    out = torch.zeros(1, DESCRIPTOR_DIM)
    num_entries = edge_index.size(1)
    out[0, 13] = float(num_nodes)
    out[0, 14] = num_entries / 2 / max(num_nodes, 1)
    if num_entries == 0:
        return out
    kappa = orc.detach().float().clamp(-1.0, 1.0)
    bins = ((kappa + 1.0) / 2.0 * HISTOGRAM_BINS).long().clamp(max=HISTOGRAM_BINS - 1)
    out[0, :HISTOGRAM_BINS] = torch.bincount(bins, minlength=HISTOGRAM_BINS).float() / num_entries
    out[0, 10] = orc.float().mean()
    out[0, 11] = orc.float().std(unbiased=False)
    deg_max = torch.bincount(edge_index[0], minlength=num_nodes).max().clamp(min=1)
    out[0, 12] = (forman.float() / (2.0 * deg_max)).mean()
    return out


class AddRicciCurvature(BaseTransform):
    """Annotate a graph with its Ricci curvatures, the structural signals CurvDiff conditions on.

    Writes ``edge_curvature`` [E] (Ollivier–Ricci), ``edge_forman`` [E], ``node_curvature`` [n]
    and ``node_forman`` [n] (incident means) and ``curvature_descriptor`` [1, 15] (c(G)), all
    float32; reads only ``edge_index`` (undirected, both directions) and ``num_nodes``.

        >>> data = AddRicciCurvature(alpha=0.5)(data)
        >>> data.edge_index[:, data.edge_curvature.argmin()]     # the most tree-like edge
    """

    def __init__(self, alpha: float = 0.5) -> None:
        require(0.0 <= alpha < 1.0, "alpha", "a number in [0, 1)", alpha)
        self.alpha = alpha

    def forward(self, data: Data) -> Data:
        n, edge_index = data.num_nodes, data.edge_index
        orc = ollivier_ricci(edge_index, n, self.alpha)
        forman = forman_curvature(edge_index, n)
        data.edge_curvature = orc
        data.edge_forman = forman
        data.node_curvature = node_curvature(edge_index, n, orc)
        data.node_forman = node_curvature(edge_index, n, forman)
        data.curvature_descriptor = curvature_descriptor(edge_index, n, orc, forman)
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}(alpha={self.alpha})"


def with_curvature(graphs: Sequence[Data]) -> list[Data]:
    """The graphs with their Ricci attributes (computed only where missing)."""
    graphs = list(graphs)
    missing = [not all(hasattr(g, k) for k in CURVATURE_KEYS) for g in graphs]
    if not any(missing):
        return graphs
    transform = AddRicciCurvature()
    out = []
    with progress(sum(missing), "Ricci curvature") as bar:
        for graph, compute in zip(graphs, missing, strict=True):
            out.append(transform(copy.copy(graph)) if compute else graph)
            if compute:
                bar.advance()
    return out


def curvature_table(graphs: Iterable[Data], alpha: float = 0.5) -> list[dict[str, float | int]]:
    """One row per undirected edge of every graph, for a per-edge CSV.

    Rows are ``{"graph", "u", "v", "ollivier_ricci", "forman"}`` with u < v, graphs in input
    order and edges sorted by (u, v).
    """
    rows: list[dict[str, float | int]] = []
    for index, data in enumerate(graphs):
        edge_index, n = data.edge_index, data.num_nodes
        orc = ollivier_ricci(edge_index, n, alpha).tolist()
        forman = forman_curvature(edge_index, n).tolist()
        src, dst = edge_index.tolist() if edge_index.numel() else ([], [])
        entries = sorted((u, v, k) for k, (u, v) in enumerate(zip(src, dst, strict=True)) if u < v)
        rows.extend(
            {"graph": index, "u": u, "v": v, "ollivier_ricci": orc[k], "forman": forman[k]}
            for u, v, k in entries
        )
    return rows
