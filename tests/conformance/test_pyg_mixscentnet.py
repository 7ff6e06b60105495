"""PyTorch Geometric's contract for MixScentNet (issue 25): molecule graphs and mixture graphs used
the way a PyG user uses ``Data``.

- :func:`smiles_to_data` gives the same atoms and bonds as PyG's own ``from_smiles`` (same
  ``edge_index``), passes ``Data.validate``, and its graphs batch in a ``DataLoader`` over an
  ``InMemoryDataset`` that the encoder reads unchanged.
- :class:`MixtureGraph` outputs valid ``Data`` whose ``component`` index is shifted by nothing
  when batched (it indexes the component table, not the batch), so a mixture batch built by
  ``DataLoader`` gives the same embeddings as one built by the library.
"""

import torch
from torch_geometric.data import Batch, InMemoryDataset
from torch_geometric.loader import DataLoader
from torch_geometric.utils import from_smiles

from mixlab.graphs.mixscentnet import (
    FeaturizedMixtures,
    MixScentNet,
    MixtureGraph,
    MoleculeEncoder,
    ecfp4,
    smiles_to_data,
    tanimoto,
)

SMILES = ["CC(=O)OCC", "c1ccccc1O", "CCCCC=O", "C[C@H](N)C(=O)O", "c1ccsc1"]


class Molecules(InMemoryDataset):
    def __init__(self, smiles):
        super().__init__(None)
        self.data, self.slices = self.collate([smiles_to_data(s) for s in smiles])


def test_molecule_graphs_match_pyg_from_smiles_and_validate():
    for smiles in SMILES:
        ours, theirs = smiles_to_data(smiles), from_smiles(smiles)
        assert ours.validate(raise_on_error=True)
        assert ours.num_nodes == theirs.num_nodes
        assert torch.equal(ours.edge_index, theirs.edge_index)


def test_the_encoder_reads_a_dataloader_batch_like_a_library_batch():
    torch.manual_seed(0)
    encoder = MoleculeEncoder(8, 8, 2).eval()
    batch = next(iter(DataLoader(Molecules(SMILES), batch_size=len(SMILES))))
    ours = Batch.from_data_list([smiles_to_data(s) for s in SMILES])
    assert torch.allclose(encoder(batch), encoder(ours), atol=1e-6)


def test_mixture_graphs_batch_without_shifting_component_indices():
    components = sorted(set(SMILES))
    transform = MixtureGraph(tanimoto(ecfp4(components)))
    mixtures = [[0, 1, 2], [3], [2, 4]]
    graphs = [transform(m) for m in mixtures]
    assert all(g.validate(raise_on_error=True) for g in graphs)
    batch = next(iter(DataLoader(graphs, batch_size=3)))
    assert batch.component.tolist() == [0, 1, 2, 3, 2, 4]  # not incremented like edge_index
    torch.manual_seed(0)
    model = MixScentNet(MoleculeEncoder(8, 8, 1), "graph", width=8).eval()
    features = FeaturizedMixtures([tuple(components[i] for i in m) for m in mixtures])
    library = model.embed(features.molecules, features.batch(range(3)))
    assert torch.allclose(model.embed(features.molecules, batch), library, atol=1e-6)
