"""Streams on a drifting union of subspaces: ``x_t = U_{k_t}(t) w_t + ν_t``, observed on a random mask.

An epoch is a stretch of the stream with one kind of change:

- ``stationary``: the K subspaces stay put;
- ``drift``: each subspace moves along a Grassmann geodesic at ``drift_rate`` radians per sample
  (Edelman, Arias, Smith 1998, Thm. 2.3: ``U(t) = U₀ V cos(Σ t) Vᵀ + Q sin(Σ t) Vᵀ`` for the
  tangent ``H = QΣVᵀ``, ``U₀ᵀH = 0``, ``‖Σ‖_F = 1``);
- ``switch``: at its start, ``n_switched`` subspaces are replaced by new random ones, which then
  stay put.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from mixlab.online.mosaic.subspace import random_basis
from mixlab.shared import is_count, require

EpochKind = Literal["stationary", "drift", "switch"]


@dataclass(frozen=True)
class Epoch:
    """One stretch of the stream."""

    kind: EpochKind
    length: int
    drift_rate: float = 1e-3
    """radians per sample along each subspace's geodesic (``drift`` epochs)"""
    n_switched: int = 1
    """subspaces replaced at the start (``switch`` epochs)"""

    def __post_init__(self) -> None:
        require(
            self.kind in ("stationary", "drift", "switch"),
            "kind",
            "stationary, drift or switch",
            self.kind,
        )
        require(is_count(self.length), "length", "an integer >= 1", self.length)
        require(
            bool(np.isfinite(self.drift_rate)) and self.drift_rate >= 0,
            "drift_rate",
            "a finite number >= 0 radians per sample",
            self.drift_rate,
        )
        require(is_count(self.n_switched), "n_switched", "an integer >= 1", self.n_switched)


@dataclass(frozen=True)
class Stream:
    """A generated stream. Samples are rows; ``X_full`` is the truth, ``X`` has NaN where unobserved."""

    X_full: np.ndarray
    """(T, n) every entry, noise included"""
    mask: np.ndarray
    """(T, n) True where observed"""
    labels: np.ndarray
    """(T,) the subspace each sample came from"""
    epoch_starts: np.ndarray
    """(E,) index of each epoch's first sample"""
    switched: tuple[tuple[int, ...], ...]
    """per epoch, the subspaces replaced at its start (empty unless a switch epoch)"""
    snapshot_times: np.ndarray
    """(S,) sample indices at which the true bases were recorded"""
    snapshots: np.ndarray
    """(S, K, n, r) the true bases at those times"""
    source_X: np.ndarray
    """(N, n) source batch for pre-training, full; its masked version is ``source_X_observed``"""
    source_mask: np.ndarray
    source_labels: np.ndarray

    @property
    def X(self) -> np.ndarray:
        return np.where(self.mask, self.X_full, np.nan)

    @property
    def source_X_observed(self) -> np.ndarray:
        return np.where(self.source_mask, self.source_X, np.nan)


