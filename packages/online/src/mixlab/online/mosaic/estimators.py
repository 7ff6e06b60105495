"""Streaming matrix completion estimators with the scikit-learn conventions (they pass its
estimator checks: ``tests/conformance/test_sklearn_mosaic.py``).

All are transformers that complete a matrix, like scikit-learn's imputers: NaN marks a missing
entry, samples are rows, and ``y`` is accepted everywhere and ignored (for pipelines).

- ``fit(X, y=None, *, mask=None)`` pre-trains on a source batch (and forgets any earlier state);
  ``partial_fit(X, y=None, *, mask=None)`` adapts on the stream, a batch at a time (a single sample
  is ``X[t : t + 1]``).
- ``transform(X, *, mask=None)`` returns the completed matrix: observed entries kept, missing ones
  estimated; ``fit_transform`` is fit then transform on the same ``X``.
- ``score(X, y=None, *, mask=None)`` is higher-is-better for model selection (``GridSearchCV``,
  ``cross_val_score``): minus the completion error on a seeded share of the observed entries that
  it hides (:data:`SCORE_HELD_OUT`). ``completion_error(X, X_full, *, mask=None)`` is the paper's
  lower-is-better NRMSE against a known full matrix.
- ``save``/``load`` keep the state (safetensors + JSON).

``mask`` (True = observed) is optional: an entry is observed where ``X`` is not NaN and, if ``mask``
is given, ``mask`` is True. So ``mask`` can hide entries that have values (a simulation's full
matrix with its sampling mask), never reveal a NaN.

- :class:`MoSAIC`: K routed rank-r experts, pre-trained by k-subspaces with missing data; each
  stream sample updates only the expert it is routed to (one GROUSE step).
- :class:`GROUSE`: one rank-r subspace tracked by GROUSE steps (Balzano, Nowak, Recht 2010).
- :class:`PETRELS`: one rank-r subspace tracked by row-wise recursive least squares with a
  forgetting factor (Chi, Eldar, Calderbank, IEEE TSP 2013).
- :class:`WindowedKSubspaces`: batch k-subspaces re-run on a sliding window (offline reference).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Self

import numpy as np
from sklearn.base import BaseEstimator, OneToOneFeatureMixin, TransformerMixin
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import validate_data

from mixlab.online.mosaic.subspace import (
    STEP_RULES,
    complete_routed,
    fit_basis,
    grouse_step,
    k_subspaces,
    random_basis,
    refine_subspaces,
    route,
)
from mixlab.shared.config import is_count, require
from mixlab.shared.files import CheckpointError, checkpoint_errors

__all__ = ["GROUSE", "PETRELS", "MoSAIC", "WindowedKSubspaces", "check_stream"]

CHANGE_FAST, CHANGE_SLOW = 0.25, 0.02
"""weights of the change detector's fast (~4 samples) and slow (~50 samples) running averages"""

SCORE_HELD_OUT = 0.2
"""share of each sample's observed entries that ``score`` hides and completes from the rest (drawn
with a fixed seed, so the same mask gives the same held-out entries for every model)"""


