"""Gymnasium's, Stable-Baselines3's and MiniGrid's side of RND-RFF (issue 26).

CoordMaze passes both env checkers and is made through gymnasium's registry, single and vector;
the bonus reaches any SB3 algorithm through ``NoveltyVecEnvWrapper`` + ``NoveltyCallback``
(rewards raised by the normalised bonus, the predictor trained on each rollout, the terminal
observation scored at episode ends); ``make_vector_env`` turns MiniGrid's Dict observations into
the flat images the learner and the bonuses take, Atari ids become stacked 84 × 84 frames (with
Montezuma's room in ``info["cell"]``), and any registered env id works too.
"""

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.env_util import make_vec_env

from mixlab.rl.rnd_rff import (
    ENV_ID,
    CoordMaze,
    NoveltyCallback,
    NoveltyVecEnvWrapper,
    PPOConfig,
    PPOLearner,
    make_bonus,
    make_vector_env,
)


def test_coord_maze_passes_gymnasium_and_sb3_checkers_and_is_registered():
    from gymnasium.utils.env_checker import check_env

    env = gym.make(ENV_ID, rooms=(1, 2), room_size=3, obs="onehot")
    check_env(env.unwrapped, skip_render_check=True)
    sb3_check_env(CoordMaze(rooms=(1, 2), room_size=3), warn=True)
    vector = gym.make_vec(
        ENV_ID, num_envs=3, vectorization_mode="vector_entry_point", rooms=(1, 2), room_size=3
    )
    obs, info = vector.reset(seed=0)
    assert obs.shape == (3, 2)
    assert info["cell"].shape == (3,)
    assert "A" in CoordMaze(render_mode="ansi").render()


@pytest.mark.parametrize("algorithm", [PPO, DQN])
def test_any_sb3_algorithm_gets_the_bonus_and_trains_the_predictor(algorithm):
    venv = NoveltyVecEnvWrapper(
        make_vec_env(lambda: CoordMaze(rooms=(1, 2), room_size=3, max_steps=20), n_envs=2, seed=0),
        bonus_kind="rff", obs_norm_steps=8, update_proportion=1.0,
    )  # fmt: skip
    assert venv.bonus.target.needs_bandwidth
    before = [p.detach().clone() for p in venv.bonus.predictor.parameters()]
    options = (
        {"n_steps": 32, "batch_size": 32}
        if algorithm is PPO
        else {"learning_starts": 16, "train_freq": 8}
    )
    model = algorithm("MlpPolicy", venv, seed=0, device="cpu", **options)
    model.learn(96, callback=NoveltyCallback(venv))
    assert venv.initialized
    assert not venv.bonus.target.needs_bandwidth
    assert any(
        not torch.equal(a, b)
        for a, b in zip(before, venv.bonus.predictor.parameters(), strict=True)
    )
    venv.reset()
    _, rewards, _, infos = venv.step(np.array([3, 3]))
    assert all(info["intrinsic_reward"] > 0 for info in infos)
    assert np.allclose(rewards, [info["intrinsic_reward"] for info in infos])  # no extrinsic yet


def test_the_terminal_observation_is_scored_at_episode_ends():
    venv = NoveltyVecEnvWrapper(
        make_vec_env(lambda: CoordMaze(rooms=(1, 2), room_size=3, max_steps=2), n_envs=1, seed=0),
        bonus_kind="count", obs_norm_steps=1, cell_size=0.01,
    )  # fmt: skip
    venv.reset()
    venv.step(np.array([3]))
    _, _, dones, infos = venv.step(np.array([3]))
    assert dones[0]
    np.testing.assert_allclose(venv.buffer[-1][0], infos[0]["terminal_observation"])
    assert not np.allclose(venv.buffer[-1][0], CoordMaze(rooms=(1, 2), room_size=3).reset()[0])


def test_the_wrapper_refuses_a_bonus_of_another_shape():
    with pytest.raises(ValueError, match="bonus takes observations of shape"):
        NoveltyVecEnvWrapper(make_vec_env(lambda: CoordMaze(), n_envs=1), make_bonus("rnd", (3,)))


def test_minigrid_and_any_registered_env_run_through_the_learner():
    envs = make_vector_env("MiniGrid-Empty-5x5-v0", 2)
    assert isinstance(envs.single_observation_space, gym.spaces.Box)
    assert envs.single_observation_space.shape == (7 * 7 * 3,)
    config = PPOConfig(num_steps=16, obs_norm_steps=4)
    learner = PPOLearner(envs, make_bonus("rff", envs.single_observation_space), config, seed=0)
    history = learner.learn(64)
    assert history[-1]["cells"] >= 2  # agent positions, from CellInfo
    cartpole = make_vector_env("CartPole-v1", 2)
    learner = PPOLearner(
        cartpole, make_bonus("rnd", cartpole.single_observation_space), config, seed=0
    )
    assert learner.learn(64)[-1]["step"] == 64


def test_montezuma_gives_stacked_frames_rooms_and_the_conv_rff_bonus():
    envs = make_vector_env("ALE/MontezumaRevenge-v5", 2)
    obs, info = envs.reset(seed=0)
    assert obs.shape == (2, 4, 84, 84)
    assert obs.dtype == np.uint8
    assert info["cell"].tolist() == [1, 1]  # RAM byte 3: the first room
    bonus = make_bonus("rff", envs.single_observation_space, k=32)
    assert type(bonus.target).__name__ == "ConvRFFTarget"
    config = PPOConfig(num_steps=8, obs_norm_steps=4, num_minibatches=1, update_epochs=1)
    history = PPOLearner(envs, bonus, config, seed=0).learn(16)
    assert bonus.bandwidth > 0
    assert history[-1]["cells"] >= 1
