"""``mixlab-rl curb``: market benchmarks, Q-learning / CURB sessions and DQN agents.

mixlab-rl curb equilibria --market bertrand --n-firms 2
mixlab-rl curb simulate --market cournot --learner curb --sessions 50 --out runs/cournot-curb
mixlab-rl curb dqn --steps 100000 --seeds 3 --curb --out runs/curb-dqn
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="CURB: unwinding algorithmic collusion in repeated Bertrand and Cournot games.",
    no_args_is_help=True,
)

LEARNERS = ("q-learning", "penalty", "belief", "curb", "no-memory", "myopic")


def _market(name: str, n_firms: int):
    from mixlab.rl.curb.markets import MARKETS

    if name not in MARKETS:
        raise ValueError(f"--market must be one of {sorted(MARKETS)}, got {name!r}")
    return MARKETS[name](n_firms=n_firms)


def _records(outcomes: list, periods, converged) -> tuple[list[dict], dict]:
    from mixlab.rl.curb.analysis import session_record, summarise_records

    records = [session_record(*row) for row in zip(outcomes, periods, converged, strict=True)]
    return records, summarise_records(records)


def _write(out: Path | None, summary: dict, records: list[dict], policies) -> None:
    import numpy as np

    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    sessions = json.dumps({"summary": summary, "sessions": records}, indent=1)
    (out / "sessions.json").write_text(sessions)
    np.save(out / "greedy_policies.npy", policies)
    typer.echo(f"wrote {out / 'sessions.json'} and {out / 'greedy_policies.npy'}")


def _report(label: str, summary: dict) -> None:
    typer.echo(
        f"{label}: Δ = {summary['collusion']:.3f} ± {summary['collusion_std']:.3f}, "
        f"punishment in {summary['punished_share']:.0%} of sessions, "
        f"rival response at t+1 {summary['rival_response']:+.4f}, "
        f"deviation unprofitable in {summary['unprofitable_deviation_share']:.0%}"
    )


@app.command()
def equilibria(
    market: Annotated[
        str, typer.Option(help="bertrand (logit, Calvano) or cournot (linear)")
    ] = "bertrand",
    n_firms: int = 2,
    n_actions: int = 15,
    xi: float = 0.1,
) -> None:
    """Print the static Nash and joint-monopoly benchmarks and the action grid."""
    import numpy as np

    from mixlab.rl.curb.markets import action_grid
    from mixlab.rl.curb.markets import equilibria as solve

    game = _market(market, n_firms)
    eq = solve(game)
    name = game.action_name
    typer.echo(
        f"Nash:     {name} {np.round(eq.nash_actions, 5)}  profit {np.round(eq.nash_profits, 5)}"
    )
    typer.echo(
        f"monopoly: {name} {np.round(eq.monopoly_actions, 5)}  profit {np.round(eq.monopoly_profits, 5)}"
    )
    grid = np.array2string(action_grid(game, n_actions, xi), precision=4, max_line_width=250)
    typer.echo(f"grid ({n_actions}): {grid}")


@app.command()
def simulate(
    market: Annotated[str, typer.Option(help="bertrand or cournot")] = "bertrand",
    learner: Annotated[str, typer.Option(help=f"one of {', '.join(LEARNERS)}")] = "q-learning",
    sessions: int = 20,
    seed: int = 0,
    n_firms: int = 2,
    n_actions: int = 15,
    alpha: float = 0.15,
    beta: float = 4e-6,
    penalty: Annotated[float, typer.Option(help="CURB's λ_max (penalty and curb learners)")] = 0.2,
    out: Annotated[
        Path | None, typer.Option(help="folder for sessions.json and greedy policies")
    ] = None,
) -> None:
    """Play seeded Q-learning sessions to convergence and measure collusion and punishment."""
    from mixlab.rl.curb.analysis import analyse_sessions
    from mixlab.rl.curb.experiment import learner as build_learner
    from mixlab.rl.curb.qlearning import train_sessions

    if learner not in LEARNERS:
        raise ValueError(f"--learner must be one of {list(LEARNERS)}, got {learner!r}")
    game = _market(market, n_firms)
    q_learner = build_learner(learner, alpha, beta, penalty)
    played = train_sessions(game, q_learner, sessions, seed=seed, n_actions=n_actions)
    records, summary = _records(analyse_sessions(played), played.periods, played.converged)
    _report(f"{market} {learner} ({sessions} sessions)", summary)
    _write(out, summary, records, played.greedy)


@app.command()
def dqn(
    steps: int = 100_000,
    seeds: int = 2,
    curb: Annotated[bool, typer.Option(help="CURB-DQN (penalty + belief injection)")] = False,
    penalty: float = 0.2,
    beta: Annotated[
        float, typer.Option(help="exploration decay; default: ε floor at 60% of steps")
    ] = 0.0,
    seed: int = 0,
    device: str = "auto",
    out: Annotated[
        Path | None, typer.Option(help="folder for sessions.json and greedy policies")
    ] = None,
) -> None:
    """Train independent DQN (or CURB-DQN) pricing agents on Calvano's Bertrand market."""
    from mixlab.rl.curb.analysis import analyse_sessions
    from mixlab.rl.curb.dqn import DQNConfig, train_dqn
    from mixlab.rl.curb.markets import LogitBertrand
    from mixlab.shared import resolve_device

    if seeds < 1:
        raise ValueError(f"--seeds must be an integer >= 1, got {seeds}")
    if steps < 1:
        raise ValueError(f"--steps must be an integer >= 1, got {steps}")
    beta = beta or 4.6 / (0.6 * steps)  # ε = exp(−βt) reaches 0.01 at 60% of training
    config = DQNConfig(steps=steps, beta=beta, penalty=penalty if curb else 0.0, belief=curb)
    game = LogitBertrand()
    trained = train_dqn(game, [config] * seeds, seed=seed, device=resolve_device(device))
    records, summary = _records(analyse_sessions(trained), [steps] * seeds, [None] * seeds)
    _report(f"bertrand {'curb-dqn' if curb else 'dqn'} ({seeds} sessions, {steps} steps)", summary)
    _write(out, summary, records, trained.greedy)
