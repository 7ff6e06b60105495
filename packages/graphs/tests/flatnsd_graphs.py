"""Graph helpers the FlatNSD test files share."""

from __future__ import annotations

import networkx as nx
import torch
from torch_geometric.utils import from_networkx


def graph(g: nx.Graph) -> tuple[torch.Tensor, int]:
    """(edge_index in both directions, number of nodes) of a networkx graph."""
    g = nx.convert_node_labels_to_integers(g)
    return from_networkx(g).edge_index, g.number_of_nodes()


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)
