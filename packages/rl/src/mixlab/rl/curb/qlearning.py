"""Tabular Q-learning in repeated oligopoly games, exactly as Calvano et al. (2020), with CURB.

Every firm is an independent Q-learner whose state is the last ``memory`` action profiles
(s = Σ digits in base m; the newest profile is the least significant n digits, firm 0 first).

- Initialisation (Calvano Eq. 8): Q_i,0(s, a) = Σ_{a_−i} π_i(a, a_−i) / ((1 − δ)·m^{n−1}) for every s.
- Exploration: ε_t = exp(−βt); with probability ε_t a uniformly random action, else the greedy one
  (ties go to the lowest action).
- Update: Q_i(s_t, a_t) ← (1 − α)·Q_i(s_t, a_t) + α·(r_i,t + δ·max_a Q_i(s_t+1, a)).
- Convergence: no firm's greedy action changed in any state for ``stable_periods`` periods
  (Calvano: 100,000), or the cap ``max_periods`` (Calvano: 10^9) is hit.

CURB (a reconstruction of the paper from its abstract; see ``seeds/curb.md``) changes two lines:

- **penalty** (reward shaping): r̃_i,t = π_i,t − λ_t·(1 − p̄_i(a_i,t | a_i⁻)), where p̄_i(·|a_i⁻) is
  i's greedy policy averaged over the rival's previous action, weighted by decayed state visits,
  and λ_t = λ_max·(1 − ε_t) ramps up as exploration dies out. For a greedy policy, 1 − p̄_i is the
  total-variation distance between i's action in this state and its rival-averaged policy: zero
  when i ignores the rival's history.
- **belief injection**: the TD continuation replaces the rival's part of s_t+1 by a
  fictitious-play belief b_i (the empirical marginal of the rival's actions):
  y = r̃ + δ·Σ_{a'} b_i(a')·max_a Q_i((a_i,t, a'), a). This cuts the credit assignment
  "my price now → the rival's reaction → my future profit" that sustains punishments.

:func:`train_sessions` takes a PettingZoo ``ParallelEnv``. On a repeated stage game (an unwrapped
:class:`~mixlab.rl.curb.RepeatedGame`: Calvano's protocol needs the payoff table for Eq. 8 and the
state encoding for belief injection) the session loop is one numba function. Sessions run in
parallel (``prange``), each drawing from its own splitmix64 stream, so a seed gives the same
session on any number of threads. :func:`reference_session` is the same loop written as plain
Python on lists (:func:`train_sessions` with ``python=True``): the reference that the tests hold
the compiled loop to, bit for bit, and the speed benchmark's baseline. Any other env with
``Discrete`` actions is stepped by :func:`_stepped_sessions` (plain Q-learning; CURB's penalty
through :class:`~mixlab.rl.curb.CurbShaping`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from mixlab.rl.curb.config import MAX_TABLE_BYTES, q_table_bytes
from mixlab.rl.curb.env import discrete_actions, repeated_game
from mixlab.shared import is_count, progress, require
from mixlab.shared.progress_report import progress_mode

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2^-53
_MASK = (1 << 64) - 1
_GOLDEN_INT, _MIX1_INT, _MIX2_INT = int(_GOLDEN), int(_MIX1), int(_MIX2)


def append_action(code: Any, action: Any, n_actions: int) -> Any:
    """The encoding of action profiles and states that the learners and the analysis share:
    ``code`` (the actions so far, as a base-m number) followed by one more action, code·m + action.
    The duopoly profile (a_0, a_1) is ``append_action(a_0, a_1, m)``, the payoff table's row
    (:class:`~mixlab.rl.curb.RepeatedGame`) and a memory-1 state; longer profiles fold it over the
    firms. Ints, NumPy arrays and torch tensors alike. It lives in this file because the compiled
    loop calls a numba copy of it, and numba's on-disk cache only notices edits to the cached
    function's own file."""
    return code * n_actions + action


_append = numba.njit(cache=True)(append_action)


