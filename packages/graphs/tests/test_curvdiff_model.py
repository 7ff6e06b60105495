"""CurvDiff's manifolds, autoencoder, denoisers, baselines and the fit/sample/save API (tiny sizes)."""

import networkx as nx
import pytest
import torch
from torch_geometric.data import Batch, Data

from mixlab.graphs.curvdiff.baselines import DiGressStyle, ErdosRenyi, LouvainSBM
from mixlab.graphs.curvdiff.curvature import DESCRIPTOR_DIM, AddRicciCurvature, ollivier_ricci
from mixlab.graphs.curvdiff.datasets import from_networkx_graph, hetero_within
from mixlab.graphs.curvdiff.diffusion import GaussianDiffusion, NodeDenoiser
from mixlab.graphs.curvdiff.digress import EdgeDenoiser
from mixlab.graphs.curvdiff.latent import (
    GraphAutoencoder,
    ProductManifold,
    gate_targets,
    latent_curvature,
)
from mixlab.graphs.curvdiff.metrics import exact_recovery
from mixlab.graphs.curvdiff.model import CurvDiff, dense_adjacency, with_curvature

TINY = {
    "hidden": 16,
    "ae_epochs": 3,
    "denoiser_width": 16,
    "denoiser_layers": 1,
    "diffusion_steps": 10,
    "diffusion_iterations": 5,
    "refine_steps": 5,
    "encodings_per_graph": 1,
}


@pytest.fixture(scope="module")
def graphs():
    return with_curvature(hetero_within(8, seed=0, min_nodes=12, max_nodes=14))


@pytest.fixture(scope="module")
def fitted(graphs):
    return CurvDiff("HSE", ricci_gating=True, ricci_conditioning=True, **TINY).fit(graphs, seed=0)


def test_exp_log_round_trip_on_every_component():
    manifold = ProductManifold("HSE", dim=12, curvature_h=-0.7, curvature_s=1.3)
    u = 0.4 * torch.randn(50, 12, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(manifold.logmap0(manifold.expmap0(u)), u, atol=1e-5)
    z = manifold.expmap0(u)
    assert not torch.allclose(z[:, :8], u[:, :8])  # H and S really are curved
    assert torch.equal(z[:, 8:], u[:, 8:])  # E is the identity


def test_gradients_reach_the_learnable_curvatures(graphs):
    model = GraphAutoencoder("HSE", latent_dim=6, hidden=8, layers=1)
    loss, _ = model.loss(Batch.from_data_list(graphs[:3]))
    loss.backward()
    assert model.manifold.raw_h.grad is not None
    assert model.manifold.raw_h.grad.abs() > 0
    assert model.manifold.raw_s.grad is not None
    assert model.manifold.raw_s.grad.abs() > 0
    assert model.manifold.curvature("H") < 0 < model.manifold.curvature("S")


def test_encoder_is_permutation_equivariant(graphs):
    model = GraphAutoencoder("HSE", latent_dim=6, hidden=8, layers=2).eval()
    graph = graphs[0]
    n = graph.num_nodes
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(n)
    permuted = Data(edge_index=inverse[graph.edge_index], num_nodes=n)
    permuted = AddRicciCurvature()(permuted)
    noise = torch.randn(n, model.noise_dim)
    u, _ = model.encode(Batch.from_data_list([graph]), noise)
    u_permuted, _ = model.encode(Batch.from_data_list([permuted]), noise[perm])
    assert torch.allclose(u_permuted[0], u[0][perm], atol=1e-5)


def test_denoisers_are_permutation_equivariant():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 6, generator=generator)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    x = x * mask.unsqueeze(-1)
    t = torch.tensor([3, 8])
    cond = torch.randn(2, DESCRIPTOR_DIM, generator=generator)
    perm = torch.tensor([4, 0, 3, 1, 2, 5, 6])  # keeps graph 1's padding at the end
    denoiser = NodeDenoiser(6, width=16, layers=2, cond_dim=DESCRIPTOR_DIM).eval()
    out = denoiser(x, t, mask, cond)
    assert torch.allclose(denoiser(x[:, perm], t, mask[:, perm], cond), out[:, perm], atol=1e-5)
    adjacency = (torch.rand(2, 7, 7, generator=generator) > 0.5).float().triu(1)
    adjacency = (adjacency + adjacency.transpose(1, 2)) * (mask.unsqueeze(1) & mask.unsqueeze(2))
    edges = EdgeDenoiser(width=8, layers=2).eval()
    logits = edges(adjacency, t, mask)
    assert torch.allclose(logits, logits.transpose(1, 2))
    permuted = edges(adjacency[:, perm][:, :, perm], t, mask[:, perm])
    assert torch.allclose(permuted, logits[:, perm][:, :, perm], atol=1e-5)