@dataclass(frozen=True)
class DriftingSubspaceStream:
    """Generator of streams on a union of K drifting rank-r subspaces of R^n.

    Every parameter is settable; :meth:`generate` is deterministic in ``seed``.
    """

    n_features: int = 100
    n_subspaces: int = 4
    rank: int = 5
    observed_fraction: float = 0.3
    """probability that an entry is observed (Bernoulli mask)"""
    noise: float = 1e-3
    """standard deviation of the additive Gaussian noise per entry"""
    n_source: int = 2000
    """source batch drawn from the initial subspaces, for pre-training"""
    epochs: tuple[Epoch, ...] = field(
        default_factory=lambda: (
            Epoch("stationary", 2000),
            Epoch("drift", 3000),
            Epoch("switch", 2000),
        )
    )
    snapshot_every: int = 100
    """samples between recorded true bases"""
    mixture: tuple[float, ...] | None = None
    """probabilities of the subspaces (None: uniform)"""

    def __post_init__(self) -> None:
        n_features = self.n_features
        require(is_count(n_features, 2), "n_features", "an integer >= 2", n_features)
        require(is_count(self.n_subspaces), "n_subspaces", "an integer >= 1", self.n_subspaces)
        valid_rank = is_count(self.rank) and self.rank < n_features
        require(valid_rank, "rank", f"an integer in [1, n_features={n_features})", self.rank)
        rate = self.observed_fraction
        require(0 < rate <= 1, "observed_fraction", "in (0, 1]", rate)
        require(
            bool(np.isfinite(self.noise)) and self.noise >= 0,
            "noise",
            "a finite number >= 0",
            self.noise,
        )
        require(is_count(self.n_source, 0), "n_source", "an integer >= 0", self.n_source)
        require(len(self.epochs) >= 1, "epochs", "at least one Epoch", self.epochs)
        require(
            is_count(self.snapshot_every), "snapshot_every", "an integer >= 1", self.snapshot_every
        )
        if self.mixture is not None:
            weights = np.asarray(self.mixture, dtype=float)
            ok = (
                len(weights) == self.n_subspaces
                and (weights >= 0).all()
                and np.isclose(weights.sum(), 1)
            )
            require(
                bool(ok), "mixture", f"{self.n_subspaces} probabilities summing to 1", self.mixture
            )
        for epoch in self.epochs:
            allowed = f"<= n_subspaces={self.n_subspaces}"
            require(epoch.n_switched <= self.n_subspaces, "n_switched", allowed, epoch.n_switched)

    def _draw(self, bases: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        weights = rng.standard_normal((len(labels), self.rank))
        clean = np.einsum("bnr,br->bn", bases[labels], weights)
        return clean + self.noise * rng.standard_normal(clean.shape)

    def _mask(self, n_samples: int, rng: np.random.Generator) -> np.ndarray:
        mask = rng.random((n_samples, self.n_features)) < self.observed_fraction
        # every sample observes at least one entry (an all-missing sample carries nothing)
        empty = np.flatnonzero(~mask.any(axis=1))
        mask[empty, rng.integers(0, self.n_features, len(empty))] = True
        return mask

    def generate(self, seed: int) -> Stream:
        rng = np.random.default_rng(seed)
        n, K = self.n_features, self.n_subspaces
        bases = np.stack([random_basis(n, self.rank, rng) for _ in range(K)])
        # renormalised: the check above allows a rounding error that rng.choice would refuse
        probabilities = (
            None if self.mixture is None else np.asarray(self.mixture) / np.sum(self.mixture)
        )

        source_labels = rng.choice(K, size=self.n_source, p=probabilities)
        source_X = self._draw(bases, source_labels, rng)
        source_mask = self._mask(self.n_source, rng)

        samples, labels, starts, snapshot_times, snapshots, switched = [], [], [], [], [], []
        t = 0
        for epoch in self.epochs:
            starts.append(t)
            replaced = (
                rng.choice(K, size=epoch.n_switched, replace=False)
                if epoch.kind == "switch"
                else []
            )
            for k in replaced:
                bases[k] = random_basis(n, self.rank, rng)
            switched.append(tuple(int(k) for k in replaced))
            directions = (
                [_geodesic_direction(bases[k], rng) for k in range(K)]
                if epoch.kind == "drift"
                else None
            )
            origin = bases.copy()
            epoch_labels = rng.choice(K, size=epoch.length, p=probabilities)
            for offset in range(epoch.length):
                if directions is not None:
                    angle = epoch.drift_rate * (offset + 1)
                    bases = np.stack(
                        [_geodesic(origin[k], *directions[k], angle) for k in range(K)]
                    )
                if t % self.snapshot_every == 0:
                    snapshot_times.append(t)
                    snapshots.append(bases.copy())
                samples.append(self._draw(bases, epoch_labels[offset : offset + 1], rng)[0])
                t += 1
            labels.append(epoch_labels)
        return Stream(
            X_full=np.asarray(samples),
            mask=self._mask(t, rng),
            labels=np.concatenate(labels),
            epoch_starts=np.asarray(starts),
            switched=tuple(switched),
            snapshot_times=np.asarray(snapshot_times),
            snapshots=np.asarray(snapshots),
            source_X=source_X,
            source_mask=source_mask,
            source_labels=source_labels,
        )


def _geodesic_direction(
    basis: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random unit tangent ``H = QΣVᵀ`` at ``basis`` (``basisᵀH = 0``, ``‖Σ‖_F = 1``), as (Q, Σ, V)."""
    tangent = rng.standard_normal(basis.shape)
    tangent -= basis @ (basis.T @ tangent)
    tangent /= np.linalg.norm(tangent)
    left, singular, right_t = np.linalg.svd(tangent, full_matrices=False)
    return left, singular, right_t.T


def _geodesic(
    basis: np.ndarray, left: np.ndarray, singular: np.ndarray, right: np.ndarray, angle: float
) -> np.ndarray:
    """The point at arc length ``angle`` along the geodesic from ``basis`` in direction ``left·Σ·rightᵀ``."""
    return (basis @ right) * np.cos(singular * angle) @ right.T + left * np.sin(
        singular * angle
    ) @ right.T