@numba.njit(cache=True)
def _uniform(rng: np.ndarray) -> float:
    """Next float in [0, 1) of the splitmix64 stream whose state is ``rng[0]``."""
    rng[0] += _GOLDEN
    z = rng[0]
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    return float(z >> np.uint64(11)) * _TO_UNIT


@numba.njit(cache=True)
def _random_action(rng: np.ndarray, m: int) -> int:
    return min(int(_uniform(rng) * m), m - 1)


@numba.njit(cache=True)
def _own_digit(state: int, firm: int, m: int, n: int) -> int:
    """Firm's action in the newest profile of ``state``."""
    return (state // m ** (n - 1 - firm)) % m


@numba.njit(cache=True, inline="always")
def td_target(reward, delta, value, next_state, belief, rival_counts, firm, own_action, m):
    """Firm ``firm``'s TD target y. Q-learning: r + δ·V(s'). With CURB's belief injection (duopoly,
    memory 1) the rival's part of s' is replaced by the fictitious-play belief
    b = rival_counts[firm] / Σ counts: y = r + δ·Σ_{a'} b(a')·V(s(a_i, a')), where s(a_i, a') puts
    firm 0's action first. ``value`` [n, S] holds every firm's max_a Q(s, a); ``own_action`` is the
    firm's action this period. (Whole arrays and an index rather than row views, and inlined:
    views and a call per firm and period cost the compiled loop 10–40 % of its speed.)"""
    if not belief:
        return reward + delta * value[firm, next_state]
    continuation = 0.0
    total = 0.0
    for rival_action in range(m):
        if firm == 0:
            believed = _append(own_action, rival_action, m)
        else:
            believed = _append(rival_action, own_action, m)
        continuation += rival_counts[firm, rival_action] * value[firm, believed]
        total += rival_counts[firm, rival_action]
    return reward + delta * (continuation / total)


@numba.njit(cache=True)
def _session(
    table,
    m,
    n,
    alpha,
    beta,
    delta,
    penalty,
    belief,
    visit_decay,
    stable_periods,
    max_periods,
    seed,
    q,
    greedy,
):
    """Run one session in place on ``q`` [n, S, m] and ``greedy`` [n, S] (already initialised).
    Returns (periods, converged, last state)."""
    n_states = q.shape[1]
    n_profiles = m**n
    rng = np.empty(1, np.uint64)
    rng[0] = np.uint64(seed)
    value = np.empty((n, n_states))
    for i in range(n):
        for s in range(n_states):
            value[i, s] = q[i, s].max()
    state = _random_action(rng, n_states)
    actions = np.zeros(n, np.int64)
    # Penalty: decayed visit weight w(s), kept in units of 1/scale so that decaying every weight
    # is one multiplication; chosen[i, own, a] = Σ_{s: own_i(s) = own} w(s)·1[g_i(s) = a].
    visits = np.zeros(n_states)
    chosen = np.zeros((n, m, m))
    own_weight = np.zeros((n, m))
    scale = 1.0
    # Belief injection: counts of each rival action, with one pseudo-count each (uniform prior).
    rival_counts = np.ones((n, m))
    stable = 0
    t = 0
    while t < max_periods and stable < stable_periods:
        epsilon = math.exp(-beta * t)
        profile = 0
        for i in range(n):
            if _uniform(rng) < epsilon:
                actions[i] = _random_action(rng, m)
            else:
                actions[i] = greedy[i, state]
            profile = _append(profile, actions[i], m)
        next_state = (state * n_profiles + profile) % n_states
        if penalty > 0:
            scale *= visit_decay
            if scale < 1e-200:
                visits *= scale
                chosen *= scale
                own_weight *= scale
                scale = 1.0
            visits[state] += 1.0 / scale
            for i in range(n):
                own = _own_digit(state, i, m, n)
                chosen[i, own, greedy[i, state]] += 1.0 / scale
                own_weight[i, own] += 1.0 / scale
        weight = penalty * (1.0 - epsilon)
        changed = False
        for i in range(n):
            a = actions[i]
            reward = table[profile, i]
            if penalty > 0:
                own = _own_digit(state, i, m, n)
                reward -= weight * (1.0 - chosen[i, own, a] / own_weight[i, own])
            target = td_target(reward, delta, value, next_state, belief, rival_counts, i, a, m)
            q[i, state, a] = (1.0 - alpha) * q[i, state, a] + alpha * target
            best = 0
            for b in range(1, m):
                if q[i, state, b] > q[i, state, best]:
                    best = b
            value[i, state] = q[i, state, best]
            if best != greedy[i, state]:
                if penalty > 0:
                    own = _own_digit(state, i, m, n)
                    chosen[i, own, greedy[i, state]] -= visits[state]
                    chosen[i, own, best] += visits[state]
                greedy[i, state] = best
                changed = True
        if belief:
            for i in range(n):
                rival_counts[i, actions[1 - i]] += 1.0
        stable = 0 if changed else stable + 1
        state = next_state
        t += 1
    return t, stable >= stable_periods, state


@numba.njit(parallel=True, nogil=True, cache=True)
def _sessions(
    table,
    m,
    n,
    alpha,
    beta,
    delta,
    penalty,
    belief,
    visit_decay,
    stable_periods,
    max_periods,
    seeds,
    q,
    greedy,
    periods,
    converged,
    last_state,
):
    for b in numba.prange(seeds.shape[0]):
        periods[b], converged[b], last_state[b] = _session(
            table,
            m,
            n,
            alpha,
            beta,
            delta,
            penalty,
            belief,
            visit_decay,
            stable_periods,
            max_periods,
            seeds[b],
            q[b],
            greedy[b],
        )


def reference_session(
    table: list[list[float]],
    m: int,
    n: int,
    alpha: float,
    beta: float,
    delta: float,
    penalty: float,
    belief: bool,
    visit_decay: float,
    stable_periods: int,
    max_periods: int,
    seed: int,
    q: list[list[list[float]]],
    greedy: list[list[int]],
) -> tuple[int, bool, int]:
    """The session loop as plain Python on lists, what a user would write without a compiler: the
    reference the compiled ``_session`` must equal bit for bit (same splitmix64 stream, same
    floating-point operations in the same order) and the speed benchmark's baseline. Updates ``q``
    [n][S][m] and ``greedy`` [n][S] in place; returns (periods, converged, last state). Shares no
    state between calls, so sessions may run in threads."""
    n_states = len(q[0])
    n_profiles = m**n
    places = [m ** (n - 1 - i) for i in range(n)]  # state → firm i's newest action: // place % m
    rng = seed

    def uniform() -> float:
        nonlocal rng
        rng = (rng + _GOLDEN_INT) & _MASK
        z = rng
        z = ((z ^ (z >> 30)) * _MIX1_INT) & _MASK
        z = ((z ^ (z >> 27)) * _MIX2_INT) & _MASK
        z ^= z >> 31
        return (z >> 11) * _TO_UNIT

    value = [[max(row) for row in q[i]] for i in range(n)]
    state = min(int(uniform() * n_states), n_states - 1)
    actions = [0] * n
    visits = [0.0] * n_states
    chosen = [[[0.0] * m for _ in range(m)] for _ in range(n)]
    own_weight = [[0.0] * m for _ in range(n)]
    scale = 1.0
    rival_counts = [[1.0] * m for _ in range(n)]
    stable = t = 0
    while t < max_periods and stable < stable_periods:
        epsilon = math.exp(-beta * t)
        profile = 0
        for i in range(n):
            if uniform() < epsilon:
                actions[i] = min(int(uniform() * m), m - 1)
            else:
                actions[i] = greedy[i][state]
            profile = profile * m + actions[i]
        next_state = (state * n_profiles + profile) % n_states
        if penalty > 0:
            scale *= visit_decay
            if scale < 1e-200:
                visits = [v * scale for v in visits]
                chosen = [[[c * scale for c in row] for row in firm] for firm in chosen]
                own_weight = [[w * scale for w in row] for row in own_weight]
                scale = 1.0
            visits[state] += 1.0 / scale
            for i in range(n):
                own = state // places[i] % m
                chosen[i][own][greedy[i][state]] += 1.0 / scale
                own_weight[i][own] += 1.0 / scale
        weight = penalty * (1.0 - epsilon)
        changed = False
        for i in range(n):
            a = actions[i]
            reward = table[profile][i]
            if penalty > 0:
                own = state // places[i] % m
                reward -= weight * (1.0 - chosen[i][own][a] / own_weight[i][own])
            if belief:
                continuation = total = 0.0
                for rival_action in range(m):
                    believed = a * m + rival_action if i == 0 else rival_action * m + a
                    continuation += rival_counts[i][rival_action] * value[i][believed]
                    total += rival_counts[i][rival_action]
                target = reward + delta * (continuation / total)
            else:
                target = reward + delta * value[i][next_state]
            row = q[i][state]
            row[a] = (1.0 - alpha) * row[a] + alpha * target
            best = 0
            for b in range(1, m):
                if row[b] > row[best]:
                    best = b
            value[i][state] = row[best]
            if best != greedy[i][state]:
                if penalty > 0:
                    own = state // places[i] % m
                    chosen[i][own][greedy[i][state]] -= visits[state]
                    chosen[i][own][best] += visits[state]
                greedy[i][state] = best
                changed = True
        if belief:
            for i in range(n):
                rival_counts[i][actions[1 - i]] += 1.0
        stable = 0 if changed else stable + 1
        state = next_state
        t += 1
    return t, stable >= stable_periods, state


@dataclass(frozen=True)
class QLearner:
    """Calvano's Q-learner (defaults = their baseline) with CURB's two switches (off by default)."""

    alpha: float = 0.15
    """learning rate α in (0, 1]"""
    beta: float = 4e-6
    """exploration decay β >= 0: ε_t = exp(−βt)"""
    delta: float = 0.95
    """discount factor δ in [0, 1) (0 is the myopic learner)"""
    memory: int = 1
    """periods of history in the state, k >= 0 (0: no memory, a single state)"""
    penalty: float = 0.0
    """CURB's λ_max >= 0 for the dependence penalty (0 switches it off)"""
    belief: bool = False
    """CURB's belief injection in the TD target"""
    visit_decay: float = 0.99999
    """per-period decay of the visit weights behind the penalty's rival-averaged policy"""
    stable_periods: int = 100_000
    """convergence: periods without any change of greedy policy"""
    max_periods: int = 1_000_000_000
    """cap on periods per session"""

    def __post_init__(self) -> None:
        require(0 < self.alpha <= 1, "alpha", "in (0, 1]", self.alpha)
        require(self.beta >= 0, "beta", ">= 0", self.beta)
        require(0 <= self.delta < 1, "delta", "in [0, 1)", self.delta)
        require(
            is_count(self.memory, 0) and self.memory <= 3, "memory", "0, 1, 2 or 3", self.memory
        )
        require(self.penalty >= 0, "penalty", ">= 0", self.penalty)
        require(0 < self.visit_decay <= 1, "visit_decay", "in (0, 1]", self.visit_decay)
        require(
            is_count(self.stable_periods), "stable_periods", "an integer >= 1", self.stable_periods
        )
        require(is_count(self.max_periods), "max_periods", "an integer >= 1", self.max_periods)
        if self.penalty > 0 or self.belief:
            require(
                self.memory == 1, "memory", "1 when CURB's penalty or belief is on", self.memory
            )

    @classmethod
    def curb(cls, penalty: float = 0.2, belief: bool = True, **kwargs) -> QLearner:
        """CURB: the ramped dependence penalty (λ_max = ``penalty``) plus belief injection."""
        return cls(penalty=penalty, belief=belief, **kwargs)


@dataclass
class Sessions:
    """Converged sessions on ``env``: Q tables [B, n, S, m], greedy policies [B, n, S], periods,
    converged flags and last states [B] (the first agent's state; on a repeated game everyone's).
    Actions an agent does not have (fewer than m) hold Q = −inf."""

    env: ParallelEnv
    learner: QLearner
    seeds: np.ndarray
    q: np.ndarray
    greedy: np.ndarray
    periods: np.ndarray
    converged: np.ndarray
    last_state: np.ndarray

    @property
    def n_actions(self) -> int:
        return self.q.shape[-1]


def initial_q(table: np.ndarray, n_actions: int, n_firms: int, delta: float) -> np.ndarray:
    """Calvano Eq. 8: each action's profit averaged over uniform rivals, discounted forever, [n, m]."""
    profits = table.reshape([n_actions] * n_firms + [n_firms])
    return np.stack(
        [
            np.moveaxis(profits[..., i], i, 0).reshape(n_actions, -1).mean(axis=1) / (1 - delta)
            for i in range(n_firms)
        ]
    )


def session_seeds(n_sessions: int, seed: int) -> np.ndarray:
    """Independent 64-bit stream seeds for sessions seed·2^20 + 0, 1, …"""
    base = np.uint64(seed) * np.uint64(1 << 20)
    return np.array([base + np.uint64(b) for b in range(n_sessions)], dtype=np.uint64)


def train_sessions(
    env: ParallelEnv,
    learner: QLearner | None = None,
    n_sessions: int = 1,
    *,
    seed: int = 0,
    python: bool = False,
) -> Sessions:
    """Play ``n_sessions`` independent seeded sessions on ``env`` to convergence.

    ``env`` is any PettingZoo ``ParallelEnv`` whose action spaces are ``Discrete``. On an
    unwrapped :class:`~mixlab.rl.curb.RepeatedGame` (such as
    :class:`~mixlab.rl.curb.RepeatedMarketEnv`) this is Calvano's protocol, compiled, with CURB's
    penalty and belief injection available; the learner's ``memory`` is at most the env's. Any
    other env is stepped: plain Q-learning by the same rules (:func:`_stepped_sessions`), CURB's
    penalty then coming from :class:`~mixlab.rl.curb.CurbShaping`. ``python=True`` runs
    :func:`reference_session`, the plain-Python loop on lists, one session after another (the
    reference for tests and benchmarks; the same numbers, more than ten times slower).
    """
    learner = learner or QLearner()
    require(is_count(n_sessions), "n_sessions", "an integer >= 1", n_sessions)
    require(is_count(seed, 0), "seed", "an integer >= 0", seed)
    sizes = discrete_actions(env)
    game = repeated_game(env)
    if game is None:
        return _stepped_sessions(env, learner, n_sessions, seed)
    n, m = len(sizes), sizes[0]
    require(len(set(sizes)) == 1, "env", "a RepeatedGame whose agents share one Discrete(m)", sizes)
    table = np.asarray(game.payoff_table, dtype=np.float64)
    require(table.shape == (m**n, n), "env.payoff_table", f"shape [{m**n}, {n}]", table.shape)
    require(
        learner.memory <= game.memory,
        "learner.memory",
        f"at most the env's memory {game.memory} (a learner remembers only what it observes)",
        learner.memory,
    )
    if learner.belief:
        require(n == 2, "env.possible_agents", "2 agents when CURB's belief injection is on", n)
    n_states = m ** (n * learner.memory)
    _check_table_bytes(
        q_table_bytes(n_sessions, n, m, learner.memory), "learner.memory", learner.memory
    )
    q0 = initial_q(table, m, n, learner.delta)
    q = np.broadcast_to(q0[None, :, None, :], (n_sessions, n, n_states, m)).copy()
    greedy = np.broadcast_to(q0.argmax(axis=1)[None, :, None], (n_sessions, n, n_states)).copy()
    seeds = session_seeds(n_sessions, seed)
    periods = np.zeros(n_sessions, np.int64)
    converged = np.zeros(n_sessions, np.bool_)
    last_state = np.zeros(n_sessions, np.int64)
    args = (
        table,
        m,
        n,
        learner.alpha,
        learner.beta,
        learner.delta,
        learner.penalty,
        learner.belief,
        learner.visit_decay,
        learner.stable_periods,
        learner.max_periods,
    )
    if python:
        with progress(n_sessions, "q-learning sessions (python)") as bar:
            for b in range(n_sessions):
                q_b, greedy_b = q[b].tolist(), greedy[b].tolist()
                periods[b], converged[b], last_state[b] = reference_session(
                    table.tolist(), *args[1:], int(seeds[b]), q_b, greedy_b
                )
                q[b], greedy[b] = q_b, greedy_b
                bar.advance()
    else:
        _compiled_sessions(args, seeds, q, greedy, periods, converged, last_state)
    return Sessions(env, learner, seeds, q, greedy, periods, converged, last_state)


def _compiled_sessions(
    args: tuple,
    seeds: np.ndarray,
    q: np.ndarray,
    greedy: np.ndarray,
    periods: np.ndarray,
    converged: np.ndarray,
    last_state: np.ndarray,
) -> None:
    """``_sessions`` in place. With progress shown it runs in a worker thread (it releases the
    GIL, under the caller's numba thread count, which numba keeps per thread) while this thread
    counts the finished sessions: a session's ``periods`` is set (>= 1) when it ends."""
    outputs = (seeds, q, greedy, periods, converged, last_state)
    if progress_mode() == "off":
        _sessions(*args, *outputs)
        return
    threads = numba.get_num_threads()
    failed: list[BaseException] = []

    def play() -> None:
        try:
            numba.set_num_threads(threads)
            _sessions(*args, *outputs)
        except BaseException as error:  # raised again in the caller's thread
            failed.append(error)

    worker = threading.Thread(target=play, name="q-learning sessions", daemon=True)
    with progress(len(seeds), "q-learning sessions") as bar:
        worker.start()
        while True:
            worker.join(0.25)
            bar.advance(int(np.count_nonzero(periods)) - bar.done)
            if not worker.is_alive():
                break
    if failed:
        raise failed[0]


def _check_table_bytes(table_bytes: int, parameter: str, value: object) -> None:
    require(
        table_bytes <= MAX_TABLE_BYTES,
        parameter,
        f"small enough that the Q tables fit in {MAX_TABLE_BYTES / 2**30:.0f} GiB "
        f"(states × actions × agents × n_sessions × 8 bytes = {table_bytes / 2**30:.1f} GiB; "
        "lower the memory, agents, actions or n_sessions)",
        value,
    )


# --- any ParallelEnv: the same Q-learning, stepping the env ---------------------------------------


def _state_index(space: spaces.Space, agent: str) -> tuple[int, Callable[[Any], int]]:
    """Number of states of a finite observation space, and observation → state index (a
    ``MultiDiscrete`` history is read as digits, the last one least significant)."""
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        return int(space.n), lambda observation: int(observation) - start
    if isinstance(space, spaces.MultiDiscrete) and space.nvec.ndim == 1:
        nvec, start = space.nvec, space.start
        return int(np.prod(nvec)), lambda observation: int(
            np.ravel_multi_index(tuple(np.asarray(observation) - start), nvec)
        )
    require(
        False,
        f"env.observation_space({agent!r})",
        "Discrete or 1-D MultiDiscrete (tabular Q-learning needs finitely many states; "
        "train_dqn learns from any observation)",
        space,
    )
    raise AssertionError  # unreachable: require raised


def _stepped_sessions(env: ParallelEnv, learner: QLearner, n_sessions: int, seed: int) -> Sessions:
    """Independent Q-learners on any ``ParallelEnv`` with ``Discrete`` actions, by stepping it.

    The rules are :class:`QLearner`'s (ε_t = exp(−βt), ties to the lowest action, the same update
    and convergence rule); the state is the agent's observation (``Discrete`` or ``MultiDiscrete``;
    ``memory=0``: one state), Q starts at 0, a terminated agent's target has no continuation, and
    the env is reset whenever every agent is done. Session b resets the env with seed
    ``seed·2^20 + b`` and draws its exploration from a generator with that seed. CURB's penalty
    comes from wrapping the env in :class:`~mixlab.rl.curb.CurbShaping`; the learner's own penalty
    and belief injection need the stage game (an unwrapped :class:`~mixlab.rl.curb.RepeatedGame`).
    """
    require(
        learner.penalty == 0 and not learner.belief,
        "learner",
        "a QLearner without penalty or belief on an env that is not an unwrapped RepeatedGame "
        "(CURB's built-in parts read the stage game's payoff table); wrap the env in "
        "CurbShaping(env, penalty=...) for CURB's penalty instead",
        learner,
    )
    require(
        learner.memory <= 1,
        "learner.memory",
        "0 (one state) or 1 (the observation is the state) on an env that is not a RepeatedGame",
        learner.memory,
    )
    sizes = discrete_actions(env)
    agents = list(env.possible_agents)
    n, m = len(agents), max(sizes)
    if learner.memory == 0:
        encoders = [(1, lambda observation: 0)] * n
    else:
        encoders = [_state_index(env.observation_space(agent), agent) for agent in agents]
    n_states = max(size for size, _ in encoders)
    _check_table_bytes(n_sessions * n * n_states * m * 8, "env.observation_space", n_states)
    q = np.zeros((n_sessions, n, n_states, m))
    for i, size in enumerate(sizes):
        q[:, i, :, size:] = -np.inf
    greedy = np.zeros((n_sessions, n, n_states), np.int64)
    seeds = session_seeds(n_sessions, seed)
    periods = np.zeros(n_sessions, np.int64)
    converged = np.zeros(n_sessions, np.bool_)
    last_state = np.zeros(n_sessions, np.int64)
    with progress(n_sessions, "q-learning sessions (stepped)") as bar:
        for b in range(n_sessions):
            periods[b], converged[b], last_state[b] = _env_session(
                env, learner, int(seeds[b]), q[b], greedy[b], sizes, encoders
            )
            bar.advance()
    return Sessions(env, learner, seeds, q, greedy, periods, converged, last_state)


def _env_session(
    env: ParallelEnv,
    learner: QLearner,
    seed: int,
    q: np.ndarray,
    greedy: np.ndarray,
    sizes: list[int],
    encoders: list[tuple[int, Callable[[Any], int]]],
) -> tuple[int, bool, int]:
    """One session on ``q`` [n, S, m] and ``greedy`` [n, S] in place; (periods, converged, the
    first agent's last state)."""
    index = {agent: i for i, agent in enumerate(env.possible_agents)}
    rng = np.random.default_rng(seed)

    def states_of(observations: dict[str, Any]) -> dict[str, int]:
        return {a: encoders[index[a]][1](obs) for a, obs in observations.items() if a in index}

    observations, _ = env.reset(seed=seed)
    states = states_of(observations)
    alpha, delta = learner.alpha, learner.delta
    stable = t = 0
    while t < learner.max_periods and stable < learner.stable_periods:
        epsilon = math.exp(-learner.beta * t)
        actions = {}
        for agent in env.agents:
            i = index[agent]
            explore = rng.random() < epsilon
            actions[agent] = (
                int(rng.integers(sizes[i])) if explore else int(greedy[i, states[agent]])
            )
        observations, rewards, terminations, _, _ = env.step(actions)
        following = states_of(observations)
        changed = False
        for agent, a in actions.items():
            i, s = index[agent], states[agent]
            alive = not terminations[agent] and agent in following
            continuation = q[i, following[agent]].max() if alive else 0.0
            q[i, s, a] = (1.0 - alpha) * q[i, s, a] + alpha * (
                rewards[agent] + delta * continuation
            )
            best = int(q[i, s].argmax())  # ties go to the lowest action
            if best != greedy[i, s]:
                greedy[i, s] = best
                changed = True
        states = following
        if not env.agents:
            observations, _ = env.reset()
            states = states_of(observations)
        stable = 0 if changed else stable + 1
        t += 1
    return t, stable >= learner.stable_periods, states.get(env.possible_agents[0], 0)
