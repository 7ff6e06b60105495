"""PyTorch Geometric's contract for CurvDiff (issue 24): :class:`AddRicciCurvature` used the way a
PyG user uses a transform, and :class:`CurvDiff` fitted on PyG datasets.

- The transform composes with ``T.Compose`` and PyG's own transforms, runs as a dataset's
  ``pre_transform``/``transform``, and its attributes batch in a ``DataLoader`` (edge attributes
  follow ``edge_index``, the descriptor stacks to [B, 15]); ``repr`` in PyG's style.
- Node relabelling moves the curvature with the nodes (it is a graph invariant, not an index one).
- ``CurvDiff.fit`` accepts an ``InMemoryDataset`` and a plain list alike, ignores node features
  that are not molecules, and refuses directed data (``T.ToUndirected`` fixes it).
"""

import networkx as nx
import pytest
import torch
import torch_geometric.transforms as T
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.loader import DataLoader
from torch_geometric.utils import from_networkx

from mixlab.graphs.curvdiff import AddRicciCurvature, CurvDiff
from mixlab.graphs.curvdiff.datasets import hetero_within

TINY = {
    "hidden": 8,
    "ae_epochs": 1,
    "denoiser_width": 8,
    "denoiser_layers": 1,
    "diffusion_steps": 4,
    "diffusion_iterations": 2,
    "refine_steps": 2,
    "encodings_per_graph": 1,
}


class GraphSet(InMemoryDataset):
    """A user's dataset: graphs with their own node features, built in memory."""

    def __init__(self, graphs, transform=None, pre_transform=None):
        super().__init__(None, transform, pre_transform)
        if pre_transform is not None:
            graphs = [pre_transform(g) for g in graphs]
        self.data, self.slices = self.collate(graphs)


def user_graphs(count: int = 6) -> list[Data]:
    graphs = []
    for graph in hetero_within(count, seed=1):
        graph.x = torch.randn(graph.num_nodes, 3)  # a user's features: not atom types
        graphs.append(graph)
    return graphs


def test_transform_composes_and_batches_in_a_dataloader():
    transform = T.Compose([T.ToUndirected(), AddRicciCurvature(), T.NormalizeFeatures()])
    assert repr(AddRicciCurvature()) == "AddRicciCurvature(alpha=0.5)"
    dataset = GraphSet(
        user_graphs(), pre_transform=T.Compose([T.ToUndirected(), AddRicciCurvature()])
    )
    batch = next(iter(DataLoader(dataset, batch_size=4)))
    assert batch.curvature_descriptor.shape == (4, 15)
    assert batch.edge_curvature.shape == (batch.edge_index.shape[1],)
    assert batch.node_curvature.shape == (batch.num_nodes,)
    one = transform(user_graphs(1)[0])
    assert one.edge_curvature.shape == (one.edge_index.shape[1],)
    assert torch.allclose(one.x.abs().sum(-1), torch.ones(one.num_nodes))


def test_curvature_is_a_graph_invariant_under_relabelling():
    graph = from_networkx(nx.karate_club_graph())
    graph = Data(edge_index=graph.edge_index, num_nodes=graph.num_nodes)
    perm = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(0))
    relabelled = Data(edge_index=perm[graph.edge_index], num_nodes=graph.num_nodes)
    ours, theirs = AddRicciCurvature()(graph), AddRicciCurvature()(relabelled)
    assert torch.allclose(theirs.node_curvature[perm], ours.node_curvature, atol=1e-6)
    assert torch.allclose(theirs.curvature_descriptor, ours.curvature_descriptor, atol=1e-6)


def test_fit_takes_a_pyg_dataset_and_samples_data():
    dataset = GraphSet(user_graphs(), transform=AddRicciCurvature())
    model = CurvDiff("HSE", ricci_gating=True, ricci_conditioning=True, **TINY).fit(dataset)
    samples = model.sample(3, seed=0)
    assert all(isinstance(g, Data) and g.x is None for g in samples)
    assert model.autoencoder.atom_types == 0  # user features are not atom types


def test_fit_refuses_directed_data_that_to_undirected_fixes():
    directed = Data(edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]), num_nodes=4)
    with pytest.raises(ValueError, match="graphs"):
        CurvDiff("E", **TINY).fit([directed, directed])
    CurvDiff("E", **TINY).fit([T.ToUndirected()(directed)] * 2)
