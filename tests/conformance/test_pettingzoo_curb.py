"""PettingZoo's and gymnasium's own checks on CURB's market env, and the fixes they rest on (issue 17).

The env is a PettingZoo ``ParallelEnv`` with a global ``state()``, text rendering and refused
invalid actions; one agent of it (or of any ``ParallelEnv``) is a ``gymnasium.Env`` through
``SingleAgentView``; the learners take any ``ParallelEnv`` with ``Discrete`` actions (the market
through its documented ``RepeatedGame`` interface, others by stepping them) and refuse the rest;
``CurbShaping`` puts CURB's penalty into any env's rewards, so that outside learners (two SB3
``DQN`` agents here) train on CURB's objective. Each targeted test fails if its fix is reverted.
"""

import warnings
from typing import Any, ClassVar

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env
from pettingzoo import ParallelEnv
from pettingzoo.test import parallel_api_test, parallel_seed_test
from stable_baselines3 import DQN

from mixlab.rl.curb import (
    CurbShaping,
    DQNConfig,
    LinearCournot,
    LogitBertrand,
    QLearner,
    RepeatedGame,
    RepeatedMarketEnv,
    SingleAgentView,
    analyse_sessions,
    train_dqn,
    train_sessions,
)


class TargetEnv(ParallelEnv):
    """Not mixlab's: every period both agents see a target in {0, 1, 2} and earn 1 for playing it.
    ``col`` has a fourth action that never pays; an episode is ``periods`` periods."""

    metadata: ClassVar[dict[str, Any]] = {"name": "target_v0", "render_modes": []}

    def __init__(self, periods: int = 10) -> None:
        self.possible_agents = ["row", "col"]
        self.agents: list[str] = []
        self.periods = periods
        self._observation_space = spaces.Discrete(3)
        self._action_spaces = {"row": spaces.Discrete(3), "col": spaces.Discrete(4)}
        self._rng = np.random.default_rng()

    def observation_space(self, agent: str) -> spaces.Space:
        return self._observation_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._period, self._target = 0, int(self._rng.integers(3))
        return dict.fromkeys(self.agents, self._target), {agent: {} for agent in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        rewards = {agent: float(int(actions[agent]) == self._target) for agent in self.agents}
        self._period, self._target = self._period + 1, int(self._rng.integers(3))
        done = self._period >= self.periods
        agents, self.agents = self.agents, [] if done else self.agents
        observations = dict.fromkeys(agents, self._target)
        terminations = dict.fromkeys(agents, False)
        return (
            observations,
            rewards,
            terminations,
            dict.fromkeys(agents, done),
            {a: {} for a in agents},
        )


class BoxActionEnv(TargetEnv):
    """A continuous action space, which tabular Q-learning and DQN cannot choose from."""

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Box(0.0, 1.0, (1,))


class PayoffTableGame(ParallelEnv):
    """A repeated game that is not a market: it only declares the RepeatedGame interface."""

    metadata: ClassVar[dict[str, Any]] = {"name": "pd_v0", "render_modes": []}

    def __init__(self, payoff_table: np.ndarray, n_actions: int) -> None:
        self.possible_agents, self.agents = ["a", "b"], []
        self.memory, self.payoff_table = 1, payoff_table
        self._action_space = spaces.Discrete(n_actions)
        self._observation_space = spaces.MultiDiscrete([n_actions] * 2)

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_space

    def observation_space(self, agent: str) -> spaces.Space:
        return self._observation_space


# --- PettingZoo and gymnasium checkers ----------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: RepeatedMarketEnv(max_cycles=30),
        lambda: RepeatedMarketEnv(LinearCournot(n_firms=3), memory=2, max_cycles=10),
        lambda: CurbShaping(RepeatedMarketEnv(max_cycles=30), penalty=0.2),
        lambda: RepeatedMarketEnv(max_cycles=30, render_mode="ansi"),
    ],
    ids=["bertrand", "cournot-3-firms-memory-2", "curb-shaping", "ansi"],
)
def test_pettingzoo_parallel_api_and_seed_tests(build):
    parallel_api_test(build(), num_cycles=60)
    parallel_seed_test(build, num_cycles=60)


