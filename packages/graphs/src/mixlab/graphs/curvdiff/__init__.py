"""CurvDiff: mixed-curvature latent diffusion for graph and molecule generation.

A product-manifold (H × S × E) graph autoencoder with learnable curvatures and a Ricci-curvature
prior, then a DDPM on its standardized tangent-space node latents (:class:`CurvDiff`); the
Ollivier–Ricci/Forman transform :class:`AddRicciCurvature`; the baselines (:class:`DiGressStyle`,
:class:`ErdosRenyi`, :class:`LouvainSBM`); graph sets (:func:`make_graph_set`, graph6 files),
molecules (:func:`read_smiles`, :func:`load_nci`, :func:`load_qm9`) and metrics
(:func:`mmd_table` in both MMD protocols, :func:`vun`, :func:`molecule_metrics`).

    >>> from mixlab.graphs.curvdiff import CurvDiff, make_graph_set, mmd_table
    >>> graphs = make_graph_set("hetero-within", 64, seed=0)     # or any PyG dataset
    >>> model = CurvDiff(geometry="HSE", ricci_gating=True, ricci_conditioning=True).fit(graphs)
    >>> samples = model.sample(64, seed=0)
    >>> mmd_table(samples, graphs, "tv")
"""

from typing import TYPE_CHECKING

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "DiGressStyle": "baselines",
    "ErdosRenyi": "baselines",
    "LouvainSBM": "baselines",
    "AddRicciCurvature": "curvature",
    "forman_curvature": "curvature",
    "ollivier_ricci": "curvature",
    "GENERATORS": "datasets",
    "make_graph_set": "datasets",
    "read_graph6": "datasets",
    "validate_graphs": "datasets",
    "write_graph6": "datasets",
    "GraphAutoencoder": "latent",
    "ProductManifold": "latent",
    "describe": "metrics",
    "mmd_table": "metrics",
    "vun": "metrics",
    "CurvDiff": "model",
    "CurvDiffConfig": "model",
    "load_nci": "molecules",
    "load_qm9": "molecules",
    "molecule_metrics": "molecules",
    "read_smiles": "molecules",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = [
    "GENERATORS",
    "AddRicciCurvature",
    "CurvDiff",
    "CurvDiffConfig",
    "DiGressStyle",
    "ErdosRenyi",
    "GraphAutoencoder",
    "LouvainSBM",
    "ProductManifold",
    "describe",
    "forman_curvature",
    "load_nci",
    "load_qm9",
    "make_graph_set",
    "mmd_table",
    "molecule_metrics",
    "ollivier_ricci",
    "read_graph6",
    "read_smiles",
    "validate_graphs",
    "vun",
    "write_graph6",
]

if TYPE_CHECKING:
    from mixlab.graphs.curvdiff.baselines import DiGressStyle, ErdosRenyi, LouvainSBM
    from mixlab.graphs.curvdiff.curvature import AddRicciCurvature, forman_curvature, ollivier_ricci
    from mixlab.graphs.curvdiff.datasets import (
        GENERATORS,
        make_graph_set,
        read_graph6,
        validate_graphs,
        write_graph6,
    )
    from mixlab.graphs.curvdiff.latent import GraphAutoencoder, ProductManifold
    from mixlab.graphs.curvdiff.metrics import describe, mmd_table, vun
    from mixlab.graphs.curvdiff.model import CurvDiff, CurvDiffConfig
    from mixlab.graphs.curvdiff.molecules import load_nci, load_qm9, molecule_metrics, read_smiles
