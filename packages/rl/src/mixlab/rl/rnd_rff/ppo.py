"""PPO with a novelty bonus for ``gymnasium.vector`` envs, after CleanRL's ``ppo_rnd_envpool.py``.

As in CleanRL's RND: two value heads (extrinsic, episodic, γ = 0.999; intrinsic, non-episodic,
γ_int = 0.99), advantages A = ext_coef·A_ext + int_coef·A_int (2 and 1), intrinsic rewards
divided by the running std of the discounted intrinsic return, observation statistics for the
bonus from a random-action rollout before training, clipped PPO updates. Without a bonus it is
plain PPO with one value head. Departures, all for small CPU budgets: vector observations go
through 64-unit tanh MLPs (CleanRL's ``ppo.py``), the predictor has its own Adam
(:class:`~.bonus.NoveltyBonus`), and the discounted intrinsic return is stepped through time per
env (CleanRL iterates over the transposed array, i.e. over envs).

    learner = PPOLearner(envs, bonus, PPOConfig(), seed=0)
    history = learner.learn(total_steps=50_000)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from mixlab.rl.rnd_rff.bonus import IntrinsicReward
from mixlab.rl.rnd_rff.targets import conv_stack, conv_width, is_image, orthogonal_init
from mixlab.shared import progress
from mixlab.shared.config import is_count, require

__all__ = ["Agent", "PPOConfig", "PPOLearner"]


@dataclass
class PPOConfig:
    """CleanRL's RND defaults where they carry over; ``num_steps`` per env per iteration."""

    num_steps: int = 128
    learning_rate: float = 1e-4
    anneal_lr: bool = True
    gamma: float = 0.999
    int_gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    clip_coef: float = 0.1
    ent_coef: float = 0.001
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    ext_coef: float = 2.0
    int_coef: float = 1.0
    obs_norm_steps: int = 256
    """random-action vector steps that set the bonus's observation statistics (not counted)"""
    hidden: int = 64

    def __post_init__(self) -> None:
        for name in ("num_steps", "num_minibatches", "update_epochs", "obs_norm_steps", "hidden"):
            value = getattr(self, name)
            require(is_count(value), name, "an integer >= 1", value)
        for name in ("gamma", "int_gamma", "gae_lambda"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 <= value <= 1):
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")


class Agent(nn.Module):
    """Actor and critic: tanh MLPs on flattened vector observations (CleanRL ``ppo.py``) or a
    shared Nature-CNN trunk on (C, H, W) images; the critic has an extrinsic and an intrinsic head."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.pixels = is_image(obs_shape)
        if self.pixels:
            trunk = conv_stack(obs_shape[0], nn.ReLU)
            width = conv_width(trunk, obs_shape)  # type: ignore[arg-type]
            body = orthogonal_init(nn.Sequential(trunk, nn.Linear(width, 448), nn.ReLU()))
            self.actor_body = self.critic_body = body
            features = 448
        else:
            in_dim = math.prod(obs_shape)

            def body() -> nn.Sequential:
                return orthogonal_init(nn.Sequential(
                    nn.Flatten(), nn.Linear(in_dim, hidden), nn.Tanh(),
                    nn.Linear(hidden, hidden), nn.Tanh(),
                ))  # fmt: skip

            self.actor_body, self.critic_body, features = body(), body(), hidden
        self.actor = orthogonal_init(nn.Linear(features, n_actions), 0.01)
        self.critic_ext = orthogonal_init(nn.Linear(features, 1), 1.0)
        self.critic_int = orthogonal_init(nn.Linear(features, 1), 1.0)

    def values(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.critic_body(obs)
        return self.critic_ext(hidden).squeeze(-1), self.critic_int(hidden).squeeze(-1)

    def forward(
        self,
        obs: torch.Tensor,
        action: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ):
        """(action, log-prob, entropy, extrinsic value, intrinsic value)."""
        distribution = Categorical(logits=self.actor(self.actor_body(obs)))
        if action is None:
            action = torch.multinomial(distribution.probs, 1, generator=generator).squeeze(-1)
        value_ext, value_int = self.values(obs)
        return action, distribution.log_prob(action), distribution.entropy(), value_ext, value_int


def _gae(rewards, values, next_value, nonterminal, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimates over [T, N] blocks (``nonterminal[t]`` masks t → t+1)."""
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(len(rewards))):
        following = next_value if t == len(rewards) - 1 else values[t + 1]
        delta = rewards[t] + gamma * following * nonterminal[t] - values[t]
        last = delta + gamma * lam * nonterminal[t] * last
        advantages[t] = last
    return advantages