@pytest.mark.parametrize("render_mode", [None, "ansi"])
def test_gymnasium_check_env_on_the_single_agent_view(render_mode):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # check_env's warnings count as failures, except that
        # other render modes are not tried on an env not made by gymnasium.make (parametrized here)
        warnings.filterwarnings("ignore", message=".*not having a spec")
        check_env(
            SingleAgentView(RepeatedMarketEnv(max_cycles=20, render_mode=render_mode), "firm_1")
        )
        check_env(SingleAgentView(CurbShaping(TargetEnv()), "col"), skip_render_check=True)


def test_single_agent_view_plays_the_others_fixed_policies_and_is_seeded():
    view = SingleAgentView(RepeatedMarketEnv(max_cycles=5), "firm_0", {"firm_1": lambda obs: 7})
    observation, _ = view.reset(seed=3)
    observation, reward, _, _, info = view.step(np.int64(2))
    assert observation.tolist() == [2, 7]
    assert reward == pytest.approx(info["profits"][0])
    random_rival = SingleAgentView(RepeatedMarketEnv(max_cycles=5), "firm_0")
    plays = []
    for _ in range(2):
        random_rival.reset(seed=4)
        plays.append([random_rival.step(0)[0][1] for _ in range(5)])
    assert plays[0] == plays[1]
    with pytest.raises(ValueError, match="agent"):
        SingleAgentView(RepeatedMarketEnv(), "firm_9")
    with pytest.raises(ValueError, match="others"):
        SingleAgentView(BoxActionEnv(), "row")  # col's Box actions cannot be drawn uniformly


# --- the env: state, rendering, info, actions ---------------------------------------------------


def test_state_is_the_global_history_in_state_space():
    env = RepeatedMarketEnv(LinearCournot(n_firms=3), memory=2)
    env.reset(seed=0)
    env.step({"firm_0": 1, "firm_1": 2, "firm_2": 3})
    state = env.state()
    assert env.state_space.contains(state)
    assert state.shape == (6,)
    assert state[-3:].tolist() == [1, 2, 3]


def test_render_modes(capsys):
    env = RepeatedMarketEnv(render_mode="ansi")
    env.reset(seed=0)
    env.step({"firm_0": 0, "firm_1": 14})
    text = env.render()
    grid = env.grid
    assert text.startswith("period 1: prices")
    assert f"{grid[0]:.4f} {grid[14]:.4f}" in text
    assert "profits" in text
    human = RepeatedMarketEnv(LinearCournot(), render_mode="human")
    human.reset(seed=0)
    human.step({"firm_0": 3, "firm_1": 3})
    assert "period 1: quantities" in capsys.readouterr().out
    assert "ansi" in RepeatedMarketEnv.metadata["render_modes"]
    with pytest.raises(ValueError, match="render_mode"):
        RepeatedMarketEnv(render_mode="rgb_array")


def test_info_names_the_actions_values():
    env = RepeatedMarketEnv(LinearCournot())
    env.reset(seed=0)
    infos = env.step({"firm_0": 0, "firm_1": 1})[4]
    np.testing.assert_allclose(infos["firm_0"]["quantities"], env.grid[[0, 1]])
    env = RepeatedMarketEnv()
    env.reset(seed=0)
    assert "prices" in env.step({"firm_0": 0, "firm_1": 1})[4]["firm_1"]


@pytest.mark.parametrize("action", [3.0, 3.7, np.float32(2.0), True, -1, 15, np.array([3]), "3"])
def test_invalid_actions_are_refused_not_truncated(action):
    env = RepeatedMarketEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions\['firm_0'\]"):
        env.step({"firm_0": action, "firm_1": 0})


@pytest.mark.parametrize("action", [3, np.int64(3), np.int32(3), np.uint8(3), np.array(3)])
def test_integer_actions_of_any_integer_type_are_accepted(action):
    env = RepeatedMarketEnv()
    env.reset(seed=0)
    observations = env.step({"firm_0": action, "firm_1": 0})[0]
    assert observations["firm_0"].tolist() == [3, 0]


# --- learners on any ParallelEnv ----------------------------------------------------------------


def test_tabular_learner_trains_on_an_outside_env():
    sessions = train_sessions(TargetEnv(), QLearner(beta=2e-3, stable_periods=300), 2, seed=1)
    assert sessions.converged.all()
    # Each agent learned to play the target it sees; col never picks its useless fourth action.
    assert sessions.greedy.tolist() == [[[0, 1, 2], [0, 1, 2]]] * 2
    assert np.isneginf(sessions.q[:, 0, :, 3]).all()
    again = train_sessions(TargetEnv(), QLearner(beta=2e-3, stable_periods=300), 2, seed=1)
    np.testing.assert_array_equal(sessions.q, again.q)


