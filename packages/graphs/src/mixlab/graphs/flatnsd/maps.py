"""Restriction-map learners: NSD's per-edge learner and FlatNSD's per-node (flat bundle) learner.

NSD's ``LocalConcatSheafLearner`` reads F = tanh(W[x_i ‖ x_j]) from the two endpoint features;
orthogonal maps come from a skew-symmetric matrix (here the Cayley transform, which replaces the
compiled ``torch_householder`` of the authors' code). FlatNSD learns one map per node (from x_v,
or from a small GNN over the graph as BuNN does), so the same map serves every edge at v and the
bundle is flat.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import SAGEConv

from mixlab.shared.checks import check_choice, check_count

NODE_MAP_KINDS = ("orthogonal", "general")
EDGE_MAP_KINDS = ("diag", "orthogonal", "general")


def skew_symmetric(params: Tensor, d: int) -> Tensor:
    """[..., d(d-1)/2] parameters → [..., d, d] skew-symmetric matrices."""
    rows, cols = torch.triu_indices(d, d, offset=1, device=params.device)
    skew = params.new_zeros(*params.shape[:-1], d, d)
    skew[..., rows, cols] = params
    return skew - skew.transpose(-1, -2)


def cayley(skew: Tensor) -> Tensor:
    """The Cayley transform (I − A)⁻¹(I + A): an orthogonal matrix (in SO(d)) for skew A."""
    eye = torch.eye(skew.size(-1), dtype=skew.dtype, device=skew.device).expand_as(skew)
    return torch.linalg.solve(eye - skew, eye + skew)


def map_parameter_count(kind: str, d: int) -> int:
    """Free parameters of one d×d map of ``kind``."""
    return {"diag": d, "orthogonal": d * (d - 1) // 2, "general": d * d}[kind]


class NodeMapLearner(nn.Module):
    """A_v = orth(tanh(φ(x)_v)) (``"orthogonal"``, Cayley) or exp(tanh(φ(x)_v)) (``"general"``:
    invertible, det = e^{tr} > 0) for every node: a flat bundle.

    φ is a linear map of x_v alone (``gnn_layers=0``, NSD's learner restricted to one node) or,
    as in BuNN (Bamberger et al., ICLR 2025), a small GNN: ``gnn_layers`` GraphSAGE layers
    (mean aggregation, ReLU) and a linear head, so a node's map can depend on its neighbourhood.
    ``bundles`` > 1 learns that many independent bundles: the output is [N, bundles, d, d]
    (else [N, d, d]).
    """

    def __init__(
        self,
        in_channels: int,
        stalk_dim: int,
        kind: str = "orthogonal",
        *,
        gnn_layers: int = 0,
        bundles: int = 1,
    ) -> None:
        super().__init__()
        check_choice(kind, "maps", NODE_MAP_KINDS)
        check_count(gnn_layers, "gnn_layers", 0)
        check_count(bundles, "bundles", 1)
        self.stalk_dim, self.kind, self.bundles = stalk_dim, kind, bundles
        self.gnn = nn.ModuleList(SAGEConv(in_channels, in_channels) for _ in range(gnn_layers))
        outputs = bundles * map_parameter_count(kind, stalk_dim)
        self.linear = nn.Linear(in_channels, outputs, bias=False)

    def reset_parameters(self) -> None:
        for conv in self.gnn:
            conv.reset_parameters()
        self.linear.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor | None = None) -> Tensor:
        if self.gnn and edge_index is None:
            raise ValueError("a map learner with gnn_layers > 0 needs the graph's edge_index")
        for conv in self.gnn:
            x = torch.relu(conv(x, edge_index))
        params = torch.tanh(self.linear(x)).view(x.size(0), self.bundles, -1)
        d = self.stalk_dim
        if self.kind == "orthogonal":
            maps = cayley(skew_symmetric(params, d))
        else:
            maps = torch.linalg.matrix_exp(params.view(x.size(0), self.bundles, d, d))
        return maps if self.bundles > 1 else maps.squeeze(1)


class EdgeMapLearner(nn.Module):
    """F_{i⊴e} = tanh(W[x_i ‖ x_j]) per directed edge (j → i): NSD's local concat learner.

    ``"diag"`` returns [E, d]; ``"orthogonal"`` (Cayley of a skew matrix) and ``"general"``
    return [E, d, d].
    """

    def __init__(self, in_channels: int, stalk_dim: int, kind: str = "diag") -> None:
        super().__init__()
        check_choice(kind, "maps", EDGE_MAP_KINDS)
        self.stalk_dim, self.kind = stalk_dim, kind
        self.linear = nn.Linear(2 * in_channels, map_parameter_count(kind, stalk_dim), bias=False)

    def reset_parameters(self) -> None:
        self.linear.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        source, target = edge_index
        params = torch.tanh(self.linear(torch.cat([x[target], x[source]], dim=-1)))
        d = self.stalk_dim
        if self.kind == "diag":
            return params
        if self.kind == "orthogonal":
            return cayley(skew_symmetric(params, d))
        return params.view(-1, d, d)


class EdgeWeightLearner(nn.Module):
    """w_e = σ(W[x_i ‖ x_j] + b), averaged over both directions so that w is symmetric (NSD's
    ``EdgeWeightLearner`` multiplies the two directions instead)."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.linear = nn.Linear(2 * in_channels, 1)

    def reset_parameters(self) -> None:
        self.linear.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor, reverse: Tensor) -> Tensor:
        source, target = edge_index
        weight = torch.sigmoid(self.linear(torch.cat([x[target], x[source]], dim=-1))).squeeze(-1)
        return (weight + weight[reverse]) / 2