def check_stream(X: Any, mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Validate a batch of partially observed samples; return ``(X with zeros where missing, observed)``.

    ``X`` is ``(n_samples, n_features)`` or one sample ``(n_features,)``. An entry is observed where
    ``X`` is not NaN and, if ``mask`` (boolean, X's shape) is given, ``mask`` is True. Raises
    ValueError naming the problem: shape mismatch, a sample with no observed entry, or inf in an
    observed entry.
    """
    X = np.array(X, dtype=np.float64, copy=True)
    if X.ndim == 1:
        X = X[None]
    require(
        X.ndim == 2, "X", "a 2-D array (n_samples, n_features) or one sample (n_features,)", X.shape
    )
    require(
        X.shape[0] >= 1 and X.shape[1] >= 2,
        "X",
        "at least one sample of at least 2 features",
        X.shape,
    )
    observed = ~np.isnan(X)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.ndim == 1:
            mask = mask[None]
        require(
            mask.shape == X.shape,
            "mask",
            f"a boolean array of the shape of X {X.shape}",
            mask.shape,
        )
        require(mask.dtype == bool, "mask", "a boolean array (True = observed)", mask.dtype)
        observed &= mask
    if not np.isfinite(X[observed]).all():
        raise ValueError("X has inf in observed entries; mark missing entries as NaN (or in mask)")
    empty = np.flatnonzero(~observed.any(axis=1))
    if len(empty):
        raise ValueError(
            f"every sample needs at least one observed entry; samples {empty[:5].tolist()} have none"
        )
    X[~observed] = 0.0
    return X, observed


def _held_out(observed: np.ndarray) -> np.ndarray:
    """The entries :meth:`~_StreamingCompleter.score` hides: a seeded :data:`SCORE_HELD_OUT` share
    of the observed ones, leaving every sample at least one observed entry."""
    hidden = observed & (np.random.default_rng(0).random(observed.shape) < SCORE_HELD_OUT)
    emptied = np.flatnonzero(~(observed & ~hidden).any(axis=1))
    hidden[emptied, hidden[emptied].argmax(axis=1)] = False  # give each its first entry back
    require(
        hidden.any(),
        "X",
        "samples with at least 2 observed entries (score completes held-out ones)",
        f"{observed.sum(axis=1).max()} at most",
    )
    return hidden


def _completion_error(completed: np.ndarray, observed: np.ndarray, X_full: Any) -> float:
    """``‖(completed − X_full)_M‖ / ‖(X_full)_M‖`` on the unobserved entries M where X_full is not NaN."""
    X_full = np.asarray(X_full, dtype=np.float64)
    require(
        X_full.shape == completed.shape,
        "X_full",
        f"an array of the shape of X {completed.shape}",
        X_full.shape,
    )
    scored = ~observed & ~np.isnan(X_full)
    require(bool(np.isfinite(X_full[scored]).all()), "X_full", "finite or NaN", "inf")
    denominator = np.linalg.norm(X_full[scored])
    require(denominator > 0, "X_full", "non-zero on some entry missing from X", "zeros or NaN")
    return float(np.linalg.norm((completed - X_full)[scored]) / denominator)


def require_count(estimator: Any, name: str, minimum: int = 1) -> None:
    """ValueError unless the parameter ``name`` is an integer >= ``minimum`` (NumPy integers too)."""
    value = getattr(estimator, name)
    require(is_count(value, minimum), name, f"an integer >= {minimum}", value)


class _StreamingCompleter(OneToOneFeatureMixin, TransformerMixin, BaseEstimator):
    """The shared contract. Subclasses implement ``_pretrain`` (from a source batch), ``_start`` (from
    nothing, when ``partial_fit`` comes first), ``_update`` (one batch of the stream) and ``_estimate``
    (the model's values on all coordinates), and list their learned state in ``_state_attributes``."""

    _state_attributes: tuple[str, ...] = ()

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True  # NaN marks a missing entry
        return tags

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "n_samples_seen_")

    def _validate_params(self) -> None:
        require_count(self, "rank")

    def _check(self, X: Any, mask: Any, *, reset: bool) -> tuple[np.ndarray, np.ndarray]:
        """scikit-learn's data checks (2-D, numeric, no inf, at least 2 features; with ``reset``
        False, the fitted feature count and names), then the mask's (:func:`check_stream`)."""
        if not reset:
            self._check_learned_shape()
        # after fit, any feature count other than the fitted one is an error that names both
        min_features = 2 if reset else 1
        X = validate_data(
            self,
            X,
            reset=reset,
            dtype=np.float64,
            ensure_all_finite="allow-nan",
            ensure_min_features=min_features,
        )
        X, mask = check_stream(X, mask)
        require(
            self.rank < X.shape[1],
            "rank",
            f"smaller than the number of features ({X.shape[1]})",
            self.rank,
        )
        return X, mask

    def fit(self, X: Any, y: Any = None, *, mask: Any = None) -> Self:
        """Pre-train on a source batch ``(n_samples, n_features)``; any earlier state is forgotten.

        ``y`` is ignored (it is there for pipelines); ``mask`` as in :func:`check_stream`.
        """
        self._validate_params()
        for name in [name for name in vars(self) if name.endswith("_")]:  # the learned state
            delattr(self, name)
        X, mask = self._check(X, mask, reset=True)
        self._rng = np.random.default_rng(self.random_state)
        self._pretrain(X, mask)
        self.n_samples_seen_ = len(X)
        return self

    def partial_fit(self, X: Any, y: Any = None, *, mask: Any = None, **options: Any) -> Self:
        """Adapt on a batch of the stream ``(n_samples, n_features)``, in order (``y`` ignored)."""
        self._validate_params()  # set_params may have changed them since fit
        first = not self.__sklearn_is_fitted__()  # no pre-training: the stream is the only data
        X, mask = self._check(X, mask, reset=first)
        if first:
            self._rng = np.random.default_rng(self.random_state)
            self._start(X.shape[1])
            self.n_samples_seen_ = 0
        self._update(X, mask, **options)
        self.n_samples_seen_ += len(X)
        return self

    def _require_fitted(self) -> None:
        if not self.__sklearn_is_fitted__():
            raise NotFittedError(
                f"this {type(self).__name__} is not fitted yet: call fit or partial_fit first"
            )

    def _complete(self, X: Any, mask: Any) -> tuple[np.ndarray, np.ndarray]:
        """The completed samples and the observed entries."""
        self._require_fitted()
        X, mask = self._check(X, mask, reset=False)
        return np.where(mask, X, self._estimate(X, mask)), mask

    def transform(self, X: Any, *, mask: Any = None) -> np.ndarray:
        """Complete samples: the model's estimate on missing entries, the observed values kept."""
        return self._complete(X, mask)[0]

    predict = transform

    def fit_transform(self, X: Any, y: Any = None, *, mask: Any = None) -> np.ndarray:
        """:meth:`fit` on ``X``, then :meth:`transform` of the same ``X`` (with the same ``mask``)."""
        return self.fit(X, mask=mask).transform(X, mask=mask)

    def completion_error(self, X: Any, X_full: Any, *, mask: Any = None) -> float:
        """Normalised completion error ``‖(X̂ − X_full)_M‖ / ‖(X_full)_M‖`` on the entries M missing from
        ``X`` whose true value ``X_full`` (X's shape) holds; NaN in ``X_full`` is an unknown truth.

        Lower is better: it is the paper's metric. :meth:`score` is its negative on held-out entries.
        """
        completed, observed = self._complete(X, mask)
        return _completion_error(completed, observed, X_full)

    def score(self, X: Any, y: Any = None, *, mask: Any = None) -> float:
        """Higher is better: minus the :meth:`completion_error` of a seeded :data:`SCORE_HELD_OUT`
        share of each sample's observed entries, completed from the rest (no ground truth needed).

        0 is a perfect completion. ``y`` is ignored; ``mask`` as in :func:`check_stream`.
        """
        self._require_fitted()
        X, observed = self._check(X, mask, reset=False)
        kept = observed & ~_held_out(observed)
        X_kept = np.where(kept, X, 0.0)
        completed = np.where(kept, X, self._estimate(X_kept, kept))
        return -_completion_error(completed, kept, np.where(observed, X, np.nan))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save parameters and learned state to ``path.safetensors`` + ``path.json`` (no pickle)."""
        from mixlab.shared.checkpoint import save_state  # NumPy arrays: safetensors.numpy, no torch

        self._require_fitted()
        save_state(
            {
                "class": type(self).__name__,
                "params": self.get_params(),
                "n_features_in_": self.n_features_in_,
                "n_samples_seen_": self.n_samples_seen_,
                "learned": {name: getattr(self, name) for name in self._state_attributes},
                "rng": self._rng.bit_generator.state,
            },
            path,
        )
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Self:
        """Load an estimator saved by :meth:`save`.

        A damaged, truncated, foreign or edited file raises :class:`CheckpointError` (a ValueError)
        naming it: the sidecar's SHA-256 of both files is checked, then every stored value."""
        from mixlab.shared.checkpoint import load_state  # arrays come back as NumPy arrays

        json_file = Path(path).with_suffix(".json")
        state = load_state(path)
        with checkpoint_errors(json_file, f"saved {cls.__name__}"):
            if not isinstance(state, dict) or "class" not in state:
                raise CheckpointError(f"{json_file}: not a saved mixlab estimator")
            if state["class"] != cls.__name__:
                raise CheckpointError(
                    f"{json_file}: holds a {state['class']}, not a {cls.__name__}"
                )
            estimator = cls(**state["params"])
            estimator._validate_params()
            estimator.n_features_in_ = state["n_features_in_"]
            estimator.n_samples_seen_ = state["n_samples_seen_"]
            require(
                is_count(estimator.n_features_in_, 2) and is_count(estimator.n_samples_seen_, 0),
                "the stored sample counts",
                "integers (n_features_in_ >= 2, n_samples_seen_ >= 0)",
                (estimator.n_features_in_, estimator.n_samples_seen_),
            )
            missing = set(cls._state_attributes) - set(state["learned"])
            require(not missing, "the learned state", f"all of {cls._state_attributes}", missing)
            for name, value in state["learned"].items():
                value = np.array(value) if isinstance(value, np.ndarray) else value
                if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                    require(bool(np.isfinite(value).all()), name, "finite", "NaN or inf")
                setattr(estimator, name, value)
            estimator._check_learned_shape()
            estimator._rng = np.random.default_rng()
            estimator._rng.bit_generator.state = state["rng"]
        return estimator

    def _check_learned_shape(self) -> None:
        """ValueError when the learned bases do not have the shape the parameters ask for."""
        learned = getattr(self, "bases_", getattr(self, "basis_", None))
        if learned is None:
            return
        expected = (
            (self.n_experts, self.n_features_in_, self.rank)
            if learned.ndim == 3
            else (self.n_features_in_, self.rank)
        )
        if learned.shape != expected:
            raise ValueError(
                f"the learned state has shape {learned.shape} but the parameters ask for {expected}: "
                "call fit again after changing n_experts or rank"
            )


class _GrouseSteps:
    """The step schedule ``η_t = max(min_step, η₀ / (1 + t/τ))``: constant when τ (``step_decay``) is
    None, ~1/t otherwise (GROUSE's decreasing schedule for stationary data, with a floor so that
    drift can still be tracked). t counts an expert's updates since the last ``reset_steps`` (or,
    in MoSAIC with ``detect_changes``, since its expert's last detected change). ``step_rule``
    turns η_t into an angle (:func:`~mixlab.online.mosaic.subspace.grouse_step`): a fraction of the
    greedy angle (``"greedy"``) or GROUSE's ``η_t·‖ρ‖‖p‖`` (``"sigma"``)."""

    step_size: float
    step_decay: float | None
    min_step: float
    step_rule: str
    updates_: np.ndarray

    def _validate_steps(self) -> None:
        step_size, step_decay, min_step = self.step_size, self.step_decay, self.min_step
        require(self.step_rule in STEP_RULES, "step_rule", " or ".join(STEP_RULES), self.step_rule)
        greedy = self.step_rule == "greedy"
        require(
            0 < step_size <= 1 if greedy else 0 < step_size < np.inf,
            "step_size",
            "in (0, 1] (a fraction of the greedy GROUSE step)"
            if greedy
            else "> 0 and finite (η₀ of θ = η·‖ρ‖‖p‖)",
            step_size,
        )
        require(
            step_decay is None or step_decay > 0,
            "step_decay",
            "None (constant step) or > 0 updates",
            step_decay,
        )
        if step_decay is not None:
            require(
                0 <= min_step <= step_size, "min_step", f"in [0, step_size={step_size}]", min_step
            )

    def _step(self, expert: int) -> float:
        if self.step_decay is None:
            return self.step_size
        return max(self.min_step, self.step_size / (1.0 + self.updates_[expert] / self.step_decay))

    def reset_steps(self) -> None:
        """Restart the decreasing step schedule (at a known change of epoch)."""
        self.updates_[:] = 0


class _RoutedExperts:
    """Completion and routing with K expert bases ``bases_`` of shape ``(K, n_features, r)``."""

    bases_: np.ndarray
    _require_fitted: Any
    _check: Any

    def _validate_params(self) -> None:
        super()._validate_params()  # type: ignore[misc]
        for name in ("n_experts", "n_init", "max_iter"):
            require_count(self, name)

    def route(self, X: Any, *, mask: Any = None) -> np.ndarray:
        """The expert each sample is routed to: ``argmin_k ‖x_Ω − U_{k,Ω} w_k‖² / |Ω|``."""
        self._require_fitted()
        return route(self.bases_, *self._check(X, mask, reset=False))[0]

    def _estimate(self, X: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return complete_routed(self.bases_, X, mask)


class MoSAIC(_GrouseSteps, _RoutedExperts, _StreamingCompleter):
    """MoSAIC: a routed mixture of K rank-r subspace experts for online matrix completion.

    Phase 1, :meth:`fit`: k-subspaces with missing data on a source batch. Phase 2,
    :meth:`partial_fit`: each sample is routed to the expert with the smallest residual per observed
    coordinate, and only that expert takes a GROUSE step toward it. Without :meth:`fit`, the experts
    start as random subspaces (k-GROUSE).

    Parameters:
        n_experts: number of experts K (default: 4).
        rank: rank r of each expert (default: 5).
        step_size: η₀: with ``step_rule="greedy"`` the GROUSE step as a fraction of the greedy step,
            in (0, 1]; with ``"sigma"`` GROUSE's η in ``θ = η·‖ρ‖‖p‖``, > 0 (default: 0.5).
        step_decay: τ of the schedule ``max(min_step, step_size/(1 + t_k/τ))``; None keeps the step
            constant (default: None).
        min_step: floor of the decreasing schedule (default: 0.05).
        step_rule: ``"greedy"`` or ``"sigma"`` (:func:`~mixlab.online.mosaic.subspace.grouse_step`)
            (default: "greedy").
        detect_changes: restart an expert's step schedule when the residual per observed entry of
            its recent samples exceeds this many times its running level (a residual test for an
            abrupt change, Page-style: fast average over ~4 samples against slow over ~50); None
            never restarts (default: None).
        adapt: False freezes the experts after pre-training (the "frozen" baseline) (default: True).
        n_init, max_iter: k-subspaces seedings and iterations in :meth:`fit` (default: 5, 30).
        random_state: seed of the seeding and of random starts (default: None).

    Attributes:
        bases_: ``(K, n_features, r)`` orthonormal expert bases.
        updates_: ``(K,)`` updates of each expert since the last :meth:`reset_steps` (or change).
        n_changes_: ``(K,)`` changes detected per expert; ``last_change_``: ``(K,)`` the sample
            (counted in ``n_samples_seen_``) of each expert's last detected change, -1 if none.
        labels_: ``(n_samples,)`` expert of each sample of the :meth:`fit` batch.
        n_iter_: k-subspaces rounds the :meth:`fit` ran (at most ``max_iter``; 0 without fit).
        last_routes_: expert of each sample of the last :meth:`partial_fit` batch.

    Example:
        >>> model = MoSAIC(n_experts=4, rank=5, random_state=0).fit(X_source)  # NaN = missing
        >>> completed = model.transform(X_batch)  # complete first (prequential) ...
        >>> model = model.partial_fit(X_batch)    # ... then adapt
    """

    _state_attributes = (
        "bases_",
        "updates_",
        "residual_level_",
        "recent_residual_",
        "n_changes_",
        "last_change_",
    )

    def __init__(
        self,
        n_experts: int = 4,
        rank: int = 5,
        *,
        step_size: float = 0.5,
        step_decay: float | None = None,
        min_step: float = 0.05,
        step_rule: str = "greedy",
        detect_changes: float | None = None,
        adapt: bool = True,
        n_init: int = 5,
        max_iter: int = 30,
        random_state: int | None = None,
    ) -> None:
        self.n_experts = n_experts
        self.rank = rank
        self.step_size = step_size
        self.step_decay = step_decay
        self.min_step = min_step
        self.step_rule = step_rule
        self.detect_changes = detect_changes
        self.adapt = adapt
        self.n_init = n_init
        self.max_iter = max_iter
        self.random_state = random_state

    def _validate_params(self) -> None:
        super()._validate_params()
        self._validate_steps()
        threshold = self.detect_changes
        require(
            threshold is None or 1 < threshold < np.inf,
            "detect_changes",
            "None or a finite ratio > 1",
            threshold,
        )

    def _reset_state(self) -> None:
        """Step counts and the change detector's state, for K experts that have seen nothing."""
        self.updates_ = np.zeros(self.n_experts, dtype=np.int64)
        self.residual_level_ = np.full(self.n_experts, -1.0)  # -1: no routed sample yet
        self.recent_residual_ = np.full(self.n_experts, -1.0)
        self.n_changes_ = np.zeros(self.n_experts, dtype=np.int64)
        self.last_change_ = np.full(self.n_experts, -1, dtype=np.int64)

    def _pretrain(self, X: np.ndarray, mask: np.ndarray) -> None:
        fitted = k_subspaces(
            X,
            mask,
            self.n_experts,
            self.rank,
            self._rng,
            n_init=self.n_init,
            max_iter=self.max_iter,
        )
        self.bases_, self.labels_, self.n_iter_ = fitted.bases, fitted.labels, fitted.n_iter
        self._reset_state()

    def _start(self, n_features: int) -> None:
        self.bases_ = np.stack(
            [random_basis(n_features, self.rank, self._rng) for _ in range(self.n_experts)]
        )
        self._reset_state()
        self.n_iter_ = 0

    def partial_fit(self, X: Any, y: Any = None, *, mask: Any = None, experts: Any = None) -> Self:
        """Phase 2: route each sample and take one GROUSE step on its expert only.

        A batch is routed with the experts as they are at its start (one vectorised pass); the
        GROUSE steps then run in order, so batches of 1 are the exact online algorithm and larger
        batches differ only in routing decisions made with slightly older experts.
        ``experts`` forces the routing (the oracle baseline, or labelled data).
        """
        return super().partial_fit(X, mask=mask, experts=experts)

    def _update(self, X: np.ndarray, mask: np.ndarray, experts: Any = None) -> None:
        if experts is None or self.detect_changes is not None:  # the test needs the residuals
            chosen, residual = route(self.bases_, X, mask)
        if experts is not None:
            chosen = np.asarray(experts).reshape(-1)
            valid = (
                len(chosen) == len(X)
                and np.issubdtype(chosen.dtype, np.integer)
                and np.isin(chosen, np.arange(self.n_experts)).all()
            )
            require(valid, "experts", f"one integer in [0, {self.n_experts}) per sample", chosen)
        self.last_routes_ = chosen
        for index, (x, observed, k) in enumerate(zip(X, mask, chosen, strict=True)):
            if self.detect_changes is not None:
                per_entry = residual[index, k] / observed.sum()
                self._watch(k, per_entry, self.n_samples_seen_ + index)
            if self.adapt:
                step = self._step(k)
                self.bases_[k] = grouse_step(self.bases_[k], x, observed, step, self.step_rule)
                self.updates_[k] += 1

    def _watch(self, expert: int, residual: float, sample: int) -> None:
        """The residual test: a fast average of the expert's residual per observed entry against its
        slow running level; a jump past ``detect_changes`` times the level restarts the expert's
        step schedule, and the level restarts from the jump."""
        level, recent = self.residual_level_[expert], self.recent_residual_[expert]
        if level < 0:
            level = recent = residual
        recent += CHANGE_FAST * (residual - recent)
        if recent > self.detect_changes * level:
            self.updates_[expert] = 0
            self.n_changes_[expert] += 1
            self.last_change_[expert] = sample
            level = recent
        else:
            level += CHANGE_SLOW * (residual - level)
        self.residual_level_[expert], self.recent_residual_[expert] = level, recent


class GROUSE(_GrouseSteps, _StreamingCompleter):
    """GROUSE: one rank-r subspace tracked by Grassmannian rank-one steps (Balzano, Nowak, Recht 2010).

    :meth:`fit` initialises the subspace as the rank-r fit of a source batch (alternating least
    squares); without it the first :meth:`partial_fit` starts from a random subspace. The step
    parameters are those of :class:`MoSAIC`.
    """

    _state_attributes = ("basis_", "updates_")

    def __init__(
        self,
        rank: int = 5,
        *,
        step_size: float = 0.5,
        step_decay: float | None = None,
        min_step: float = 0.05,
        step_rule: str = "greedy",
        random_state: int | None = None,
    ) -> None:
        self.rank = rank
        self.step_size = step_size
        self.step_decay = step_decay
        self.min_step = min_step
        self.step_rule = step_rule
        self.random_state = random_state

    def _validate_params(self) -> None:
        super()._validate_params()
        self._validate_steps()

    def _pretrain(self, X: np.ndarray, mask: np.ndarray) -> None:
        self.basis_ = fit_basis(X, mask, self.rank, self._rng)
        self.updates_ = np.zeros(1, dtype=np.int64)

    def _start(self, n_features: int) -> None:
        self.basis_ = random_basis(n_features, self.rank, self._rng)
        self.updates_ = np.zeros(1, dtype=np.int64)

    def _update(self, X: np.ndarray, mask: np.ndarray) -> None:
        for x, observed in zip(X, mask, strict=True):
            self.basis_ = grouse_step(self.basis_, x, observed, self._step(0), self.step_rule)
            self.updates_[0] += 1

    def _estimate(self, X: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return complete_routed(self.basis_[None], X, mask)


class PETRELS(_StreamingCompleter):
    """PETRELS: subspace tracking by parallel row-wise recursive least squares (Chi, Eldar,
    Calderbank, IEEE TSP 2013, Alg. 1), with forgetting factor λ.

    For each sample, ``a = argmin ‖x_Ω − D_Ω a‖``. Every row's inverse correlation follows
    ``P_m ← λ⁻¹P_m − p_m β⁻¹ v vᵀ`` (``v = λ⁻¹P_m a``, ``β = 1 + λ⁻¹aᵀP_m a``, ``p_m`` = 1 if row m
    is observed), and observed rows move ``d_m ← d_m + (x_m − aᵀd_m) P_m a``. Unobserved rows only
    forget, ``P_m ← λ⁻¹P_m``; that scaling is applied lazily, as ``λ^−(gap)`` when the row is next
    observed, so a sample costs O(|Ω| r²) and not O(n r²). The factor is capped at 1e12 (a row
    unobserved for ~1,400 samples at λ = 0.98 has forgotten everything anyway).

    Parameters:
        rank: rank of the tracked subspace (default: 5).
        forgetting: λ in (0, 1] (default: 0.98).
        initial_inverse: P_m starts as this times the identity (default: 1.0).
        random_state: seed of the random start (default: None).
    """

    _state_attributes = ("basis_", "inverse_", "last_observed_", "steps_")

    def __init__(
        self,
        rank: int = 5,
        *,
        forgetting: float = 0.98,
        initial_inverse: float = 1.0,
        random_state: int | None = None,
    ) -> None:
        self.rank = rank
        self.forgetting = forgetting
        self.initial_inverse = initial_inverse
        self.random_state = random_state

    def _validate_params(self) -> None:
        super()._validate_params()
        require(0 < self.forgetting <= 1, "forgetting", "in (0, 1]", self.forgetting)
        require(self.initial_inverse > 0, "initial_inverse", "> 0", self.initial_inverse)

    def _pretrain(self, X: np.ndarray, mask: np.ndarray) -> None:
        self._start(X.shape[1])
        self.basis_ = fit_basis(X, mask, self.rank, self._rng)

    def _start(self, n_features: int) -> None:
        self.basis_ = random_basis(n_features, self.rank, self._rng)
        self.inverse_ = np.tile(self.initial_inverse * np.eye(self.rank), (n_features, 1, 1))
        self.last_observed_ = np.zeros(
            n_features, dtype=np.int64
        )  # step at which P_m was last updated
        self.steps_ = np.zeros(1, dtype=np.int64)

    def _update(self, X: np.ndarray, mask: np.ndarray) -> None:
        log_forgetting = -np.log(self.forgetting)
        for x, observed in zip(X, mask, strict=True):
            self.steps_[0] += 1
            rows = np.flatnonzero(observed)
            basis_rows = self.basis_[rows]  # (m, r)
            coefficients = np.linalg.lstsq(basis_rows, x[rows], rcond=None)[0]  # a, (r,)
            # λ⁻¹ for this step and every step the row went unobserved: λ^−(t − t_m)
            gap = self.steps_[0] - self.last_observed_[rows]
            scale = np.exp(np.minimum(gap * log_forgetting, np.log(1e12)))
            inverse = scale[:, None, None] * self.inverse_[rows]  # λ⁻¹ P_m, (m, r, r)
            gain = inverse @ coefficients  # v, (m, r)
            beta = 1.0 + gain @ coefficients  # (m,)
            inverse = inverse - np.einsum("mr,ms->mrs", gain, gain) / beta[:, None, None]
            errors = x[rows] - basis_rows @ coefficients  # (m,)
            self.basis_[rows] = basis_rows + errors[:, None] * (inverse @ coefficients)
            self.inverse_[rows] = inverse
            self.last_observed_[rows] = self.steps_[0]

    def _estimate(self, X: np.ndarray, mask: np.ndarray) -> np.ndarray:
        # D is not orthonormal: complete in an orthonormal basis of its span (same span, better conditioned).
        return complete_routed(np.linalg.qr(self.basis_)[0][None], X, mask)


class WindowedKSubspaces(_RoutedExperts, _StreamingCompleter):
    """Batch k-subspaces with missing data re-run on the last ``window`` samples every
    ``refit_every`` samples, warm-started from the current experts; an offline reference.

    Parameters:
        n_experts, rank: as in :class:`MoSAIC` (default: 4, 5).
        window: samples kept (default: 1000).
        refit_every: samples between refits (default: 500).
        init: ``"k-subspaces"`` to pre-train in :meth:`fit`, or a ``(K, n_features, rank)`` array of
            bases to start from (e.g. a fitted MoSAIC's ``bases_``) (default: "k-subspaces").
        n_init, max_iter: k-subspaces seedings and iterations (default: 2, 10).
        random_state: seed (default: None).

    Attributes:
        bases_: ``(K, n_features, r)`` orthonormal expert bases.
        n_iter_: k-subspaces rounds of the last (re-)fit (0 before the first, or with an ``init`` array).
    """

    _state_attributes = ("bases_", "window_X_", "window_mask_", "since_refit_")

    def __init__(
        self,
        n_experts: int = 4,
        rank: int = 5,
        *,
        window: int = 1000,
        refit_every: int = 500,
        init: str | np.ndarray = "k-subspaces",
        n_init: int = 2,
        max_iter: int = 10,
        random_state: int | None = None,
    ) -> None:
        self.n_experts = n_experts
        self.rank = rank
        self.window = window
        self.refit_every = refit_every
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.random_state = random_state

    def _validate_params(self) -> None:
        super()._validate_params()
        require_count(self, "window", 2 * self.n_experts * self.rank)
        require_count(self, "refit_every")
        if isinstance(self.init, str):
            require(
                self.init == "k-subspaces", "init", "'k-subspaces' or an array of bases", self.init
            )

    def _initial_bases(self, n_features: int) -> np.ndarray | None:
        """The ``init`` array, checked; None when ``init`` is "k-subspaces"."""
        if isinstance(self.init, str):
            return None
        bases = np.array(self.init, dtype=np.float64)
        expected = (self.n_experts, n_features, self.rank)
        require(bases.shape == expected, "init", f"an array of shape {expected}", bases.shape)
        return bases

    def _pretrain(self, X: np.ndarray, mask: np.ndarray) -> None:
        self.bases_, self.n_iter_ = self._initial_bases(X.shape[1]), 0
        if self.bases_ is None:
            fitted = k_subspaces(
                X,
                mask,
                self.n_experts,
                self.rank,
                self._rng,
                n_init=self.n_init,
                max_iter=self.max_iter,
            )
            self.bases_, self.n_iter_ = fitted.bases, fitted.n_iter
        self.window_X_, self.window_mask_ = X[-self.window :], mask[-self.window :]
        self.since_refit_ = 0

    def _start(self, n_features: int) -> None:
        self.bases_, self.n_iter_ = self._initial_bases(n_features), 0
        if self.bases_ is None:
            self.bases_ = np.stack(
                [random_basis(n_features, self.rank, self._rng) for _ in range(self.n_experts)]
            )
        self.window_X_ = np.zeros((0, n_features))
        self.window_mask_ = np.zeros((0, n_features), dtype=bool)
        self.since_refit_ = 0

    def _update(self, X: np.ndarray, mask: np.ndarray) -> None:
        self.window_X_ = np.concatenate([self.window_X_, X])[-self.window :]
        self.window_mask_ = np.concatenate([self.window_mask_, mask])[-self.window :]
        self.since_refit_ += len(X)
        if (
            self.since_refit_ >= self.refit_every
            and len(self.window_X_) >= 2 * self.n_experts * self.rank
        ):
            self.bases_, _, self.n_iter_ = refine_subspaces(
                self.bases_, self.window_X_, self.window_mask_, self._rng, max_iter=self.max_iter
            )  # k-subspaces iterations on the window, from the current bases
            self.since_refit_ = 0
