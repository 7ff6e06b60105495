import copy
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import subspace_angles
from sklearn.base import clone

from mixlab.online.cli import main
from mixlab.online.mosaic import (
    GROUSE,
    PETRELS,
    DriftingSubspaceStream,
    Epoch,
    MoSAIC,
    WindowedKSubspaces,
    contraction_exponent,
    grouse_step,
    observed_fit,
    power_law_fits_better,
    routing_accuracy,
    subspace_distance,
)
from mixlab.online.mosaic.experiment import METHOD, REFERENCES, Config, system_names
from mixlab.online.mosaic.subspace import fit_basis, random_basis


def union_samples(
    n_features=40, n_subspaces=3, rank=3, n_samples=600, observed=0.5, noise=0.0, seed=0
):
    rng = np.random.default_rng(seed)
    bases = np.stack([random_basis(n_features, rank, rng) for _ in range(n_subspaces)])
    labels = rng.integers(0, n_subspaces, n_samples)
    X_full = np.einsum("bnr,br->bn", bases[labels], rng.standard_normal((n_samples, rank)))
    X_full += noise * rng.standard_normal(X_full.shape)
    mask = rng.random(X_full.shape) < observed
    return bases, labels, X_full, mask


def test_observed_fit_matches_per_sample_least_squares() -> None:
    rng = np.random.default_rng(1)
    bases = np.stack([random_basis(12, 3, rng) for _ in range(2)])
    X = rng.standard_normal((5, 12))
    mask = rng.random((5, 12)) < 0.6
    weights, residual = observed_fit(bases, X * mask, mask)
    for i in range(5):
        for k in range(2):
            U = bases[k][mask[i]]
            w, *_ = np.linalg.lstsq(U, X[i, mask[i]], rcond=None)
            np.testing.assert_allclose(weights[i, k], w, atol=1e-6)
            np.testing.assert_allclose(
                residual[i, k], np.sum((X[i, mask[i]] - U @ w) ** 2), atol=1e-8
            )


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), fraction=st.floats(0.05, 1.0), observed=st.floats(0.3, 1.0))
def test_grouse_step_keeps_the_basis_orthonormal(
    seed: int, fraction: float, observed: float
) -> None:
    rng = np.random.default_rng(seed)
    basis = random_basis(20, 4, rng)
    x = rng.standard_normal(20)
    mask = rng.random(20) < observed
    mask[:5] = True
    updated = grouse_step(basis, x, mask, fraction)
    np.testing.assert_allclose(updated.T @ updated, np.eye(4), atol=1e-10)


def test_greedy_grouse_step_takes_the_sample_into_the_span() -> None:
    rng = np.random.default_rng(3)
    basis, x = random_basis(15, 3, rng), rng.standard_normal(15)
    updated = grouse_step(basis, x, np.ones(15, bool), 1.0)
    assert np.linalg.norm(x - updated @ (updated.T @ x)) < 1e-10 * np.linalg.norm(x)


def test_noiseless_single_subspace_is_recovered_exactly() -> None:
    truth, _, X_full, mask = union_samples(n_subspaces=1, n_samples=1500, observed=0.4)
    X = np.where(mask, X_full, np.nan)
    tracker = GROUSE(rank=3, step_size=1.0, random_state=0).partial_fit(X)
    assert subspace_distance(tracker.basis_, truth[0]) < 1e-6
    assert (
        subspace_distance(fit_basis(X_full * mask, mask, 3, np.random.default_rng(0)), truth[0])
        < 1e-6
    )
    completed = tracker.transform(X[-50:])
    np.testing.assert_allclose(completed, X_full[-50:], atol=1e-5)


def test_petrels_tracks_a_stationary_subspace() -> None:
    truth, _, X_full, mask = union_samples(n_subspaces=1, n_samples=800, observed=0.5, noise=1e-4)
    tracker = PETRELS(rank=3, random_state=0).partial_fit(np.where(mask, X_full, np.nan))
    assert subspace_distance(np.linalg.qr(tracker.basis_)[0], truth[0]) < 1e-2


