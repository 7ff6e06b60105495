"""The repeated pricing (or quantity) game as a PettingZoo ``ParallelEnv``, and what learners read
from an env.

Agents ``firm_0 … firm_{n−1}`` each choose an index on the action grid every period and earn the
stage-game profit. Every agent observes the last ``memory`` action profiles (oldest first, as grid
indices), Calvano et al.'s state; :meth:`RepeatedMarketEnv.state` is the same history. The game has
no terminal state; ``max_cycles`` truncates it.

The learners (:func:`~mixlab.rl.curb.train_sessions`, :func:`~mixlab.rl.curb.train_dqn`) take any
``ParallelEnv`` whose action spaces are ``Discrete`` (:func:`discrete_actions`). An unwrapped env
that is a :class:`RepeatedGame` (this one is) also gets the compiled learners and CURB's built-in
penalty and belief injection, which need the stage game's payoffs, not only its rewards.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
from gymnasium import logger, spaces
from pettingzoo import ParallelEnv

from mixlab.rl.curb.markets import LogitBertrand, Market, action_grid, profit_table
from mixlab.shared import is_count, require

RENDER_MODES = ("ansi", "human")


@runtime_checkable
class RepeatedGame(Protocol):
    """A ``ParallelEnv`` that repeats one stage game: the interface of the compiled learners.

    - ``possible_agents``: the n players; each ``action_space(agent)`` is the same ``Discrete(m)``.
    - ``payoff_table``: [m^n, n], every player's reward for each action profile, profile
      (a_0, …, a_{n−1}) at row Σ_j a_j·m^(n−1−j) (the first agent is the most significant digit).
      The reward of a period depends on that period's profile only.
    - ``memory``: the observation is the last ``memory`` profiles, oldest first (a ``MultiDiscrete``
      of n·memory indices), the same for every agent.
    """

    possible_agents: list[str]
    memory: int
    payoff_table: np.ndarray

    def action_space(self, agent: str) -> spaces.Space: ...


def repeated_game(env: ParallelEnv) -> RepeatedGame | None:
    """``env`` if it is an unwrapped :class:`RepeatedGame`, else None. A wrapper is never one: it
    may change rewards (:class:`~mixlab.rl.curb.CurbShaping` does), so learners must step it."""
    if getattr(env, "unwrapped", env) is env and isinstance(env, RepeatedGame):
        return env
    return None


def discrete_actions(env: ParallelEnv) -> list[int]:
    """Number of actions of every possible agent; refuses an env whose action spaces are not all
    ``gymnasium.spaces.Discrete`` starting at 0 (what the learners here can choose from)."""
    require(
        isinstance(getattr(env, "possible_agents", None), list | tuple) and env.possible_agents,
        "env",
        "a PettingZoo ParallelEnv with possible_agents",
        type(env).__name__,
    )
    sizes = []
    for agent in env.possible_agents:
        space = env.action_space(agent)
        require(
            isinstance(space, spaces.Discrete) and int(space.start) == 0,
            f"env.action_space({agent!r})",
            "gymnasium.spaces.Discrete(n) starting at 0 (tabular Q-learning and DQN choose one "
            "of n actions; discretise a continuous action first)",
            space,
        )
        sizes.append(int(space.n))
    return sizes


def action_index(action: Any, n_actions: int, agent: str) -> int:
    """``action`` as an index in [0, n_actions): Python or NumPy integers (also 0-d arrays, as
    ``model.predict`` returns); floats, bools and out-of-range values are refused, not truncated."""
    value = np.asarray(action)
    require(
        value.ndim == 0 and np.issubdtype(value.dtype, np.integer),
        f"actions[{agent!r}]",
        f"an integer action index in [0, {n_actions})",
        action,
    )
    require(
        0 <= int(value) < n_actions,
        f"actions[{agent!r}]",
        f"an integer action index in [0, {n_actions})",
        action,
    )
    return int(value)


class RepeatedMarketEnv(ParallelEnv):
    """Repeated oligopoly: ``RepeatedMarketEnv(LinearCournot(n_firms=3), n_actions=15, memory=1)``.

    ``infos[agent]`` carries the actions' values (``prices`` or ``quantities``) and every firm's
    ``profits`` of the period. The first observation is a uniformly random history. A
    :class:`RepeatedGame`: ``payoff_table`` is :func:`~mixlab.rl.curb.profit_table` on ``grid``.
    ``render_mode="ansi"`` makes :meth:`render` return the last period as text, ``"human"`` prints it.
    """

    metadata: ClassVar[dict[str, Any]] = {
        "name": "repeated_market_v0",
        "render_modes": list(RENDER_MODES),
        "render_fps": 4,
        "is_parallelizable": True,
    }

    def __init__(
        self,
        market: Market | None = None,
        *,
        n_actions: int = 15,
        xi: float = 0.1,
        memory: int = 1,
        max_cycles: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        self.market = market or LogitBertrand()
        require(is_count(memory), "memory", "an integer >= 1", memory)
        require(
            max_cycles is None or is_count(max_cycles),
            "max_cycles",
            "None or an integer >= 1",
            max_cycles,
        )
        require(
            render_mode is None or render_mode in RENDER_MODES,
            "render_mode",
            f"None or one of {list(RENDER_MODES)}",
            render_mode,
        )
        self.grid = action_grid(self.market, n_actions, xi)
        self.payoff_table = profit_table(self.market, self.grid)
        self.memory = memory
        self.max_cycles = max_cycles
        self.render_mode = render_mode
        n = self.market.n_firms
        self.possible_agents = [f"firm_{i}" for i in range(n)]
        self.agents: list[str] = []
        self._action_space = spaces.Discrete(n_actions)
        self._observation_space = spaces.MultiDiscrete([n_actions] * (n * memory))
        self.state_space = spaces.MultiDiscrete([n_actions] * (n * memory))
        self._history = np.zeros(n * memory, dtype=np.int64)
        self._last_profits: np.ndarray | None = None
        self._period = 0
        self.np_random = np.random.default_rng()

    def observation_space(self, agent: str) -> spaces.MultiDiscrete:
        return self._observation_space

    def action_space(self, agent: str) -> spaces.Discrete:
        return self._action_space

    def state(self) -> np.ndarray:
        """The global state: the last ``memory`` action profiles, oldest first (``state_space``)."""
        return self._history.copy()

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
            self._action_space.seed(seed)
        self.agents = list(self.possible_agents)
        self._period = 0
        self._last_profits = None
        self._history = self.np_random.integers(0, self.grid.size, self._history.size)
        return self._observations(), {agent: {} for agent in self.agents}

    def _observations(self) -> dict[str, np.ndarray]:
        return {agent: self._history.copy() for agent in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        require(bool(self.agents), "step", "called after reset() and before truncation", actions)
        missing = [agent for agent in self.agents if agent not in actions]
        require(not missing, "actions", f"one action for each of {self.agents}", sorted(actions))
        m, n = self.grid.size, self.market.n_firms
        profile = np.array([action_index(actions[agent], m, agent) for agent in self.agents])
        profits = self.payoff_table[int(np.ravel_multi_index(tuple(profile), [m] * n))]
        self._history = np.concatenate([self._history[n:], profile])
        self._last_profits = profits
        self._period += 1
        truncated = self.max_cycles is not None and self._period >= self.max_cycles
        info = {self.market.action_plural: self.grid[profile], "profits": profits}
        agents = self.agents
        observations = self._observations()
        rewards = {agent: float(profits[i]) for i, agent in enumerate(agents)}
        terminations = dict.fromkeys(agents, False)
        truncations = dict.fromkeys(agents, truncated)
        infos = {agent: dict(info) for agent in agents}
        if truncated:
            self.agents = []
        if self.render_mode == "human":
            self.render()
        return observations, rewards, terminations, truncations, infos

    def render(self) -> str | None:
        """The last period as one line of text: returned (``"ansi"``) or printed (``"human"``)."""
        if self.render_mode is None:
            logger.warn(
                "render() called without a render_mode; pass render_mode='ansi' or 'human' "
                "to RepeatedMarketEnv"
            )
            return None
        n = self.market.n_firms
        values = " ".join(f"{v:.4f}" for v in self.grid[self._history[-n:]])
        text = f"period {self._period}: {self.market.action_plural} {values}"
        if self._last_profits is not None:
            text += "  profits " + " ".join(f"{p:.4f}" for p in self._last_profits)
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        pass
