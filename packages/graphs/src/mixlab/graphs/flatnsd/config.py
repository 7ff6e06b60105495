"""The FlatNSD experiment's Config and its registry entry, importable without torch or PyG.

``mixlab list`` and ``mixlab run flatnsd --help`` read :data:`METHOD` from here; the experiment
(:mod:`mixlab.graphs.flatnsd.experiment`, torch and PyG) loads only when the method runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mixlab.shared.config import ExperimentConfig, is_count, require
from mixlab.shared.registry import Method

SYSTEMS: dict[str, tuple[str, dict[str, Any]]] = {
    # name: (family, options of build_model)
    "gcn": ("mp", {"conv": "gcn"}),
    "gin": ("mp", {"conv": "gin"}),
    "gat": ("mp", {"conv": "gat"}),
    "nsd_diag": ("sheaf", {"sheaf": "diag"}),
    "nsd_bundle": ("sheaf", {"sheaf": "bundle"}),
    "nsd_general": ("sheaf", {"sheaf": "general"}),
    # FlatNSD's maps come from BuNN's small GNN φ (one GraphSAGE layer) over the graph
    "flatnsd": ("sheaf", {"sheaf": "flat", "map_gnn_layers": 1}),
    # BuNN's heat-kernel layer: concat + FFN, two bundles
    "flatnsd_heat": (
        "sheaf",
        {"sheaf": "flat", "update": "heat", "map_gnn_layers": 1, "bundles": 2},
    ),
}
"""every system the experiment and ``mixlab-graphs flatnsd train --model`` can build"""
FLAT_SYSTEMS = ("flatnsd", "flatnsd_heat")
MP_SYSTEMS = tuple(name for name, (family, _) in SYSTEMS.items() if family == "mp")
REGIME_SYSTEM = "gcn"
"""the reference whose accuracy at the smallest sizes says the training budget suffices"""
MAX_TREE_DEPTH = 8
RING_CLASSES = 5
"""RingTransfer's classes (and its signal features: a one-hot label)"""
RING_NOISE = 2
"""RingTransfer's random node features by default (independent of the label)"""