def test_pretrained_experts_route_well_separated_subspaces_correctly() -> None:
    truth, labels, X_full, mask = union_samples(n_samples=900, observed=0.5, noise=1e-3)
    model = MoSAIC(n_experts=3, rank=3, n_init=2, random_state=0).fit(X_full[:600], mask=mask[:600])
    assert routing_accuracy(model.labels_, labels[:600]) == 1.0
    assert routing_accuracy(model.route(X_full[600:], mask=mask[600:]), labels[600:]) == 1.0
    for basis in model.bases_:
        assert min(subspace_distance(basis, t) for t in truth) < 1e-2
    assert model.completion_error(X_full[600:], X_full[600:], mask=mask[600:]) < 1e-2


def test_partial_fit_one_by_one_equals_batched() -> None:
    _, _, X_full, mask = union_samples(n_samples=700, observed=0.6, noise=1e-3, seed=4)
    start = MoSAIC(n_experts=3, rank=3, n_init=2, random_state=0).fit(X_full[:400], mask=mask[:400])
    one_by_one, batched = copy.deepcopy(start), copy.deepcopy(start)
    for i in range(400, 700):
        one_by_one.partial_fit(X_full[i : i + 1], mask=mask[i : i + 1])
    batched.partial_fit(X_full[400:700], mask=mask[400:700])
    for a, b in zip(one_by_one.bases_, batched.bases_, strict=True):
        assert subspace_distance(a, b) < 1e-3


def test_same_seed_same_model() -> None:
    _, _, X_full, mask = union_samples(seed=5)
    first = (
        MoSAIC(3, 3, n_init=2, random_state=7)
        .fit(X_full, mask=mask)
        .partial_fit(X_full[:50], mask=mask[:50])
    )
    second = (
        MoSAIC(3, 3, n_init=2, random_state=7)
        .fit(X_full, mask=mask)
        .partial_fit(X_full[:50], mask=mask[:50])
    )
    np.testing.assert_array_equal(first.bases_, second.bases_)


def test_frozen_experts_do_not_move() -> None:
    _, _, X_full, mask = union_samples(seed=6)
    model = MoSAIC(3, 3, n_init=1, adapt=False, random_state=0).fit(X_full[:300], mask=mask[:300])
    before = model.bases_.copy()
    model.partial_fit(X_full[300:], mask=mask[300:])
    np.testing.assert_array_equal(model.bases_, before)


@pytest.mark.parametrize("estimator", [MoSAIC(3, 3, n_init=1, random_state=0), GROUSE(3, random_state=0),
                                       PETRELS(4, random_state=0), WindowedKSubspaces(3, 3, window=100, refit_every=20, random_state=0)],
                         ids=lambda e: type(e).__name__)  # fmt: skip
def test_save_and_load_round_trip(estimator, tmp_path: Path) -> None:
    _, _, X_full, mask = union_samples(seed=8)
    estimator.fit(X_full[:300], mask=mask[:300]).partial_fit(X_full[300:350], mask=mask[300:350])
    estimator.save(tmp_path / "model")
    loaded = type(estimator).load(tmp_path / "model")
    np.testing.assert_array_equal(
        loaded.transform(X_full[350:], mask=mask[350:]),
        estimator.transform(X_full[350:], mask=mask[350:]),
    )
    # both continue identically
    estimator.partial_fit(X_full[350:400], mask=mask[350:400])
    loaded.partial_fit(X_full[350:400], mask=mask[350:400])
    np.testing.assert_allclose(
        loaded.transform(X_full[400:], mask=mask[400:]),
        estimator.transform(X_full[400:], mask=mask[400:]),
    )
    with pytest.raises(ValueError, match="holds a"):
        (GROUSE if not isinstance(estimator, GROUSE) else PETRELS).load(tmp_path / "model")


