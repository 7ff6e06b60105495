"""Sample-quality metrics for MoH in the feature space of a small CNN trained here on the real data.

No Inception network can be downloaded, so the Fréchet and kernel distances are taken between
features of :class:`FeatureNet`, a small classifier fitted to the real images by
:func:`feature_net`. Report them as **FID_local** and **KID_local**, never as "FID" or "KID": they
are not comparable with published Inception-v3 numbers, only between runs scored by the same net.

With features f of real images (r) and generated ones (g), d = ``feature_dim``:

- FID_local (Heusel et al. 2017, arXiv:1706.08500), :func:`frechet_distance`::

      d²((μ_r, Σ_r), (μ_g, Σ_g)) = ‖μ_r − μ_g‖² + tr(Σ_r + Σ_g − 2 (Σ_r Σ_g)^{1/2})

- KID_local (Bińkowski et al. 2018, "Demystifying MMD GANs", arXiv:1801.01401), :func:`kid`: the
  unbiased MMD² with the kernel k(x, y) = (xᵀy / d + 1)³, averaged over random subsets of m::

      MMD²_u = Σ_{i≠j} k(r_i, r_j) / (m(m−1)) + Σ_{i≠j} k(g_i, g_j) / (m(m−1)) − 2 Σ_{i,j} k(r_i, g_j) / m²

- precision and recall (Kynkäänniemi et al. 2019, arXiv:1904.06991), :func:`precision_recall`:
  each set's manifold is the union of balls around its points whose radius is the distance to the
  point's k-th nearest neighbour in the same set; precision is the share of generated points inside
  the real manifold, recall the share of real points inside the generated one.
- recognisable rate, :func:`recognisable_rate`: the share of generated images the classifier
  assigns a class with max softmax ≥ 0.9 (only for a net trained on labels).

:func:`gaussian_fit_samples` is the experiment's trivial generator: a Gaussian with the real pixel
mean and covariance, which any useful model must beat.

:func:`feature_net` trains once per (images, labels, settings, the source of this module) and
caches the weights under ``mixlab.shared.cache_dir("moh")`` (``$MIXLAB_CACHE`` when set) through
:func:`mixlab.shared.cache.cached`. With labels the
net is a classifier over them, trained with random shifts of up to H/8 pixels (no flips: a mirrored
digit is not a real one). Without labels it learns the self-supervised pretext task of RotNet
(Gidaris et al. 2018, arXiv:1803.07728), predicting which of 4 rotations by 90° was applied, so a
folder of unlabelled images still gets features; such a net has ``num_classes = None``.
Measured on sklearn's digits (8×8, a random 1437 training / 360 held-out split, one CPU thread,
the defaults): 0.989, 0.989, 0.994 held-out accuracy for seeds 0, 1, 2, in 6.5–7.3 s of training
each (plus ~10 s once per process where bytecode is not cached: building the first optimiser
imports torch's compiler stack); 200 steps gave 0.981–0.992. Against the training images, the
held-out images score FID_local 0.81 and the Gaussian fit 11.1 (rotation net: 0.025 and 0.51).
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.linalg
import torch
import torch.nn.functional as F
from torch import nn

from mixlab.shared import is_count, load_state, progress, require, save_state
from mixlab.shared.cache import cached
from mixlab.shared.files import CheckpointError

__all__ = [
    "FeatureNet",
    "feature_net",
    "features",
    "frechet_distance",
    "gaussian_fit_samples",
    "kid",
    "precision_recall",
    "recognisable_rate",
    "score",
]

FEATURE_NET_CODE = ("mixlab.attention_arch.moh.metrics",)
"""the modules whose source makes a cached feature net (its cache key covers them)"""
ROTATIONS = 4
"""the pretext task without labels: which of 0°, 90°, 180°, 270° was applied"""


class FeatureNet(nn.Module):
    """A small CNN: image → ``feature_dim`` features (the penultimate layer) → class logits.

    Three blocks of 3×3 conv → GroupNorm → SiLU (the last two with stride 2), a global average
    pool, a linear feature layer with SiLU, then a linear head over ``num_classes`` labels, or over
    the 4 rotations of the pretext task when ``num_classes`` is None.

    Args:
        in_channels: image channels, 1 or 3.
        num_classes: labels the head predicts, or None for the rotation pretext task (a net without
            class head: :func:`recognisable_rate` gives None for it).
        feature_dim: width of the feature layer (default: 64).
        width: channels of the first block; the others have 2× (default: 32).

    Shapes:
        input ``[N, in_channels, H, W]`` with H, W ≥ 8, values in [-1, 1];
        :meth:`features` ``[N, feature_dim]``; :meth:`forward` ``[N, num_classes or 4]``.
    """

    def __init__(
        self, in_channels: int, num_classes: int | None, *, feature_dim: int = 64, width: int = 32
    ):
        super().__init__()
        require(in_channels in (1, 3), "in_channels", "1 or 3", in_channels)
        require(num_classes is None or is_count(num_classes, 2), "num_classes",
                "None or an integer >= 2", num_classes)  # fmt: skip
        require(is_count(feature_dim), "feature_dim", "an integer >= 1", feature_dim)
        require(is_count(width, 8) and width % 8 == 0, "width", "a multiple of 8", width)
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.feature_dim = feature_dim

        def block(cin: int, cout: int, stride: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride=stride, padding=1), nn.GroupNorm(8, cout), nn.SiLU()
            )

        self.trunk = nn.Sequential(
            block(in_channels, width, 1),  # H
            block(width, 2 * width, 2),  # H/2
            block(2 * width, 2 * width, 2),  # H/4
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(2 * width, feature_dim),
            nn.SiLU(),
        )
        self.head = nn.Linear(feature_dim, ROTATIONS if num_classes is None else num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, C, H, W]`` → ``[N, feature_dim]``, the input of the head."""
        return self.trunk(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, C, H, W]`` → logits ``[N, num_classes]`` (``[N, 4]`` rotations without labels)."""
        return self.head(self.features(x))


def _check_images(images: object, name: str, *, minimum: int = 2) -> torch.Tensor:
    """``images`` as a float32 CPU-or-device tensor, after checking shape and range."""
    require(isinstance(images, torch.Tensor) and images.is_floating_point(), name,
            "a float tensor [N, C, H, W]", type(images).__name__)  # fmt: skip
    assert isinstance(images, torch.Tensor)
    shape = tuple(images.shape)
    require(images.dim() == 4 and shape[1] in (1, 3) and shape[2] == shape[3] >= 8, name,
            "a tensor [N, C, H, W] with C in (1, 3) and H = W >= 8", shape)  # fmt: skip
    require(shape[0] >= minimum, f"{name} (number of images)", f"at least {minimum}", shape[0])
    images = images.float()
    low, high = images.min().item(), images.max().item()
    require(math.isfinite(low) and math.isfinite(high) and low >= -1.0001 and high <= 1.0001,
            f"{name} values", "finite and in [-1, 1] (scale the data, or .clamp(-1, 1) samples)",
            (low, high))  # fmt: skip
    return images


def _check_seed(seed: object) -> None:
    require(is_count(seed, 0) and seed < 2**32, "seed", "an integer in [0, 2**32)", seed)


# ---------------------------------------------------------------------------------------------
# The feature net: training and its cache
# ---------------------------------------------------------------------------------------------


def _shift(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Move each image by its own random (dy, dx) in [-max_shift, max_shift], edges replicated."""
    n, _, h, w = images.shape
    padded = F.pad(images, (max_shift,) * 4, mode="replicate")
    dy, dx = torch.randint(0, 2 * max_shift + 1, (2, n, 1), generator=generator)
    rows = (dy + torch.arange(h))[:, :, None]  # [N, H, 1]
    cols = (dx + torch.arange(w))[:, None, :]  # [N, 1, W]
    batch = torch.arange(n)[:, None, None]
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)  # [N, C, H, W]


