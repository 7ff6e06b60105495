"""CURB for outside learners: the penalty as a PettingZoo wrapper, and one agent as a gymnasium.Env.

- :class:`CurbShaping` subtracts CURB's dependence penalty from the rewards of any ``ParallelEnv``
  with ``Discrete`` actions, so that any learner (tabular, SB3, RLlib, CleanRL) trains on CURB's
  objective without knowing about it.
- :class:`SingleAgentView` exposes one agent of a ``ParallelEnv`` as a ``gymnasium.Env`` while the
  other agents play fixed policies (uniformly random by default, or e.g. a trained SB3 model's
  ``predict``); one agent at a time, alternating, trains a team of single-agent learners.

    from stable_baselines3 import DQN
    env = CurbShaping(RepeatedMarketEnv(max_cycles=100), penalty=0.2)
    firm_0 = DQN("MlpPolicy", SingleAgentView(env, "firm_0")).learn(5_000)
    rival = {"firm_0": lambda observation: firm_0.predict(observation, deterministic=True)[0]}
    firm_1 = DQN("MlpPolicy", SingleAgentView(env, "firm_1", others=rival)).learn(5_000)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv
from pettingzoo.utils.wrappers import BaseParallelWrapper

from mixlab.rl.curb.env import action_index, discrete_actions
from mixlab.shared import require

Policy = Callable[[Any], Any]
"""observation → action"""


class CurbShaping(BaseParallelWrapper):
    """CURB's dependence penalty added to the rewards of any ``ParallelEnv`` with ``Discrete``
    actions (for learners that know nothing of CURB).

    r̃_i,t = r_i,t − λ_t·(1 − p̂_i(a_i,t | a_i,t−1)),  λ_t = λ_max·(1 − exp(−β·t)),

    where p̂_i(·|a⁻) is the distribution of agent i's actions in the periods after its own action
    was a⁻, counted with weights that decay by ``visit_decay`` per period (this period included),
    and t counts the wrapper's steps over all episodes. p̂_i averages i's behaviour over everything
    the rivals did, so the penalty is zero for an agent whose action is fixed by its own last
    action and grows as its play reacts to the rivals' history: the quantity of
    :class:`~mixlab.rl.curb.QLearner`'s penalty, estimated from the actions played instead of the
    learner's greedy policy (which a wrapper cannot see). For the same reason random play
    (exploration) is penalised like a reaction; ``beta`` ramps the penalty in as exploration
    ε_t = exp(−βt) dies out (use the learner's β; ``beta=0``, the default, applies λ_max from the
    first step). The first period of an episode, with no previous action, is not penalised.
    ``infos[agent]["curb_penalty"]`` is the amount subtracted.
    """

    def __init__(
        self,
        env: ParallelEnv,
        penalty: float = 0.2,
        *,
        beta: float = 0.0,
        visit_decay: float = 0.99999,
    ) -> None:
        super().__init__(env)
        require(math.isfinite(penalty) and penalty >= 0, "penalty", "a finite number >= 0", penalty)
        require(math.isfinite(beta) and beta >= 0, "beta", "a finite number >= 0", beta)
        require(0 < visit_decay <= 1, "visit_decay", "in (0, 1]", visit_decay)
        self.penalty = penalty
        self.beta = beta
        self.visit_decay = visit_decay
        sizes = discrete_actions(env)
        self.counts_ = {
            agent: np.zeros((m, m)) for agent, m in zip(env.possible_agents, sizes, strict=True)
        }
        """per agent [previous own action, action]: decayed counts behind p̂_i"""
        self.steps_ = 0
        self._previous: dict[str, int] = {}

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, dict]]:
        self._previous = {}
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        observations, rewards, terminations, truncations, infos = self.env.step(actions)
        ramp = 1.0 - math.exp(-self.beta * self.steps_) if self.beta > 0 else 1.0
        weight = self.penalty * ramp
        shaped = dict(rewards)
        infos = {agent: dict(info) for agent, info in infos.items()}  # an env may share one dict
        for agent, action in actions.items():
            if agent not in self.counts_:
                continue  # not an agent of the env; the env has already accepted or refused it
            counts = self.counts_[agent]
            a = action_index(action, counts.shape[1], agent)
            counts *= self.visit_decay
            previous = self._previous.get(agent)
            penalty = 0.0
            if previous is not None:
                counts[previous, a] += 1.0
                penalty = weight * (1.0 - counts[previous, a] / counts[previous].sum())
            self._previous[agent] = a
            if agent in shaped:
                shaped[agent] = float(rewards[agent]) - penalty
                infos.setdefault(agent, {})["curb_penalty"] = penalty
        self.steps_ += 1
        return observations, shaped, terminations, truncations, infos


class SingleAgentView(gymnasium.Env):
    """Agent ``agent`` of a ``ParallelEnv`` as a ``gymnasium.Env``; ``others`` maps each other
    agent to a fixed policy (observation → action), and agents not in it act uniformly at random
    (``Discrete`` action spaces only; drawn from this env's seeded ``np_random``).

    An episode ends when ``agent`` is terminated or truncated. ``reset(seed=s)`` resets the
    wrapped env with ``s`` too. Rendering is the wrapped env's.
    """

    def __init__(
        self, env: ParallelEnv, agent: str, others: Mapping[str, Policy] | None = None
    ) -> None:
        agents = list(getattr(env, "possible_agents", []))
        require(agent in agents, "agent", f"one of {agents}", agent)
        others = dict(others or {})
        unknown = sorted(set(others) - set(agents) - {agent})
        require(
            not unknown and agent not in others,
            "others",
            f"keyed by agents other than {agent!r}",
            unknown or agent,
        )
        for other in agents:
            space = env.action_space(other)
            require(
                other == agent or other in others or isinstance(space, spaces.Discrete),
                "others",
                f"a policy for {other!r}, whose action space {space} cannot be drawn uniformly",
                sorted(others),
            )
        self.env = env
        self.agent = agent
        self.others = others
        self.observation_space = env.observation_space(agent)
        self.action_space = env.action_space(agent)
        self.metadata = {"render_modes": [], **getattr(env, "metadata", {})}
        self.render_mode = getattr(env, "render_mode", None)
        self._observations: dict[str, Any] = {}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._observations, infos = self.env.reset(seed=seed, options=options)
        return self._observations[self.agent], infos.get(self.agent, {})

    def _other_action(self, other: str) -> Any:
        if other in self.others:
            return self.others[other](self._observations[other])
        space = self.env.action_space(other)
        return int(space.start + self.np_random.integers(space.n))

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        actions = {
            other: self._other_action(other) for other in self.env.agents if other != self.agent
        }
        actions[self.agent] = action
        observations, rewards, terminations, truncations, infos = self.env.step(actions)
        self._observations = observations
        return (
            observations[self.agent],
            float(rewards[self.agent]),
            bool(terminations[self.agent]),
            bool(truncations[self.agent]),
            infos.get(self.agent, {}),
        )

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
