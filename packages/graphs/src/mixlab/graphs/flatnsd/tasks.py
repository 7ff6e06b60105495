"""Procedural over-squashing benchmarks: RingTransfer (Bodnar et al., CWN) and Tree-NeighborsMatch
(Alon & Yahav, ICLR 2021). Every graph carries ``target_mask``: the one node whose output is read.

Both tasks come with held-out graphs: RingTransfer's nodes carry random features independent of
the label (so no two graphs coincide), Tree-NeighborsMatch's (key, permutation) examples are split
into disjoint train and test sets, and :func:`check_disjoint` refuses a test graph that equals a
training graph.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch_geometric.data import Data

from mixlab.graphs.flatnsd.config import RING_CLASSES, RING_NOISE
from mixlab.shared.checks import check_count

__all__ = [
    "RING_CLASSES",
    "check_disjoint",
    "ring_transfer",
    "ring_transfer_split",
    "split_graphs",
    "tree_neighbors_match",
    "tree_neighbors_match_split",
    "unseen",
]


def _undirected(edges: list[tuple[int, int]]) -> torch.Tensor:
    pairs = torch.tensor(edges, dtype=torch.long).T
    return torch.cat([pairs, pairs.flip(0)], dim=1)


def ring_transfer(
    num_graphs: int, ring_size: int, *, noise_features: int = RING_NOISE, seed: int = 0
) -> list[Data]:
    """Rings of ``ring_size`` nodes (CWN's RingTransfer): node n//2 holds a one-hot class
    (5 classes), node 0 (the target) zeros, every other node ones; the label must travel n//2
    hops to node 0.

    Every node also gets ``noise_features`` values drawn uniformly from [0, 1), independent of the
    label: without them a ring has only 5 distinct graphs, and a test set would repeat the
    training graphs. CWN's rings have no self-loops; neither do these."""
    if ring_size < 3:
        raise ValueError(f"ring_size must be >= 3, got {ring_size}")
    if num_graphs < 1:
        raise ValueError(f"num_graphs must be >= 1, got {num_graphs}")
    check_count(noise_features, "noise_features", 0)
    rng = np.random.default_rng(seed)
    edge_index = _undirected([(i, (i + 1) % ring_size) for i in range(ring_size)])
    mask = torch.zeros(ring_size, dtype=torch.bool)
    mask[0] = True
    graphs = []
    for label in rng.integers(RING_CLASSES, size=num_graphs):
        signal = torch.ones(ring_size, RING_CLASSES)
        signal[0] = 0.0
        signal[ring_size // 2] = torch.nn.functional.one_hot(torch.tensor(int(label)), RING_CLASSES)
        noise = torch.as_tensor(rng.random((ring_size, noise_features)), dtype=torch.float32)
        graphs.append(
            Data(
                x=torch.cat([signal, noise], dim=1),
                edge_index=edge_index,
                y=torch.tensor([int(label)]),
                target_mask=mask,
            )
        )
    return graphs


def tree_neighbors_match(
    depth: int, *, max_graphs: int = 4000, self_loops: bool = True, seed: int = 0
) -> list[Data]:
    """Full binary trees of ``depth``: leaf i holds (key i, value π(i)), the root holds a key k;
    the label is π(k), so the root must gather every leaf through the tree. 2**depth classes.
    Every example (k, π) is distinct; :func:`split_graphs` holds some out.

    Features are one-hot (key slot, value slot), slot 0 meaning "none", as Alon & Yahav's
    embeddings. Edges are undirected here (the original points child → parent), because sheaf
    diffusion is undirected; every model sees the same graph. ``self_loops=True`` keeps the
    original's self-loop at every node (the sheaf layers give a self-loop weight 0: its
    coboundary is zero).
    """
    if not 2 <= depth <= 8:
        raise ValueError(f"depth must be in [2, 8], got {depth}")
    if max_graphs < 1:
        raise ValueError(f"max_graphs must be >= 1, got {max_graphs}")
    rng = np.random.default_rng(seed)
    num_leaves = 2**depth
    num_nodes = 2 * num_leaves - 1
    edge_index = _undirected([(child, (child - 1) // 2) for child in range(1, num_nodes)])
    if self_loops:
        loops = torch.arange(num_nodes).repeat(2, 1)
        edge_index = torch.cat([edge_index, loops], dim=1)
    first_leaf = num_leaves - 1
    mask = torch.zeros(num_nodes, dtype=torch.bool)
    mask[0] = True
    # Alon & Yahav: up to 1000 value permutations, each with every key; distinct, or a repeated
    # example could land on both sides of a train/test split.
    if math.factorial(num_leaves) <= 1000:
        permutations = [np.array(p) for p in itertools.permutations(range(num_leaves))]
    else:
        drawn: dict[tuple[int, ...], np.ndarray] = {}
        while len(drawn) < 1000:
            permutation = rng.permutation(num_leaves)
            drawn.setdefault(tuple(permutation.tolist()), permutation)
        permutations = list(drawn.values())
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


def _fingerprint(graph: Data) -> bytes:
    """A digest of what a model sees of a graph: features, edges and label."""
    digest = hashlib.blake2b(digest_size=16)
    for tensor in (graph.x, graph.edge_index, graph.y):
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.digest()


def unseen(graphs: Sequence[Data], seen: Sequence[Data]) -> list[Data]:
    """The graphs of ``graphs`` that equal no graph of ``seen`` (features, edges, label)."""
    fingerprints = {_fingerprint(graph) for graph in seen}
    return [graph for graph in graphs if _fingerprint(graph) not in fingerprints]


def check_disjoint(train: Sequence[Data], test: Sequence[Data]) -> None:
    """Raise ``ValueError`` if any test graph equals a training graph (features, edges, label)."""
    repeated = len(test) - len(unseen(test, train))
    if repeated:
        raise ValueError(
            f"{repeated} of {len(test)} test graphs equal a training graph; "
            "a test set must hold out graphs the model has not seen"
        )


def split_graphs(
    graphs: Sequence[Data], test_fraction: float, *, seed: int = 0
) -> tuple[list[Data], list[Data]]:
    """A random (train, test) split of ``graphs`` with ``test_fraction`` of them (at least one)
    held out; checked with :func:`check_disjoint`."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    if len(graphs) < 2:
        raise ValueError(f"graphs must hold at least 2 graphs to split, got {len(graphs)}")
    order = np.random.default_rng(seed).permutation(len(graphs))
    held_out = min(len(graphs) - 1, max(1, round(test_fraction * len(graphs))))
    test = [graphs[i] for i in order[:held_out]]
    train = [graphs[i] for i in order[held_out:]]
    check_disjoint(train, test)
    return train, test


def ring_transfer_split(
    num_train: int,
    num_test: int,
    ring_size: int,
    *,
    noise_features: int = RING_NOISE,
    seed: int = 0,
) -> tuple[list[Data], list[Data]]:
    """(train, test) RingTransfer graphs: training rings from ``seed``, test rings from
    ``seed + 10_000``, checked with :func:`check_disjoint`."""
    train = ring_transfer(num_train, ring_size, noise_features=noise_features, seed=seed)
    test = ring_transfer(num_test, ring_size, noise_features=noise_features, seed=seed + 10_000)
    check_disjoint(train, test)
    return train, test


def tree_neighbors_match_split(
    depth: int, num_train: int, *, test_fraction: float = 0.2, seed: int = 0
) -> tuple[list[Data], list[Data]]:
    """(train, test) Tree-NeighborsMatch examples: up to ``num_train`` / (1 − ``test_fraction``)
    distinct ones from ``seed``, ``test_fraction`` of them held out (:func:`split_graphs`)."""
    wanted = math.ceil(num_train / (1 - test_fraction))
    graphs = tree_neighbors_match(depth, max_graphs=wanted, seed=seed)
    return split_graphs(graphs, test_fraction, seed=seed)
