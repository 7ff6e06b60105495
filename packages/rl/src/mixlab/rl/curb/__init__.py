"""CURB: unwinding algorithmic collusion in repeated Bertrand and Cournot games.

- Markets: :class:`LogitBertrand` (Calvano et al. 2020) and :class:`LinearCournot` stage games,
  :func:`equilibria` (static Nash, joint monopoly), :func:`action_grid`, :func:`profit_table`, and
  :class:`RepeatedMarketEnv`, the repeated game as a PettingZoo ``ParallelEnv`` (a
  :class:`RepeatedGame`: it exposes its payoff table to the compiled learners).
- Learners, on any PettingZoo ``ParallelEnv`` with ``Discrete`` actions: :func:`train_sessions`
  plays many seeded tabular Q-learning sessions (:class:`QLearner`, with CURB's penalty and belief
  injection as switches: ``QLearner.curb()``), compiled and in parallel on a repeated game;
  :func:`train_dqn` trains DQN and CURB-DQN agents (:class:`DQNConfig`).
- Outside learners: :class:`CurbShaping` adds CURB's penalty to any env's rewards;
  :class:`SingleAgentView` is one agent as a ``gymnasium.Env`` (for Stable-Baselines3).
- Analysis: :func:`analyse_policy` (collusion index over the converged cycle, impulse response,
  TV dependence), :func:`impulse_response`, :func:`tv_dependence`, :func:`dependence_penalty`.

    from mixlab.rl.curb import LogitBertrand, QLearner, RepeatedMarketEnv, train_sessions
    sessions = train_sessions(RepeatedMarketEnv(LogitBertrand()), QLearner.curb(), 20, seed=0)
"""

from typing import TYPE_CHECKING

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "CurbShaping": "wrappers",
    "DQNConfig": "dqn",
    "DQNSessions": "dqn",
    "Dependence": "analysis",
    "Equilibria": "markets",
    "ImpulseResponse": "analysis",
    "LinearCournot": "markets",
    "LogitBertrand": "markets",
    "QLearner": "qlearning",
    "RepeatedGame": "env",
    "RepeatedMarketEnv": "env",
    "SessionOutcome": "analysis",
    "Sessions": "qlearning",
    "SingleAgentView": "wrappers",
    "action_grid": "markets",
    "analyse_policy": "analysis",
    "analyse_sessions": "analysis",
    "best_response_table": "markets",
    "collusion_index": "markets",
    "converged_cycle": "analysis",
    "cycle_profits": "analysis",
    "dependence_penalty": "analysis",
    "equilibria": "markets",
    "greedy_probabilities": "analysis",
    "impulse_response": "analysis",
    "initial_q": "qlearning",
    "policy_dependence": "analysis",
    "profit_table": "markets",
    "rival_marginal_policy": "analysis",
    "session_record": "analysis",
    "softmax_probabilities": "analysis",
    "summarise_records": "analysis",
    "train_dqn": "dqn",
    "train_sessions": "qlearning",
    "tv_dependence": "analysis",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = [
    "CurbShaping",
    "DQNConfig",
    "DQNSessions",
    "Dependence",
    "Equilibria",
    "ImpulseResponse",
    "LinearCournot",
    "LogitBertrand",
    "QLearner",
    "RepeatedGame",
    "RepeatedMarketEnv",
    "SessionOutcome",
    "Sessions",
    "SingleAgentView",
    "action_grid",
    "analyse_policy",
    "analyse_sessions",
    "best_response_table",
    "collusion_index",
    "converged_cycle",
    "cycle_profits",
    "dependence_penalty",
    "equilibria",
    "greedy_probabilities",
    "impulse_response",
    "initial_q",
    "policy_dependence",
    "profit_table",
    "rival_marginal_policy",
    "session_record",
    "softmax_probabilities",
    "summarise_records",
    "train_dqn",
    "train_sessions",
    "tv_dependence",
]

if TYPE_CHECKING:
    from mixlab.rl.curb.analysis import (
        Dependence,
        ImpulseResponse,
        SessionOutcome,
        analyse_policy,
        analyse_sessions,
        converged_cycle,
        cycle_profits,
        dependence_penalty,
        greedy_probabilities,
        impulse_response,
        policy_dependence,
        rival_marginal_policy,
        session_record,
        softmax_probabilities,
        summarise_records,
        tv_dependence,
    )
    from mixlab.rl.curb.dqn import DQNConfig, DQNSessions, train_dqn
    from mixlab.rl.curb.env import RepeatedGame, RepeatedMarketEnv
    from mixlab.rl.curb.markets import (
        Equilibria,
        LinearCournot,
        LogitBertrand,
        action_grid,
        best_response_table,
        collusion_index,
        equilibria,
        profit_table,
    )
    from mixlab.rl.curb.qlearning import QLearner, Sessions, initial_q, train_sessions
    from mixlab.rl.curb.wrappers import CurbShaping, SingleAgentView
