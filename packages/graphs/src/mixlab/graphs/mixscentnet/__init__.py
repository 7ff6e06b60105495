"""MixScentNet: odour-mixture perception from SMILES (reconstructed around POMMix; paper not found).

A molecule GNN (POMMix's 85/14-D atom and bond features, GATv2 node attention or GINE, PNA
readout) is pretrained to regress Mordred 2D descriptors (self-supervised), its component
embeddings become the nodes of a mixture graph (complete, with Tanimoto-ECFP4 and |Δc| edge
features) read by two ``GATv2Conv`` layers, and a scaled-cosine head turns two mixture embeddings
into a perceptual distance; everything is fine-tuned end to end.

    from mixlab.graphs.mixscentnet import MixtureDistanceModel
    model = MixtureDistanceModel().fit(mixtures, pairs, distances)
    model.predict(new_mixtures, new_pairs)

See ``seeds/mixscentnet.md`` for what is reconstructed and the measured results.
"""

from typing import TYPE_CHECKING

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "ATOM_FEATURES": "featurize",
    "BOND_FEATURES": "featurize",
    "FeaturizedMixtures": "training",
    "GradientBoostingDistance": "baselines",
    "LabelModel": "training",
    "MeanDistance": "baselines",
    "MeanPooling": "model",
    "MixScentNet": "model",
    "MixtureDistanceModel": "estimator",
    "MixtureGATv2": "model",
    "MixtureGraph": "model",
    "MixturePairs": "data",
    "ModelConfig": "estimator",
    "MoleculeEncoder": "model",
    "MordredPretrainer": "training",
    "OdourLabels": "data",
    "ScaledCosineDistance": "model",
    "SelfAttentionAggregation": "model",
    "SnitzAngle": "baselines",
    "distance_metrics": "training",
    "ecfp4": "featurize",
    "embed_mixtures": "training",
    "fit_distance": "training",
    "load_gslf": "data",
    "load_mixture_pairs": "data",
    "macro_auroc": "training",
    "median_r2": "training",
    "mixture_descriptors": "baselines",
    "mordred_targets": "featurize",
    "non_overlapping": "data",
    "predict_distance": "training",
    "rdkit_descriptors": "featurize",
    "read_mixtures_csv": "data",
    "read_pairs_csv": "data",
    "smiles_to_data": "featurize",
    "snitz_angle": "baselines",
    "split_pairs": "data",
    "tanimoto": "featurize",
    "write_synthetic_olfaction": "data",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = [
    "ATOM_FEATURES",
    "BOND_FEATURES",
    "FeaturizedMixtures",
    "GradientBoostingDistance",
    "LabelModel",
    "MeanDistance",
    "MeanPooling",
    "MixScentNet",
    "MixtureDistanceModel",
    "MixtureGATv2",
    "MixtureGraph",
    "MixturePairs",
    "ModelConfig",
    "MoleculeEncoder",
    "MordredPretrainer",
    "OdourLabels",
    "ScaledCosineDistance",
    "SelfAttentionAggregation",
    "SnitzAngle",
    "distance_metrics",
    "ecfp4",
    "embed_mixtures",
    "fit_distance",
    "load_gslf",
    "load_mixture_pairs",
    "macro_auroc",
    "median_r2",
    "mixture_descriptors",
    "mordred_targets",
    "non_overlapping",
    "predict_distance",
    "rdkit_descriptors",
    "read_mixtures_csv",
    "read_pairs_csv",
    "smiles_to_data",
    "snitz_angle",
    "split_pairs",
    "tanimoto",
    "write_synthetic_olfaction",
]

if TYPE_CHECKING:
    from mixlab.graphs.mixscentnet.baselines import (
        GradientBoostingDistance,
        MeanDistance,
        SnitzAngle,
        mixture_descriptors,
        snitz_angle,
    )
    from mixlab.graphs.mixscentnet.data import (
        MixturePairs,
        OdourLabels,
        load_gslf,
        load_mixture_pairs,
        non_overlapping,
        read_mixtures_csv,
        read_pairs_csv,
        split_pairs,
        write_synthetic_olfaction,
    )
    from mixlab.graphs.mixscentnet.estimator import MixtureDistanceModel, ModelConfig
    from mixlab.graphs.mixscentnet.featurize import (
        ATOM_FEATURES,
        BOND_FEATURES,
        ecfp4,
        mordred_targets,
        rdkit_descriptors,
        smiles_to_data,
        tanimoto,
    )
    from mixlab.graphs.mixscentnet.model import (
        MeanPooling,
        MixScentNet,
        MixtureGATv2,
        MixtureGraph,
        MoleculeEncoder,
        ScaledCosineDistance,
        SelfAttentionAggregation,
    )
    from mixlab.graphs.mixscentnet.training import (
        FeaturizedMixtures,
        LabelModel,
        MordredPretrainer,
        distance_metrics,
        embed_mixtures,
        fit_distance,
        macro_auroc,
        median_r2,
        predict_distance,
    )
