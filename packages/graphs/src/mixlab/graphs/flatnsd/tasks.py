"""Procedural over-squashing benchmarks: RingTransfer (Bodnar et al., CWN) and Tree-NeighborsMatch
(Alon & Yahav, ICLR 2021). Every graph carries ``target_mask``: the one node whose output is read.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from torch_geometric.data import Data

from mixlab.graphs.flatnsd.config import RING_CLASSES

__all__ = ["RING_CLASSES", "ring_transfer", "tree_neighbors_match"]


def _undirected(edges: list[tuple[int, int]]) -> torch.Tensor:
    pairs = torch.tensor(edges, dtype=torch.long).T
    return torch.cat([pairs, pairs.flip(0)], dim=1)


def ring_transfer(num_graphs: int, ring_size: int, *, seed: int = 0) -> list[Data]:
    """Rings of ``ring_size`` nodes: node n//2 holds a one-hot class (5 classes), node 0 (the
    target) zeros, every other node ones; the label must travel n//2 hops to node 0."""
    if ring_size < 3:
        raise ValueError(f"ring_size must be >= 3, got {ring_size}")
    if num_graphs < 1:
        raise ValueError(f"num_graphs must be >= 1, got {num_graphs}")
    rng = np.random.default_rng(seed)
    edge_index = _undirected([(i, (i + 1) % ring_size) for i in range(ring_size)])
    mask = torch.zeros(ring_size, dtype=torch.bool)
    mask[0] = True
    graphs = []
    for label in rng.integers(RING_CLASSES, size=num_graphs):
        x = torch.ones(ring_size, RING_CLASSES)
        x[0] = 0.0
        x[ring_size // 2] = torch.nn.functional.one_hot(torch.tensor(int(label)), RING_CLASSES)
        graphs.append(
            Data(x=x, edge_index=edge_index, y=torch.tensor([int(label)]), target_mask=mask)
        )
    return graphs


def tree_neighbors_match(depth: int, *, max_graphs: int = 4000, seed: int = 0) -> list[Data]:
    """Full binary trees of ``depth``: leaf i holds (key i, value π(i)), the root holds a key k;
    the label is π(k), so the root must gather every leaf through the tree. 2**depth classes.

    Features are one-hot (key slot, value slot), slot 0 meaning "none", as Alon & Yahav's
    embeddings. Edges are undirected here (the original points child → parent), because sheaf
    diffusion is undirected; every model sees the same graph.
    """
    if not 2 <= depth <= 8:
        raise ValueError(f"depth must be in [2, 8], got {depth}")
    if max_graphs < 1:
        raise ValueError(f"max_graphs must be >= 1, got {max_graphs}")
    rng = np.random.default_rng(seed)
    num_leaves = 2**depth
    num_nodes = 2 * num_leaves - 1
    edge_index = _undirected([(child, (child - 1) // 2) for child in range(1, num_nodes)])
    first_leaf = num_leaves - 1
    mask = torch.zeros(num_nodes, dtype=torch.bool)
    mask[0] = True
    # Alon & Yahav: up to 1000 value permutations, each with every key.
    if math.factorial(num_leaves) <= 1000:
        permutations = [np.array(p) for p in itertools.permutations(range(num_leaves))]
    else:
        permutations = [rng.permutation(num_leaves) for _ in range(1000)]
    examples = [(key, perm) for perm in permutations for key in range(num_leaves)]
    if len(examples) > max_graphs:
        chosen = rng.choice(len(examples), size=max_graphs, replace=False)
        examples = [examples[i] for i in chosen]
    graphs = []
    for key, perm in examples:
        keys = torch.zeros(num_nodes, dtype=torch.long)
        values = torch.zeros(num_nodes, dtype=torch.long)
        keys[0] = key + 1
        keys[first_leaf:] = torch.arange(1, num_leaves + 1)
        values[first_leaf:] = torch.as_tensor(perm) + 1
        one_hot = torch.nn.functional.one_hot
        x = torch.cat([one_hot(keys, num_leaves + 1), one_hot(values, num_leaves + 1)], 1).float()
        graphs.append(
            Data(x=x, edge_index=edge_index, y=torch.tensor([int(perm[key])]), target_mask=mask)
        )
    return graphs
