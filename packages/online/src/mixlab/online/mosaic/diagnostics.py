"""Diagnostics of a routed mixture against the true union of subspaces."""

from __future__ import annotations

import numpy as np
from scipy.linalg import subspace_angles
from scipy.optimize import linear_sum_assignment

from mixlab.shared import require


def subspace_distance(basis: np.ndarray, reference: np.ndarray) -> float:
    """``‖sin Θ(basis, reference)‖_F``: 0 for the same subspace, √r for orthogonal rank-r subspaces."""
    return float(np.linalg.norm(np.sin(subspace_angles(basis, reference))))


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
    size = max(int(routes.max()) + 1, int(labels.max()) + 1, n_experts or 0)
    confusion = np.zeros((size, size))
    np.add.at(confusion, (routes, labels), 1)
    rows, columns = linear_sum_assignment(-confusion)
    return float(confusion[rows, columns].sum() / len(routes))


def contraction_exponent(steps: np.ndarray, errors: np.ndarray) -> float:
    """The exponent a of a power-law fit ``error ≈ c · t^(−a)`` by least squares in log–log space.

    a in (0, 1) is sublinear contraction; a > 1 superlinear; an exponential decay fitted this way
    gives an exponent that grows with the window.
    """
    steps, errors = np.asarray(steps, dtype=float), np.asarray(errors, dtype=float)
    keep = (steps > 0) & (errors > 0)
    require(
        keep.sum() >= 3,
        "steps/errors",
        "at least 3 points with positive step and error",
        int(keep.sum()),
    )
    slope = np.polyfit(np.log(steps[keep]), np.log(errors[keep]), 1)[0]
    return float(-slope)


def power_law_fits_better(steps: np.ndarray, errors: np.ndarray) -> bool:
    """Whether ``log error`` is fitted better (least squares) by a power law ``c·t^(−a)`` (linear in
    log t) than by an exponential ``c·e^(−b t)`` (linear in t): sublinear versus linear contraction."""
    steps, errors = np.asarray(steps, dtype=float), np.asarray(errors, dtype=float)
    keep = (steps > 0) & (errors > 0)
    require(
        keep.sum() >= 3,
        "steps/errors",
        "at least 3 points with positive step and error",
        int(keep.sum()),
    )
    log_errors = np.log(errors[keep])

    def residual(abscissa: np.ndarray) -> float:
        coefficients = np.polyfit(abscissa, log_errors, 1)
        return float(np.sum((np.polyval(coefficients, abscissa) - log_errors) ** 2))

    return residual(np.log(steps[keep])) < residual(steps[keep])
