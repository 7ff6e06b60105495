"""Tests of mixlab.rl.curb: markets, Q-learning, CURB, DQN, analysis, env, CLI and experiment."""

from __future__ import annotations

import json
import math

import numba
import numpy as np
import pytest
import torch

from mixlab.rl.curb import (
    DQNConfig,
    LinearCournot,
    LogitBertrand,
    QLearner,
    RepeatedMarketEnv,
    action_grid,
    analyse_policy,
    analyse_sessions,
    best_response_table,
    collusion_index,
    converged_cycle,
    dependence_penalty,
    equilibria,
    greedy_probabilities,
    impulse_response,
    initial_q,
    policy_dependence,
    profit_table,
    rival_marginal_policy,
    softmax_probabilities,
    train_dqn,
    train_sessions,
    tv_dependence,
)
from mixlab.rl.curb.dqn import EnsembleMLP

M = 15


@pytest.fixture(scope="module")
def bertrand():
    market = LogitBertrand()
    grid = action_grid(market)
    return market, grid, profit_table(market, grid), equilibria(market)


# --- markets -----------------------------------------------------------------------------------


def test_calvano_benchmarks(bertrand):
    _, grid, table, eq = bertrand
    np.testing.assert_allclose(eq.nash_profits, 0.22293, atol=1e-5)
    np.testing.assert_allclose(eq.monopoly_profits, 0.33749, atol=1e-5)
    np.testing.assert_allclose(eq.nash_actions, 1.47293, atol=1e-5)
    np.testing.assert_allclose(eq.monopoly_actions, 1.92498, atol=1e-5)
    calvano_grid = [1.4277, 1.4665, 1.5052, 1.5440, 1.5827, 1.6215, 1.6602, 1.6990]
    np.testing.assert_allclose(grid[:8], calvano_grid, atol=1e-4)
    np.testing.assert_allclose(grid[-1], 1.9702, atol=1e-4)
    calvano_responses = [1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5, 5, 6, 6, 6]
    responses = best_response_table(table, M, 2)
    assert responses[0].reshape(M, M)[0].tolist() == calvano_responses  # firm 0 vs rival's price
    assert responses[1].reshape(M, M)[:, 0].tolist() == calvano_responses  # firm 1 vs firm 0's


def test_cournot_benchmarks():
    eq = equilibria(LinearCournot())
    np.testing.assert_allclose(eq.nash_actions, 1 / 3, atol=1e-6)
    np.testing.assert_allclose(eq.nash_profits, 1 / 9, atol=1e-6)
    np.testing.assert_allclose(eq.monopoly_actions, 1 / 4, atol=1e-6)
    np.testing.assert_allclose(eq.monopoly_profits, 1 / 8, atol=1e-6)
    grid = action_grid(LinearCournot())
    np.testing.assert_allclose([grid[0], grid[-1]], [0.2417, 0.3417], atol=1e-4)
    # n firms: q_N = (A − c)/((n + 1)B), joint monopoly splits (A − c)/(2B).
    eq3 = equilibria(LinearCournot(n_firms=3, costs=0.1))
    np.testing.assert_allclose(eq3.nash_actions, 0.9 / 4, atol=1e-6)
    np.testing.assert_allclose(eq3.monopoly_actions.sum(), 0.9 / 2, atol=1e-5)


def test_nash_is_a_mutual_best_response_for_asymmetric_firms():
    market = LogitBertrand(n_firms=3, costs=(1.0, 1.1, 0.9), qualities=(2.0, 2.1, 1.9))
    eq = equilibria(market)
    for i in range(3):
        prices = np.repeat(eq.nash_actions[None], 201, axis=0)
        prices[:, i] = np.linspace(eq.nash_actions[i] - 0.2, eq.nash_actions[i] + 0.2, 201)
        assert market.profits(prices)[:, i].max() <= eq.nash_profits[i] + 1e-9
    assert eq.monopoly_profits.sum() > eq.nash_profits.sum()