def test_a_model_saved_before_numpy_safetensors_still_loads() -> None:
    # saved by the release that wrote NumPy arrays through safetensors.torch: the same file format
    rng = np.random.default_rng(8)
    bases = np.stack([random_basis(12, 2, rng) for _ in range(2)])
    labels = rng.integers(0, 2, 120)
    X = np.einsum("bnr,br->bn", bases[labels], rng.standard_normal((120, 2)))
    mask = rng.random(X.shape) < 0.6
    fresh = MoSAIC(2, 2, n_init=1, max_iter=3, random_state=0).fit(X[:100], mask=mask[:100])
    loaded = MoSAIC.load(Path(__file__).parent / "data" / "mosaic_saved_before_numpy_safetensors")
    assert isinstance(loaded.bases_, np.ndarray)
    np.testing.assert_allclose(loaded.bases_, fresh.bases_, atol=1e-8)
    np.testing.assert_allclose(
        loaded.transform(X[100:], mask=mask[100:]),
        fresh.transform(X[100:], mask=mask[100:]),
        atol=1e-8,
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m, X, M: m.fit(X, mask=M[:, :-1]), "mask must be a boolean array of the shape of X"),
        (lambda m, X, M: m.fit(X, mask=M.astype(int)), "mask must be a boolean array"),
        (lambda m, X, M: m.fit(X, mask=np.zeros_like(M)), "at least one observed entry; samples \\[0, 1, 2, 3, 4\\]"),
        (lambda m, X, M: m.fit(np.where(M, np.inf, X), mask=M), "Input X contains infinity"),
        (lambda m, X, M: m.fit(np.where(M, np.nan, X), mask=M), "at least one observed entry"),  # NaN is missing, whatever the mask
        (lambda m, X, M: m.fit(X[0], mask=M[0]), "Expected 2D array, got 1D array instead"),
        (lambda m, X, M: m.set_params(rank=40).fit(X, mask=M), "rank must be smaller than the number of features \\(40\\)"),
        (lambda m, X, M: m.set_params(rank=0).fit(X, mask=M), "rank must be an integer >= 1"),
        (lambda m, X, M: m.set_params(step_size=1.5).fit(X, mask=M), "step_size must be in \\(0, 1\\]"),
        (lambda m, X, M: m.set_params(n_experts=0).fit(X, mask=M), "n_experts must be an integer >= 1"),
        (lambda m, X, M: m.transform(X, mask=M), "not fitted yet"),  # NotFittedError is a ValueError
        (lambda m, X, M: m.fit(X, mask=M).partial_fit(X[:, :10], mask=M[:, :10]), "X has 10 features, but MoSAIC is expecting 40 features as input"),
        (lambda m, X, M: m.fit(X, mask=M).partial_fit(X[:3], mask=M[:3], experts=[0, 1, 9]), "experts must be one integer in \\[0, 3\\)"),
    ],
)  # fmt: skip
def test_bad_input_is_named(call, message: str) -> None:
    _, _, X_full, mask = union_samples(n_samples=200)
    with pytest.raises(ValueError, match=message):
        call(MoSAIC(3, 3, n_init=1, max_iter=3, random_state=0), X_full, mask)


def test_stream_geodesic_drift_moves_at_the_given_rate() -> None:
    generator = DriftingSubspaceStream(
        n_features=30,
        n_subspaces=2,
        rank=3,
        n_source=10,
        epochs=(Epoch("drift", 200, drift_rate=2e-3),),
        snapshot_every=50,
    )
    stream = generator.generate(0)
    for basis in stream.snapshots.reshape(-1, 30, 3):
        np.testing.assert_allclose(basis.T @ basis, np.eye(3), atol=1e-10)
    first, last = stream.snapshots[0], stream.snapshots[-1]
    moved = stream.snapshot_times[-1] - stream.snapshot_times[0]
    for k in range(2):
        # ‖Θ‖_F equals the arc length along a unit-speed geodesic (Edelman, Arias, Smith 1998)
        assert np.linalg.norm(subspace_angles(first[k], last[k])) == pytest.approx(
            2e-3 * moved, rel=1e-6
        )


def test_stream_switch_replaces_one_subspace_and_is_seeded() -> None:
    generator = DriftingSubspaceStream(
        n_features=30, n_subspaces=3, rank=2, n_source=10,
        epochs=(Epoch("stationary", 50), Epoch("switch", 50)), snapshot_every=50,
    )  # fmt: skip
    stream = generator.generate(1)
    moved = [
        subspace_distance(a, b) > 1e-6
        for a, b in zip(stream.snapshots[0], stream.snapshots[1], strict=True)
    ]
    assert sum(moved) == 1
    np.testing.assert_array_equal(generator.generate(1).X_full, stream.X_full)
    assert abs(stream.mask.mean() - generator.observed_fraction) < 0.05
    with pytest.raises(ValueError, match="observed_fraction must be in"):
        DriftingSubspaceStream(observed_fraction=0.0)


