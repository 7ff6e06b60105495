"""scikit-learn's own estimator checks on every MoSAIC estimator, and the fixes they rest on (issue 17).

The estimators are transformers that complete a matrix, like scikit-learn's imputers: NaN marks a
missing entry, ``fit(X, y=None, *, mask=None)`` leaves ``y`` to the rest of a pipeline, ``transform``
returns the completed matrix, and ``score`` is higher-is-better so that ``GridSearchCV`` and
``cross_val_score`` can select a model. Each targeted test below fails if its fix is reverted.
"""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.utils import get_tags
from sklearn.utils.estimator_checks import parametrize_with_checks

from mixlab.online.mosaic import GROUSE, PETRELS, MoSAIC, WindowedKSubspaces
from mixlab.online.mosaic.estimators import _held_out

# Rank 1 and few iterations: the checks fit on 2 to 10 features and 10 to 30 samples.
CHECKED = [
    MoSAIC(2, 1, n_init=1, max_iter=5, random_state=0),
    GROUSE(1, random_state=0),
    PETRELS(1, random_state=0),
    WindowedKSubspaces(2, 1, n_init=1, max_iter=5, random_state=0),
]
# For the targeted tests on two rank-2 subspaces of 16 features (the single-subspace trackers at
# rank 4 span both).
ESTIMATORS = [
    MoSAIC(2, 2, n_init=1, max_iter=5, random_state=0),
    GROUSE(4, random_state=0),
    PETRELS(4, random_state=0),
    WindowedKSubspaces(2, 2, window=40, refit_every=20, n_init=1, max_iter=5, random_state=0),
]

EXPECTED_FAILED_CHECKS: dict[str, dict[str, str]] = {}
"""check name -> reason, per estimator class: none, every check passes (at most 5 allowed)"""


@parametrize_with_checks(
    CHECKED,
    expected_failed_checks=lambda estimator: EXPECTED_FAILED_CHECKS.get(
        type(estimator).__name__, {}
    ),
)
def test_scikit_learn_estimator_checks(estimator, check) -> None:
    check(estimator)


def union_of_subspaces(n_samples=120, n_features=16, rank=2, observed=0.6, seed=0):
    """Samples of two random rank-``rank`` subspaces: ``(X_full, mask, X with NaN where missing)``."""
    rng = np.random.default_rng(seed)
    bases = rng.standard_normal((2, n_features, rank))
    labels = rng.integers(0, 2, n_samples)
    X_full = np.einsum("bnr,br->bn", bases[labels], rng.standard_normal((n_samples, rank)))
    mask = rng.random(X_full.shape) < observed
    mask[:, 0] = True
    return X_full, mask, np.where(mask, X_full, np.nan)


each_estimator = pytest.mark.parametrize(
    "estimator", ESTIMATORS, ids=lambda estimator: type(estimator).__name__
)


@each_estimator
def test_a_pipeline_gives_y_to_its_classifier(estimator) -> None:
    X_full, _, X = union_of_subspaces()
    y = (X_full[:, 1] > 0).astype(int)  # a label that depends on a partly missing column
    pipeline = make_pipeline(clone(estimator), LogisticRegression()).fit(X, y)
    assert pipeline.score(X, y) > 0.9
    clone(estimator).partial_fit(X, y)  # y is ignored, not taken for a mask


@each_estimator
def test_fitting_again_forgets_the_first_fit(estimator) -> None:
    _, _, X_first = union_of_subspaces(n_features=10, seed=1)
    _, _, X = union_of_subspaces()
    refitted = clone(estimator).fit(X_first).partial_fit(X_first[:20]).fit(X)
    fresh = clone(estimator).fit(X)
    assert refitted.n_features_in_ == 16
    assert refitted.n_samples_seen_ == len(X)
    learned = sorted(name for name in vars(fresh) if name.endswith("_"))
    assert sorted(name for name in vars(refitted) if name.endswith("_")) == learned  # none stale
    np.testing.assert_array_equal(refitted.transform(X), fresh.transform(X))


@each_estimator
def test_an_unfitted_estimator_raises_not_fitted_error(estimator) -> None:
    X_full, _, X = union_of_subspaces(n_samples=10)
    estimator = clone(estimator)
    calls = [estimator.transform, estimator.score, lambda X: estimator.completion_error(X, X_full)]
    if hasattr(estimator, "route"):
        calls.append(estimator.route)
    for call in calls:
        with pytest.raises(NotFittedError, match="is not fitted yet: call fit or partial_fit"):
            call(X)


def test_grid_search_picks_the_true_rank_by_the_higher_score() -> None:
    _, _, X = union_of_subspaces(n_samples=180)
    search = GridSearchCV(
        MoSAIC(2, n_init=2, max_iter=10, random_state=0), {"rank": [1, 2, 6]}, cv=3
    ).fit(X)
    scores = search.cv_results_["mean_test_score"]
    assert np.isfinite(scores).all()
    assert search.best_params_ == {"rank": 2}  # too small and too large ranks complete worse
    assert scores[1] > -0.01
    assert max(scores[0], scores[2]) < -0.1


@each_estimator
def test_cross_val_score_is_finite_and_at_most_zero(estimator) -> None:
    _, _, X = union_of_subspaces()
    scores = cross_val_score(clone(estimator), X, cv=3)
    assert np.isfinite(scores).all()
    assert (scores <= 0).all()


@each_estimator
def test_nan_marks_missing_entries_and_mask_can_hide_more(estimator) -> None:
    X_full, mask, X = union_of_subspaces()
    assert get_tags(estimator).input_tags.allow_nan
    model = clone(estimator).fit(X)
    completed = model.transform(X)
    assert np.isfinite(completed).all()
    np.testing.assert_array_equal(completed[mask], X_full[mask])  # observed entries are kept
    # the full matrix with its mask is the same data as NaN where missing
    np.testing.assert_array_equal(clone(estimator).fit(X_full, mask=mask).transform(X), completed)
    np.testing.assert_array_equal(model.transform(X_full, mask=mask), completed)
    np.testing.assert_array_equal(
        clone(estimator).fit_transform(X_full, mask=mask), clone(estimator).fit_transform(X)
    )
    # a mask cannot reveal a NaN, but it can hide a value
    np.testing.assert_array_equal(model.transform(X, mask=np.ones_like(mask)), completed)
    hidden = mask.copy()
    hidden[:, 1] = False
    assert not np.array_equal(model.transform(X, mask=hidden)[:, 1], X_full[:, 1])


@each_estimator
def test_score_is_minus_the_completion_error_on_held_out_entries(estimator) -> None:
    X_full, _, X = union_of_subspaces()
    model = clone(estimator).fit(X)
    observed = ~np.isnan(X)
    hidden = _held_out(observed)
    assert 0 < hidden.sum() < observed.sum()
    assert model.score(X) == -model.completion_error(np.where(hidden, np.nan, X), X)
    assert model.score(X, np.zeros(len(X))) == model.score(X)  # y is ignored
    # completion_error is the paper's metric, lower is better: near 0 for a model of the right size
    assert 0 < model.completion_error(X, X_full) < 0.05
