"""The repeated pricing (or quantity) game as a PettingZoo ``ParallelEnv``.

Agents ``firm_0 … firm_{n−1}`` each choose an index on the action grid every period and earn the
stage-game profit. Every agent observes the last ``memory`` action profiles (oldest first, as grid
indices), Calvano et al.'s state. The game has no terminal state; ``max_cycles`` truncates it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from mixlab.rl.curb.markets import LogitBertrand, Market, action_grid, profit_table
from mixlab.shared import is_count, require


class RepeatedMarketEnv(ParallelEnv):
    """Repeated oligopoly: ``RepeatedMarketEnv(LinearCournot(n_firms=3), n_actions=15, memory=1)``.

    ``infos[agent]`` carries the actions' values (``prices`` or ``quantities``) and every firm's
    ``profits`` of the period. The first observation is a uniformly random history.
    """

    metadata: ClassVar[dict[str, Any]] = {
        "name": "repeated_market_v0",
        "render_modes": [],
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
    ) -> None:
        self.market = market or LogitBertrand()
        require(is_count(memory), "memory", "an integer >= 1", memory)
        require(
            max_cycles is None or is_count(max_cycles),
            "max_cycles",
            "None or an integer >= 1",
            max_cycles,
        )
        self.grid = action_grid(self.market, n_actions, xi)
        self.table = profit_table(self.market, self.grid)
        self.memory = memory
        self.max_cycles = max_cycles
        n = self.market.n_firms
        self.possible_agents = [f"firm_{i}" for i in range(n)]
        self.agents: list[str] = []
        self._action_space = spaces.Discrete(n_actions)
        self._observation_space = spaces.MultiDiscrete([n_actions] * (n * memory))
        self._history = np.zeros(n * memory, dtype=np.int64)
        self._period = 0
        self.np_random = np.random.default_rng()

    def observation_space(self, agent: str) -> spaces.MultiDiscrete:
        return self._observation_space

    def action_space(self, agent: str) -> spaces.Discrete:
        return self._action_space

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
            self._action_space.seed(seed)
        self.agents = list(self.possible_agents)
        self._period = 0
        self._history = self.np_random.integers(0, self.grid.size, self._history.size)
        return self._observations(), {agent: {} for agent in self.agents}

    def _observations(self) -> dict[str, np.ndarray]:
        return {agent: self._history.copy() for agent in self.agents}

    def step(self, actions: dict[str, int]) -> tuple[dict, dict, dict, dict, dict]:
        require(bool(self.agents), "step", "called after reset() and before truncation", actions)
        missing = [agent for agent in self.agents if agent not in actions]
        require(not missing, "actions", f"one action for each of {self.agents}", sorted(actions))
        m, n = self.grid.size, self.market.n_firms
        profile = np.array([int(actions[agent]) for agent in self.possible_agents])
        require(
            bool(np.all((profile >= 0) & (profile < m))),
            "actions",
            f"grid indices in [0, {m})",
            actions,
        )
        profits = self.table[int(np.ravel_multi_index(tuple(profile), [m] * n))]
        self._history = np.concatenate([self._history[n:], profile])
        self._period += 1
        truncated = self.max_cycles is not None and self._period >= self.max_cycles
        values = self.grid[profile]
        info = {f"{self.market.action_name}s": values, "profits": profits}
        agents = self.agents
        observations = self._observations()
        rewards = {agent: float(profits[i]) for i, agent in enumerate(agents)}
        terminations = dict.fromkeys(agents, False)
        truncations = dict.fromkeys(agents, truncated)
        infos = {agent: dict(info) for agent in agents}
        if truncated:
            self.agents = []
        return observations, rewards, terminations, truncations, infos