def test_diagnostics() -> None:
    labels = np.array([0, 0, 1, 1, 2, 2])
    assert routing_accuracy(np.array([2, 2, 0, 0, 1, 1]), labels) == 1.0
    assert routing_accuracy(np.array([2, 2, 0, 0, 1, 0]), labels) == pytest.approx(5 / 6)
    steps = np.arange(1, 100)
    assert contraction_exponent(steps, 3.0 * steps**-0.4) == pytest.approx(0.4)
    assert power_law_fits_better(steps, 3.0 * steps**-0.4)
    assert not power_law_fits_better(steps, 3.0 * np.exp(-0.05 * steps))


def _tiny_config(**changes) -> Config:
    return Config.from_profile(
        "quick", device="cpu", n_features=30, n_subspaces=2, rank=2, observed_fractions=(0.5,), n_seeds=1,
        n_source=200, epoch_lengths=(100,) * 5, n_init=1, window=100, refit_every=50,
        routing_fractions=(0.1, 0.5), routing_samples=100, **changes,
    )  # fmt: skip


def test_quick_experiment_smoke(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _tiny_config()
    monkeypatch.setenv("MIXLAB_PROGRESS", "lines")
    monkeypatch.setenv("MIXLAB_PROGRESS_EVERY", "0")
    result = METHOD.execute(config, tmp_path)
    shown = capsys.readouterr().err  # each loop's counter, named after the cell that runs it
    assert "stream p=0.5 seed=0 · stream batches: 25/25" in shown
    assert "stream p=0.5 seed=0 · contraction sweep batches: 10/10" in shown
    assert "routing seed=0 · routing sweep rates: 2/2" in shown
    data = json.loads((tmp_path / "result.json").read_text())
    assert data["cache"]["state"] == "none"  # MoSAIC caches nothing
    assert set(data["metrics"]) == {*system_names(config)["all"], *REFERENCES}
    assert len({tuple(row) for row in data["metrics"].values()}) == 1  # every row has the same keys
    assert len(data["claims"]) == 8
    assert (tmp_path / "diagnostics.png").exists()
    # the regime checks are computed from the measured references
    assert [check["text"].split()[:2] for check in data["regime"]] == [
        ["The", "oracle"],
        ["GROUSE", "at"],
    ]
    assert all(isinstance(check["holds"], bool) for check in data["regime"])
    oracle_worst = max(
        v
        for k, v in data["metrics"]["true_subspaces"].items()
        if k.startswith("nrmse_p") and v is not None
    )
    assert data["regime"][0]["holds"] == (oracle_worst <= 0.05)
    assert all(isinstance(claim["holds"], bool) for claim in data["claims"])
    # every claim is judged from Config.CLAIMS, seed by seed, with its control's outcome
    assert [claim["key"] for claim in data["claims"]] == [spec.key for spec in Config.CLAIMS]
    for claim, spec in zip(data["claims"], Config.CLAIMS, strict=True):
        assert claim["control"]["system"] == spec.control
        assert isinstance(claim["control"]["holds"], bool)
        assert claim["control"]["evidence"]
        assert claim["per_seed"] is True
        assert claim["state"] in ("holds", "fails", "untested", "vacuous")
    assert data["env"]["device"] == "cpu"
    assert (tmp_path / "error_over_time.png").exists()
    # the same seed gives the same metrics
    assert METHOD.execute(config, tmp_path / "again").metrics == result.metrics
    # resuming a finished run reuses every stream from the checkpoint: none is run again
    import mixlab.online.mosaic.experiment as experiment

    def must_not_run(*args):
        raise AssertionError("a finished stream was run again on --resume")

    monkeypatch.setattr(experiment, "run_stream", must_not_run)
    monkeypatch.setattr(experiment, "routing_sweep", must_not_run)
    assert METHOD.execute(config, tmp_path, resume=True).metrics == result.metrics
    with pytest.raises(ValueError, match="written with other values of \\['noise'\\]"):
        METHOD.execute(_tiny_config(noise=0.1), tmp_path, resume=True)


def _generate_and_complete(tmp_path: Path, epochs: str, *extra: str) -> tuple[Path, Path]:
    """``mosaic generate`` a 30-feature stream (300 source rows), then ``mosaic complete`` it."""
    stream, completed = tmp_path / "stream.npz", tmp_path / "completed.npy"
    assert main(["mosaic", "generate", "--out", str(stream), "--n-features", "30", "--n-source", "300",
                 "--epochs", epochs, "--observed-fraction", "0.5"]) == 0  # fmt: skip
    argv = [
        "mosaic",
        "complete",
        str(stream),
        "--pretrain",
        "300",
        "--rank",
        "5",
        "--out",
        str(completed),
    ]
    assert main([*argv, *extra]) == 0
    return stream, completed


def test_cli_generate_and_complete(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stream, completed = _generate_and_complete(
        tmp_path,
        "stationary:200",
        "--truth",
        str(tmp_path / "stream.npz"),
        "--save-model",
        str(tmp_path / "model"),
    )
    error = float(capsys.readouterr().out.strip().split()[-1])
    assert error < 0.05
    assert np.isfinite(np.load(completed)).all()
    assert main(["mosaic", "complete", str(stream), "--pretrain", "-1"]) == 2
    assert "--pretrain must be an integer >= 0" in capsys.readouterr().err


def test_scikit_learn_conventions() -> None:
    model = MoSAIC(3, 3, step_decay=100.0, random_state=1)
    copied = clone(model)
    assert copied.get_params() == model.get_params()
    assert not hasattr(copied, "bases_")  # __init__ only stores parameters
    _, _, X_full, mask = union_samples(n_samples=200)
    assert copied.fit(X_full, mask=mask) is copied
    assert copied.partial_fit(X_full[:5], mask=mask[:5]) is copied
    assert copied.n_samples_seen_ == 205
    assert copied.bases_.shape == (3, 40, 3)


def test_missing_entries_as_nan_equal_an_explicit_mask() -> None:
    _, _, X_full, mask = union_samples(n_samples=300, seed=9)
    with_mask = MoSAIC(3, 3, n_init=1, random_state=0).fit(X_full, mask=mask)
    with_nan = MoSAIC(3, 3, n_init=1, random_state=0).fit(np.where(mask, X_full, np.nan))
    np.testing.assert_array_equal(with_mask.bases_, with_nan.bases_)


def _naive_petrels(basis, inverse, X, mask, forgetting):
    """Chi, Eldar, Calderbank (2013), Alg. 1, row by row over all rows (p_m = 0 or 1)."""
    basis, inverse = basis.copy(), inverse.copy()
    for x, observed in zip(X, mask, strict=True):
        a = np.linalg.lstsq(basis[observed], x[observed], rcond=None)[0]
        for m in range(len(basis)):
            p_m = float(observed[m])
            v = inverse[m] @ a / forgetting
            beta = 1 + a @ v
            inverse[m] = inverse[m] / forgetting - p_m * np.outer(v, v) / beta
            basis[m] = basis[m] + p_m * (x[m] - a @ basis[m]) * (inverse[m] @ a)
    return basis


def test_petrels_matches_the_row_by_row_recursion() -> None:
    _, _, X_full, mask = union_samples(
        n_features=12, n_subspaces=1, rank=2, n_samples=60, observed=0.5, noise=1e-2
    )
    mask[:, :3] = True  # enough observed rows per sample for the least squares
    tracker = PETRELS(rank=2, forgetting=0.9, random_state=0).partial_fit(X_full[:1], mask=mask[:1])
    start_basis, start_inverse = tracker.basis_.copy(), tracker.inverse_.copy()
    # the lazily-applied forgetting of rows unobserved in the first sample
    start_inverse *= (1 / 0.9) ** (tracker.steps_[0] - tracker.last_observed_)[:, None, None]
    tracker.partial_fit(X_full[1:], mask=mask[1:])
    expected = _naive_petrels(start_basis, start_inverse, X_full[1:], mask[1:], 0.9)
    np.testing.assert_allclose(tracker.basis_, expected, rtol=1e-8, atol=1e-10)


def test_only_the_routed_expert_moves() -> None:
    _, _, X_full, mask = union_samples(seed=10, noise=1e-3)
    model = MoSAIC(3, 3, n_init=1, random_state=0).fit(X_full[:300], mask=mask[:300])
    before = model.bases_.copy()
    model.partial_fit(X_full[300:301], mask=mask[300:301])
    (routed,) = model.last_routes_
    assert not np.array_equal(model.bases_[routed], before[routed])
    for k in set(range(3)) - {int(routed)}:
        np.testing.assert_array_equal(model.bases_[k], before[k])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: GROUSE(rank=2, step_size=0.0), "step_size must be in"),
        (lambda: GROUSE(rank=2, step_decay=-1.0), "step_decay must be None"),
        (
            lambda: GROUSE(rank=2, step_size=0.1, step_decay=10.0, min_step=0.5),
            "min_step must be in",
        ),
        (lambda: PETRELS(rank=2, forgetting=1.5), "forgetting must be in"),
        (lambda: PETRELS(rank=2, initial_inverse=0.0), "initial_inverse must be > 0"),
        (lambda: WindowedKSubspaces(2, 2, window=3), "window must be an integer >= 8"),
        (lambda: WindowedKSubspaces(0, 2), "n_experts must be an integer >= 1"),
        (
            lambda: WindowedKSubspaces(2, 2, init=np.zeros((2, 5, 2))),
            "init must be an array of shape",
        ),
        (lambda: MoSAIC(2, np.int64(2), step_size=2.0), "step_size must be in"),
    ],
)
def test_baselines_name_bad_parameters(make, message: str) -> None:
    _, _, X_full, mask = union_samples(n_samples=100)
    with pytest.raises(ValueError, match=message):
        make().fit(X_full, mask=mask)


