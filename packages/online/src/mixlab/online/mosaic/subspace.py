"""Subspace math with missing data: projections on observed coordinates, the GROUSE step, and
k-subspaces with missing data. Pure NumPy functions on arrays; the estimators are built on them.

Conventions: samples are rows. ``X`` is ``(n_samples, n_features)`` with missing entries set to 0,
``mask`` is a boolean array of the same shape (True = observed). A basis ``U`` is ``(n_features, rank)``
with orthonormal columns; ``K`` experts stack to ``(K, n_features, rank)``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# Tikhonov term on U_Ωᵀ U_Ω: keeps the solve defined when a sample observes fewer than `rank`
# coordinates (then the weights are the minimum-norm-like fit), negligible otherwise.
RIDGE = 1e-9


def random_basis(n_features: int, rank: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random point of the Grassmannian as an orthonormal ``(n_features, rank)`` basis."""
    basis, _ = np.linalg.qr(rng.standard_normal((n_features, rank)))
    return basis


GATHER_ELEMENTS = 1 << 21
"""largest ``(K, chunk, |Ω|, r)`` gather of basis rows :func:`observed_fit` builds at once (16 MB)"""


def observed_fit(
    bases: np.ndarray, X: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares weights of each sample in each basis, from its observed coordinates only.

    For sample i and expert k, ``w_ik = argmin_w ‖x_Ω − U_{k,Ω} w‖²`` (GROUSE, Balzano et al. 2010, Eq. 2),
    solved through the normal equations ``(U_Ωᵀ U_Ω) w = U_Ωᵀ x_Ω`` batched over samples and experts.
    Only the observed rows ``U_{k,Ω}`` are read, so a sample costs O(|Ω|·K·r²), not O(n·K·r²): the
    rows are gathered into a ``(K, B, max |Ω|, r)`` block, padded with zero rows (which add nothing
    to the Gram matrix or the residual), in chunks of at most :data:`GATHER_ELEMENTS`.

    Args:
        bases: ``(K, n, r)`` orthonormal bases.
        X: ``(B, n)`` samples with missing entries zeroed.
        mask: ``(B, n)`` boolean, True where observed.

    Returns:
        weights ``(B, K, r)`` and the observed residual energy ``‖x_Ω − U_{k,Ω} w_ik‖²`` as ``(B, K)``.
    """
    n_experts, _, rank = bases.shape
    n_samples = len(X)
    counts = mask.sum(axis=1)
    width = max(int(counts.max(initial=0)), 1)
    # rows[i, j]: the j-th observed coordinate of sample i; past |Ω_i| (padding) row 0, zeroed
    sample, coordinate = np.nonzero(mask)
    first = np.cumsum(counts) - counts
    rows = np.zeros((n_samples, width), dtype=np.intp)
    rows[sample, np.arange(len(sample)) - first[sample]] = coordinate
    padding = np.arange(width) >= counts[:, None]  # (B, max |Ω|)
    weights = np.empty((n_samples, n_experts, rank))
    residual = np.empty((n_samples, n_experts))
    chunk = max(1, GATHER_ELEMENTS // (n_experts * width * rank))
    for lo in range(0, n_samples, chunk):
        chunk_rows, chunk_padding = rows[lo : lo + chunk], padding[lo : lo + chunk]
        observed_bases = bases[:, chunk_rows]  # U_{k,Ω_i}: (K, b, |Ω|, r)
        observed_bases[:, chunk_padding] = 0.0
        observed_X = np.take_along_axis(X[lo : lo + chunk], chunk_rows, axis=1)  # (b, |Ω|)
        observed_X[chunk_padding] = 0.0
        transposed = observed_bases.transpose(0, 1, 3, 2)
        gram = transposed @ observed_bases  # (K, b, r, r)
        rhs = transposed @ observed_X[None, :, :, None]  # (K, b, r, 1)
        chunk_weights = np.linalg.solve(gram + RIDGE * np.eye(rank), rhs)
        fit = (observed_bases @ chunk_weights)[..., 0]  # U_Ω w: (K, b, |Ω|)
        weights[lo : lo + chunk] = chunk_weights[..., 0].transpose(1, 0, 2)
        residual[lo : lo + chunk] = ((observed_X[None] - fit) ** 2).sum(axis=-1).T
    return weights, residual


def route(bases: np.ndarray, X: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Matched-subspace routing: each sample goes to the expert with the smallest residual per
    observed coordinate, ``argmin_k ‖x_Ω − U_{k,Ω} w_k‖² / |Ω|`` (Balzano, Recht, Nowak, ISIT 2010).

    Returns the chosen experts ``(B,)`` and all residuals ``(B, K)``.
    """
    _, residual = observed_fit(bases, X, mask)
    return residual.argmin(axis=1), residual


def complete_routed(bases: np.ndarray, X: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Each sample's estimate ``U_k w_k`` on all coordinates, in the expert that fits it best."""
    weights, residual = observed_fit(bases, X, mask)
    chosen = residual.argmin(axis=1)
    return np.einsum("bnr,br->bn", bases[chosen], weights[np.arange(len(X)), chosen])


STEP_RULES = ("greedy", "sigma")
"""how :func:`grouse_step` turns a step size into an angle (see there)"""


def grouse_step(
    basis: np.ndarray, x: np.ndarray, mask: np.ndarray, step: float, rule: str = "greedy"
) -> np.ndarray:
    """One GROUSE step (Balzano, Nowak, Recht 2010, Alg. 1) toward sample ``x`` observed on ``mask``.

    With ``w = U_Ω⁺ x_Ω``, ``p = U w`` and the residual ``ρ`` (``x_Ω − U_Ω w`` on Ω, 0 elsewhere), the
    geodesic step of angle θ is ``U + ((cos θ − 1) p/‖p‖ + sin θ ρ/‖ρ‖) wᵀ/‖w‖``. It keeps U orthonormal
    because ``ρ ⟂ span(U)`` (normal equations). The greedy angle ``θ* = arctan(‖ρ‖/‖p‖)`` makes the new
    span contain the sample's observed part (Zhang & Balzano, AISTATS 2016). ``rule`` sets θ:

    - ``"greedy"``: ``θ = step · θ*``, ``step`` in (0, 1]; smaller fractions average noise;
    - ``"sigma"``: GROUSE's own ``θ = step · σ`` with ``σ = ‖ρ‖‖p‖`` (Alg. 1; ``step`` is η_t,
      ``η₀/t`` in its stationary analysis), capped at θ* (a larger angle rotates past the sample).
    """
    # Exact least squares (no ridge): the step is orthonormal only if ρ is exactly ⟂ span(U).
    weights = np.linalg.lstsq(basis[mask], x[mask], rcond=None)[0]
    projection = basis @ weights
    residual = np.zeros_like(x)
    residual[mask] = x[mask] - projection[mask]
    residual_norm, projection_norm = np.linalg.norm(residual), np.linalg.norm(projection)
    weight_norm = np.linalg.norm(weights)
    if residual_norm < 1e-12 or projection_norm < 1e-12 or weight_norm < 1e-12:
        return basis  # the sample already lies in the span (or carries no signal): nothing to learn
    greedy = np.arctan(residual_norm / projection_norm)
    if rule == "greedy":
        theta = step * greedy
    else:
        theta = min(step * residual_norm * projection_norm, greedy)
    direction = (np.cos(theta) - 1.0) * projection / projection_norm + np.sin(
        theta
    ) * residual / residual_norm
    return basis + np.outer(direction, weights / weight_norm)


def fit_basis(
    X: np.ndarray, mask: np.ndarray, rank: int, rng: np.random.Generator, n_iter: int = 10
) -> np.ndarray:
    """Rank-``rank`` basis of samples with missing entries by alternating least squares.

    Starts from the SVD of the zero-filled data (rescaled by the observed fraction), then alternates
    ``w_i = argmin ‖x_{i,Ω} − U_Ω w‖`` over samples and ``u_j = argmin Σ_{i: j ∈ Ω_i} (x_ij − u_jᵀ w_i)²``
    over rows (low-rank matrix completion by alternating minimisation, Jain, Netrapalli, Sanghavi 2013).
    """
    n_samples, n_features = X.shape
    if n_samples == 0:
        return random_basis(n_features, rank, rng)
    observed = mask.astype(X.dtype)
    rate = max(observed.mean(), 1e-12)
    _, _, right = np.linalg.svd(X / rate, full_matrices=False)
    basis = right[:rank].T
    if basis.shape[1] < rank:  # fewer samples than the rank: pad with random directions
        basis = np.linalg.qr(
            np.hstack([basis, rng.standard_normal((n_features, rank - basis.shape[1]))])
        )[0]
    for _ in range(n_iter):
        weights = observed_fit(basis[None], X, mask)[0][:, 0]  # (B, r)
        # Row-wise normal equations: (Σ_i m_ij w_i w_iᵀ) u_j = Σ_i m_ij x_ij w_i, all rows at once.
        row_gram = np.einsum("bj,br,bs->jrs", observed, weights, weights)
        row_rhs = np.einsum("bj,br->jr", X * observed, weights)
        rows = np.linalg.solve(row_gram + 1e-6 * np.eye(rank), row_rhs[..., None])[..., 0]
        basis = np.linalg.qr(rows)[0]
    return basis


class KSubspacesFit(NamedTuple):
    """The result of :func:`k_subspaces`."""

    bases: np.ndarray
    """``(K, n, r)`` orthonormal bases"""
    labels: np.ndarray
    """``(B,)`` expert of each sample"""
    objective: float
    """mean residual per observed coordinate"""
    n_iter: int
    """rounds of routing and re-fitting run (at most ``max_iter``)"""


def k_subspaces(
    X: np.ndarray,
    mask: np.ndarray,
    n_experts: int,
    rank: int,
    rng: np.random.Generator,
    *,
    n_init: int = 5,
    max_iter: int = 30,
    fit_iter: int = 5,
) -> KSubspacesFit:
    """k-subspaces with missing data (Balzano, Szlam, Recht, Nowak, SSP 2012): alternate routing every
    sample to its best expert and re-fitting each expert on its samples, from ``n_init`` seedings.

    Seeding is greedy and trimmed: each new expert is fitted to a random subset of the samples the
    experts so far explain worst, then re-fitted on the fraction of those it explains best, so that
    it locks onto one subspace of the union instead of averaging several.

    Returns the best seeding's :class:`KSubspacesFit`.
    """
    counts = np.maximum(mask.sum(axis=1), 1)
    best: KSubspacesFit | None = None
    for _ in range(n_init):
        bases = _trimmed_seeding(X, mask, n_experts, rank, rng, counts)
        bases, labels, n_iter = refine_subspaces(
            bases, X, mask, rng, max_iter=max_iter, fit_iter=fit_iter
        )
        residual = route(bases, X, mask)[1]
        objective = float((residual.min(axis=1) / counts).mean())
        if best is None or objective < best.objective:
            best = KSubspacesFit(bases.copy(), labels, objective, n_iter)
    assert best is not None
    return best


def refine_subspaces(
    bases: np.ndarray,
    X: np.ndarray,
    mask: np.ndarray,
    rng: np.random.Generator,
    *,
    max_iter: int,
    fit_iter: int = 5,
) -> tuple[np.ndarray, np.ndarray, int]:
    """The k-subspaces iterations from ``bases``: route every sample to its best expert, re-fit each
    expert on its samples, until the routing stops changing (or ``max_iter``). An expert left with
    fewer than ``rank`` samples is reseeded on a disjoint slice of the worst-explained samples.

    Returns the new bases ``(K, n, r)``, the final routing ``(B,)`` and the rounds of re-fits run.
    """
    bases = bases.copy()
    n_samples, (n_experts, _, rank) = len(X), bases.shape
    counts = np.maximum(mask.sum(axis=1), 1)
    labels = np.full(n_samples, -1)
    n_iter = 0
    for _ in range(max_iter):
        new_labels, residual = route(bases, X, mask)
        if np.array_equal(new_labels, labels):
            break
        labels, n_iter = new_labels, n_iter + 1
        worst_first = np.argsort(residual.min(axis=1) / counts)[::-1]
        reseed_size = max(4 * rank, n_samples // (4 * n_experts))
        reseeded = 0
        for k in range(n_experts):
            members = labels == k
            if members.sum() < rank:
                members = np.zeros(n_samples, bool)
                members[worst_first[reseeded * reseed_size : (reseeded + 1) * reseed_size]] = True
                reseeded += 1
            bases[k] = fit_basis(X[members], mask[members], rank, rng, n_iter=fit_iter)
    return bases, route(bases, X, mask)[0], n_iter


def _trimmed_seeding(
    X: np.ndarray,
    mask: np.ndarray,
    n_experts: int,
    rank: int,
    rng: np.random.Generator,
    counts: np.ndarray,
) -> np.ndarray:
    n_samples, n_features = X.shape
    share = max(2 * rank, n_samples // (2 * n_experts))  # samples one expert is refitted on
    bases = np.empty((0, n_features, rank))
    for _ in range(n_experts):
        if len(bases):
            unexplained = route(bases, X, mask)[1].min(axis=1) / counts
            pool = np.argsort(unexplained)[-n_samples // 2 :]
        else:
            pool = np.arange(n_samples)
        subset = rng.choice(pool, size=min(len(pool), share), replace=False)
        basis = fit_basis(X[subset], mask[subset], rank, rng, n_iter=3)
        for _ in range(5):  # keep the samples this basis explains best, and refit on them
            residual = route(basis[None], X[pool], mask[pool])[1][:, 0] / counts[pool]
            keep = pool[np.argsort(residual)[: max(rank, share // 2)]]
            basis = fit_basis(X[keep], mask[keep], rank, rng, n_iter=3)
        bases = np.concatenate([bases, basis[None]])
    return bases