def test_dqn_trains_on_an_outside_env():
    config = DQNConfig(
        steps=400, hidden=16, lr=1e-2, batch_size=32, buffer_size=1000, learning_starts=50,
        target_every=50, gamma=0.0, beta=1e-2,
    )  # fmt: skip
    trained = train_dqn(TargetEnv(), [config, config], seed=0, trace_every=100)
    assert trained.greedy is None
    assert trained.reward_trace.shape == (2, 4)
    assert trained.reward_trace[:, 0].max() < 0.6 < 0.9 < trained.reward_trace[:, -1].min()
    for session in range(2):
        for target in range(3):
            actions = trained.act({"row": target, "col": target}, session=session)
            assert actions == {"row": target, "col": target}


def test_learners_read_only_the_repeated_game_interface():
    market = RepeatedMarketEnv(LinearCournot())
    game = PayoffTableGame(market.payoff_table, 15)
    assert isinstance(game, RepeatedGame)
    learner = QLearner.curb(beta=1e-3, stable_periods=500)
    np.testing.assert_array_equal(
        train_sessions(game, learner, 2, seed=4).q, train_sessions(market, learner, 2, seed=4).q
    )
    config = DQNConfig(
        steps=100, hidden=16, batch_size=16, learning_starts=32, target_every=20, buffer_size=100,
        penalty=0.2, belief=True,
    )  # fmt: skip
    np.testing.assert_array_equal(
        train_dqn(game, [config], seed=2).greedy, train_dqn(market, [config], seed=2).greedy
    )


def test_market_numbers_are_unchanged_by_the_env_api():
    """Periods to convergence of seeded sessions, as measured with the Market-taking API."""
    cournot = train_sessions(
        RepeatedMarketEnv(LinearCournot()), QLearner(beta=1e-4, stable_periods=2000), 3, seed=5
    )
    assert cournot.periods.tolist() == [386981, 219327, 214491]
    bertrand = train_sessions(
        RepeatedMarketEnv(LogitBertrand()), QLearner.curb(beta=1e-4, stable_periods=2000), 3, seed=5
    )
    assert bertrand.periods.tolist() == [76853, 65285, 74717]


@pytest.mark.parametrize(
    "train",
    [
        lambda env: train_sessions(env, QLearner(max_periods=10)),
        lambda env: train_dqn(env, [DQNConfig(steps=10, batch_size=1, learning_starts=0)]),
        lambda env: CurbShaping(env),
    ],
    ids=["train_sessions", "train_dqn", "CurbShaping"],
)
def test_non_discrete_action_spaces_are_refused(train):
    with pytest.raises(
        ValueError, match=r"env.action_space\('row'\) must be gymnasium.spaces.Discrete"
    ):
        train(BoxActionEnv())


def test_builtin_curb_parts_on_an_outside_env_point_to_curb_shaping():
    with pytest.raises(ValueError, match="CurbShaping"):
        train_sessions(TargetEnv(), QLearner(penalty=0.2))
    with pytest.raises(ValueError, match="CurbShaping"):
        train_dqn(TargetEnv(), [DQNConfig(belief=True)])


# --- CurbShaping --------------------------------------------------------------------------------


def _shaped_penalties(firm_1_rule) -> tuple[list[float], list[float]]:
    """firm_0 plays uniformly at random, firm_1 plays ``firm_1_rule(own last, firm_0's last)``
    on a shaped market; each firm's penalty per period."""
    env = CurbShaping(RepeatedMarketEnv(), penalty=0.5)
    observations, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    penalties: tuple[list[float], list[float]] = ([], [])
    for _ in range(300):
        rival, own = (int(v) for v in observations["firm_1"])
        actions = {"firm_0": int(rng.integers(15)), "firm_1": firm_1_rule(own, rival)}
        observations, rewards, _, _, infos = env.step(actions)
        for i, agent in enumerate(("firm_0", "firm_1")):
            penalty = infos[agent]["curb_penalty"]
            assert rewards[agent] == pytest.approx(infos[agent]["profits"][i] - penalty)
            penalties[i].append(penalty)
    return penalties