def test_parameters_changed_after_fit_are_checked() -> None:
    _, _, X_full, mask = union_samples(n_samples=100)
    model = MoSAIC(3, 3, n_init=1, random_state=0).fit(X_full, mask=mask)
    with pytest.raises(ValueError, match="step_decay must be None"):
        model.set_params(step_decay=-1.0).partial_fit(X_full[:2], mask=mask[:2])
    # a small constant step needs no min_step
    MoSAIC(3, 3, n_init=1, step_size=0.01, random_state=0).fit(X_full, mask=mask)


def test_experiment_config_is_checked() -> None:
    with pytest.raises(
        ValueError,
        match="observed_fractions must be at least one rate, distinct rates in \\(0, 1\\)",
    ):
        Config(observed_fractions=(0.2, 1.0))
    with pytest.raises(ValueError, match="n_subspaces·rank must be < n_features=30"):
        Config(n_features=30, n_subspaces=4, rank=8)
    with pytest.raises(ValueError, match="epoch_lengths must be five multiples of batch_size=20"):
        Config(epoch_lengths=(1510, 2000, 1500, 1000, 1000))
    with pytest.raises(ValueError, match="epoch_lengths must be five multiples"):
        Config(epoch_lengths=(1500, 2000, 1500))
    with pytest.raises(
        ValueError, match="step_decay_sweep must be at least two finite values > 0, distinct"
    ):
        Config(step_decay_sweep=(5.0, 5.0))
    with pytest.raises(ValueError, match="routing_fractions must be at least one rate"):
        Config(routing_fractions=(0.0,))
    with pytest.raises(ValueError, match="computes with NumPy on the CPU"):
        METHOD.execute(Config(device="cuda"), Path("unused"))