def _rotate(images: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate each image by a random multiple of 90°; returns (rotated, the multiple)."""
    turns = torch.randint(0, ROTATIONS, (len(images),), generator=generator)
    rotated = images.clone()
    for k in range(1, ROTATIONS):
        chosen = turns == k
        rotated[chosen] = torch.rot90(images[chosen], k, dims=(2, 3))
    return rotated, turns


def _train(
    net: FeatureNet,
    images: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    seed: int,
    steps: int,
    batch_size: int,
    lr: float,
) -> None:
    """AdamW with a one-cycle schedule on cross-entropy (labels, or rotations without them)."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps)
    max_shift = max(1, images.shape[-1] // 8)
    device = next(net.parameters()).device
    net.train()
    with progress(steps, "feature net") as bar:
        for _ in range(steps):
            index = torch.randint(len(images), (min(batch_size, len(images)),), generator=generator)
            batch = _shift(images[index], max_shift, generator)
            if labels is None:
                batch, target = _rotate(batch, generator)
            else:
                target = labels[index]
            loss = F.cross_entropy(net(batch.to(device)), target.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            bar.advance(loss=loss.item())
    net.eval()


def feature_net(
    images: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    seed: int = 0,
    steps: int = 300,
    batch_size: int = 128,
    lr: float = 3e-3,
    feature_dim: int = 64,
    width: int = 32,
    cache: bool = True,
    device: str | torch.device = "cpu",
) -> FeatureNet:
    """A :class:`FeatureNet` trained on the real ``images``, frozen and in eval mode.

    Trained on the CPU (deterministic given ``seed``), then moved to ``device``. With ``cache``
    the weights are stored once per (images' bytes, labels, settings, the source of this module)
    in ``cache_dir("moh")/feature-net-<digest>`` by :func:`mixlab.shared.cache.cached` and later
    calls load them; each entry is a folder written under a temporary name and renamed into
    place, so readers never see a partial one, and one process builds it while any other that
    asks for it meanwhile waits and then loads it (the cache's lock).

    Args:
        images: real images ``[N, C, H, W]``, C in (1, 3), H = W >= 8, values in [-1, 1], N >= 2.
        labels: ``[N]`` integer class labels in [0, num_classes), or None to train on the rotation
            pretext task (then ``net.num_classes`` is None).
        seed: initialisation, batches and augmentation (default: 0).
        steps: optimiser steps (default: 300, ~27 epochs of 1437 digits training images).
        batch_size: images per step (default: 128).
        lr: peak learning rate of the one-cycle schedule (default: 3e-3).
        feature_dim, width: see :class:`FeatureNet` (defaults: 64, 32).
        cache: load from / save to the cache (default: True).
        device: where the returned net lives (default: "cpu").
    """
    images = _check_images(images, "images").detach().cpu().contiguous()
    num_classes = None
    if labels is not None:
        require(isinstance(labels, torch.Tensor) and not labels.is_floating_point()
                and not labels.is_complex() and labels.shape == (len(images),), "labels",
                f"None or an integer tensor [{len(images)}]",
                tuple(labels.shape) if isinstance(labels, torch.Tensor) else labels)  # fmt: skip
        labels = labels.detach().cpu().long().contiguous()
        require(labels.min().item() >= 0, "labels", "non-negative integers", labels.min().item())
        num_classes = int(labels.max().item()) + 1
        require(num_classes >= 2, "labels", "at least two classes (0 and 1)", num_classes)
    _check_seed(seed)
    require(is_count(steps), "steps", "an integer >= 1", steps)
    require(is_count(batch_size), "batch_size", "an integer >= 1", batch_size)
    require(isinstance(lr, int | float) and math.isfinite(lr) and lr > 0, "lr",
            "a finite number > 0", lr)  # fmt: skip
    settings = {"seed": seed, "steps": steps, "batch_size": batch_size,
                "lr": float(lr), "feature_dim": feature_dim, "width": width,
                "num_classes": num_classes, "shape": list(images.shape)}  # fmt: skip

    def build() -> FeatureNet:
        with torch.random.fork_rng(devices=[]):  # seed the initialisation without side effects
            torch.manual_seed(seed)
            return FeatureNet(images.shape[1], num_classes, feature_dim=feature_dim, width=width)

    def train() -> FeatureNet:
        net = build()
        _train(net, images, labels, seed=seed, steps=steps, batch_size=batch_size, lr=lr)
        return net

    net = _cached(images, labels, settings, build, train) if cache else train()
    return net.to(device).eval().requires_grad_(False)


def _cached(
    images: torch.Tensor,
    labels: torch.Tensor | None,
    settings: dict,
    build: Callable[[], FeatureNet],
    train: Callable[[], FeatureNet],
) -> FeatureNet:
    """Load the net of these images, labels and settings from the cache, or train it and store
    it there first."""
    data = hashlib.sha256(images.numpy().tobytes())
    data.update(b"no labels" if labels is None else labels.numpy().tobytes())
    key = {**settings, "data_sha256": data.hexdigest()}

    def train_into(folder: Path) -> None:
        save_state({"settings": settings, "model": train().state_dict()}, folder / "net")

    entry = cached("moh", "feature-net", key, train_into, code=FEATURE_NET_CODE)
    return _load(entry, build)


def _load(entry: Path, build: Callable[[], FeatureNet]) -> FeatureNet:
    advice = f"a cached feature net: delete the folder {entry} to train it again"
    try:
        state = load_state(entry / "net")
        if not isinstance(state, dict) or "model" not in state:
            raise CheckpointError(f"{entry / 'net.json'}: not a cached feature net")
        net = build()
        try:
            net.load_state_dict(state["model"])
        except (KeyError, RuntimeError) as error:
            raise CheckpointError(f"{entry / 'net.json'}: damaged ({error})") from error
    except CheckpointError as error:
        raise CheckpointError(f"{error} ({advice})") from error
    return net


# ---------------------------------------------------------------------------------------------
# Features and the distances between them
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def features(net: FeatureNet, images: torch.Tensor, *, batch_size: int = 256) -> torch.Tensor:
    """``net.features`` of ``images`` ``[N, C, H, W]`` in batches: ``[N, feature_dim]`` float64
    on the CPU."""
    images = _check_images(images, "images", minimum=1)
    require(images.shape[1] == net.in_channels, "images", f"{net.in_channels}-channel images",
            tuple(images.shape))  # fmt: skip
    device = next(net.parameters()).device
    out = [net.features(chunk.to(device)).double().cpu() for chunk in images.split(batch_size)]
    return torch.cat(out)


def _as_features(x: object, name: str) -> np.ndarray:
    array = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    require(array.ndim == 2 and array.shape[0] >= 2 and array.shape[1] >= 1, name,
            "features [N, d] with N >= 2", array.shape)  # fmt: skip
    require(bool(np.isfinite(array).all()), name, "finite", "non-finite values")
    return array


def _check_dims(real: np.ndarray, fake: np.ndarray) -> None:
    require(real.shape[1] == fake.shape[1], "fake_feats",
            f"features of the real features' dimension {real.shape[1]}", fake.shape[1])  # fmt: skip


def frechet_distance(mu1, sigma1, mu2, sigma2, *, eps: float = 1e-6) -> float:
    """The Fréchet (2-Wasserstein) distance between N(mu1, sigma1) and N(mu2, sigma2)::

        ‖μ₁ − μ₂‖² + tr(Σ₁) + tr(Σ₂) − 2 tr((Σ₁ Σ₂)^{1/2})

    (Dowson & Landau 1982; Heusel et al. 2017), computed as pytorch-fid does: the matrix square
    root by ``scipy.linalg.sqrtm``; when Σ₁Σ₂ is singular (a non-finite root, or scipy's
    singular-matrix warning), again with ``eps``·I added to both covariances inside the root
    only; imaginary parts from rounding are dropped (a large one raises: not covariances).

    Args:
        mu1, mu2: means ``[d]`` (arrays or tensors).
        sigma1, sigma2: covariances ``[d, d]``.
    """
    mu1, mu2 = (np.atleast_1d(np.asarray(mu, dtype=np.float64)) for mu in (mu1, mu2))
    d = mu1.shape[0]
    require(mu1.ndim == 1, "mu1", "a vector [d]", mu1.shape)
    require(mu2.shape == (d,), "mu2", f"a vector [{d}] like mu1", mu2.shape)
    sigma1, sigma2 = (np.atleast_2d(np.asarray(s, dtype=np.float64)) for s in (sigma1, sigma2))
    require(sigma1.shape == (d, d), "sigma1", f"a matrix [{d}, {d}] (d of mu1)", sigma1.shape)
    require(sigma2.shape == (d, d), "sigma2", f"a matrix [{d}, {d}] (d of mu1)", sigma2.shape)
    for name, value in (("mu1", mu1), ("mu2", mu2), ("sigma1", sigma1), ("sigma2", sigma2)):
        require(bool(np.isfinite(value).all()), name, "finite", "non-finite values")
    diff = mu1 - mu2
    with warnings.catch_warnings():
        warnings.simplefilter("error", scipy.linalg.LinAlgWarning)  # scipy's "Matrix is singular"
        try:
            covmean = scipy.linalg.sqrtm(sigma1 @ sigma2)
        except scipy.linalg.LinAlgWarning:
            covmean = np.full((d, d), np.nan)
    if not np.isfinite(covmean).all():  # a singular product (fewer samples than dimensions)
        offset = np.eye(d) * eps
        covmean = scipy.linalg.sqrtm((sigma1 + offset) @ (sigma2 + offset))
    if np.iscomplexobj(covmean):
        imaginary = np.abs(np.diagonal(covmean).imag).max()
        require(imaginary < 1e-3, "sigma1, sigma2", "positive semi-definite covariances",
                f"a square root with imaginary part {imaginary:.3g}")  # fmt: skip
        covmean = covmean.real
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * np.trace(covmean))


def _gaussian(feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return feats.mean(0), np.cov(feats, rowvar=False).reshape(feats.shape[1], feats.shape[1])


def kid(
    real_feats, fake_feats, *, subsets: int = 100, subset_size: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """Kernel inception distance (Bińkowski et al. 2018): the unbiased MMD² with the kernel
    k(x, y) = (xᵀy / d + 1)³, averaged over ``subsets`` random subsets of ``subset_size`` real and
    fake features (drawn without replacement; the size clipped to the smaller set)::

        MMD²_u = [Σ_{i≠j} k(x_i, x_j) + Σ_{i≠j} k(y_i, y_j)] / (m(m−1)) − 2 Σ_{i,j} k(x_i, y_j) / m²

    Returns (mean, standard deviation over the subsets). Unbiased: its expectation is 0 when both
    sets come from one distribution, so a mean slightly below 0 is possible.
    """
    real, fake = _as_features(real_feats, "real_feats"), _as_features(fake_feats, "fake_feats")
    _check_dims(real, fake)
    require(is_count(subsets), "subsets", "an integer >= 1", subsets)
    require(is_count(subset_size, 2), "subset_size", "an integer >= 2", subset_size)
    _check_seed(seed)
    d = real.shape[1]
    m = min(subset_size, len(real), len(fake))
    rng = np.random.default_rng(seed)
    real_t, fake_t = torch.from_numpy(real), torch.from_numpy(fake)
    mmds = np.empty(subsets)
    for s in range(subsets):
        x = real_t[rng.choice(len(real), m, replace=False)]
        y = fake_t[rng.choice(len(fake), m, replace=False)]
        k_xx, k_yy, k_xy = ((a @ b.T / d + 1) ** 3 for a, b in ((x, x), (y, y), (x, y)))
        within = k_xx.sum() - k_xx.trace() + k_yy.sum() - k_yy.trace()
        mmds[s] = (within / (m * (m - 1)) - 2 * k_xy.sum() / m**2).item()
    return float(mmds.mean()), float(mmds.std())


_EXACT = "donot_use_mm_for_euclid_dist"
"""exact differences: the matmul form can put a point a little away from itself"""


def _kth_neighbour_radii(points: torch.Tensor, k: int, chunk: int) -> torch.Tensor:
    """Distance from each point to its k-th nearest other point ``[N]``."""
    radii = [
        torch.cdist(rows, points, compute_mode=_EXACT)
        .kthvalue(k + 1, dim=1)  # the 1st is the point itself
        .values
        for rows in points.split(chunk)
    ]
    return torch.cat(radii)


def _inside(queries: torch.Tensor, centres: torch.Tensor, radii: torch.Tensor, chunk: int) -> float:
    """Share of ``queries`` within radii[i] of some centres[i]."""
    hits = [
        (torch.cdist(rows, centres, compute_mode=_EXACT) <= radii).any(dim=1)
        for rows in queries.split(chunk)
    ]
    return torch.cat(hits).double().mean().item()


def precision_recall(
    real_feats, fake_feats, *, k: int = 3, chunk: int = 1024
) -> tuple[float, float]:
    """Improved precision and recall (Kynkäänniemi et al. 2019, arXiv:1904.06991).

    A set's manifold is ∪_i B(φ_i, NN_k(φ_i)), balls around its features whose radius is the
    distance to the k-th nearest neighbour in the same set. precision = share of fake features in
    the real manifold; recall = share of real features in the fake manifold. Both sets need more
    than ``k`` points. ``chunk`` rows of distances are held at a time.
    """
    real, fake = _as_features(real_feats, "real_feats"), _as_features(fake_feats, "fake_feats")
    _check_dims(real, fake)
    require(is_count(k), "k", "an integer >= 1", k)
    smaller = min(len(real), len(fake))
    require(smaller > k, "k", f"less than the size of the smaller set ({smaller})", k)
    require(is_count(chunk), "chunk", "an integer >= 1", chunk)
    real_t, fake_t = torch.from_numpy(real), torch.from_numpy(fake)
    real_radii = _kth_neighbour_radii(real_t, k, chunk)
    fake_radii = _kth_neighbour_radii(fake_t, k, chunk)
    return _inside(fake_t, real_t, real_radii, chunk), _inside(real_t, fake_t, fake_radii, chunk)


@torch.no_grad()
def recognisable_rate(
    net: nn.Module, images: torch.Tensor, threshold: float = 0.9, *, batch_size: int = 256
) -> float | None:
    """Share of ``images`` that ``net`` assigns a class with max softmax ≥ ``threshold``, or None
    for a net without class head (``net.num_classes`` None: the rotation pretext task).

    Args:
        net: a :class:`FeatureNet`, or any module with ``num_classes`` whose forward gives logits.
        images: ``[N, C, H, W]`` in [-1, 1].
        threshold: in (0, 1] (default: 0.9).
    """
    require(hasattr(net, "num_classes"), "net", "a FeatureNet (a module with num_classes)",
            type(net).__name__)  # fmt: skip
    require(isinstance(threshold, int | float) and not isinstance(threshold, bool)
            and 0 < threshold <= 1, "threshold",
            "a number in (0, 1]", threshold)  # fmt: skip
    if net.num_classes is None:
        return None
    images = _check_images(images, "images", minimum=1)
    device = next(net.parameters()).device
    confident = [
        net(chunk.to(device)).softmax(-1).amax(-1).cpu() >= threshold
        for chunk in images.split(batch_size)
    ]
    return torch.cat(confident).double().mean().item()


def score(
    net: FeatureNet,
    real_images: torch.Tensor,
    fake_images: torch.Tensor,
    *,
    seed: int = 0,
    kid_subsets: int = 100,
    kid_subset_size: int = 1000,
    k: int = 3,
    threshold: float = 0.9,
    batch_size: int = 256,
) -> dict[str, float | None]:
    """All the metrics of generated ``fake_images`` against ``real_images`` (both
    ``[N, C, H, W]`` in [-1, 1], the same C, H, W), in the feature space of ``net``.

    Returns ``fid_local``, ``kid_local`` and ``kid_local_std`` (:func:`kid`, seeded by ``seed``),
    ``precision`` and ``recall`` (:func:`precision_recall` with ``k``), and ``recognisable``
    (:func:`recognisable_rate` of the fakes; None for a net without class head). With fewer
    images than ``net.feature_dim`` the covariances are singular and FID_local is biased upwards.
    """
    real_images = _check_images(real_images, "real_images")
    fake_images = _check_images(fake_images, "fake_images")
    require(fake_images.shape[1:] == real_images.shape[1:], "fake_images",
            f"images of the real images' shape {tuple(real_images.shape[1:])}",
            tuple(fake_images.shape[1:]))  # fmt: skip
    real = features(net, real_images, batch_size=batch_size).numpy()
    fake = features(net, fake_images, batch_size=batch_size).numpy()
    kid_mean, kid_std = kid(real, fake, subsets=kid_subsets, subset_size=kid_subset_size, seed=seed)
    precision, recall = precision_recall(real, fake, k=k)
    return {
        "fid_local": frechet_distance(*_gaussian(real), *_gaussian(fake)),
        "kid_local": kid_mean,
        "kid_local_std": kid_std,
        "precision": precision,
        "recall": recall,
        "recognisable": recognisable_rate(net, fake_images, threshold, batch_size=batch_size),
    }


def gaussian_fit_samples(images: torch.Tensor, n: int, *, seed: int = 0) -> torch.Tensor:
    """``n`` samples ``[n, C, H, W]`` of N(μ, Σ), the pixel mean and covariance of ``images``,
    clipped to [-1, 1]: the trivial generator a model must beat. Drawn as μ + V √Λ z with
    Σ = V Λ Vᵀ (eigenvalues below 0 from rounding set to 0), z ~ N(0, I), seeded by ``seed``."""
    images = _check_images(images, "images")
    require(is_count(n), "n", "an integer >= 1", n)
    _check_seed(seed)
    pixels = images.detach().cpu().double().flatten(1)  # [N, C·H·W]
    eigenvalues, eigenvectors = torch.linalg.eigh(torch.cov(pixels.T))
    factor = eigenvectors * eigenvalues.clamp(min=0).sqrt()  # Σ = factor factorᵀ
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(n, pixels.shape[1], generator=generator, dtype=torch.float64)
    samples = (pixels.mean(0) + z @ factor.T).clamp(-1, 1)
    return samples.float().reshape(n, *images.shape[1:])
