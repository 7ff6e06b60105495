"""FlatNSD: sheaf effective resistance and Neural Sheaf Diffusion on flat vector bundles.

Sheaf tools (:func:`sheaf_laplacian`, :func:`sheaf_effective_resistance`,
:func:`total_sheaf_resistance`, :func:`diffusion_sensitivity`, :func:`jacobian_sensitivity`,
the transform :class:`AddSheafResistance`), layers in PyG's ``MessagePassing`` contract
(:class:`FlatNSDConv`, the NSD baselines :class:`NSDConv`), models that stack them
(:class:`SheafDiffusionNet`, :class:`MessagePassingNet`) and the over-squashing benchmarks
(:func:`ring_transfer`, :func:`tree_neighbors_match`).

    >>> from mixlab.graphs.flatnsd import FlatNSDConv, SheafDiffusionNet, AddSheafResistance
    >>> model = SheafDiffusionNet(dataset.num_features, dataset.num_classes, sheaf="flat",
    ...                           stalk_dim=2, channels=16, num_layers=4)
    >>> data = AddSheafResistance()(data)          # data.edge_resistance, data.total_resistance
"""

from typing import TYPE_CHECKING

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "FlatNSDConv": "layers",
    "MessagePassingNet": "layers",
    "NSDConv": "layers",
    "SheafDiffusionConv": "layers",
    "SheafDiffusionNet": "layers",
    "EdgeMapLearner": "maps",
    "EdgeWeightLearner": "maps",
    "NodeMapLearner": "maps",
    "check_edge_index": "sheaf",
    "diffusion_sensitivity": "sheaf",
    "jacobian_sensitivity": "sheaf",
    "sheaf_effective_resistance": "sheaf",
    "sheaf_laplacian": "sheaf",
    "total_sheaf_resistance": "sheaf",
    "check_disjoint": "tasks",
    "ring_transfer": "tasks",
    "ring_transfer_split": "tasks",
    "tree_neighbors_match_split": "tasks",
    "split_graphs": "tasks",
    "tree_neighbors_match": "tasks",
    "theory_checks": "theory",
    "load_trained": "training",
    "save_trained": "training",
    "train_readout": "training",
    "AddSheafResistance": "transforms",
    "learned_sheaf_statistics": "transforms",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = [
    "AddSheafResistance",
    "EdgeMapLearner",
    "EdgeWeightLearner",
    "FlatNSDConv",
    "MessagePassingNet",
    "NSDConv",
    "NodeMapLearner",
    "SheafDiffusionConv",
    "SheafDiffusionNet",
    "check_disjoint",
    "check_edge_index",
    "diffusion_sensitivity",
    "jacobian_sensitivity",
    "learned_sheaf_statistics",
    "load_trained",
    "ring_transfer",
    "ring_transfer_split",
    "save_trained",
    "sheaf_effective_resistance",
    "sheaf_laplacian",
    "split_graphs",
    "theory_checks",
    "total_sheaf_resistance",
    "train_readout",
    "tree_neighbors_match",
    "tree_neighbors_match_split",
]

if TYPE_CHECKING:
    from mixlab.graphs.flatnsd.layers import (
        FlatNSDConv,
        MessagePassingNet,
        NSDConv,
        SheafDiffusionConv,
        SheafDiffusionNet,
    )
    from mixlab.graphs.flatnsd.maps import EdgeMapLearner, EdgeWeightLearner, NodeMapLearner
    from mixlab.graphs.flatnsd.sheaf import (
        check_edge_index,
        diffusion_sensitivity,
        jacobian_sensitivity,
        sheaf_effective_resistance,
        sheaf_laplacian,
        total_sheaf_resistance,
    )
    from mixlab.graphs.flatnsd.tasks import (
        check_disjoint,
        ring_transfer,
        ring_transfer_split,
        split_graphs,
        tree_neighbors_match,
        tree_neighbors_match_split,
    )
    from mixlab.graphs.flatnsd.theory import theory_checks
    from mixlab.graphs.flatnsd.training import load_trained, save_trained, train_readout
    from mixlab.graphs.flatnsd.transforms import AddSheafResistance, learned_sheaf_statistics