class PPOLearner:
    """PPO (+ a bonus from :mod:`.bonus`, or ``None``) on a ``SAME_STEP``-autoresetting vector
    env with a ``Discrete`` action space. :meth:`learn` returns one history row per iteration:
    ``step``, ``cells`` (distinct ``info["cell"]`` values so far, when the env reports them),
    ``episodes``, ``successes`` (episodes with a positive extrinsic return), ``return``,
    ``intrinsic`` and ``first_reward_step`` (the env step of the first extrinsic reward)."""

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        bonus: IntrinsicReward | None = None,
        config: PPOConfig | None = None,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        if not isinstance(envs.single_action_space, gym.spaces.Discrete):
            raise ValueError(
                f"the env's action space must be Discrete, got {envs.single_action_space}"
            )
        mode = envs.metadata.get("autoreset_mode")  # gymnasium's default, unset, is NEXT_STEP
        if mode != gym.vector.AutoresetMode.SAME_STEP:
            raise ValueError(
                f"the vector env must reset finished episodes in the same step (got {mode}); "
                "make it with autoreset_mode=gym.vector.AutoresetMode.SAME_STEP"
            )
        space = envs.single_observation_space
        if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
            raise ValueError(
                "observation space must be a Box, got a Dict/Tuple space: flatten it first"
            )
        self.envs, self.bonus = envs, bonus
        self.config = config or PPOConfig()
        self.seed, self.device = seed, torch.device(device)
        self.obs_shape = tuple(space.shape)
        if bonus is not None and bonus.obs_shape != self.obs_shape:
            raise ValueError(
                f"the bonus takes observations of shape {bonus.obs_shape}, the env gives {self.obs_shape}"
            )
        if bonus is not None and bonus.forward_filter.gamma != self.config.int_gamma:
            raise ValueError(
                f"the bonus normalises with int_gamma {bonus.forward_filter.gamma}, the learner's "
                f"intrinsic stream uses {self.config.int_gamma}: make both the same"
            )
        # the learner's own generator: actions and minibatches never touch the global one
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            agent = Agent(self.obs_shape, int(envs.single_action_space.n), self.config.hidden)
        self.agent = agent.to(self.device)
        # images stored as bytes are fed to the policy in [0, 1] (CleanRL's x / 255)
        self.obs_scale = 1 / 255 if space.dtype == np.uint8 and self.agent.pixels else 1.0
        self.optimizer = torch.optim.Adam(
            self.agent.parameters(), lr=self.config.learning_rate, eps=1e-5
        )
        self.global_step, self.history, self.seen = 0, [], set()
        self.first_reward_step: int | None = None
        self._obs: np.ndarray | None = None
        self._episode_return = np.zeros(envs.num_envs)

    def _policy_input(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(obs, dtype=torch.float32, device=self.device) * self.obs_scale

    # -- environment -------------------------------------------------------------------------
    def _reset(self) -> np.ndarray:
        obs, info = self.envs.reset(seed=self.seed + self.global_step)
        self._note_cells(info)
        self._episode_return[:] = 0
        return obs

    def _note_cells(self, info: dict[str, Any]) -> None:
        """Cells from ``info["cell"]`` and, for envs whose episode just ended, from the terminal
        step's info (gymnasium's ``SAME_STEP`` puts the reset info in ``info`` itself)."""
        for source in (info, info.get("final_info", {})):
            if "cell" in source:
                cells = np.asarray(source["cell"])
                mask = source.get("_cell", np.ones(len(cells), bool))
                self.seen.update(cells[mask].tolist())

    def _init_normalization(self) -> None:
        """CleanRL's observation-statistics rollout: uniform random actions, not counted."""
        rng = np.random.default_rng(self.seed)
        observed = []
        for _ in range(self.config.obs_norm_steps):
            actions = rng.integers(self.envs.single_action_space.n, size=self.envs.num_envs)
            obs, *_ = self.envs.step(actions)
            observed.append(obs)
        self.bonus.init_normalization(np.concatenate(observed))  # type: ignore[union-attr]

    # -- training ----------------------------------------------------------------------------
    def learn(
        self, total_steps: int, callback: Callable[[PPOLearner], None] | None = None
    ) -> list[dict[str, Any]]:
        """Train until ``global_step`` reaches ``total_steps`` (whole iterations of
        ``num_steps × num_envs``); ``callback(self)`` runs after every iteration (checkpoints)."""
        require(is_count(total_steps), "total_steps", "an integer >= 1", total_steps)
        config, n = self.config, self.envs.num_envs
        batch = config.num_steps * n
        iterations = max(1, total_steps // batch)
        if self._obs is None:
            self._obs = self._reset()
            if self.bonus is not None and self.global_step == 0:
                self._init_normalization()
                self._obs = self._reset()
        total = iterations * batch
        with progress(total, "ppo env steps", completed=min(self.global_step, total)) as bar:
            while self.global_step < total:
                if config.anneal_lr:
                    done_share = self.global_step / total
                    self.optimizer.param_groups[0]["lr"] = (1 - done_share) * config.learning_rate
                self.history.append(self._iteration())
                if callback is not None:
                    callback(self)
                bar.advance(self.global_step - bar.done, cells=len(self.seen))
        return self.history

    @torch.no_grad()
    def _rollout(self) -> dict[str, Any]:
        config, n = self.config, self.envs.num_envs
        steps = config.num_steps
        obs = np.zeros((steps, n, *self.obs_shape), np.float32)
        next_obs = np.zeros_like(obs)
        actions = torch.zeros(steps, n, dtype=torch.long)
        logprobs, values_ext, values_int = (torch.zeros(steps, n) for _ in range(3))
        rewards, dones = np.zeros((steps, n), np.float32), np.zeros((steps, n), np.float32)
        episodes = successes = 0
        returns: list[float] = []
        for t in range(steps):
            obs[t] = self._obs
            action, logprob, _, value_ext, value_int = self.agent(
                self._policy_input(self._obs), generator=self.generator
            )
            actions[t], logprobs[t], values_ext[t], values_int[t] = (
                action.cpu(),
                logprob.cpu(),
                value_ext.cpu(),
                value_int.cpu(),
            )
            self._obs, reward, terminated, truncated, info = self.envs.step(action.cpu().numpy())
            self.global_step += n
            done = np.logical_or(terminated, truncated)
            # the bonus scores where the step led: the terminal observation when it ended
            landed = np.asarray(self._obs, np.float32).copy()
            if "final_obs" in info:
                for i in np.flatnonzero(info["_final_obs"]):
                    landed[i] = info["final_obs"][i]
            next_obs[t], rewards[t], dones[t] = landed, reward, done
            self._note_cells(info)
            self._episode_return += reward
            if self.first_reward_step is None and (np.asarray(reward) > 0).any():
                self.first_reward_step = self.global_step
            for i in np.flatnonzero(done):
                episodes += 1
                successes += int(self._episode_return[i] > 0)
                returns.append(float(self._episode_return[i]))
                self._episode_return[i] = 0
        return {
            "obs": obs, "next_obs": next_obs, "actions": actions, "logprobs": logprobs,
            "values_ext": values_ext, "values_int": values_int, "rewards": rewards, "dones": dones,
            "episodes": episodes, "successes": successes, "returns": returns,
        }  # fmt: skip

    def _iteration(self) -> dict[str, Any]:
        started = time.perf_counter()
        config, n = self.config, self.envs.num_envs
        roll = self._rollout()
        flat_next = roll["next_obs"].reshape(-1, *self.obs_shape)
        intrinsic = np.zeros_like(roll["rewards"])
        if self.bonus is not None:
            raw = self.bonus.bonus(flat_next).reshape(config.num_steps, n)
            intrinsic = self.bonus.normalize_rewards(raw)
        with torch.no_grad():
            last_ext, last_int = self.agent.values(self._policy_input(self._obs))
        nonterminal = 1.0 - torch.as_tensor(roll["dones"])
        adv_ext = _gae(torch.as_tensor(roll["rewards"]), roll["values_ext"], last_ext.cpu(),
                       nonterminal, config.gamma, config.gae_lambda)  # fmt: skip
        ret_ext = adv_ext + roll["values_ext"]
        if self.bonus is not None:
            adv_int = _gae(torch.as_tensor(intrinsic), roll["values_int"], last_int.cpu(),
                           torch.ones_like(nonterminal), config.int_gamma, config.gae_lambda)  # fmt: skip
            ret_int = adv_int + roll["values_int"]
            advantages = config.ext_coef * adv_ext + config.int_coef * adv_int
        else:
            ret_int = torch.zeros_like(ret_ext)
            advantages = adv_ext
        self._update(roll, advantages, ret_ext, ret_int)
        if self.bonus is not None:
            self.bonus.update(flat_next)
        returns = roll["returns"]
        return {
            "step": self.global_step,
            "cells": len(self.seen),
            "episodes": roll["episodes"],
            "successes": roll["successes"],
            "return": float(np.mean(returns)) if returns else None,
            "intrinsic": float(intrinsic.mean()),
            "first_reward_step": self.first_reward_step,
            "seconds": time.perf_counter() - started,
        }

    def _update(self, roll, advantages, ret_ext, ret_int) -> None:
        config, device = self.config, self.device
        obs = self._policy_input(roll["obs"].reshape(-1, *self.obs_shape))
        actions, logprobs = (
            roll["actions"].reshape(-1).to(device),
            roll["logprobs"].reshape(-1).to(device),
        )
        advantages, ret_ext, ret_int = (
            x.reshape(-1).to(device) for x in (advantages, ret_ext, ret_int)
        )
        size = len(obs)
        minibatch = max(1, size // config.num_minibatches)
        for _ in range(config.update_epochs):
            order = torch.randperm(size, device=device, generator=self.generator)
            for start in range(0, size, minibatch):
                index = order[start : start + minibatch]
                _, new_logprob, entropy, value_ext, value_int = self.agent(
                    obs[index], actions[index]
                )
                ratio = (new_logprob - logprobs[index]).exp()
                adv = advantages[index]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8) if len(index) > 1 else adv
                pg_loss = torch.max(
                    -adv * ratio, -adv * ratio.clamp(1 - config.clip_coef, 1 + config.clip_coef)
                ).mean()
                v_loss = 0.5 * (value_ext - ret_ext[index]).square().mean()
                if self.bonus is not None:
                    v_loss = v_loss + 0.5 * (value_int - ret_int[index]).square().mean()
                loss = pg_loss - config.ent_coef * entropy.mean() + config.vf_coef * v_loss
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.agent.parameters(), config.max_grad_norm)
                self.optimizer.step()

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything :meth:`learn` needs to continue, except the envs: a restored learner
        starts fresh episodes (the episodes in flight when it was saved are not recorded)."""
        return {
            "config": asdict(self.config),
            "agent": self.agent.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "bonus": None if self.bonus is None else self.bonus.state_dict(),
            "global_step": self.global_step,
            "history": self.history,
            "seen": sorted(self.seen),
            "first_reward_step": self.first_reward_step,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.agent.load_state_dict(state["agent"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.bonus is not None:
            self.bonus.load_state_dict(state["bonus"])
        self.global_step, self.history = int(state["global_step"]), list(state["history"])
        self.seen, self.first_reward_step = set(state["seen"]), state["first_reward_step"]
        self.generator.set_state(state["generator"])
        self._obs = None  # fresh episodes