def test_curb_shaping_penalises_reacting_to_the_rival_not_following_ones_own_history():
    random_0, copying = _shaped_penalties(lambda own, rival: rival)  # copy firm_0's last price
    assert copying[0] == 0.0  # no previous action in the first period
    assert np.mean(copying[100:]) > 0.35  # λ·(1 − p̂) with p̂ near 1/15
    random_0_again, cycling = _shaped_penalties(lambda own, rival: (own + 1) % 15)
    assert max(cycling) == 0.0  # an action fixed by the own last action is never penalised
    assert random_0 == random_0_again  # firm_0's penalty does not depend on firm_1's play
    # The wrapper sees actions, not policies: firm_0's random play costs like a reaction would.
    assert np.mean(random_0[100:]) > 0.35


def test_curb_shaping_ramps_with_beta_and_feeds_any_learner():
    env = CurbShaping(TargetEnv(), penalty=1.0, beta=1e-3)
    env.reset(seed=0)
    for _ in range(2):
        assert env.step({"row": 0, "col": 0})[4]["row"]["curb_penalty"] == 0.0
    penalty = env.step({"row": 1, "col": 1})[4]["row"]["curb_penalty"]
    # Third step (t = 2): λ = 1 − e^{−2β}; after a 0, row played 0 once before (decayed) and 1 now.
    decay = env.visit_decay
    assert penalty == pytest.approx((1 - np.exp(-2e-3)) * (1 - 1 / (1 + decay)))
    with pytest.raises(ValueError, match="penalty"):
        CurbShaping(TargetEnv(), penalty=-1.0)
    # The tabular learner steps the shaped market (it is a wrapper, not a RepeatedGame), and the
    # collusion analysis still reads the market underneath.
    shaped = CurbShaping(RepeatedMarketEnv(LinearCournot(), n_actions=5), penalty=0.1, beta=1e-3)
    sessions = train_sessions(shaped, QLearner(beta=1e-3, stable_periods=300), 1, seed=0)
    assert sessions.converged.all()
    assert shaped.steps_ == sessions.periods[0]
    assert np.isfinite(analyse_sessions(sessions)[0].collusion)


# --- outside learners: two Stable-Baselines3 DQN agents -----------------------------------------


def _mean_profit(policies: dict, periods: int = 200) -> np.ndarray:
    env = RepeatedMarketEnv(max_cycles=periods)
    observations, _ = env.reset(seed=11)
    rng = np.random.default_rng(11)
    total = np.zeros(2)
    while env.agents:
        actions = {
            agent: policies[agent](observations[agent]) if agent in policies else rng.integers(15)
            for agent in env.agents
        }
        observations, rewards, _, _, _ = env.step(actions)
        total += [rewards["firm_0"], rewards["firm_1"]]
    return total / periods


def test_two_sb3_dqn_agents_train_through_the_single_agent_view_and_curb_shaping():
    def view(agent: str, others: dict) -> SingleAgentView:
        shaped = CurbShaping(RepeatedMarketEnv(max_cycles=100), penalty=0.05)
        return SingleAgentView(shaped, agent, others)

    settings = {
        "learning_starts": 100,
        "buffer_size": 2_000,
        "target_update_interval": 100,
        "exploration_fraction": 0.5,
        "policy_kwargs": {"net_arch": [32, 32]},
        "seed": 0,
        "device": "cpu",
    }
    firm_0 = DQN("MlpPolicy", view("firm_0", {}), **settings).learn(1_000)

    def play_0(observation):
        return firm_0.predict(observation, deterministic=True)[0]

    firm_1 = DQN("MlpPolicy", view("firm_1", {"firm_0": play_0}), **settings).learn(1_000)

    def play_1(observation):
        return firm_1.predict(observation, deterministic=True)[0]

    assert firm_0.num_timesteps == firm_1.num_timesteps == 1_000
    # Trained against a random rival, firm_0 earns more against one than a random firm does.
    assert _mean_profit({"firm_0": play_0})[0] > _mean_profit({})[0]
    # Both trained agents play each other through the parallel env with predict's 0-d arrays.
    profits = _mean_profit({"firm_0": play_0, "firm_1": play_1})
    assert (profits > 0).all()