def test_public_api_resolves() -> None:
    import mixlab.online.mosaic as mosaic

    assert sorted(mosaic.__all__) == sorted(mosaic._MODULE_OF)
    for name in mosaic.__all__:
        assert getattr(mosaic, name) is not None


def test_changing_the_shape_after_fit_asks_for_a_refit() -> None:
    _, _, X_full, mask = union_samples(n_samples=100)
    model = MoSAIC(3, 3, n_init=1, random_state=0).fit(X_full, mask=mask)
    with pytest.raises(ValueError, match="call fit again after changing n_experts or rank"):
        model.set_params(n_experts=4).partial_fit(X_full[:2], mask=mask[:2])
    with pytest.raises(ValueError, match="routes must be non-negative integers"):
        routing_accuracy(np.array([-1, 0]), np.array([0, 0]))


def test_cli_completes_source_rows_with_the_pretrained_model(tmp_path: Path) -> None:
    stream, out = _generate_and_complete(tmp_path, "stationary:100,switch:200")
    with np.load(stream) as archive:
        full, observed = archive["X_full"], archive["X"]
    missing = np.isnan(observed[:300])
    error = np.linalg.norm((np.load(out)[:300] - full[:300])[missing]) / np.linalg.norm(
        full[:300][missing]
    )
    assert error < 0.05
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 not a zip")
    assert main(["mosaic", "complete", str(tmp_path / "broken.npz")]) == 2


