"""``mixlab-rl curb``: market benchmarks, Q-learning / CURB sessions and DQN agents.

mixlab-rl curb equilibria --market bertrand --n-firms 2
mixlab-rl curb simulate --market cournot --learner curb --sessions 50 --out runs/cournot-curb
mixlab-rl curb dqn --steps 100000 --seeds 3 --curb --out runs/curb-dqn
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from mixlab.rl.curb.config import (
    COMPETITIVE_BAND,
    MARKET_NAMES,
    MAX_TABLE_BYTES,
    TABULAR_SYSTEMS,
    q_table_bytes,
)
from mixlab.shared.checks import (
    check_choice,
    check_count,
    check_number,
    check_output_folder,
    check_seed,
)
from mixlab.shared.config import require
from mixlab.shared.device import check_device_name

app = typer.Typer(
    help="CURB: unwinding algorithmic collusion in repeated Bertrand and Cournot games.",
    no_args_is_help=True,
)

LEARNERS = TABULAR_SYSTEMS
BELIEF_LEARNERS = ("belief", "curb")
"""learners with belief injection: duopolies only"""


# --- validation: every option is checked before anything is solved, simulated or trained -------


def _market(name: str, n_firms: int):
    from mixlab.rl.curb.markets import MARKETS

    check_choice(name, "--market", MARKET_NAMES)
    return MARKETS[name](n_firms=n_firms)


def _records(outcomes: list, periods, converged) -> tuple[list[dict], dict]:
    from mixlab.rl.curb.analysis import session_record, summarise_records

    records = [session_record(*row) for row in zip(outcomes, periods, converged, strict=True)]
    return records, summarise_records(records)


def _write(out: Path | None, summary: dict, records: list[dict], policies) -> None:
    """``greedy_policies.npy``, then ``sessions.json``; each written to a temporary name and
    renamed, so a killed run leaves complete files or none."""
    import numpy as np

    from mixlab.shared.files import write_json_atomic

    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    policies_file = out / "greedy_policies.npy"
    partial = out / ".greedy_policies.npy.partial"
    with open(partial, "wb") as handle:
        np.save(handle, policies)
    os.replace(partial, policies_file)
    sessions_file = write_json_atomic(
        out / "sessions.json", {"summary": summary, "sessions": records}, indent=1
    )
    typer.echo(f"wrote {sessions_file} and {policies_file}")


def _report(label: str, summary: dict) -> None:
    typer.echo(
        f"{label}: Δ = {summary['collusion']:.3f} ± {summary['collusion_std']:.3f} "
        f"(median {summary['collusion_median']:.3f}, {summary['share_in_band']:.0%} in "
        f"[{COMPETITIVE_BAND[0]}, {COMPETITIVE_BAND[1]}], {summary['lock_in_share']:.0%} locked "
        "at the start), "
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
    check_choice(market, "--market", MARKET_NAMES)
    check_count(n_firms, "--n-firms", 2)
    check_count(n_actions, "--n-actions", 2)
    check_number(xi, "--xi", xi >= 0, "a finite number >= 0")
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
    check_choice(market, "--market", MARKET_NAMES)
    check_choice(learner, "--learner", LEARNERS)
    check_count(sessions, "--sessions")
    check_seed(seed)
    check_count(n_firms, "--n-firms", 2)
    if learner in BELIEF_LEARNERS:
        require(
            n_firms == 2, "--n-firms", f"2 with --learner {learner} (belief injection)", n_firms
        )
    check_count(n_actions, "--n-actions", 2)
    check_number(alpha, "--alpha", 0 < alpha <= 1, "in (0, 1]")
    check_number(beta, "--beta", beta > 0, "a finite number > 0 (ε = exp(−βt) must decay)")
    check_number(penalty, "--penalty", penalty > 0, "a finite number > 0")
    memory = 0 if learner == "no-memory" else 1
    table = q_table_bytes(sessions, n_firms, n_actions, memory)
    require(
        table <= MAX_TABLE_BYTES,
        "--sessions",
        f"small enough that the Q tables fit in {MAX_TABLE_BYTES / 2**30:.0f} GiB ({table / 2**30:.1f}"
        " GiB asked; lower --sessions, --n-firms or --n-actions)",
        sessions,
    )
    if out is not None:
        check_output_folder(out, "--out")

    from mixlab.rl.curb.analysis import analyse_sessions
    from mixlab.rl.curb.env import RepeatedMarketEnv
    from mixlab.rl.curb.experiment import learner as build_learner
    from mixlab.rl.curb.qlearning import train_sessions

    env = RepeatedMarketEnv(_market(market, n_firms), n_actions=n_actions)
    q_learner = build_learner(learner, alpha, beta, penalty)
    played = train_sessions(env, q_learner, sessions, seed=seed)
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
    check_count(steps, "--steps")
    check_count(seeds, "--seeds")
    check_number(penalty, "--penalty", penalty > 0, "a finite number > 0")
    check_number(beta, "--beta", beta >= 0, "a finite number >= 0 (0: the default decay)")
    check_seed(seed)
    check_device_name(device, "--device")
    if out is not None:
        check_output_folder(out, "--out")

    from mixlab.shared.device import resolve_device

    torch_device = resolve_device(device)  # a missing CUDA is refused before training

    from mixlab.rl.curb.analysis import analyse_sessions
    from mixlab.rl.curb.dqn import DQNConfig, train_dqn
    from mixlab.rl.curb.env import RepeatedMarketEnv

    beta = beta or 4.6 / (0.6 * steps)  # ε = exp(−βt) reaches 0.01 at 60% of training
    config = DQNConfig(steps=steps, beta=beta, penalty=penalty if curb else 0.0, belief=curb)
    trained = train_dqn(RepeatedMarketEnv(), [config] * seeds, seed=seed, device=torch_device)
    records, summary = _records(analyse_sessions(trained), [steps] * seeds, [None] * seeds)
    _report(f"bertrand {'curb-dqn' if curb else 'dqn'} ({seeds} sessions, {steps} steps)", summary)
    _write(out, summary, records, trained.greedy)
