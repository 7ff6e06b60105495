"""MixScentNet networks and training (issue 25): invariance to component order, symmetry in the
pair, gradients into the encoder, the mixture graph's edge features, the head, the Snitz angle by
hand, Mordred targets and their cache, seeded determinism, and the estimator's save/load."""

import numpy as np
import pytest
import torch

from mixlab.graphs.mixscentnet import featurize
from mixlab.graphs.mixscentnet.baselines import SnitzAngle, snitz_angle
from mixlab.graphs.mixscentnet.estimator import MixtureDistanceModel
from mixlab.graphs.mixscentnet.featurize import ecfp4, mordred_targets, tanimoto
from mixlab.graphs.mixscentnet.model import (
    AGGREGATORS,
    MixScentNet,
    MixtureGraph,
    MoleculeEncoder,
    ScaledCosineDistance,
)
from mixlab.graphs.mixscentnet.training import (
    FeaturizedMixtures,
    fit_distance,
    macro_auroc,
    predict_distance,
)

MIXTURES = [
    ("CCO", "CC(=O)OCC", "c1ccccc1O"),
    ("CCCCC=O", "CC(C)O"),
    ("c1ccsc1",),
    ("CC(=O)O", "CCCCCCO", "CCOC(C)=O", "CC=O"),
]
PAIRS = np.array([[0, 1], [1, 2], [2, 3], [0, 3], [1, 3], [0, 2]])
DISTANCE = np.array([0.2, 0.5, 0.7, 0.3, 0.6, 0.8])


def network(
    aggregator: str = "graph", seed: int = 0, conv: str = "gatv2", readout: str = "pna"
) -> MixScentNet:
    torch.manual_seed(seed)
    encoder = MoleculeEncoder(8, 8, 2, conv)
    return MixScentNet(encoder, aggregator, width=8, readout=readout).eval()


@pytest.mark.parametrize(
    ("aggregator", "readout"), [*((a, "pna") for a in AGGREGATORS), ("graph", "attention")]
)
def test_distance_ignores_component_order_and_is_symmetric(aggregator, readout):
    model = network(aggregator, readout=readout)
    features = FeaturizedMixtures(MIXTURES)
    shuffled = FeaturizedMixtures([tuple(reversed(m)) for m in MIXTURES])
    forward = predict_distance(model, features, PAIRS)
    assert np.allclose(forward, predict_distance(model, shuffled, PAIRS), atol=1e-5)
    assert np.allclose(forward, predict_distance(model, features, PAIRS[:, ::-1]), atol=1e-6)
    assert ((forward >= 0) & (forward <= 1)).all()


@pytest.mark.parametrize("conv", ["gatv2", "gine"])
def test_gradients_reach_the_encoder(conv):
    model = network(conv=conv).train()
    features = FeaturizedMixtures(MIXTURES)
    from mixlab.graphs.mixscentnet.training import _pair_inputs

    out = model(*_pair_inputs(features, PAIRS, torch.device("cpu")))
    out.sum().backward()
    first = model.encoder.embed.weight.grad
    assert first is not None
    assert first.abs().sum() > 0


def test_mixture_graph_is_complete_with_tanimoto_and_concentration_edges():
    similarity = tanimoto(ecfp4(["CCO", "CCCO", "c1ccccc1"]))
    graph = MixtureGraph(similarity)([0, 2], [1.0, 0.25])
    assert graph.num_nodes == 2
    assert graph.edge_index.shape == (2, 4)
    edges = {
        tuple(e): a
        for e, a in zip(graph.edge_index.T.tolist(), graph.edge_attr.tolist(), strict=False)
    }
    assert edges[(0, 0)] == pytest.approx([1.0, 0.0])
    assert edges[(0, 1)] == pytest.approx([float(similarity[0, 2]), 0.75])
    with pytest.raises(ValueError, match="at least one component"):
        MixtureGraph(similarity)([])


def test_scaled_cosine_head_starts_at_a_half_and_never_inverts():
    head = ScaledCosineDistance()
    z = torch.randn(3, 5)
    assert torch.allclose(head(z, z), torch.full((3,), 0.5))
    head.a.data.fill_(-1.0)  # clamped at 0: distance no longer depends on the cosine
    assert torch.allclose(head(z, -z), head(z, z))


def test_snitz_angle_equals_a_hand_computation():
    u, v = np.array([[1.0, 0.0, 1.0]]), np.array([[0.0, 1.0, 1.0]])
    assert snitz_angle(u, v)[0] == pytest.approx(np.arccos(0.5))  # cos = 1 / (√2 · √2)
    descriptors = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    pairs = np.array([[0, 1], [0, 2], [1, 2], [0, 0]])
    angles = np.array([np.pi / 2, np.pi / 4, np.pi / 4, 0.0])
    model = SnitzAngle(descriptors).fit(pairs, 0.1 + 0.5 * angles)
    assert model.slope == pytest.approx(0.5, abs=1e-5)
    assert model.intercept == pytest.approx(0.1, abs=1e-5)


