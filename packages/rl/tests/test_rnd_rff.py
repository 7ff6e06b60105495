"""RND-RFF's library: targets approximate their kernels and stay frozen, bonuses fall where they
were fitted, the GP variance is exact, CoordMaze is a valid env, PPO learns and is seeded."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from mixlab.rl.rnd_rff import (
    BONUS_KINDS,
    BONUS_METHODS,
    CoordMaze,
    CoordMazeVector,
    CountBonus,
    DRNDBonus,
    MLPTarget,
    NoveltyBonus,
    PPOConfig,
    PPOLearner,
    RFFTarget,
    auroc,
    count_correlation,
    fpr_at_95,
    gp_posterior_variance,
    make_bonus,
    median_bandwidth,
    rbf_kernel,
)
from mixlab.rl.rnd_rff.targets import MULTISCALE

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _kernel_error(spectrum: str, D: int, seeds: int = 6) -> float:
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    errors = []
    for seed in range(seeds):
        target = RFFTarget(3, D, None, bandwidth=1.3, spectrum=spectrum, seed=seed)
        phi = target.features(x)
        errors.append((phi @ phi.T - target.kernel(x, x)).abs().mean().item())
    return float(np.mean(errors))


@pytest.mark.parametrize("spectrum", ["gaussian", "laplace", "multiscale"])
def test_features_approximate_the_kernel_with_error_shrinking_like_one_over_root_d(spectrum):
    small, large = _kernel_error(spectrum, 256), _kernel_error(spectrum, 4096)
    assert large < 0.02
    assert small / large > 2.5  # 1/√D predicts 4 for 16× the features


def test_the_spectra_give_the_rbf_laplace_and_mixture_kernels():
    x, y = torch.randn(5, 3).double(), torch.randn(7, 3).double()
    ell = 0.8
    gaussian = RFFTarget(3, 8, bandwidth=ell, spectrum="gaussian").kernel(x, y)
    torch.testing.assert_close(gaussian, torch.exp(-torch.cdist(x, y).square() / (2 * ell**2)))
    laplace = RFFTarget(3, 8, bandwidth=ell, spectrum="laplace").kernel(x, y)
    l1 = (x[:, None, :] - y[None]).abs().sum(-1)
    torch.testing.assert_close(laplace, torch.exp(-l1 / ell))
    mixture = RFFTarget(3, 8, bandwidth=ell, spectrum="multiscale").kernel(x, y)
    expected = (
        sum(torch.exp(-torch.cdist(x, y).square() / (2 * (ell * m) ** 2)) for m in MULTISCALE) / 4
    )
    torch.testing.assert_close(mixture, expected)
    torch.testing.assert_close(rbf_kernel(ell)(x, y), gaussian)


def test_outputs_are_gp_draws_with_unit_prior_variance():
    target = RFFTarget(2, 2048, 256, bandwidth=1.0, seed=0)
    x = torch.randn(300, 2) * 20  # far apart: nearly independent draws
    assert target(x).var().item() == pytest.approx(1.0, abs=0.1)


def test_median_bandwidth_matches_a_direct_computation():
    x = np.random.default_rng(0).normal(size=(50, 2))
    distances = np.linalg.norm(x[:, None] - x[None], axis=-1)[np.triu_indices(50, 1)]
    assert median_bandwidth(x) == pytest.approx(np.median(distances), rel=1e-5)


def test_targets_stay_frozen_while_the_predictor_learns():
    data = np.random.default_rng(0).normal(size=(512, 4)).astype(np.float32)
    bonus = make_bonus("rff", (4,), seed=0, lr=1e-3, update_proportion=0.5)
    bonus.init_normalization(data)
    assert not any(p.requires_grad for p in bonus.target.parameters())
    target = {k: v.clone() for k, v in bonus.target.state_dict().items()}
    predictor = [p.detach().clone() for p in bonus.predictor.parameters()]
    bonus.update(data)
    for key, value in bonus.target.state_dict().items():
        assert torch.equal(value, target[key]), key
    assert any(
        not torch.equal(a, b) for a, b in zip(predictor, bonus.predictor.parameters(), strict=True)
    )
    mlp = MLPTarget(4, seed=0)
    assert not any(p.requires_grad for p in mlp.parameters())


@pytest.mark.parametrize("kind", BONUS_KINDS)
def test_the_bonus_falls_on_fitted_points_and_stays_high_far_away(kind):
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(600, 2)) * 0.3).astype(np.float32)
    bonus = make_bonus(kind, (2,), seed=0, lr=2e-3)
    bonus.init_normalization(data)
    before = bonus.bonus(data[:100]).mean()
    bonus.fit(data, steps=250)
    fitted = bonus.bonus(data[:100]).mean()
    far = bonus.bonus(np.full((20, 2), 6.0, np.float32) * np.sign(rng.normal(size=(20, 2)))).mean()
    assert fitted < 0.5 * before
    assert far > 3 * fitted


@pytest.mark.parametrize("kind", BONUS_KINDS)
def test_every_kind_has_the_same_methods_and_they_work(kind):
    """Issue 70: ``make_bonus("count", ...)`` had no ``fit``, though the module docstring showed
    one; every kind now answers every method of BONUS_METHODS the same way."""
    rng = np.random.default_rng(0)
    data = rng.normal(size=(300, 3)).astype(np.float32)
    bonus = make_bonus(kind, (3,), seed=0)
    assert all(callable(getattr(bonus, name, None)) for name in BONUS_METHODS)
    assert bonus.fit(data, steps=20, batch_size=64) is bonus
    assert bonus.distill(data[:50], steps=5) is bonus
    assert bonus.bonus(data[:7]).shape == (7,)
    assert bonus.bonus(data[:7], batch_size=3).shape == (7,)
    assert isinstance(bonus.update(data[:64]), float)
    assert isinstance(bonus.update(data[:64], update_stats=False), float)
    assert bonus.normalize_rewards(np.ones((4, 2))).shape == (4, 2)
    if kind.startswith("rff"):
        ell = bonus.bandwidth
        assert bonus.scale_bandwidth(0.5) == pytest.approx(ell / 2)
    else:
        assert bonus.bandwidth is None
        with pytest.raises(ValueError, match="scale_bandwidth needs an RFF target"):
            bonus.scale_bandwidth(0.5)
    restored = make_bonus(kind, (3,), seed=1)
    restored.load_state_dict(bonus.state_dict())
    np.testing.assert_allclose(restored.bonus(data[:20]), bonus.bonus(data[:20]), rtol=1e-6)
    with pytest.raises(ValueError, match=r"obs must have shape \[batch, 3\]"):
        bonus.bonus(data[:5, :2])


def test_drnd_bonus_has_its_pseudo_count_term_bounded():
    bonus = make_bonus("drnd", (3,), seed=0, n_targets=4)
    assert isinstance(bonus, DRNDBonus)
    data = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    bonus.init_normalization(data)
    bonus.alpha = 0.0  # only the count term: sqrt of a ratio clipped to [1e-3, 1]
    values = bonus.bonus(data)
    assert values.min() >= math.sqrt(1e-3) - 1e-6
    assert values.max() <= 1 + 1e-6


def test_drnd_predictor_learns_the_mean_of_its_targets():
    data = np.random.default_rng(0).normal(size=(512, 3)).astype(np.float32)
    bonus = make_bonus("drnd", (3,), seed=0, lr=2e-3).fit(data, steps=300)
    with torch.no_grad():
        x = bonus.normalize(data[:128])
        outputs, prediction = bonus.target(x), bonus.predictor(x)
    to_mean = (prediction - outputs.mean(0)).square().mean()
    to_one = (prediction - outputs[0]).square().mean()
    assert to_mean < 0.5 * to_one


def test_count_bonus_is_one_over_root_n():
    bonus = CountBonus((2,), cell_size=1.0)
    points = np.array([[0.2, 0.2], [0.7, 0.1], [3.5, 0.0]], np.float32)  # two share a cell
    assert bonus.bonus(points).tolist() == [1.0, 1.0, 1.0]
    bonus.update(points)
    np.testing.assert_allclose(bonus.bonus(points), [1 / math.sqrt(2), 1 / math.sqrt(2), 1.0])
    restored = CountBonus((2,), cell_size=1.0)
    restored.load_state_dict(bonus.state_dict())
    np.testing.assert_allclose(restored.bonus(points), bonus.bonus(points))


def test_intrinsic_rewards_are_divided_by_the_std_of_the_discounted_return():
    bonus = CountBonus((1,), int_gamma=0.5)
    raw = np.ones((3, 2))
    out = bonus.normalize_rewards(raw)
    returns = np.array([1, 1.5, 1.75])  # per env, through time
    assert out[0, 0] == pytest.approx(1 / math.sqrt(np.var(np.repeat(returns, 2)) + 1e-4), rel=0.05)


def test_gp_variance_equals_a_direct_solve():
    rng = np.random.default_rng(0)
    train, query = rng.normal(size=(30, 2)), rng.normal(size=(10, 2)) * 2
    kernel, noise = rbf_kernel(0.7), 1e-2
    K = kernel(torch.from_numpy(train), torch.from_numpy(train)).numpy()
    k = kernel(torch.from_numpy(train), torch.from_numpy(query)).numpy()
    direct = 1 - np.einsum("nm,nm->m", k, np.linalg.solve(K + noise * np.eye(30), k))
    np.testing.assert_allclose(
        gp_posterior_variance(kernel, train, query, noise), direct, atol=1e-9
    )


def test_auroc_fpr_and_count_correlation_match_hand_values():
    assert auroc([0, 1, 2], [1.5, 3, 3]) == pytest.approx(8 / 9)
    assert auroc([1, 1], [1, 1]) == 0.5
    assert fpr_at_95(np.arange(10), np.full(20, 5.0)) == 0.5
    counts = np.array([1, 4, 9, 16, 0])
    assert count_correlation(1 / np.sqrt(np.maximum(counts, 1)), counts) == pytest.approx(1.0)


def test_coord_maze_passes_check_env_and_the_vector_env_matches_it():
    from gymnasium.utils.env_checker import check_env

    for kind in ("xy", "onehot"):
        check_env(CoordMaze(rooms=(1, 2), room_size=3, obs=kind), skip_render_check=True)
    single = CoordMaze(rooms=(2, 2), room_size=3, obs="xy", max_steps=40)
    vector = CoordMazeVector(1, rooms=(2, 2), room_size=3, obs="xy", max_steps=40)
    obs, _ = single.reset(seed=0)
    vobs, _ = vector.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(100):
        action = int(rng.integers(4))
        obs, reward, terminated, truncated, _ = single.step(action)
        vobs, vreward, vterm, vtrunc, vinfo = vector.step(np.array([action]))
        if terminated or truncated:
            np.testing.assert_allclose(vinfo["final_obs"][0], obs)
            obs, _ = single.reset()
        np.testing.assert_allclose(vobs[0], obs)
        assert (vreward[0], vterm[0], vtrunc[0]) == (reward, terminated, truncated)
    assert vector.visits.sum() > 0


def test_one_hot_and_xy_mazes_are_the_same_maze():
    xy = CoordMazeVector(2, obs="xy", rooms=(1, 2), room_size=3)
    onehot = CoordMazeVector(2, obs="onehot", rooms=(1, 2), room_size=3)
    assert xy.layout.n_cells == onehot.single_observation_space.shape[0] == 2 * 9 + 1
    xy.reset(), onehot.reset()
    for action in (3, 3, 3, 1):
        a = np.array([action, 0])
        assert np.array_equal(xy.step(a)[4]["cell"], onehot.step(a)[4]["cell"])


def _chain_run(seed: int, bonus_kind: str | None, steps: int = 6144):
    envs = CoordMazeVector(4, rooms=(1, 3), room_size=2, obs="onehot", max_steps=30)
    bonus = (
        None
        if bonus_kind is None
        else make_bonus(bonus_kind, envs.single_observation_space, cell_size=0.5)
    )
    config = PPOConfig(num_steps=64, learning_rate=2.5e-3, obs_norm_steps=8)
    return PPOLearner(envs, bonus, config, seed=seed).learn(steps)


def test_ppo_with_the_count_bonus_solves_a_short_chain():
    history = _chain_run(0, "count")
    last = history[-4:]
    assert history[-1]["first_reward_step"] is not None
    assert sum(r["successes"] for r in last) / max(1, sum(r["episodes"] for r in last)) > 0.8


def test_seeded_runs_are_deterministic():
    def strip(history):
        return [{k: v for k, v in row.items() if k != "seconds"} for row in history]

    first = strip(_chain_run(3, "rff", 1024))
    assert strip(_chain_run(3, "rff", 1024)) == first
    assert strip(_chain_run(4, "rff", 1024)) != first
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    _chain_run(3, "rff", 512)
    assert torch.equal(torch.rand(1), before)  # the learner leaves the global generator alone


def test_a_restored_learner_continues_from_its_state():
    envs = CoordMazeVector(2, rooms=(1, 2), room_size=3)
    config = PPOConfig(num_steps=32, obs_norm_steps=4)
    learner = PPOLearner(envs, make_bonus("rnd", envs.single_observation_space), config, seed=0)
    learner.learn(128)
    restored = PPOLearner(
        envs, make_bonus("rnd", envs.single_observation_space, seed=5), config, seed=1
    )
    restored.load_state_dict(learner.state_dict())
    assert restored.global_step == 128
    assert restored.history == learner.history
    for a, b in zip(learner.agent.parameters(), restored.agent.parameters(), strict=True):
        assert torch.equal(a, b)
    probe = np.random.default_rng(0).random((5, 2)).astype(np.float32)
    np.testing.assert_allclose(restored.bonus.bonus(probe), learner.bonus.bonus(probe))
    assert len(restored.learn(256)) == 4


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: RFFTarget(2, 16, bandwidth=0.0), "bandwidth"),
        (lambda: RFFTarget(2, 16, bandwidth=-1.0), "bandwidth"),
        (lambda: RFFTarget(2, 0), "D must"),
        (lambda: RFFTarget(2, 16, spectrum="cauchy"), "spectrum"),
        (lambda: make_bonus("rff", (2,), update_proportion=0.0), "update_proportion"),
        (lambda: make_bonus("rff", (2,), update_proportion=1.5), "update_proportion"),
        (lambda: make_bonus("rnd", gym.spaces.Dict({"a": gym.spaces.Discrete(2)})), "Dict"),
        (lambda: make_bonus("rnd", gym.spaces.Discrete(5)), "one-hot encode"),
        (
            lambda: PPOLearner(CoordMazeVector(2), make_bonus("rnd", (2,), int_gamma=0.9)),
            "int_gamma",
        ),
        (lambda: make_bonus("gauss", (2,)), "bonus must be one of"),
        (lambda: NoveltyBonus((3,), RFFTarget(2, 16, bandwidth=1.0)), "target takes 2 inputs"),
        (
            lambda: make_bonus("rff", (2,), bandwidth=1.0).bonus(np.zeros((4, 3))),
            r"obs must have shape \[batch, 2\]",
        ),
        (lambda: CoordMaze(obs="pixels"), "obs must be one of"),
        (
            lambda: PPOLearner(CoordMazeVector(2), make_bonus("rnd", (5,))),
            "bonus takes observations",
        ),
    ],
)
def test_bad_inputs_name_the_parameter(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_a_next_step_vector_env_is_refused():
    envs = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync")
    with pytest.raises(ValueError, match="same step"):
        PPOLearner(envs)


def test_numpy_scalars_are_accepted_as_numbers():
    target = RFFTarget(2, 8, bandwidth=np.float32(0.5))
    assert float(target.bandwidth) == 0.5
    make_bonus("rff", (2,), bandwidth=np.float64(1.0), update_proportion=np.float32(0.5))


def test_the_terminal_cell_is_counted_and_the_reset_cell_reported():
    envs = CoordMazeVector(1, rooms=(1, 2), room_size=2, max_steps=1)
    envs.reset()
    _, _, _, truncated, info = envs.step(np.array([3]))
    assert truncated[0]
    start = envs.layout.cell[tuple(envs.layout.start)]
    assert info["cell"][0] == start
    assert info["final_info"]["cell"][0] == start + 1
