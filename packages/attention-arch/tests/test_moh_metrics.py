"""MoH's local sample-quality metrics: FID_local against the closed form, KID's unbiasedness,
precision/recall at their extremes, the recognisable rate, the Gaussian reference generator, the
cached feature net (labelled and rotation paths), and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from mixlab.attention_arch.moh.metrics import (
    FeatureNet,
    feature_net,
    frechet_distance,
    gaussian_fit_samples,
    kid,
    precision_recall,
    recognisable_rate,
    score,
)
from mixlab.shared.files import CheckpointError

torch.set_num_threads(1)


def gaussian_features(n, d=8, shift=0.0, seed=0):
    return np.random.default_rng(seed).standard_normal((n, d)) + shift


def blobs(n=48, size=8, seed=0):
    """Two classes of [-1, 1] images: a bright square top-left (0) or bottom-right (1), noisy."""
    generator = torch.Generator().manual_seed(seed)
    images = -torch.ones(n, 1, size, size) + 0.1 * torch.rand(n, 1, size, size, generator=generator)
    labels = torch.arange(n) % 2
    half = size // 2
    images[labels == 0, :, :half, :half] = 0.9
    images[labels == 1, :, half:, half:] = 0.9
    return images, labels


TINY = {"steps": 30, "batch_size": 16, "feature_dim": 8, "width": 8}


# --- Fréchet distance -------------------------------------------------------------------------


def test_frechet_distance_matches_the_closed_form_for_diagonal_covariances():
    rng = np.random.default_rng(0)
    mu1, mu2 = rng.standard_normal(5), rng.standard_normal(5)
    s1, s2 = rng.uniform(0.1, 3, 5), rng.uniform(0.1, 3, 5)
    expected = ((mu1 - mu2) ** 2).sum() + (s1 + s2 - 2 * np.sqrt(s1 * s2)).sum()
    got = frechet_distance(mu1, np.diag(s1), mu2, np.diag(s2))
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert expected > 0.1  # a case where a wrong formula would show


def test_frechet_distance_matches_the_closed_form_for_commuting_full_covariances():
    # Σ1 = Q diag(a) Qᵀ, Σ2 = Q diag(b) Qᵀ commute; (Σ1Σ2)^{1/2} = Q diag(√(ab)) Qᵀ.
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    a, b = rng.uniform(0.2, 4, 6), rng.uniform(0.2, 4, 6)
    sigma1, sigma2 = q @ np.diag(a) @ q.T, q @ np.diag(b) @ q.T
    mu1, mu2 = rng.standard_normal(6), rng.standard_normal(6)
    expected = ((mu1 - mu2) ** 2).sum() + (a + b - 2 * np.sqrt(a * b)).sum()
    got = frechet_distance(torch.from_numpy(mu1), sigma1, mu2, torch.from_numpy(sigma2))
    assert got == pytest.approx(expected, rel=1e-8)


def test_frechet_distance_is_zero_for_identical_statistics_even_when_singular():
    features = gaussian_features(50)
    mu, sigma = features.mean(0), np.cov(features, rowvar=False)
    assert frechet_distance(mu, sigma, mu, sigma) == pytest.approx(0, abs=1e-8)
    singular = np.diag([1.0, 2.0, 0.0])  # rank 2
    assert frechet_distance(np.zeros(3), singular, np.zeros(3), singular) == pytest.approx(
        0, abs=1e-5
    )


# --- KID -------------------------------------------------------------------------------------


def test_kid_is_near_zero_for_one_distribution_and_clearly_positive_for_a_shift():
    real, same = gaussian_features(400, seed=0), gaussian_features(400, seed=1)
    shifted = gaussian_features(400, shift=1.0, seed=2)
    mean_same, std_same = kid(real, same, subsets=20, subset_size=200)
    mean_shifted, _ = kid(real, shifted, subsets=20, subset_size=200)
    assert abs(mean_same) < 0.05
    assert std_same > 0
    assert mean_shifted > 1.0 > 20 * abs(mean_same)


def test_kid_is_unbiased_where_the_biased_estimate_is_not():
    # Small subsets: the V-statistic (with the i = j terms) is clearly > 0 on one distribution,
    # the unbiased estimate averages to 0 within its standard error.
    real, fake = gaussian_features(2000, d=4, seed=3), gaussian_features(2000, d=4, seed=4)
    mean, std = kid(real, fake, subsets=400, subset_size=10, seed=1)
    assert abs(mean) < 3 * std / np.sqrt(400)
    x, y = real[:10], fake[:10]
    kernel = lambda a, b: (a @ b.T / 4 + 1) ** 3  # noqa: E731
    biased = kernel(x, x).mean() + kernel(y, y).mean() - 2 * kernel(x, y).mean()
    assert biased > 10 * abs(mean)


def test_kid_clips_the_subset_size_and_is_seeded():
    real, fake = gaussian_features(30), gaussian_features(12, seed=5)
    assert kid(real, fake, subsets=5, seed=3) == kid(real, fake, subsets=5, seed=3)
    assert kid(real, fake, subsets=5, seed=3) != kid(real, fake, subsets=5, seed=4)


# --- precision / recall ----------------------------------------------------------------------


def test_precision_recall_identical_sets_are_one_and_far_sets_are_zero():
    real = gaussian_features(60)
    assert precision_recall(real, real.copy(), k=3) == (1.0, 1.0)
    assert precision_recall(real, real + 100.0, k=3) == (0.0, 0.0)


def test_precision_recall_by_hand_with_k_1():
    # real radii (nearest other real point): all 1. Fakes 0.5 and 1.9 lie inside, 5 does not.
    # fake radii: 1.4, 1.4, 3.1; every real point is within 1.4 of 0.5 or 1.9.
    real = np.array([[0.0], [1.0], [2.0], [3.0]])
    fake = np.array([[0.5], [1.9], [5.0]])
    precision, recall = precision_recall(real, fake, k=1)
    assert precision == pytest.approx(2 / 3)
    assert recall == 1.0
    assert precision_recall(fake, real, k=1) == pytest.approx((1.0, 2 / 3))


def test_precision_recall_a_collapsed_generator_is_precise_but_misses_modes():
    real = gaussian_features(200, d=2)
    collapsed = real[np.linalg.norm(real, axis=1) < 0.5][:20]  # the real data's centre only
    precision, recall = precision_recall(real, collapsed, k=3, chunk=7)
    assert precision == 1.0
    assert recall < 0.5


# --- recognisable rate ----------------------------------------------------------------------


class FixedLogits(nn.Module):
    """Forward gives fixed logits whatever the images (one row per image)."""

    def __init__(self, logits, num_classes):
        super().__init__()
        self.logits = nn.Parameter(torch.as_tensor(logits, dtype=torch.float32))
        self.num_classes = num_classes

    def forward(self, images):
        return self.logits[: len(images)]


def test_recognisable_rate_counts_confident_images():
    # softmax maxima: ~1.0, 0.5 (in float32), 0.79, 1/3
    logits = [[10.0, 0.0, 0.0], [1.0, 1.0, -30.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    net = FixedLogits(logits, 3)
    images = torch.zeros(4, 1, 8, 8)
    assert recognisable_rate(net, images) == 0.25
    assert recognisable_rate(net, images, threshold=0.5) == 0.75
    assert recognisable_rate(net, images, threshold=1 / 3 - 1e-6) == 1.0
    assert recognisable_rate(net, images, threshold=1.0) == 0.0


def test_recognisable_rate_is_none_without_class_head():
    net = FeatureNet(1, None, feature_dim=8, width=8)
    assert recognisable_rate(net, torch.zeros(3, 1, 8, 8)) is None


# --- Gaussian reference ------------------------------------------------------------------------


def test_gaussian_fit_samples_have_the_data_mean_covariance_and_shape():
    generator = torch.Generator().manual_seed(0)
    base = torch.linspace(-0.4, 0.4, 3 * 8 * 8).reshape(1, 3, 8, 8)
    images = base + 0.1 * torch.randn(500, 3, 8, 8, generator=generator)
    images[:, 1] = images[:, 0]  # a singular covariance: channel 1 copies channel 0
    samples = gaussian_fit_samples(images, 4000, seed=1)
    assert samples.shape == (4000, 3, 8, 8)
    assert samples.dtype == torch.float32
    assert samples.min() >= -1
    assert samples.max() <= 1
    assert (samples.mean(0) - images.mean(0)).abs().max() < 0.02
    assert (samples.std(0) - images.std(0)).abs().max() < 0.02
    assert torch.allclose(samples[:, 1], samples[:, 0], atol=1e-4)  # the correlation is kept
    assert torch.equal(samples[:10], gaussian_fit_samples(images, 10, seed=1))


# --- the feature net ---------------------------------------------------------------------------


@pytest.mark.parametrize(("channels", "size"), [(1, 8), (3, 13), (3, 32)])
def test_feature_net_shapes(channels, size):
    net = FeatureNet(channels, 5, feature_dim=16, width=8)
    x = torch.rand(2, channels, size, size) * 2 - 1
    assert net.features(x).shape == (2, 16)
    assert net(x).shape == (2, 5)
    assert FeatureNet(channels, None, width=8)(x).shape == (2, 4)  # rotation head


def test_feature_net_learns_a_tiny_labelled_set_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path))
    images, labels = blobs()
    rng_before = torch.get_rng_state()
    net = feature_net(images, labels, seed=0, **TINY)
    assert torch.equal(torch.get_rng_state(), rng_before)  # no side effect on the global generator
    assert net.num_classes == 2
    assert not net.training
    assert not any(p.requires_grad for p in net.parameters())
    test_images, test_labels = blobs(seed=1)
    with torch.no_grad():
        assert (net(test_images).argmax(-1) == test_labels).float().mean() == 1.0
    entries = list((tmp_path / "moh").iterdir())
    assert [entry.name.startswith("feature-net-") for entry in entries] == [True]  # no temporary
    assert (entries[0] / "cache.json").is_file()  # keyed and timed by mixlab.shared.cache
    again = feature_net(images, labels, seed=0, **TINY)
    for (name, a), b in zip(net.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    # another seed or other labels is another entry
    feature_net(images, labels, seed=1, **TINY)
    feature_net(images, 1 - labels, seed=0, **TINY)
    assert len(list((tmp_path / "moh").iterdir())) == 3
    # a damaged entry is refused, not silently used or retrained
    weights = entries[0] / "net.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + bytes(8))
    with pytest.raises(CheckpointError, match="delete the folder"):
        feature_net(images, labels, seed=0, **TINY)


def test_feature_net_is_deterministic_given_seed_without_cache():
    images, labels = blobs(n=16)
    a = feature_net(images, labels, seed=2, cache=False, **{**TINY, "steps": 3})
    b = feature_net(images, labels, seed=2, cache=False, **{**TINY, "steps": 3})
    c = feature_net(images, labels, seed=3, cache=False, **{**TINY, "steps": 3})
    assert torch.equal(a.head.weight, b.head.weight)
    assert not torch.equal(a.head.weight, c.head.weight)


def test_feature_net_without_labels_trains_on_rotations_and_scores(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path))
    images, _ = blobs(n=32)
    net = feature_net(images, seed=0, **{**TINY, "steps": 5})
    assert net.num_classes is None
    assert net.head.out_features == 4
    metrics = score(net, images, gaussian_fit_samples(images, 16), kid_subsets=3)
    assert set(metrics) == {"fid_local", "kid_local", "kid_local_std", "precision", "recall",
                            "recognisable"}  # fmt: skip
    assert metrics["recognisable"] is None
    assert all(isinstance(metrics[key], float) for key in metrics if key != "recognisable")


def test_score_of_real_against_itself_is_perfect(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path))
    images, labels = blobs()
    net = feature_net(images, labels, **TINY)
    metrics = score(net, images, images.clone(), kid_subsets=5, threshold=0.5)
    assert metrics["fid_local"] == pytest.approx(0, abs=1e-4)
    assert metrics["precision"] == metrics["recall"] == 1.0
    assert metrics["recognisable"] == 1.0  # every image classified (right) by the 2-class head
    noise = torch.rand(48, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    worse = score(net, images, noise, kid_subsets=5)
    assert worse["fid_local"] > 0.1
    assert worse["kid_local"] > 0.02
    assert worse["precision"] < 0.5
    assert worse["recall"] < 0.5


# --- refusals ------------------------------------------------------------------------------------


def test_bad_inputs_raise_value_errors_naming_the_parameter():
    real, fake = gaussian_features(20, d=8), gaussian_features(20, d=6)
    with pytest.raises(ValueError, match="fake_feats must be features of the real features' dim"):
        kid(real, fake)
    with pytest.raises(ValueError, match="fake_feats must be"):
        precision_recall(real, fake)
    with pytest.raises(ValueError, match="real_feats must be features \\[N, d\\] with N >= 2"):
        kid(real[:1], real)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        precision_recall(real, real, k=0)
    with pytest.raises(ValueError, match="k must be less than the size of the smaller set"):
        precision_recall(real, real[:3], k=3)
    with pytest.raises(ValueError, match="subsets must be an integer >= 1"):
        kid(real, real, subsets=0)
    with pytest.raises(ValueError, match="mu2 must be a vector"):
        frechet_distance(np.zeros(3), np.eye(3), np.zeros(4), np.eye(3))
    with pytest.raises(ValueError, match="sigma2 must be a matrix"):
        frechet_distance(np.zeros(3), np.eye(3), np.zeros(3), np.eye(4))
    net = FixedLogits([[0.0, 1.0]], 2)
    for threshold in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="threshold must be a number in \\(0, 1\\]"):
            recognisable_rate(net, torch.zeros(1, 1, 8, 8), threshold=threshold)
    with pytest.raises(ValueError, match="net must be a FeatureNet"):
        recognisable_rate(nn.Linear(2, 2), torch.zeros(1, 1, 8, 8))


def test_bad_images_and_training_settings_are_refused():
    images, labels = blobs(n=8)
    with pytest.raises(ValueError, match="images \\(number of images\\) must be at least 2"):
        feature_net(images[:1], labels[:1], cache=False)
    with pytest.raises(ValueError, match="images must be a tensor \\[N, C, H, W\\] with C in"):
        feature_net(images[:, :, :4, :4], labels, cache=False)
    with pytest.raises(ValueError, match="images must be a tensor"):
        feature_net(images.expand(-1, 2, -1, -1), labels, cache=False)
    with pytest.raises(ValueError, match="images values must be finite and in \\[-1, 1\\]"):
        feature_net(images * 255, labels, cache=False)
    with pytest.raises(ValueError, match="labels must be None or an integer tensor \\[8\\]"):
        feature_net(images, labels.float(), cache=False)
    with pytest.raises(ValueError, match="labels must be at least two classes"):
        feature_net(images, torch.zeros(8, dtype=torch.long), cache=False)
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        feature_net(images, labels, steps=0, cache=False)
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        feature_net(images, labels, lr=float("nan"), cache=False)
    with pytest.raises(ValueError, match="seed must be an integer in"):
        feature_net(images, labels, seed=-1, cache=False)
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        gaussian_fit_samples(images, 0)
    with pytest.raises(ValueError, match="images \\(number of images\\) must be at least 2"):
        gaussian_fit_samples(images[:1], 5)
    net = FeatureNet(1, 2, feature_dim=8, width=8)
    with pytest.raises(ValueError, match="fake_images must be images of the real images' shape"):
        score(net, images, torch.zeros(4, 1, 16, 16))
    with pytest.raises(ValueError, match="images must be 1-channel images"):
        score(net, images.expand(-1, 3, -1, -1), images.expand(-1, 3, -1, -1))
    with pytest.raises(ValueError, match="in_channels must be 1 or 3"):
        FeatureNet(2, 4)
