"""What converged greedy policies do: their cycle, collusion index, impulse response and TV
dependence on the rival's history.

A policy here is the tabular greedy strategy of every firm, ``policy[i, s]`` = firm i's action in
state s (memory-k history, encoded as in :mod:`mixlab.rl.curb.qlearning`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mixlab.rl.curb.config import COMPETITIVE_BAND
from mixlab.rl.curb.env import RepeatedMarketEnv, repeated_game
from mixlab.rl.curb.markets import Equilibria, best_response_table, collusion_index, equilibria
from mixlab.rl.curb.qlearning import Sessions, append_action, initial_q
from mixlab.shared import is_count, require


def _profile(policy: np.ndarray, state: int, m: int) -> int:
    profile = 0
    for action in policy[:, state]:
        profile = append_action(profile, int(action), m)
    return profile


def start_actions(table: np.ndarray, n_actions: int, n_firms: int) -> np.ndarray:
    """Every firm's greedy action under Calvano's Eq. 8 initial Q, [n]: the best action against
    uniformly random rivals, the same in every state and for every δ. A learner that never moves
    its greedy policy plays this profile forever."""
    return initial_q(table, n_actions, n_firms, 0.0).argmax(axis=1)


def start_profile(table: np.ndarray, n_actions: int, n_firms: int) -> int:
    """The profile of :func:`start_actions`, as a row of the payoff table (the only state of a
    one-state policy that plays it)."""
    return _profile(start_actions(table, n_actions, n_firms)[:, None], 0, n_actions)


def _next_state(state: int, profile: int, m: int, n: int, n_states: int) -> int:
    return (state * m**n + profile) % n_states


def _actions(profile: int, m: int, n: int) -> np.ndarray:
    return np.array(np.unravel_index(profile, [m] * n))


def converged_cycle(policy: np.ndarray, start: int, n_actions: int) -> list[int]:
    """States of the cycle that greedy play from ``start`` falls into (in order of play)."""
    n, n_states = policy.shape
    require(0 <= start < n_states, "start", f"a state in [0, {n_states})", start)
    seen: dict[int, int] = {}
    path = []
    state = start
    while state not in seen:
        seen[state] = len(path)
        path.append(state)
        state = _next_state(state, _profile(policy, state, n_actions), n_actions, n, n_states)
    return path[seen[state] :]


def cycle_profits(policy: np.ndarray, cycle: list[int], table: np.ndarray) -> np.ndarray:
    """Per-firm profit averaged over the cycle, [n]."""
    m = round(table.shape[0] ** (1 / policy.shape[0]))
    return table[[_profile(policy, s, m) for s in cycle]].mean(axis=0)


@dataclass
class ImpulseResponse:
    """Play around a forced one-period deviation, averaged over the states of the cycle.

    Index 0 of ``actions`` and ``profits`` ([T + 2, n]) is the pre-shock period, index 1 the
    deviation, then T periods of greedy play. ``punished``: the rivals' action moved towards
    competition in the period after the deviation (Calvano's sign of a punishment).
    ``deviation_gain``: Σ_t δ^t (π_dev,t − π_cycle,t) of the deviator over the T + 1 periods from
    the deviation on; negative means the deviation does not pay. ``undercut_share``: the share of
    cycle states where the deviator already played its static best response, so that the forced
    deviation was one grid step towards competition instead.
    """

    actions: np.ndarray
    profits: np.ndarray
    deviator: int
    punished: bool
    rival_response: float
    deviation_gain: float
    undercut_share: float = 0.0


def impulse_response(
    policy: np.ndarray,
    cycle: list[int],
    table: np.ndarray,
    grid: np.ndarray,
    *,
    deviator: int = 0,
    deviation: int | None = None,
    periods: int = 25,
    delta: float = 0.95,
    competitive_direction: int = -1,
) -> ImpulseResponse:
    """Force ``deviator`` to play ``deviation`` (default: its static best response to the rivals'
    cycle actions, Calvano's ``ir_type = 0``, or one grid step towards competition where that is
    what it plays already) for one period from every state of the cycle, then
    let every firm follow its greedy policy for ``periods`` periods; average over cycle states."""
    n, n_states = policy.shape
    m = grid.size
    require(0 <= deviator < n, "deviator", f"a firm in [0, {n})", deviator)
    require(is_count(periods), "periods", "an integer >= 1", periods)
    require(len(cycle) >= 1, "cycle", "one or more states", cycle)
    if deviation is not None:
        require(0 <= deviation < m, "deviation", f"an action in [0, {m})", deviation)
    responses = best_response_table(table, m, n)
    rivals = [j for j in range(n) if j != deviator]
    actions = np.zeros((len(cycle), periods + 2, n), dtype=np.int64)
    profits = np.zeros((len(cycle), periods + 2, n))
    on_cycle = np.zeros((len(cycle), periods + 1))
    fallbacks = 0
    for c, start in enumerate(cycle):
        profile = _profile(policy, start, m)
        actions[c, 0] = _actions(profile, m, n)
        profits[c, 0] = table[profile]
        forced = actions[c, 0].copy()
        if deviation is not None:
            forced[deviator] = deviation
        else:
            forced[deviator] = responses[deviator, profile]
            if forced[deviator] == actions[c, 0, deviator]:
                # Already best-responding (near the static Nash point): the static best
                # response is no deviation at all, so move one grid step towards competition.
                step = (
                    competitive_direction
                    if 0 <= forced[deviator] + competitive_direction < m
                    else -competitive_direction
                )
                forced[deviator] += step
                fallbacks += 1
        state = start
        for t in range(1, periods + 2):
            played = forced if t == 1 else policy[:, state]
            profile = int(np.ravel_multi_index(tuple(played), [m] * n))
            actions[c, t] = played
            profits[c, t] = table[profile]
            state = _next_state(state, profile, m, n, n_states)
        for t in range(periods + 1):  # the deviator's profit had nobody deviated
            on_cycle[c, t] = table[_profile(policy, cycle[(c + t) % len(cycle)], m), deviator]
    mean_actions = grid[actions].mean(axis=0)
    discount = delta ** np.arange(periods + 1)
    gain = (discount * (profits[:, 1:, deviator] - on_cycle)).sum(axis=1).mean()
    response = mean_actions[2, rivals].mean() - mean_actions[0, rivals].mean()
    step = (grid[-1] - grid[0]) / (m - 1)
    return ImpulseResponse(
        actions=mean_actions,
        profits=profits.mean(axis=0),
        deviator=deviator,
        punished=bool(competitive_direction * response > 1e-6 * step),
        rival_response=float(response),
        deviation_gain=float(gain),
        undercut_share=fallbacks / len(cycle),
    )


def greedy_probabilities(policy_row: np.ndarray, n_actions: int) -> np.ndarray:
    """One-hot [S, m] action distribution of a greedy policy [S]."""
    return np.eye(n_actions)[policy_row]


def softmax_probabilities(q: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(Q/τ) over the last axis."""
    require(temperature > 0, "temperature", "> 0", temperature)
    logits = q / temperature
    logits = logits - logits.max(axis=-1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(axis=-1, keepdims=True)


def _by_history(probabilities: np.ndarray, firm: int) -> np.ndarray:
    """[own previous action, rival previous action, action] view of a 2-firm memory-1 policy."""
    n_states, m = probabilities.shape
    require(
        n_states == m * m,
        "probabilities",
        f"shape [{m * m}, {m}] (2 firms, memory 1)",
        probabilities.shape,
    )
    require(firm in (0, 1), "firm", "0 or 1", firm)
    table = probabilities.reshape(m, m, m)  # [firm 0's, firm 1's previous action, action]
    return table if firm == 0 else table.transpose(1, 0, 2)


def rival_marginal_policy(
    probabilities: np.ndarray, firm: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """p̄_i(·|a_i⁻) = Σ_{a_j⁻} w(a_i⁻, a_j⁻)·π_i(·|a_i⁻, a_j⁻) / Σ w: firm's policy [S, m] averaged
    over the rival's previous action, [m own previous actions, m]. ``weights`` [S]: state visit
    weights (default uniform)."""
    by_history = _by_history(probabilities, firm)
    m = by_history.shape[0]
    w = np.ones(m * m) if weights is None else np.asarray(weights, np.float64)
    require(
        w.shape == (m * m,) and bool(np.all(w >= 0)),
        "weights",
        f"{m * m} non-negative numbers",
        w.shape,
    )
    w = w.reshape(m, m) if firm == 0 else w.reshape(m, m).T
    total = w.sum(axis=1, keepdims=True)
    w = np.where(total > 0, w / np.where(total > 0, total, 1), 1 / m)
    return np.einsum("or,ora->oa", w, by_history)


def dependence_penalty(
    probabilities: np.ndarray, firm: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """CURB's per-(state, action) penalty ℓ_i(s, a) = 1 − p̄_i(a | a_i⁻), [S, m]. Zero on the
    played actions of a policy that ignores the rival's history."""
    m = probabilities.shape[1]
    marginal = rival_marginal_policy(probabilities, firm, weights)
    own = np.arange(m * m) // m if firm == 0 else np.arange(m * m) % m
    return 1.0 - marginal[own]


def tv_dependence(probabilities: np.ndarray, firm: int) -> np.ndarray:
    """TV_i(a_i⁻; a_j, a_j') = ½ Σ_a |π_i(a|a_i⁻, a_j) − π_i(a|a_i⁻, a_j')|, [m, m, m]."""
    by_history = _by_history(probabilities, firm)
    return 0.5 * np.abs(by_history[:, :, None, :] - by_history[:, None, :, :]).sum(axis=-1)


@dataclass
class Dependence:
    """TV statistics of one firm's policy: D_i = E_{a_i⁻} max_{a_j, a_j'} TV_i, and the
    cooperate-versus-defect TV_i^cd = TV_i(a_i^c; a_j^c, BR_j(a_i^c)) at the cycle's first state."""

    aggregate: float
    cooperate_defect: float


def policy_dependence(
    probabilities: np.ndarray, firm: int, cycle_state: int, table: np.ndarray
) -> Dependence:
    """TV statistics of firm's [S, m] policy; the cooperative actions are those of ``cycle_state``."""
    m = probabilities.shape[1]
    tv = tv_dependence(probabilities, firm)
    own_c, rival_c = (cycle_state // m, cycle_state % m)
    if firm == 1:
        own_c, rival_c = rival_c, own_c
    # The rival's static best response to firm's cooperative action (its own digit is ignored).
    profile = append_action(own_c, rival_c, m) if firm == 0 else append_action(rival_c, own_c, m)
    rival_d = best_response_table(table, m, 2)[1 - firm, profile]
    return Dependence(
        aggregate=float(tv.max(axis=(1, 2)).mean()),
        cooperate_defect=float(tv[own_c, rival_c, rival_d]),
    )


@dataclass
class SessionOutcome:
    """One converged session: collusion index over its cycle, cycle length, mean action, impulse
    response (firm 0 deviates), firm-averaged TV statistics of the greedy policies, and whether
    the cycle is the Eq. 8 start profile played forever (``locked_at_start``: the outcome of a
    learner frozen at its initial greedy policy; None when the learner did not start from Eq. 8,
    as DQN and the stepped learners do not)."""

    collusion: float
    cycle_length: int
    mean_action: float
    impulse: ImpulseResponse
    tv_aggregate: float | None
    tv_cooperate_defect: float | None
    locked_at_start: bool | None = None


def analyse_policy(
    policy: np.ndarray,
    last_state: int,
    table: np.ndarray,
    grid: np.ndarray,
    eq: Equilibria,
    *,
    delta: float,
    competitive_direction: int,
    periods: int = 25,
    start: int | None = None,
) -> SessionOutcome:
    """Freeze ``policy``, find its cycle from ``last_state`` and measure it. ``start``: the
    profile the learner started from (:func:`start_profile` for Calvano's Eq. 8), for
    ``locked_at_start``; None leaves that None."""
    m = grid.size
    cycle = converged_cycle(policy, last_state, m)
    profits = cycle_profits(policy, cycle, table)
    played = np.array([_actions(_profile(policy, s, m), m, policy.shape[0]) for s in cycle])
    impulse = impulse_response(
        policy,
        cycle,
        table,
        grid,
        periods=periods,
        delta=delta,
        competitive_direction=competitive_direction,
    )
    tv_aggregate = tv_cd = None
    if policy.shape == (2, m * m):
        stats = [
            policy_dependence(greedy_probabilities(policy[i], m), i, cycle[0], table)
            for i in range(2)
        ]
        tv_aggregate = float(np.mean([d.aggregate for d in stats]))
        tv_cd = float(np.mean([d.cooperate_defect for d in stats]))
    return SessionOutcome(
        collusion=float(collusion_index(profits, eq)),
        cycle_length=len(cycle),
        mean_action=float(grid[played].mean()),
        impulse=impulse,
        tv_aggregate=tv_aggregate,
        tv_cooperate_defect=tv_cd,
        locked_at_start=None
        if start is None
        else all(_profile(policy, s, m) == start for s in cycle),
    )


def _market_env(env: Any) -> RepeatedMarketEnv:
    market_env = getattr(env, "unwrapped", env)
    require(
        isinstance(market_env, RepeatedMarketEnv),
        "played.env",
        "a RepeatedMarketEnv, possibly wrapped (collusion is measured against its market's "
        "Nash and monopoly profits)",
        type(market_env).__name__,
    )
    return market_env


def _analyse(
    market_env: RepeatedMarketEnv,
    policy: np.ndarray,
    last_state: int,
    delta: float,
    periods: int,
    start: int | None,
) -> SessionOutcome:
    return analyse_policy(
        policy,
        last_state,
        market_env.payoff_table,
        market_env.grid,
        equilibria(market_env.market),
        delta=delta,
        competitive_direction=market_env.market.competitive_direction,
        periods=periods,
        start=start,
    )


def frozen_start(env: Any, *, delta: float = 0.95, periods: int = 25) -> SessionOutcome:
    """The control for every learner on ``env`` (a :class:`~mixlab.rl.curb.RepeatedMarketEnv`):
    the outcome of never learning, every firm playing its Eq. 8 greedy action
    (:func:`start_actions`) in every memory-1 state. A system whose sessions end here has not
    unwound anything; it never left the start."""
    market_env = _market_env(env)
    n, m = len(market_env.possible_agents), market_env.grid.size
    table = market_env.payoff_table
    policy = np.repeat(start_actions(table, m, n)[:, None], m**n, axis=1)
    return _analyse(market_env, policy, 0, delta, periods, start_profile(table, m, n))


def analyse_sessions(
    played: Any, *, delta: float = 0.95, periods: int = 25
) -> list[SessionOutcome]:
    """:func:`analyse_policy` for every session of ``played`` (the result of
    :func:`~mixlab.rl.curb.train_sessions` or :func:`~mixlab.rl.curb.train_dqn` on a
    :class:`~mixlab.rl.curb.RepeatedMarketEnv`, possibly wrapped). Deviations are valued at
    ``delta`` (Calvano's δ by default, also for myopic learners). Sessions of the compiled
    Q-learning path start from Calvano's Eq. 8, so theirs record ``locked_at_start``."""
    market_env = _market_env(played.env)
    require(
        played.greedy is not None,
        "played.greedy",
        "tabular greedy policies (train_dqn gives them on 2-firm markets only)",
        None,
    )
    start = None
    if isinstance(played, Sessions) and repeated_game(played.env) is not None:
        table = market_env.payoff_table
        start = start_profile(table, market_env.grid.size, played.greedy.shape[1])
    return [
        _analyse(market_env, policy, int(last), delta, periods, start)
        for policy, last in zip(played.greedy, played.last_state, strict=True)
    ]


def session_record(outcome: SessionOutcome, periods: int, converged: bool | None) -> dict[str, Any]:
    """One session's numbers as JSON-ready values; ``converged`` is None for DQN (trained for a
    fixed budget)."""
    impulse = outcome.impulse
    return {
        "collusion": outcome.collusion,
        "cycle_length": outcome.cycle_length,
        "mean_action": outcome.mean_action,
        "punished": impulse.punished,
        "rival_response": impulse.rival_response,
        "deviation_gain": impulse.deviation_gain,
        "undercut_share": impulse.undercut_share,
        "tv_aggregate": outcome.tv_aggregate,
        "tv_cooperate_defect": outcome.tv_cooperate_defect,
        "locked_at_start": outcome.locked_at_start,
        "periods": int(periods),
        "converged": None if converged is None else bool(converged),
        "impulse_actions": impulse.actions.tolist(),
    }


def band_distance(collusion: np.ndarray) -> np.ndarray:
    """How far each Δ lies outside the competitive band [−0.1, 0.2] (0 inside): above it is
    collusion left, below it overshoot past the one-shot Nash profits."""
    low, high = COMPETITIVE_BAND
    return np.maximum(0.0, np.maximum(collusion - high, low - collusion))


def summarise_records(sessions: list[dict[str, Any]]) -> dict[str, float | None]:
    """Summary of :func:`session_record` rows: the distribution of Δ (mean, sample std, s.e.,
    median, shares below 0.1, below −0.1 and inside the competitive band, mean distance to the
    band), the share locked at the start profile, punishment and deviation statistics, TV
    statistics and convergence (means over the sessions that have the number)."""

    def mean(name: str) -> float | None:
        values = [s[name] for s in sessions if s[name] is not None]
        return float(np.mean(values)) if values else None

    collusion = np.array([s["collusion"] for s in sessions])
    return {
        "collusion": float(collusion.mean()),
        "collusion_std": float(collusion.std(ddof=1)) if collusion.size > 1 else 0.0,
        "collusion_se": float(collusion.std(ddof=1) / np.sqrt(collusion.size))
        if collusion.size > 1
        else 0.0,
        "share_below_0.1": float(np.mean(collusion < 0.1)),
        # Overshoot: more competitive than the one-shot Nash equilibrium.
        "share_below_minus_0.1": float(np.mean(collusion < -0.1)),
        "collusion_median": float(np.median(collusion)),
        "share_in_band": float(np.mean(band_distance(collusion) == 0)),
        "band_distance": float(band_distance(collusion).mean()),
        "lock_in_share": mean("locked_at_start"),
        "punished_share": mean("punished"),
        "rival_response": mean("rival_response"),
        "deviation_gain": mean("deviation_gain"),
        "unprofitable_deviation_share": float(np.mean([s["deviation_gain"] < 0 for s in sessions])),
        "undercut_share": mean("undercut_share"),
        "mean_action": mean("mean_action"),
        "cycle_length": mean("cycle_length"),
        "tv_aggregate": mean("tv_aggregate"),
        "tv_cooperate_defect": mean("tv_cooperate_defect"),
        "periods": mean("periods"),
        "converged_share": mean("converged"),
        "sessions": float(len(sessions)),
    }