def test_seeded_fits_are_deterministic_and_learn():
    features = FeaturizedMixtures(MIXTURES)
    outputs = []
    for _ in range(2):
        model = network(seed=3).train()
        history = fit_distance(model, features, PAIRS, DISTANCE, steps=30, validation=0.0, seed=3)
        outputs.append(predict_distance(model, features, PAIRS))
    assert np.array_equal(outputs[0], outputs[1])
    assert history["train"][-1] < history["train"][0]


def test_early_stopping_stops_at_the_plateau_and_keeps_the_best_step(monkeypatch):
    """A validation error that stops falling ends the fit after ``patience`` checks, and the
    weights of the best check are the ones kept (its step is ``best_step``)."""
    from mixlab.graphs.mixscentnet import training

    features = FeaturizedMixtures(MIXTURES)
    errors = iter([0.5, 0.4, 0.3, 0.2995, 0.31, 0.32, 0.33, 0.34])

    def validation_error(model, features, pairs):  # predictions whose MAE is the next error
        return np.full(len(pairs), next(errors))

    monkeypatch.setattr(training, "predict_distance", validation_error)
    model = network(seed=1).train()
    history = fit_distance(model, features, PAIRS, np.zeros(len(PAIRS)), steps=100, eval_every=2,
                           patience=3, min_delta=1e-3, validation=0.5, seed=1)  # fmt: skip
    # checks at steps 2, 4, 6 improve; 8 improves by less than min_delta; 10, 12 do not
    assert len(history["train"]) == 12
    assert history["best_step"] == 6
    assert history["validation"][-1] == 0.32


def test_mini_batches_draw_every_pair_once_per_epoch(monkeypatch):
    features = FeaturizedMixtures(MIXTURES)
    seen = []
    real = MixScentNet.forward

    def forward(self, molecules, mixtures, pairs):
        if self.training:
            seen.append(len(pairs))
        return real(self, molecules, mixtures, pairs)

    monkeypatch.setattr(MixScentNet, "forward", forward)
    model = network(seed=2).train()
    history = fit_distance(model, features, PAIRS, DISTANCE, steps=4, batch_size=4,
                           validation=0.0, seed=2)  # fmt: skip
    assert len(history["train"]) == 4
    assert sorted(seen) == [3, 3, 3, 3]  # two epochs of 6 pairs, each in two batches of 3
    with pytest.raises(ValueError, match="batch_size"):
        fit_distance(model, features, PAIRS, DISTANCE, steps=1, batch_size=0)


def test_mordred_targets_are_finite_robust_z_and_cached(tmp_path, monkeypatch):
    smiles = ["CCO", "CCCO", "c1ccccc1", "CC(=O)O", "CCN", "CCCCCC"]
    targets, names = mordred_targets(smiles, tmp_path)
    assert targets.shape == (6, len(names))
    assert len(names) > 100
    assert np.isfinite(targets).all()
    assert np.abs(targets).max() <= featurize.MORDRED_CLIP

    def recompute(*args):
        raise AssertionError("cached descriptors were computed again")

    monkeypatch.setattr(featurize, "_mordred_raw", recompute)
    again, _ = mordred_targets(list(reversed(smiles)), tmp_path)
    assert np.allclose(again, targets[::-1])


def test_macro_auroc_skips_labels_with_one_class():
    labels = np.array([[1, 0], [0, 0], [1, 0]])
    assert macro_auroc(np.array([[0.9, 0.1], [0.2, 0.3], [0.8, 0.5]]), labels) == 1.0
    with pytest.raises(ValueError, match="both classes"):
        macro_auroc(np.zeros((2, 1)), np.zeros((2, 1)))


def test_estimator_fits_saves_and_reloads(tmp_path):
    model = MixtureDistanceModel(hidden=8, embedding=8, mixture_width=8, layers=1, steps=5)
    model.fit(MIXTURES, PAIRS, DISTANCE)
    before = model.predict(MIXTURES, PAIRS)
    folder = model.save(tmp_path / "model")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    loaded = MixtureDistanceModel.load(folder)
    assert np.allclose(loaded.predict(MIXTURES, PAIRS), before, atol=1e-6)
    # a folder saved before issue 80 (the weights in torch's pickle container) still loads
    torch.save(model.network.state_dict(), folder / "model.pt")
    (folder / "model.safetensors").unlink()
    older = MixtureDistanceModel.load(folder)
    assert np.allclose(older.predict(MIXTURES, PAIRS), before, atol=1e-6)
    assert model.embed(MIXTURES).shape == (4, 8)
    with pytest.raises(ValueError, match=r"distance: values must lie in \[0, 1\]"):
        model.fit(MIXTURES, PAIRS, DISTANCE + 1)
    with pytest.raises(ValueError, match=r"pairs must index the 4 mixtures"):
        model.predict(MIXTURES, [[0, 4]])
    with pytest.raises(ValueError, match=r"mixtures\[1\] must be a non-empty"):
        model.predict([("CCO",), ()], [[0, 1]])
    with pytest.raises(ValueError, match="aggregator"):
        MixtureDistanceModel(aggregator="sum")