@dataclass
class Config(ExperimentConfig):
    """Defaults are the quick profile (a few minutes on 2 CPU cores); full follows the spec's design."""

    ring_sizes: tuple[int, ...] = (4, 6, 8)
    """RingTransfer ring sizes n (layers = n // 2)"""
    ring_train: int = 500
    """RingTransfer training graphs per size"""
    ring_test: int = 200
    """RingTransfer test graphs per size (held out: no test graph equals a training graph)"""
    ring_noise: int = RING_NOISE
    """random features per RingTransfer node, independent of the label (they make every graph
    distinct, so the test graphs are held out)"""
    tree_depths: tuple[int, ...] = (2, 3)
    """Tree-NeighborsMatch depths r (layers = r + 1)"""
    tree_graphs: int = 500
    """Tree-NeighborsMatch training graphs per depth (depth 2's 77 distinct training examples
    are repeated)"""
    tree_test_fraction: float = 0.2
    """share of the distinct Tree-NeighborsMatch examples held out as test graphs"""
    n_seeds: int = 3
    """training seeds per cell: seed, seed + 1, ..."""
    epochs: int = 30
    """RingTransfer training epochs (a system stops early once it fits the training set)"""
    lr: float = 3e-3
    """RingTransfer Adam learning rate, every system"""
    tree_epochs: int = 60
    """Tree-NeighborsMatch training epochs (early stop as above)"""
    tree_lr: float = 1e-2
    """Tree-NeighborsMatch Adam learning rate, every system: at 3e-3 GCN needs about 200 epochs
    to fit depth 2 (width 32, two seeds), which the quick budget cannot give every system; at
    1e-2 it fits in about 60 (training accuracy, the task's measure; the test graphs are not
    read). On RingTransfer 1e-2 stalls GIN at n = 6 and FlatNSD-heat at n = 8, so each task
    keeps its own"""
    batch_size: int = 64
    """graphs per batch"""
    stalk_dim: int = 2
    """stalk dimension d of the sheaf models"""
    channels: int = 16
    """FlatNSD's channels f per stalk dimension; its parameter count is every system's budget"""
    systems: tuple[str, ...] = ("gcn", "gin", "gat", "nsd_bundle", "flatnsd", "flatnsd_heat")
    """systems to train (FlatNSD, GCN for the regime check, and any other baselines); quick
    keeps one NSD (Bundle, the strongest in the landed runs), full trains all"""
    theory_stalk_dim: int = 3
    """stalk dimension of the random bundles in the theory checks"""

    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {},
        "full": {
            "ring_sizes": (4, 8, 12, 16),
            "ring_train": 1000,
            "tree_depths": (2, 3, 4),
            "tree_graphs": 1000,
            "epochs": 60,
            "tree_epochs": 120,
            "systems": tuple(SYSTEMS),
        },
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        sizes_ok = (
            isinstance(self.ring_sizes, tuple | list)
            and len(self.ring_sizes) >= 1
            and all(is_count(n, 4) for n in self.ring_sizes)
            and len(set(self.ring_sizes)) == len(self.ring_sizes)
        )
        require(sizes_ok, "ring_sizes", "one or more distinct integers >= 4", self.ring_sizes)
        depths_ok = (
            isinstance(self.tree_depths, tuple | list)
            and len(self.tree_depths) >= 1
            and all(is_count(r, 2) and r <= MAX_TREE_DEPTH for r in self.tree_depths)
            and len(set(self.tree_depths)) == len(self.tree_depths)
        )
        require(
            depths_ok,
            "tree_depths",
            f"one or more distinct integers in [2, {MAX_TREE_DEPTH}]",
            self.tree_depths,
        )
        require(
            is_count(self.ring_noise),
            "ring_noise",
            "an integer >= 1 (without random features the test rings repeat training rings)",
            self.ring_noise,
        )
        require(
            isinstance(self.tree_test_fraction, int | float)
            and not isinstance(self.tree_test_fraction, bool)
            and 0 < self.tree_test_fraction < 1,
            "tree_test_fraction",
            "a number in (0, 1)",
            self.tree_test_fraction,
        )
        for name in (
            "ring_train",
            "ring_test",
            "tree_graphs",
            "n_seeds",
            "epochs",
            "tree_epochs",
            "batch_size",
            "stalk_dim",
            "channels",
            "theory_stalk_dim",
        ):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(
            self.seed + self.n_seeds <= 2**32,
            "n_seeds",
            f"at most 2**32 - seed = {2**32 - self.seed} (seeds seed .. seed + n_seeds - 1)",
            self.n_seeds,
        )
        for name in ("lr", "tree_lr"):
            value = getattr(self, name)
            require(
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and 0 < value < float("inf"),
                name,
                "a finite number > 0",
                value,
            )
        systems_ok = isinstance(self.systems, tuple | list) and all(
            isinstance(s, str) and s in SYSTEMS for s in self.systems
        )
        require(systems_ok, "systems", f"names from {sorted(SYSTEMS)}", self.systems)
        require(
            len(set(self.systems)) == len(self.systems),
            "systems",
            "distinct names",
            self.systems,
        )
        require(
            "flatnsd" in self.systems and REGIME_SYSTEM in self.systems,
            "systems",
            "a list with flatnsd and gcn (the claims compare FlatNSD with message passing; "
            "GCN's accuracy at the smallest sizes is the regime check)",
            self.systems,
        )


METHOD = Method(
    name="flatnsd",
    domain="graphs",
    paper="Sheaf effective resistance and FlatNSD: Neural Sheaf Diffusion on flat vector bundles against over-squashing",
    claim="Sheaf effective resistance is inversely related to over-squashing sensitivity for flat bundles; FlatNSD keeps accuracy on over-squashing benchmarks where message passing collapses",
    config=Config,
    run="mixlab.graphs.flatnsd.experiment:run",
    headline_plot="ring_accuracy.png",
)

__all__ = ["FLAT_SYSTEMS", "METHOD", "MP_SYSTEMS", "RING_NOISE", "SYSTEMS", "Config"]
