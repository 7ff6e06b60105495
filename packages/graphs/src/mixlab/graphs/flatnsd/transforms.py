"""Sheaf effective resistance as a PyG transform, and of the sheaf a trained FlatNSD model learned."""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

from mixlab.graphs.flatnsd.layers import FlatNSDConv, SheafDiffusionNet
from mixlab.graphs.flatnsd.sheaf import sheaf_effective_resistance, total_sheaf_resistance


class AddSheafResistance(BaseTransform):
    """Annotate a graph with its sheaf effective resistance, to find where its bottleneck is.

    Reads the sheaf from attributes of ``data`` (``node_maps`` [N, d, d] for a flat bundle, or
    ``edge_maps`` [E, d, d] / [E, d] per edge; neither gives the plain graph, d = 1) and the optional
    ``edge_weight``; writes ``edge_resistance`` [E] (tr R^F_e / d per edge of ``edge_index``) and,
    unless the sheaf has per-edge maps, ``total_resistance`` (Σ_{u<v} tr R^F_uv).

        >>> data = AddSheafResistance()(data)
        >>> data.edge_index[:, data.edge_resistance.argmax()]     # the most resistive edge
    """

    def __init__(
        self,
        node_maps: str = "node_maps",
        edge_maps: str = "edge_maps",
        edge_weight: str = "edge_weight",
    ) -> None:
        self.node_maps, self.edge_maps, self.edge_weight = node_maps, edge_maps, edge_weight

    def forward(self, data: Data) -> Data:
        node_maps = data.get(self.node_maps) if self.node_maps else None
        edge_maps = data.get(self.edge_maps) if self.edge_maps else None
        weight = data.get(self.edge_weight) if self.edge_weight else None
        if weight is not None:
            weight = weight.double()
        sheaf = {
            "node_maps": None if node_maps is None else node_maps.double(),
            "edge_maps": None if edge_maps is None else edge_maps.double(),
        }
        resistance = sheaf_effective_resistance(
            data.edge_index, num_nodes=data.num_nodes, edge_weight=weight, **sheaf
        )
        data.edge_resistance = torch.diagonal(resistance, dim1=-2, dim2=-1).mean(-1)
        if edge_maps is None:
            data.total_resistance = total_sheaf_resistance(
                data.edge_index,
                node_maps=sheaf["node_maps"],
                num_nodes=data.num_nodes,
                edge_weight=weight,
            )
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}(node_maps={self.node_maps!r}, edge_maps={self.edge_maps!r})"


def learned_sheaf_statistics(
    model: SheafDiffusionNet, x: Tensor, edge_index: Tensor
) -> dict[str, float]:
    """What the flat sheaves a FlatNSD model builds on one graph look like, averaged over layers
    (and bundles):
    ``resistance``, their total sheaf effective resistance relative to the graph's own (1 means
    unchanged), and ``mean_edge_weight``, the learned weights that alone can move it (R ∝ 1/w)."""
    if not all(isinstance(conv, FlatNSDConv) for conv in model.convs):
        raise ValueError("learned_sheaf_statistics needs a model of FlatNSDConv layers")
    was_training = model.training
    model.eval()
    with torch.no_grad():
        baseline = float(total_sheaf_resistance(edge_index, num_nodes=x.size(0)))
        resistances, weights = [], []
        for conv, h in zip(model.convs, model.layer_inputs(x, edge_index), strict=True):
            node_maps, weight = conv.sheaf(h, edge_index)
            d = conv.stalk_dim
            for bundle in node_maps.view(x.size(0), -1, d, d).unbind(1):  # each of the bundles
                total = total_sheaf_resistance(
                    edge_index, node_maps=bundle.double(), edge_weight=weight.double()
                )
                resistances.append(float(total) / (d * baseline))
            weights.append(float(weight.mean()))
    model.train(was_training)
    return {
        "resistance": sum(resistances) / len(resistances),
        "mean_edge_weight": sum(weights) / len(weights),
    }