def test_profit_table_and_collusion_index(bertrand):
    market, grid, table, eq = bertrand
    a, b = 3, 11
    np.testing.assert_allclose(table[a * M + b], market.profits(np.array([grid[a], grid[b]])))
    assert collusion_index(eq.nash_profits, eq) == pytest.approx(0.0)
    assert collusion_index(eq.monopoly_profits, eq) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="profits must be finite numbers"):  # issue 80
        collusion_index(np.full_like(eq.nash_profits, np.nan), eq)
    with pytest.raises(ValueError, match="profits must be an array with the"):
        collusion_index(np.ones(len(eq.nash_profits) + 1), eq)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: LogitBertrand(n_firms=1), "n_firms"),
        (lambda: LinearCournot(n_firms=1), "n_firms"),
        (lambda: LogitBertrand(costs=-1.0), "costs"),
        (lambda: LinearCournot(costs=(0.1, -0.2)), "costs"),
        (lambda: LogitBertrand(costs=(1.0, 1.0, 1.0)), "costs"),
        (lambda: LogitBertrand(mu=0), "mu"),
        (lambda: action_grid(LogitBertrand(), 0), "n_actions"),
        (lambda: profit_table(LogitBertrand(), np.array([])), "grid"),
        (lambda: QLearner(delta=1.0), "delta"),
        (lambda: QLearner(delta=-0.1), "delta"),
        (lambda: QLearner(alpha=0), "alpha"),
        (lambda: QLearner.curb(memory=2), "memory"),
        (lambda: train_sessions(RepeatedMarketEnv(), n_sessions=0), "n_sessions"),
        (
            lambda: train_sessions(RepeatedMarketEnv(LogitBertrand(n_firms=3)), QLearner.curb()),
            "possible_agents",
        ),
        (lambda: DQNConfig(gamma=1.0), "gamma"),
        (lambda: train_sessions(RepeatedMarketEnv(memory=3), QLearner(memory=3), 4), "memory"),
        (lambda: train_sessions(RepeatedMarketEnv(), QLearner(memory=2)), "learner.memory"),
        (lambda: train_sessions(LogitBertrand()), "possible_agents"),
        (
            lambda: train_dqn(RepeatedMarketEnv(LogitBertrand(n_firms=3)), [DQNConfig(penalty=1)]),
            "CurbShaping",
        ),
    ],
)
def test_bad_input_names_the_parameter(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# --- Q-learning --------------------------------------------------------------------------------


def test_initial_q_is_calvano_eq8(bertrand):
    _, _, table, _ = bertrand
    q0 = initial_q(table, M, 2, 0.95)
    profits = table.reshape(M, M, 2)
    np.testing.assert_allclose(q0[0], profits[:, :, 0].mean(axis=1) / 0.05)
    np.testing.assert_allclose(q0[1], profits[:, :, 1].mean(axis=0) / 0.05)


@pytest.mark.parametrize(
    "learner",
    [
        QLearner(max_periods=1500),
        QLearner(penalty=0.2, max_periods=1500),
        QLearner(belief=True, max_periods=1500),
        QLearner.curb(max_periods=1500),
        QLearner(memory=0, max_periods=1500),
        # Past exploration: the convergence stop, and the penalty's rescaling of its weights.
        QLearner(beta=1e-2, stable_periods=50, max_periods=5000),
        QLearner.curb(beta=1e-2, visit_decay=0.3, stable_periods=50, max_periods=5000),
    ],
    ids=["q-learning", "penalty", "belief", "curb", "no-memory", "converging", "curb-rescaled"],
)
def test_compiled_loop_equals_the_plain_python_reference(learner):
    env = RepeatedMarketEnv(LinearCournot())
    compiled = train_sessions(env, learner, 2, seed=3)
    reference = train_sessions(env, learner, 2, seed=3, python=True)
    np.testing.assert_array_equal(compiled.q, reference.q)
    np.testing.assert_array_equal(compiled.greedy, reference.greedy)
    np.testing.assert_array_equal(compiled.last_state, reference.last_state)
    np.testing.assert_array_equal(compiled.periods, reference.periods)


def test_belief_injected_td_target_by_hand_on_a_3x3_game():
    """y = r + δ·Σ_a' b(a')·V_i(s(a_i, a')), s(a_0, a_1) = a_0·3 + a_1: firm 0's own action is
    the first digit, firm 1's the second. Swapping the digits gives other numbers."""
    from mixlab.rl.curb.qlearning import td_target

    value = np.array([np.arange(9.0), 10.0 * np.arange(9.0) ** 2])  # V_i(s), [2 firms, 9 states]
    counts = np.array([[1.0, 2.0, 3.0], [2.0, 0.0, 1.0]])  # firm i's counts of the rival's actions
    reward, delta = 0.5, 0.9
    # Firm 0 played 2: next states (2, 0), (2, 1), (2, 2) = 6, 7, 8 with belief 1/6, 2/6, 3/6.
    expected_0 = reward + delta * (1 * 6 + 2 * 7 + 3 * 8) / 6
    # Firm 1 played 1: next states (0, 1), (1, 1), (2, 1) = 1, 4, 7 with belief 2/3, 0, 1/3.
    expected_1 = reward + delta * (2 * 10 * 1 + 1 * 10 * 49) / 3
    assert td_target(reward, delta, value, 0, True, counts, 0, 2, 3) == pytest.approx(expected_0)
    assert td_target(reward, delta, value, 0, True, counts, 1, 1, 3) == pytest.approx(expected_1)
    # With the digits swapped firm 0 would read states 2, 5, 8 and firm 1 states 3, 4, 5.
    assert expected_0 != pytest.approx(reward + delta * (1 * 2 + 2 * 5 + 3 * 8) / 6)
    assert expected_1 != pytest.approx(reward + delta * (2 * 90 + 1 * 250) / 3)
    # Without belief injection the target is the plain r + δ·V_i(s').
    assert td_target(reward, delta, value, 5, False, counts, 1, 1, 3) == reward + delta * 250.0


def test_seeded_sessions_are_deterministic_on_any_thread_count():
    env, learner = RepeatedMarketEnv(), QLearner(beta=1e-4, stable_periods=2000)
    threads = numba.get_num_threads()
    first = train_sessions(env, learner, 3, seed=7)
    numba.set_num_threads(1)
    try:
        single = train_sessions(env, learner, 3, seed=7)
    finally:
        numba.set_num_threads(threads)
    other = train_sessions(env, learner, 3, seed=8)
    np.testing.assert_array_equal(first.q, single.q)
    np.testing.assert_array_equal(first.periods, single.periods)
    assert not np.array_equal(first.q, other.q)
    # The sessions of one batch differ from each other.
    assert not np.array_equal(first.q[0], first.q[1])


def test_compiled_sessions_show_their_progress_and_play_alike_without_it(monkeypatch, capsys):
    env, learner = RepeatedMarketEnv(), QLearner(beta=1e-4, stable_periods=2000)
    monkeypatch.setenv("MIXLAB_PROGRESS", "lines")
    monkeypatch.setenv("MIXLAB_PROGRESS_EVERY", "0")
    shown = train_sessions(env, learner, 3, seed=7)  # in a worker thread, counted from here
    assert "q-learning sessions: 3/3" in capsys.readouterr().err
    monkeypatch.setenv("MIXLAB_PROGRESS", "0")
    quiet = train_sessions(env, learner, 3, seed=7)  # in this thread, nothing shown
    assert capsys.readouterr().err == ""
    np.testing.assert_array_equal(shown.q, quiet.q)
    np.testing.assert_array_equal(shown.periods, quiet.periods)


def test_convergence_rule_and_cap():
    capped = train_sessions(RepeatedMarketEnv(), QLearner(max_periods=500), 2)
    assert capped.periods.tolist() == [500, 500]
    assert not capped.converged.any()
    fast = train_sessions(RepeatedMarketEnv(), QLearner(beta=1e-3, stable_periods=1000), 2)
    assert fast.converged.all()
    assert (fast.periods < 1_000_000).all()


def test_q_learning_lands_in_calvanos_range_and_punishes(bertrand):
    sessions = train_sessions(RepeatedMarketEnv(bertrand[0]), QLearner(), 20, seed=0)
    assert sessions.converged.all()
    outcomes = analyse_sessions(sessions)
    collusion = np.mean([o.collusion for o in outcomes])
    assert 0.75 <= collusion <= 0.95
    assert np.mean([o.impulse.punished for o in outcomes]) >= 0.5


def test_curb_unwinds_collusion_on_a_small_batch(bertrand):
    sessions = train_sessions(RepeatedMarketEnv(bertrand[0]), QLearner.curb(), 10, seed=0)
    collusion = [o.collusion for o in analyse_sessions(sessions)]
    assert np.mean(collusion) < 0.4


def test_three_firm_market_runs():
    env = RepeatedMarketEnv(LinearCournot(n_firms=3))
    sessions = train_sessions(env, QLearner(beta=1e-3, stable_periods=500), 2)
    assert sessions.greedy.shape == (2, 3, 15**3)
    policy = sessions.greedy[0]
    cycle = converged_cycle(policy, int(sessions.last_state[0]), 15)
    # Greedy play maps each cycle state to the next one (states keep the newest profile only).
    for here, after in zip(cycle, cycle[1:] + cycle[:1], strict=True):
        assert after == int(np.ravel_multi_index(tuple(policy[:, here]), [15] * 3))


# --- analysis ----------------------------------------------------------------------------------


def _grim_trigger(high: int, low: int) -> np.ndarray:
    """Both firms play ``high`` after (high, high) and ``low`` after anything else."""
    policy = np.full((2, M * M), low)
    policy[:, high * M + high] = high
    return policy


def test_impulse_response_detects_grim_trigger_punishment(bertrand):
    _, grid, table, _ = bertrand
    policy = _grim_trigger(high=13, low=1)
    cycle = converged_cycle(policy, 13 * M + 13, M)
    assert cycle == [13 * M + 13]
    response = impulse_response(policy, cycle, table, grid)
    assert response.punished
    assert response.rival_response < 0
    assert response.deviation_gain < 0  # the deviation does not pay
    assert response.actions[1, 0] < grid[13]  # the deviator cut its price
    # A policy that ignores the rival does not punish, and deviating pays.
    constant = np.full((2, M * M), 13)
    calm = impulse_response(constant, [13 * M + 13], table, grid)
    assert not calm.punished
    assert calm.deviation_gain > 0


def test_impulse_response_on_a_two_state_cycle_matches_a_hand_computed_gain(bertrand):
    _, grid, table, _ = bertrand
    # (13, 13) → play (12, 12) → play (13, 13) → ...; any other history → (1, 1) forever.
    policy = np.full((2, M * M), 1)
    policy[:, 13 * M + 13] = 12
    policy[:, 12 * M + 12] = 13
    cycle = converged_cycle(policy, 13 * M + 13, M)
    assert cycle == [13 * M + 13, 12 * M + 12]
    periods, delta = 5, 0.9
    response = impulse_response(policy, cycle, table, grid, periods=periods, delta=delta)
    on_path = [12, 13]  # action played from cycle state c
    gains = []
    for c in range(2):
        rival = on_path[c]
        deviate = [1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5, 5, 6, 6, 6][rival]
        path = [table[deviate * M + rival, 0]] + [table[1 * M + 1, 0]] * periods
        cycle_path = [table[on_path[(c + t) % 2] * (M + 1), 0] for t in range(periods + 1)]
        gains.append(
            sum(delta**t * (p - q) for t, (p, q) in enumerate(zip(path, cycle_path, strict=True)))
        )
    assert response.deviation_gain == pytest.approx(np.mean(gains))
    assert response.punished
    np.testing.assert_allclose(response.actions[0], grid[on_path].mean())
    np.testing.assert_allclose(response.actions[2:, 1], grid[1])


def test_impulse_response_in_cournot_punishes_by_raising_quantity():
    market = LinearCournot()
    grid = action_grid(market)
    table = profit_table(market, grid)
    policy = _grim_trigger(high=1, low=13)  # collude on a low quantity, punish with a high one
    response = impulse_response(policy, [1 * M + 1], table, grid, competitive_direction=1)
    assert response.punished
    assert response.rival_response > 0


def test_impulse_response_undercuts_when_already_at_the_best_response(bertrand):
    _, grid, table, _ = bertrand
    nash = np.full((2, M * M), 1)  # index 1 is its own static best response
    response = impulse_response(nash, [1 * M + 1], table, grid)
    assert response.undercut_share == 1.0
    assert response.actions[1, 0] == grid[0]  # one step down, towards competition
    assert not response.punished
    assert response.deviation_gain < 0  # cutting below the best response loses


def test_lock_in_is_the_start_profile_played_forever():
    from mixlab.rl.curb import CurbShaping
    from mixlab.rl.curb.analysis import frozen_start, start_actions, start_profile

    env = RepeatedMarketEnv(LinearCournot())
    m = env.grid.size
    start = start_actions(env.payoff_table, m, 2)
    # Eq. 8's greedy action is the best reply to uniformly random rivals.
    profits = env.payoff_table.reshape(m, m, 2)
    assert start.tolist() == [profits[:, :, 0].mean(axis=1).argmax()] * 2
    frozen = frozen_start(env)
    assert frozen.locked_at_start
    assert frozen.cycle_length == 1
    assert not frozen.impulse.punished
    # The same profile reached from elsewhere counts; any other cycle does not.
    policy = np.full((2, m * m), start[0])
    policy[:, 1] = 0  # from state 1 play (0, 0) once, then the start profile from state 0 on
    eq = equilibria(env.market)
    args = (env.payoff_table, env.grid, eq)
    kwargs = {
        "delta": 0.95,
        "competitive_direction": 1,
        "start": start_profile(env.payoff_table, m, 2),
    }
    assert analyse_policy(policy, 1, *args, **kwargs).locked_at_start
    policy[:, :] = (start[0] + 1) % m
    assert analyse_policy(policy, 0, *args, **kwargs).locked_at_start is False
    # Without a start profile (a learner that did not start from Eq. 8) there is no lock-in.
    assert (
        analyse_policy(policy, 0, *args, delta=0.95, competitive_direction=1).locked_at_start
        is None
    )
    # No memory (one state) and three firms.
    assert analyse_policy(start[:, None], 0, *args, **kwargs).locked_at_start
    assert analyse_policy(start[::-1, None] - 1, 0, *args, **kwargs).locked_at_start is False
    three = RepeatedMarketEnv(LogitBertrand(n_firms=3), n_actions=5)
    assert frozen_start(three).locked_at_start
    sessions = train_sessions(three, QLearner(beta=1e-3, stable_periods=2000), 2)
    assert [o.locked_at_start for o in analyse_sessions(sessions)] == [False, False]
    # Stepped sessions (a wrapped env) start from Q = 0, not Eq. 8.
    stepped = train_sessions(CurbShaping(env, penalty=0.1), QLearner(max_periods=200), 1)
    assert analyse_sessions(stepped)[0].locked_at_start is None


def test_belief_effect_is_a_paired_one_sided_test():
    from mixlab.rl.curb.experiment import belief_effect

    rng = np.random.default_rng(0)
    penalty = [{"collusion": 0.5 + 0.2 * rng.random()} for _ in range(30)]
    closer = [{"collusion": s["collusion"] - 0.15} for s in penalty]
    farther = [{"collusion": s["collusion"] + 0.15} for s in penalty]
    effect, p = belief_effect(penalty, closer)
    assert effect == pytest.approx(0.15)
    assert p < 0.001
    effect, p = belief_effect(penalty, farther)
    assert effect == pytest.approx(-0.15)
    assert p > 0.99
    # Overshoot below the band is distance too; sessions inside the band all tie.
    assert belief_effect(penalty, [{"collusion": -0.6}] * 30)[1] > 0.99
    assert belief_effect([{"collusion": 0.1}] * 5, [{"collusion": 0.0}] * 5) == (0.0, 1.0)
    with pytest.raises(ValueError, match="as many sessions"):
        belief_effect(penalty, closer[:1])


def test_signed_rank_p_by_hand():
    from mixlab.rl.curb.experiment import signed_rank_p

    # n = 5, all positive: W+ = 15, null mean 7.5, variance 5·6·11/24 = 13.75.
    z = 7.5 / np.sqrt(13.75)
    assert signed_rank_p(np.array([1.0, 2, 3, 4, 5])) == pytest.approx(0.5 * math.erfc(z / 2**0.5))
    # Zeros drop out; ties share a rank and shrink the variance: |d| = 1, 1, 2 → ranks 1.5, 1.5, 3.
    w_plus, variance = 1.5 + 3, 3 * 4 * 7 / 24 - (2**3 - 2) / 48
    expected = 0.5 * math.erfc((w_plus - 3) / np.sqrt(variance) / 2**0.5)
    assert signed_rank_p(np.array([0.0, 1, -1, 2])) == pytest.approx(expected)
    assert signed_rank_p(np.zeros(4)) == 1.0


def test_tv_penalty_is_zero_for_a_policy_that_ignores_the_rival():
    rng = np.random.default_rng(0)
    own_rule = rng.integers(0, M, size=M)  # action depends on own last action only
    policy = np.repeat(own_rule, M)  # state s = own·M + rival for firm 0
    probabilities = greedy_probabilities(policy, M)
    weights = rng.random(M * M)
    penalty = dependence_penalty(probabilities, 0, weights)
    np.testing.assert_allclose(penalty[np.arange(M * M), policy], 0.0, atol=1e-12)
    assert np.allclose(tv_dependence(probabilities, 0), 0)
    # Firm 1 reads its own action from the low digit.
    policy_1 = np.tile(own_rule, M)
    penalty_1 = dependence_penalty(greedy_probabilities(policy_1, M), 1, weights)
    np.testing.assert_allclose(penalty_1[np.arange(M * M), policy_1], 0.0, atol=1e-12)
    # Softmax of a rival-independent Q: the TV statistic is exactly zero.
    q = np.repeat(rng.normal(size=(M, 1, M)), M, axis=1).reshape(M * M, M)
    assert np.allclose(tv_dependence(softmax_probabilities(q, 0.1), 0), 0)


def test_tv_penalty_is_positive_for_a_policy_that_reacts_to_the_rival(bertrand):
    _, _, table, _ = bertrand
    policy = _grim_trigger(13, 1)
    probabilities = greedy_probabilities(policy[0], M)
    penalty = dependence_penalty(probabilities, 0)
    assert penalty[13 * M + 13, 13] > 0.9  # high is played after one of 15 rival actions only
    stats = policy_dependence(probabilities, 0, 13 * M + 13, table)
    assert stats.cooperate_defect == pytest.approx(1.0)
    marginal = rival_marginal_policy(probabilities, 0)
    np.testing.assert_allclose(marginal.sum(axis=1), 1.0)


# --- DQN ---------------------------------------------------------------------------------------


def test_ensemble_members_are_independent():
    torch.manual_seed(0)
    net = EnsembleMLP(3, 2, 8, 5)
    x = torch.rand(3, 4, 2)
    net(x)[1].sum().backward()
    for weight in net.weights:
        assert weight.grad[0].abs().sum() == 0
        assert weight.grad[2].abs().sum() == 0
        assert weight.grad[1].abs().sum() > 0


def test_dqn_and_curb_dqn_train_deterministically(bertrand):
    market, _, _, eq = bertrand
    configs = [
        DQNConfig(steps=400, learning_starts=64, target_every=50, buffer_size=200, beta=1e-2)
    ]
    configs.append(
        DQNConfig(
            steps=400,
            learning_starts=64,
            target_every=50,
            buffer_size=200,
            beta=1e-2,
            penalty=0.2,
            belief=True,
        )
    )
    env = RepeatedMarketEnv(market)
    first = train_dqn(env, configs, seed=1, trace_every=100)
    second = train_dqn(env, configs, seed=1, trace_every=100)
    assert first.greedy.shape == (2, 2, M * M)
    np.testing.assert_array_equal(first.greedy, second.greedy)
    np.testing.assert_array_equal(first.reward_trace, second.reward_trace)
    assert first.reward_trace.shape == (2, 4)
    # act() plays the greedy tables: the action after history (a_0, a_1) is greedy[a_0·m + a_1].
    assert first.act({"firm_0": np.array([3, 9]), "firm_1": np.array([3, 9])}, session=1) == {
        "firm_0": first.greedy[1, 0, 3 * M + 9],
        "firm_1": first.greedy[1, 1, 3 * M + 9],
    }
    outcome = analyse_policy(
        first.greedy[1],
        int(first.last_state[1]),
        env.payoff_table,
        env.grid,
        eq,
        delta=0.95,
        competitive_direction=-1,
    )
    assert np.isfinite(outcome.collusion)


# --- environment, CLI, experiment --------------------------------------------------------------


def test_pettingzoo_parallel_api():
    from pettingzoo.test import parallel_api_test

    parallel_api_test(RepeatedMarketEnv(max_cycles=30), num_cycles=60)
    parallel_api_test(
        RepeatedMarketEnv(LinearCournot(n_firms=3), memory=2, max_cycles=10), num_cycles=30
    )


def test_env_rewards_are_the_profit_table(bertrand):
    _, _, table, _ = bertrand
    env = RepeatedMarketEnv(max_cycles=3)
    observations, _ = env.reset(seed=0)
    assert observations["firm_0"].shape == (2,)
    observations, rewards, _, truncations, infos = env.step({"firm_0": 4, "firm_1": 9})
    assert rewards["firm_1"] == pytest.approx(table[4 * M + 9, 1])
    np.testing.assert_array_equal(env.payoff_table, table)
    assert observations["firm_1"].tolist() == [4, 9]
    assert "prices" in infos["firm_0"]
    assert not truncations["firm_0"]
    with pytest.raises(ValueError, match="actions"):
        env.step({"firm_0": 4})
    with pytest.raises(ValueError, match="actions"):
        env.step({"firm_0": 4, "firm_1": 15})
    with pytest.raises(ValueError, match="reset"):
        RepeatedMarketEnv().step({"firm_0": 0, "firm_1": 0})


def test_cli_simulate_and_errors(tmp_path, capsys):
    from mixlab.rl.cli import main

    assert (
        main(["curb", "simulate", "--market", "cournot", "--sessions", "2", "--out", str(tmp_path)])
        == 0
    )
    saved = json.loads((tmp_path / "sessions.json").read_text())
    assert len(saved["sessions"]) == 2
    assert np.load(tmp_path / "greedy_policies.npy").shape == (2, 2, M * M)
    assert main(["curb", "equilibria", "--market", "cournot"]) == 0
    assert "0.11111" in capsys.readouterr().out
    assert main(["curb", "simulate", "--market", "hotelling"]) == 2
    assert main(["curb", "equilibria", "--n-firms", "1"]) == 2
    assert "--n-firms" in capsys.readouterr().err


def test_experiment_runs_and_resumes(tmp_path):
    from mixlab.rl.curb.experiment import METHOD, Config, run

    config = Config(n_sessions=2, dqn_steps=300, dqn_seeds=1, beta=2e-5)
    result = METHOD.execute(config, tmp_path)  # refuses a claim not judged from Config.CLAIMS
    assert result.cache["state"] == "none"  # nothing one-time to reuse
    assert {"bertrand/q-learning", "cournot/curb", "bertrand/dqn", "bertrand/curb-dqn"} <= set(
        result.metrics
    )
    # Q-learning's collusion is the regime check; CURB in each game, belief injection's own
    # effect, DQN colludes and CURB-DQN unwinds are claims.
    assert len(result.claims) == 5
    assert all(claim.key and claim.control is not None for claim in result.claims)
    assert {claim.control.system for claim in result.claims} == {"myopic"}
    assert "lock-in share" in result.claims[1].evidence
    assert "cournot p" in result.claims[2].evidence
    # The frozen-at-start control sits beside every system: Cournot's is Δ = −0.21, locked.
    frozen = result.metrics["cournot/frozen-start"]
    assert frozen["collusion"] == pytest.approx(-0.21, abs=1e-6)
    assert frozen["lock_in_share"] == 1.0
    assert result.metrics["bertrand/q-learning"]["lock_in_share"] == 0.0
    assert result.metrics["cournot/curb"]["belief_effect_p"] is not None
    assert result.metrics["cournot/penalty"]["belief_effect_p"] is None
    assert result.metrics["cournot/myopic"]["closer_than_penalty_p"] is not None
    # Each DQN system is its own cell (timed on its own); lock-in is not defined for DQN.
    dqn_cells = [c for c in json.loads((tmp_path / "cells.json").read_text()) if c["kind"] == "dqn"]
    assert [(c["system"], c["dqn"]["belief"]) for c in dqn_cells] == [
        ("dqn", False),
        ("curb-dqn", True),
    ]
    assert all(len(c["sessions"]) == config.dqn_seeds for c in dqn_cells)
    assert result.metrics["bertrand/dqn"]["lock_in_share"] is None
    assert len(result.regime) == 1
    assert "Q-learning colludes" in result.regime[0].text
    assert "Δ" in result.regime[0].evidence
    assert "punishing" in result.regime[0].evidence
    assert (tmp_path / "collusion.png").exists()
    assert (tmp_path / "impulse_response.png").exists()
    again = run(config, tmp_path, resume=True)
    assert again.metrics == result.metrics
    with pytest.raises(ValueError, match="grid_alphas"):
        Config(grid_alphas=(0.1,))