def test_cosine_ddpm_sampling_is_masked_and_seeded():
    diffusion = GaussianDiffusion(NodeDenoiser(4, width=8, layers=1), steps=5).eval()
    mask = torch.tensor([[True, True, False], [True, True, True]])
    first = diffusion.sample(mask, 4, generator=torch.Generator().manual_seed(3))
    second = diffusion.sample(mask, 4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(first, second)
    assert torch.all(first[0, 2] == 0)
    assert diffusion.alpha_bar[0] == 1
    assert diffusion.alpha_bar[-1] < 1e-3


def test_refinement_recovers_the_graphs_the_encoder_misses(graphs):
    model = CurvDiff("E", **{**TINY, "refine_steps": 0})
    model.fit(graphs, seed=0)
    adjacency, mask = dense_adjacency(graphs)

    def recovery(refine_steps):
        model.config.refine_steps = refine_steps
        u, _ = model.encode(graphs)
        return exact_recovery(model.autoencoder.edge_logits(u).sigmoid(), adjacency, mask)

    assert recovery(0) < 0.5  # three epochs of amortized encoding
    assert recovery(150) == 1.0


def test_latent_curvature_matches_ollivier_ricci_on_an_isometric_embedding():
    graph = from_networkx_graph(nx.convert_node_labels_to_integers(nx.grid_2d_graph(3, 3)))
    graph = AddRicciCurvature()(graph)
    hops = torch.tensor(nx.floyd_warshall_numpy(nx.grid_2d_graph(3, 3)), dtype=torch.float)
    adjacency, _ = dense_adjacency([graph])
    row, column = graph.edge_index
    predicted = latent_curvature(hops.unsqueeze(0), adjacency, torch.zeros_like(row), row, column)
    exact = ollivier_ricci(graph.edge_index, graph.num_nodes)
    assert torch.allclose(predicted, exact, atol=1e-3)


def test_gate_targets_follow_the_sign_of_the_curvature():
    targets = gate_targets(torch.tensor([-0.5, 0.0, 0.04, 0.3]), "HSE")
    assert targets.tolist() == [0, 2, 2, 1]


def test_samples_are_symmetric_seeded_graphs_and_the_model_reloads(fitted, graphs, tmp_path):
    samples = fitted.sample(6, seed=4)
    sizes = {g.num_nodes for g in graphs}
    for sample in samples:
        assert sample.num_nodes in sizes
        dense = torch.zeros(sample.num_nodes, sample.num_nodes)
        dense[sample.edge_index[0], sample.edge_index[1]] = 1
        assert torch.equal(dense, dense.T)
        assert dense.diagonal().sum() == 0
    again = fitted.sample(6, seed=4)
    assert all(torch.equal(a.edge_index, b.edge_index) for a, b in zip(samples, again, strict=True))
    fitted.save(tmp_path / "model")
    loaded = CurvDiff.load(tmp_path / "model")
    reloaded = loaded.sample(6, seed=4)
    assert all(
        torch.equal(a.edge_index, b.edge_index) for a, b in zip(samples, reloaded, strict=True)
    )
    assert loaded.curvatures() == pytest.approx(fitted.curvatures())


def test_baselines_sample_graphs_like_the_training_set(graphs):
    sizes = {g.num_nodes for g in graphs}
    for baseline in (
        ErdosRenyi().fit(graphs),
        LouvainSBM().fit(graphs),
        DiGressStyle(width=8, layers=1, steps=5, iterations=3, batch_size=4).fit(graphs),
    ):
        samples = baseline.sample(5, seed=1)
        assert len(samples) == 5
        assert {g.num_nodes for g in samples} <= sizes
        first = baseline.sample(5, seed=1)
        assert all(
            torch.equal(a.edge_index, b.edge_index) for a, b in zip(samples, first, strict=True)
        )
        for sample in samples:
            source, target = sample.edge_index
            assert not bool((source == target).any())


@pytest.mark.parametrize(
    ("graphs_given", "options", "message"),
    [
        ([], {}, "graphs"),
        ([Data(edge_index=torch.tensor([[0], [1]]), num_nodes=2)], {}, "graphs"),
        ([Data(edge_index=torch.tensor([[0, 1, 1], [1, 0, 1]]), num_nodes=2)], {}, "graphs"),
        ([from_networkx_graph(nx.path_graph(70))], {}, "graphs"),
    ],
)
def test_fit_rejects_bad_graph_lists(graphs_given, options, message):
    with pytest.raises(ValueError, match=message):
        CurvDiff("E", **TINY, **options).fit(graphs_given)


@pytest.mark.parametrize(
    ("options", "parameter"),
    [
        ({"geometry": "HXE"}, "geometry"),
        ({"geometry": "HH"}, "geometry"),
        ({"geometry": "HSE", "curvature_s": 0.0}, "curvature_s"),
        ({"geometry": "HSE", "curvature_h": 0.5}, "curvature_h"),
        ({"geometry": "E", "ricci_gating": True}, "ricci_gating"),
        ({"geometry": "HSE", "latent_dim": 10}, "latent_dim"),
    ],
)
def test_bad_options_name_the_parameter(options, parameter):
    with pytest.raises(ValueError, match=parameter):
        CurvDiff(**options)
