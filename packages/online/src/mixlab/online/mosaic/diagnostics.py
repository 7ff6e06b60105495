"""Diagnostics of a routed mixture against the true union of subspaces."""

from __future__ import annotations

import numpy as np
from scipy.linalg import subspace_angles
from scipy.optimize import linear_sum_assignment

from mixlab.shared import require


def subspace_distance(basis: np.ndarray, reference: np.ndarray) -> float:
    """``‖sin Θ(basis, reference)‖_F``: 0 for the same subspace, √r for orthogonal rank-r subspaces."""
    return float(np.linalg.norm(np.sin(subspace_angles(basis, reference))))


def pairwise_subspace_distances(bases: np.ndarray, references: np.ndarray) -> np.ndarray:
    """``‖sin Θ(bases[i], references[j])‖_F`` for every pair, as ``(len(bases), len(references))``.

    For orthonormal bases of the same rank r, ``Σ cos² θ = ‖UᵢᵀVⱼ‖_F²``, so
    ``‖sin Θ‖_F² = r − ‖UᵢᵀVⱼ‖_F²``: one batched product instead of an SVD per pair
    (:func:`subspace_distance`, which also takes different ranks; they agree to ~1e-8).
    """
    require(
        bases.ndim == references.ndim == 3 and bases.shape[1:] == references.shape[1:],
        "references",
        f"a stack of bases of the shape of each of bases {bases.shape[1:]}",
        references.shape,
    )
    overlap = np.einsum("inr,jns->ijrs", bases, references)
    return np.sqrt(np.maximum(bases.shape[2] - (overlap**2).sum(axis=(2, 3)), 0.0))


def match_experts(bases: np.ndarray, true_bases: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pair experts with true subspaces minimising the total sin-Θ distance (Hungarian algorithm).

    Returns ``assignment`` (expert k ↦ true subspace) and the matched distances, per expert.
    """
    distances = np.array([[subspace_distance(b, t) for t in true_bases] for b in bases])
    experts, subspaces = linear_sum_assignment(distances)
    assignment = np.full(len(bases), -1)
    assignment[experts] = subspaces
    return assignment, distances[experts, subspaces]


def routing_accuracy(routes: np.ndarray, labels: np.ndarray, n_experts: int | None = None) -> float:
    """Fraction of samples routed to the expert matched to their true subspace, the matching chosen
    to maximise agreement (Hungarian algorithm on the confusion matrix)."""
    routes, labels = np.asarray(routes), np.asarray(labels)
    require(
        routes.shape == labels.shape and routes.ndim == 1,
        "routes",
        f"a 1-D array like labels {labels.shape}",
        routes.shape,
    )
    for name, values in (("routes", routes), ("labels", labels)):
        valid = np.issubdtype(values.dtype, np.integer) and (values >= 0).all()
        require(
            bool(valid), name, "non-negative integers", values.dtype if not valid else values.min()
        )
    size = max(int(routes.max()) + 1, int(labels.max()) + 1, n_experts or 0)
    confusion = np.zeros((size, size))
    np.add.at(confusion, (routes, labels), 1)
    rows, columns = linear_sum_assignment(-confusion)
    return float(confusion[rows, columns].sum() / len(routes))


def _decay_points(steps: np.ndarray, errors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The points with positive step and error, as ``(steps, log errors)``; at least 3 of them."""
    steps, errors = np.asarray(steps, dtype=float), np.asarray(errors, dtype=float)
    keep = (steps > 0) & (errors > 0)
    usable = int(keep.sum())
    require(usable >= 3, "steps/errors", "at least 3 points with positive step and error", usable)
    return steps[keep], np.log(errors[keep])


def _least_squares_residual(abscissa: np.ndarray, ordinate: np.ndarray) -> float:
    coefficients = np.polyfit(abscissa, ordinate, 1)
    return float(np.sum((np.polyval(coefficients, abscissa) - ordinate) ** 2))


def contraction_exponent(steps: np.ndarray, errors: np.ndarray) -> float:
    """The exponent a of a power-law fit ``error ≈ c · t^(−a)`` by least squares in log–log space.

    a in (0, 1) is sublinear contraction; a > 1 superlinear; an exponential decay fitted this way
    gives an exponent that grows with the window (see :func:`power_law_fits_better`).
    """
    steps, log_errors = _decay_points(steps, errors)
    return float(-np.polyfit(np.log(steps), log_errors, 1)[0])


def power_law_fits_better(steps: np.ndarray, errors: np.ndarray) -> bool:
    """Whether ``log error`` is fitted better (least squares) by a power law ``c·t^(−a)`` (linear in
    log t) than by an exponential ``c·e^(−b t)`` (linear in t): sublinear versus linear contraction."""
    steps, log_errors = _decay_points(steps, errors)
    return _least_squares_residual(np.log(steps), log_errors) < _least_squares_residual(
        steps, log_errors
    )
