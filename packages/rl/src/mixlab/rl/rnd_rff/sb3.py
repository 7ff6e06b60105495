"""A novelty bonus for any Stable-Baselines3 algorithm (SB3 has no RND).

:class:`NoveltyVecEnvWrapper` adds ``int_coef`` × the normalised bonus of each new observation to
the reward; :class:`NoveltyCallback` trains the bonus on the observations of each rollout. SB3
algorithms have one value head, so the bonus is reward shaping there: its stream is episodic,
unlike :class:`~.ppo.PPOLearner`'s two-head CleanRL version.

    venv = NoveltyVecEnvWrapper(make_vec_env("CartPole-v1", 8), bonus_kind="rff")
    model = PPO("MlpPolicy", venv)
    model.learn(100_000, callback=NoveltyCallback(venv))
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper

from mixlab.rl.rnd_rff.bonus import IntrinsicReward, make_bonus, observation_shape

__all__ = ["NoveltyCallback", "NoveltyVecEnvWrapper"]


class NoveltyVecEnvWrapper(VecEnvWrapper):
    """Adds the bonus to the rewards of ``venv``.

    ``bonus`` is any :mod:`~.bonus` object, or ``bonus_kind`` (with ``bonus_options`` for
    :func:`~.bonus.make_bonus`) builds one for the env's observation space. On the first
    ``reset`` the wrapper takes ``obs_norm_steps`` random-action steps to set the observation
    statistics and the median bandwidth (CleanRL's rollout), then resets again. ``infos`` carry
    ``intrinsic_reward``; the bonus of an episode's last step is that of its terminal observation.
    """

    def __init__(
        self,
        venv: VecEnv,
        bonus: IntrinsicReward | None = None,
        *,
        bonus_kind: str = "rff",
        int_coef: float = 1.0,
        obs_norm_steps: int = 64,
        seed: int = 0,
        **bonus_options,
    ) -> None:
        super().__init__(venv)
        if not (isinstance(int_coef, int | float) and int_coef >= 0):
            raise ValueError(f"int_coef must be a number >= 0, got {int_coef!r}")
        if (
            isinstance(obs_norm_steps, bool)
            or not isinstance(obs_norm_steps, int)
            or obs_norm_steps < 1
        ):
            raise ValueError(f"obs_norm_steps must be an integer >= 1, got {obs_norm_steps!r}")
        self.bonus = bonus or make_bonus(
            bonus_kind, venv.observation_space, seed=seed, **bonus_options
        )
        shape = observation_shape(venv.observation_space)  # a clear error for Dict spaces
        if self.bonus.obs_shape != shape:
            raise ValueError(
                f"the bonus takes observations of shape {self.bonus.obs_shape}, the env gives {shape}"
            )
        self.int_coef, self.obs_norm_steps = float(int_coef), obs_norm_steps
        self.rng = np.random.default_rng(seed)
        self.initialized = False
        self.buffer: list[np.ndarray] = []

    def reset(self) -> np.ndarray:
        obs = self.venv.reset()
        if not self.initialized:
            seen = []
            for _ in range(self.obs_norm_steps):
                actions = self._random_actions()
                self.venv.step_async(actions)
                seen.append(self.venv.step_wait()[0])
            self.bonus.init_normalization(np.concatenate(seen).astype(np.float32))
            self.initialized = True
            obs = self.venv.reset()
        return obs

    def _random_actions(self) -> np.ndarray:
        """Uniform actions for the warm-up rollout, drawn from the wrapper's seeded generator."""
        space, n = self.action_space, self.num_envs
        if isinstance(space, spaces.Discrete):
            return space.start + self.rng.integers(space.n, size=n)
        if isinstance(space, spaces.MultiDiscrete):
            return self.rng.integers(space.nvec, size=(n, *space.nvec.shape))
        if isinstance(space, spaces.Box) and space.is_bounded():
            return self.rng.uniform(space.low, space.high, size=(n, *space.shape)).astype(
                space.dtype
            )
        raise ValueError(f"the warm-up rollout cannot draw actions from {space}")

    def state_dict(self) -> dict[str, object]:
        """The bonus's state (save it beside the SB3 model to resume with the same bonus)."""
        return {"bonus": self.bonus.state_dict(), "initialized": self.initialized,
                "rng": self.rng.bit_generator.state}  # fmt: skip

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.bonus.load_state_dict(state["bonus"])  # type: ignore[arg-type]
        self.initialized = bool(state["initialized"])
        self.rng.bit_generator.state = state["rng"]

    def step_wait(self):
        obs, rewards, dones, infos = self.venv.step_wait()
        landed = np.array(obs, np.float32, copy=True)
        for i, info in enumerate(infos):
            if dones[i] and "terminal_observation" in info:
                landed[i] = info["terminal_observation"]
        intrinsic = self.bonus.normalize_rewards(self.bonus.bonus(landed)[None])[0]
        self.buffer.append(landed)
        for info, value in zip(infos, intrinsic, strict=True):
            info["intrinsic_reward"] = float(value)
        return obs, rewards + self.int_coef * intrinsic, dones, infos


class NoveltyCallback(BaseCallback):
    """Trains ``wrapper.bonus`` on the observations gathered since the last rollout ended."""

    def __init__(self, wrapper: NoveltyVecEnvWrapper, verbose: int = 0) -> None:
        super().__init__(verbose)
        if not isinstance(wrapper, NoveltyVecEnvWrapper):
            raise ValueError(
                f"wrapper must be a NoveltyVecEnvWrapper, got {type(wrapper).__name__}"
            )
        self.wrapper = wrapper

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        if self.wrapper.buffer:
            loss = self.wrapper.bonus.update(np.concatenate(self.wrapper.buffer))
            self.wrapper.buffer.clear()
            self.logger.record("novelty/predictor_loss", loss)