def test_experiment_integer_fields_are_checked() -> None:
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        Config(batch_size=0)
    with pytest.raises(ValueError, match="n_seeds must be an integer >= 1"):
        Config(n_seeds=1.5)


def test_observed_fit_reads_only_the_observed_rows_in_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Routing from U_Ω alone equals the full computation: rows no sample observes are NaN here, so
    reading any of them would poison the result; tiny chunks exercise the chunked gather, and the
    samples observe different numbers of entries (one fewer than the rank)."""
    import mixlab.online.mosaic.subspace as subspace

    rng = np.random.default_rng(4)
    bases = np.stack([random_basis(30, 3, rng) for _ in range(3)])
    X = rng.standard_normal((7, 30))
    mask = rng.random((7, 30)) < 0.4
    mask[:, 20:] = False  # nobody observes rows 20..29
    mask[0] = False
    mask[0, :2] = True  # 2 observed entries for rank 3: the ridge keeps the solve defined
    expected = observed_fit(bases, X * mask, mask)
    poisoned = bases.copy()
    poisoned[:, 20:] = np.nan
    monkeypatch.setattr(subspace, "GATHER_ELEMENTS", 3 * 2 * mask.sum(axis=1).max() * 3)
    weights, residual = subspace.observed_fit(poisoned, X * mask, mask)
    np.testing.assert_allclose(weights, expected[0], atol=1e-10)
    np.testing.assert_allclose(residual, expected[1], atol=1e-10)
    for i in range(1, 7):  # the dense definition: least squares on U_Ω for every expert
        for k in range(3):
            w, *_ = np.linalg.lstsq(bases[k][mask[i]], X[i, mask[i]], rcond=None)
            np.testing.assert_allclose(weights[i, k], w, atol=1e-8)
            fitted = bases[k][mask[i]] @ w
            np.testing.assert_allclose(
                residual[i, k], np.sum((X[i, mask[i]] - fitted) ** 2), atol=1e-8
            )


def test_sigma_step_rule_is_grouse_angle_capped_at_greedy() -> None:
    rng = np.random.default_rng(5)
    basis, x = random_basis(15, 3, rng), rng.standard_normal(15)
    full = np.ones(15, bool)
    weights = basis.T @ x
    residual_norm = np.linalg.norm(x - basis @ weights)
    sigma = residual_norm * np.linalg.norm(weights)
    greedy = np.arctan(residual_norm / np.linalg.norm(weights))
    step = 0.3 * greedy / sigma  # θ = 0.3 θ* through GROUSE's θ = η σ
    np.testing.assert_allclose(
        grouse_step(basis, x, full, step, "sigma"), grouse_step(basis, x, full, 0.3), atol=1e-12
    )
    # a huge η is capped at the greedy angle: the sample enters the span, no overshoot
    capped = grouse_step(basis, x, full, 1e6, "sigma")
    np.testing.assert_allclose(capped, grouse_step(basis, x, full, 1.0), atol=1e-12)
    np.testing.assert_allclose(capped.T @ capped, np.eye(3), atol=1e-10)


def test_change_detection_finds_a_planted_switch() -> None:
    stream = DriftingSubspaceStream(
        n_features=40,
        n_subspaces=3,
        rank=3,
        observed_fraction=0.5,
        n_source=600,
        epochs=(Epoch("stationary", 800), Epoch("switch", 600)),
    ).generate(0)
    model = MoSAIC(
        3,
        3,
        step_size=1.0,
        step_decay=20.0,
        min_step=0.0,
        detect_changes=10.0,
        n_init=2,
        random_state=0,
    ).fit(stream.source_X_observed)
    switch = int(stream.epoch_starts[1])
    X = stream.X
    for start in range(0, switch, 20):
        model.partial_fit(X[start : start + 20])
    assert model.n_changes_.sum() == 0, "a change detected in the stationary epoch"
    seen_at_switch = model.n_samples_seen_  # the source batch counts too
    for start in range(switch, len(X), 20):
        model.partial_fit(X[start : start + 20])
    assert model.n_changes_.sum() >= 1
    # each expert that fired did so right after the switch (last_change_ is its latest change)
    fired_at = model.last_change_[model.n_changes_ > 0]
    assert (fired_at >= seen_at_switch).all()
    assert (fired_at < seen_at_switch + 100).all(), (seen_at_switch, model.last_change_)
    # the restart is what the test does: step counts fell back to count only the samples since
    assert model.updates_.sum() < len(X) - switch
    quiet = clone(model).set_params(detect_changes=None).fit(stream.source_X_observed)
    quiet.partial_fit(X)
    assert quiet.updates_.sum() == len(X)  # no restart without the test


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"step_rule": "cosine"}, "step_rule must be greedy or sigma"),
        ({"detect_changes": 1.0}, "detect_changes must be None or a finite ratio > 1"),
        ({"step_rule": "sigma", "step_size": 0.0}, "step_size must be > 0 and finite"),
    ],
)
def test_step_rule_and_change_detection_are_checked(params: dict, message: str) -> None:
    X = union_samples(n_samples=60)[2]
    MoSAIC(3, 3, n_init=1, step_size=2.0, step_rule="sigma", random_state=0).fit(X)  # η > 1 is fine
    with pytest.raises(ValueError, match=message):
        MoSAIC(3, 3, n_init=1, random_state=0, **params).fit(X)


def test_contraction_sweep_shows_the_exponent_set_by_tau() -> None:
    """The protocol must not hide that the decay exponent follows the schedule: on the same
    stationary-then-switch stream, a larger τ gives a clearly larger fitted exponent, and the
    residual test restarts the experts at the switch in every run."""
    from mixlab.online.mosaic.experiment import contraction_sweep

    config = Config.from_profile(
        "quick", n_features=60, n_subspaces=3, rank=3, n_source=300, n_init=1,
        epoch_lengths=(400, 100, 600, 100, 100), step_decay_sweep=(5.0, 200.0),
    )  # fmt: skip
    sweep = contraction_sweep(config, 0.5, 0)
    slow, fast = (sweep["contraction"][f"mosaic_tau{tau}"][0]["exponent"] for tau in (5, 200))
    assert slow is not None
    assert fast is not None
    assert fast > 2 * slow, (slow, fast)
    assert all(record["delays"][0] is not None for record in sweep["detections"].values())


def test_pairwise_subspace_distances_equal_the_principal_angles() -> None:
    from mixlab.online.mosaic.diagnostics import pairwise_subspace_distances

    rng = np.random.default_rng(6)
    bases = np.stack([random_basis(20, 3, rng) for _ in range(3)])
    references = np.stack([random_basis(20, 3, rng) for _ in range(2)] + [bases[1]])
    pairwise = pairwise_subspace_distances(bases, references)
    expected = [[subspace_distance(b, t) for t in references] for b in bases]
    np.testing.assert_allclose(pairwise, expected, atol=1e-7)
    assert pairwise[1, 2] < 1e-7  # a subspace is at distance 0 from itself
    with pytest.raises(ValueError, match="references must be a stack of bases"):
        pairwise_subspace_distances(bases, references[:, :, :2])
