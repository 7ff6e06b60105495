"""CURB against Q-learning collusion in repeated Bertrand and Cournot games (``mixlab run curb``).

1. Tabular, both games, ``n_sessions`` seeded sessions per system at Calvano's (α, β):
   Q-learning (Calvano et al. 2020), penalty only, belief injection only, CURB (both), and the
   no-memory (k = 0) and myopic (δ = 0) references. Per session: collusion index Δ over the
   converged cycle, impulse response to a one-period deviation (punishment, deviation gain),
   TV dependence of the greedy policies on the rival's history, convergence time.
2. Full profile: Q-learning and CURB on a coarse (α, β) grid, and CURB's λ_max swept.
3. Bertrand, DQN and CURB-DQN (``dqn_seeds`` sessions each, trained in one batched loop).

Regime (``result.json``'s ``regime``, gating every claim): Q-learning colludes on Bertrand as in
Calvano et al. (mean Δ in [0.75, 0.95] and at least 50 % of sessions punish a deviation); without
it the setup cannot show CURB unwinding anything. The DQN claims (DQN colludes, CURB-DQN unwinds it)
are tested only when the DQN baseline learned a reactive policy (:func:`dqn_learned`): punishment in
at least 50 % of its sessions or a mean coop-vs-defect TV dependence TV^cd of at least 0.5. An
untrained DQN (random weights) has Δ ≈ 0.46 over 30 seeds, punishment in 7 % and TV^cd ≈ 0.22, so
Δ alone would count it as colluding.

Every cell is checkpointed, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from mixlab.rl.curb.analysis import analyse_sessions, session_record, summarise_records
from mixlab.rl.curb.config import (
    CALVANO_RANGE,
    DQN_SYSTEMS,
    GAMES,
    LEARNED_TV,
    MAJORITY,
    METHOD,
    RARE,
    TABULAR_SYSTEMS,
    UNWOUND,
    Config,
)
from mixlab.rl.curb.dqn import DQNConfig, train_dqn
from mixlab.rl.curb.env import RepeatedMarketEnv
from mixlab.rl.curb.markets import MARKETS
from mixlab.rl.curb.qlearning import QLearner, train_sessions
from mixlab.shared import Claim, Result, resolve_device, run_cells, save_figure
from mixlab.shared.files import write_json_atomic

__all__ = [
    "DQN_SYSTEMS",
    "GAMES",
    "METHOD",
    "TABULAR_SYSTEMS",
    "Config",
    "claims",
    "dqn_learned",
    "learner",
    "regime",
    "run",
    "summarise",
]


def learner(system: str, alpha: float, beta: float, penalty: float) -> QLearner:
    """The Q-learner behind each tabular system."""
    base = {"alpha": alpha, "beta": beta}
    return {
        "q-learning": QLearner(**base),
        "penalty": QLearner(**base, penalty=penalty),
        "belief": QLearner(**base, belief=True),
        "curb": QLearner.curb(penalty, **base),
        "no-memory": QLearner(**base, memory=0),
        "myopic": QLearner(**base, delta=0.0),
    }[system]


def _cells(config: Config) -> list[dict[str, Any]]:
    """Every tabular batch of sessions, then the DQN batch."""
    base = {"alpha": config.alpha, "beta": config.beta, "penalty": config.penalty}
    cells = [
        {"kind": "tabular", "game": game, "system": system, **base}
        for game in GAMES
        for system in TABULAR_SYSTEMS
    ]
    cells += [
        {"kind": "sweep", "game": game, "system": "curb", **base, "penalty": lam}
        for game in GAMES
        for lam in config.penalty_sweep
        if lam != config.penalty
    ]
    cells += [
        {
            "kind": "grid",
            "game": game,
            "system": system,
            "alpha": a,
            "beta": b,
            "penalty": config.penalty,
        }
        for game in GAMES
        for system in ("q-learning", "curb")
        for a in config.grid_alphas
        for b in config.grid_betas
        if (a, b) != (config.alpha, config.beta)
    ]
    cells.append({"kind": "dqn", "game": "bertrand", "system": "dqn+curb-dqn"})
    return cells


def run_tabular(config: Config, cell: dict[str, Any]) -> dict[str, Any]:
    env = RepeatedMarketEnv(MARKETS[cell["game"]](), n_actions=config.n_actions)
    q_learner = learner(cell["system"], cell["alpha"], cell["beta"], cell["penalty"])
    start = time.perf_counter()
    n_sessions = config.grid_sessions if cell["kind"] == "grid" else config.n_sessions
    sessions = train_sessions(env, q_learner, n_sessions, seed=config.seed)
    seconds = time.perf_counter() - start
    outcomes = [
        session_record(outcome, periods, converged)
        for outcome, periods, converged in zip(
            analyse_sessions(sessions), sessions.periods, sessions.converged, strict=True
        )
    ]
    return {**cell, "seconds": seconds, "sessions": outcomes}


def run_dqn(config: Config, cell: dict[str, Any]) -> list[dict[str, Any]]:
    env = RepeatedMarketEnv(MARKETS["bertrand"](), n_actions=config.n_actions)
    common = {"steps": config.dqn_steps, "beta": config.dqn_beta}
    configs = [DQNConfig(**common)] * config.dqn_seeds + [
        DQNConfig(**common, penalty=config.penalty, belief=True)
    ] * config.dqn_seeds
    start = time.perf_counter()
    trained = train_dqn(env, configs, seed=config.seed, device=resolve_device(config.device))
    seconds = time.perf_counter() - start
    outcomes = [session_record(o, config.dqn_steps, None) for o in analyse_sessions(trained)]
    results = []
    for offset, system in enumerate(DQN_SYSTEMS):
        mine = slice(offset * config.dqn_seeds, (offset + 1) * config.dqn_seeds)
        results.append(
            {
                "kind": "dqn",
                "game": "bertrand",
                "system": system,
                "seconds": seconds / 2,
                "dqn": asdict(configs[offset * config.dqn_seeds]),
                "profit_trace": trained.reward_trace[mine].mean(axis=0).tolist(),
                "sessions": outcomes[mine],
            }
        )
    return results


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    def run_cell(cell: dict[str, Any]) -> list[dict[str, Any]]:
        return run_dqn(config, cell) if cell["kind"] == "dqn" else [run_tabular(config, cell)]

    outcomes = run_cells(
        out_dir, config, _cells(config), run_cell, resume=resume, label="curb cells"
    )
    records = [record for outcome in outcomes for record in outcome]
    write_json_atomic(out_dir / "cells.json", _compact(records), indent=None)
    metrics = summarise(records, config)
    _plots(records, config, out_dir)
    return Result(metrics=metrics, claims=claims(metrics, config), regime=regime(metrics, config))


def _compact(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records for cells.json: per-session numbers, and each cell's impulse response averaged over
    its sessions (the per-session curves would make the full profile's file megabytes)."""
    return [
        {
            **{key: value for key, value in record.items() if key != "sessions"},
            "impulse_actions": np.mean(
                [s["impulse_actions"] for s in record["sessions"]], axis=0
            ).tolist(),
            "sessions": [
                {key: value for key, value in s.items() if key != "impulse_actions"}
                for s in record["sessions"]
            ],
        }
        for record in records
    ]


def summarise(records: list[dict[str, Any]], config: Config) -> dict[str, dict[str, float | None]]:
    """One row per game and system at Calvano's (α, β) and the configured λ_max; CURB rows at other
    λ_max; on the grid rows of Q-learning and CURB (None elsewhere): the range of cell-mean Δ, the
    cells with Δ below the "unwound" line, and for CURB the cells where it is below Q-learning."""
    metrics: dict[str, dict[str, float | None]] = {}
    for record in records:
        if record["kind"] == "grid":
            continue
        name = f"{record['game']}/{record['system']}"
        if record["kind"] == "sweep":
            name += f"@penalty={record['penalty']}"
        row = summarise_records(record["sessions"])
        row["seconds"] = record["seconds"]
        grid = (
            _grid_cells(records, config, record["game"], record["system"])
            if record["kind"] == "tabular"
            else []
        )
        values = [c["collusion"] for c in grid]
        row["grid_cells"] = float(len(grid)) if grid else None
        row["grid_collusion_min"] = float(min(values)) if grid else None
        row["grid_collusion_max"] = float(max(values)) if grid else None
        row["grid_cells_unwound"] = float(sum(v < UNWOUND for v in values)) if grid else None
        row["grid_cells_below_q_learning"] = (
            _cells_below_q_learning(records, config, record["game"], grid)
            if grid and record["system"] == "curb"
            else None
        )
        metrics[name] = row
    return metrics


def _cells_below_q_learning(
    records: list[dict[str, Any]], config: Config, game: str, curb: list[dict[str, float]]
) -> float:
    """Grid cells where CURB's mean Δ is below Q-learning's in the same (α, β) cell."""
    baseline = {
        (c["alpha"], c["beta"]): c["collusion"]
        for c in _grid_cells(records, config, game, "q-learning")
    }
    return float(sum(c["collusion"] < baseline[(c["alpha"], c["beta"])] for c in curb))


def _grid_cells(
    records: list[dict[str, Any]], config: Config, game: str, system: str
) -> list[dict[str, float]]:
    """Mean Δ per (α, β) grid cell of a system (Calvano's cell comes from the main batch)."""
    if not config.grid_alphas or system not in ("q-learning", "curb"):
        return []
    cells = []
    for record in records:
        on_grid = record["kind"] == "grid" or (
            record["kind"] == "tabular"
            and record["alpha"] in config.grid_alphas
            and record["beta"] in config.grid_betas
        )
        if on_grid and record["game"] == game and record["system"] == system:
            cells.append(
                {
                    "alpha": record["alpha"],
                    "beta": record["beta"],
                    "collusion": float(np.mean([s["collusion"] for s in record["sessions"]])),
                }
            )
    return cells


def regime(metrics: dict[str, dict[str, Any]], config: Config) -> list[Claim]:
    """The setup can test CURB: Q-learning colludes on Bertrand as in Calvano et al. (Δ in
    [0.75, 0.95], punishment in at least half of the sessions)."""
    q = metrics["bertrand/q-learning"]
    low, high = CALVANO_RANGE
    return [
        Claim.all_of(
            f"Q-learning colludes in Bertrand as in Calvano et al.: Δ in [{low}, {high}] and at "
            f"least {MAJORITY:.0%} of sessions punish a deviation ({config.n_sessions} sessions, "
            f"α = {config.alpha}, β = {config.beta})",
            [
                Claim.compare("Δ at least the low end", q["collusion"], ">=", low, value_label="Δ"),
                Claim.compare(
                    "Δ at most the high end", q["collusion"], "<=", high, value_label="Δ"
                ),
                Claim.compare(
                    "punishment present",
                    q["punished_share"],
                    ">=",
                    MAJORITY,
                    value_label="share of sessions punishing",
                ),
            ],
        )
    ]


def dqn_learned(metrics: dict[str, dict[str, Any]]) -> Claim:
    """The DQN baseline learned a reactive (reward-punishment) policy: at least half of its
    sessions punish a deviation, or its greedy policies' mean coop-vs-defect TV dependence TV^cd
    (how much the action after the cooperative price changes when the rival defects) is at least
    0.5. Holds when either part does; the evidence shows both numbers."""
    dqn = metrics["bertrand/dqn"]
    parts = [
        Claim.compare(
            "DQN punishes",
            dqn["punished_share"],
            ">=",
            MAJORITY,
            value_label="DQN share of sessions punishing",
        ),
        Claim.compare(
            "DQN reacts to the rival",
            dqn["tv_cooperate_defect"] if dqn["tv_cooperate_defect"] is not None else float("nan"),
            ">=",
            LEARNED_TV,
            value_label="DQN TV^cd",
        ),
    ]
    return Claim(
        text=(f"DQN learned: punishment in >= {MAJORITY:.0%} of sessions or TV^cd >= {LEARNED_TV}"),
        holds=any(part.holds for part in parts),
        evidence=" or ".join(part.evidence for part in parts),
    )


def claims(metrics: dict[str, dict[str, Any]], config: Config) -> list[Claim]:
    curb = {game: metrics[f"{game}/curb"] for game in GAMES}
    result = [
        Claim.all_of(
            f"CURB (penalty λ_max = {config.penalty} + belief injection) brings Δ below {UNWOUND} "
            f"in both games and removes punishment (at most {RARE:.0%} of sessions punish)",
            [
                part
                for game in GAMES
                for part in (
                    Claim.compare(
                        f"{game} Δ unwound",
                        curb[game]["collusion"],
                        "<",
                        UNWOUND,
                        value_label=f"{game} Δ",
                    ),
                    Claim.compare(
                        f"{game} punishment removed",
                        curb[game]["punished_share"],
                        "<=",
                        RARE,
                        value_label=f"{game} share punishing",
                    ),
                )
            ],
        ),
    ]
    if config.grid_alphas:
        result.append(
            Claim.all_of(
                f"The effect holds across the (α, β) grid ({len(config.grid_alphas)} × "
                f"{len(config.grid_betas)}): in every cell of both games CURB's Δ is below "
                f"{UNWOUND} and below Q-learning's",
                [
                    part
                    for game in GAMES
                    for part in (
                        Claim.compare(
                            f"{game}: CURB's worst cell unwound",
                            metrics[f"{game}/curb"]["grid_collusion_max"],
                            "<",
                            UNWOUND,
                            value_label=f"{game} CURB max Δ over cells",
                        ),
                        Claim.compare(
                            f"{game}: CURB's worst cell below Q-learning's best",
                            metrics[f"{game}/curb"]["grid_collusion_max"],
                            "<",
                            metrics[f"{game}/q-learning"]["grid_collusion_min"],
                            value_label=f"{game} CURB max Δ",
                            reference_label="Q-learning min Δ",
                        ),
                    )
                ],
            )
        )
    dqn, curb_dqn = metrics["bertrand/dqn"], metrics["bertrand/curb-dqn"]
    learned = [dqn_learned(metrics)]
    result += [
        Claim.compare(
            f"The DQN baseline itself colludes on Bertrand (Δ >= {UNWOUND}; {config.dqn_seeds} "
            f"sessions of {config.dqn_steps} steps; reported before any claim about CURB-DQN; "
            "tested only when DQN learned a reactive policy)",
            dqn["collusion"],
            ">=",
            UNWOUND,
            value_label="DQN Δ",
            requires=learned,
        ),
        Claim.all_of(
            f"CURB-DQN unwinds DQN collusion: Δ below {UNWOUND} and below DQN's (tested only "
            "when DQN learned a reactive policy)",
            [
                Claim.compare(
                    "CURB-DQN unwound",
                    curb_dqn["collusion"],
                    "<",
                    UNWOUND,
                    value_label="CURB-DQN Δ",
                ),
                Claim.compare(
                    "CURB-DQN below DQN",
                    curb_dqn["collusion"],
                    "<",
                    dqn["collusion"],
                    value_label="CURB-DQN Δ",
                    reference_label="DQN Δ",
                ),
            ],
            requires=learned,
        ),
    ]
    return result


def _plots(records: list[dict[str, Any]], config: Config, out_dir: Path) -> None:
    import matplotlib.pyplot as plt

    main = [r for r in records if r["kind"] in ("tabular", "dqn")]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, game in zip(axes, GAMES, strict=True):
        mine = [r for r in main if r["game"] == game]
        axis.boxplot(
            [[s["collusion"] for s in r["sessions"]] for r in mine],
            tick_labels=[r["system"] for r in mine],
        )
        axis.axhline(0, color="grey", lw=0.8)
        axis.axhline(1, color="grey", lw=0.8, ls="--")
        axis.set_title(f"{game}: collusion index Δ per session")
        axis.tick_params(axis="x", rotation=45)
    save_figure(figure, out_dir / "collusion.png")

    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, game in zip(axes, GAMES, strict=True):
        for record in main:
            if record["game"] != game or record["system"] not in (
                "q-learning",
                "curb",
                "dqn",
                "curb-dqn",
            ):
                continue
            curve = np.mean([s["impulse_actions"] for s in record["sessions"]], axis=0)
            periods = np.arange(-1, curve.shape[0] - 1)
            (line,) = axis.plot(periods, curve[:, 0], label=f"{record['system']} deviator")
            axis.plot(
                periods,
                curve[:, 1],
                ls="--",
                color=line.get_color(),
                label=f"{record['system']} rival",
            )
        axis.axvline(0, color="grey", lw=0.8)
        axis.set_xlabel("period (0 = forced deviation to the static best response)")
        axis.set_ylabel("price" if game == "bertrand" else "quantity")
        axis.set_title(f"{game}: impulse response (mean over sessions)")
        axis.legend(fontsize=7)
    save_figure(figure, out_dir / "impulse_response.png")
    if config.grid_alphas:
        _grid_plot(records, config, out_dir)


def _grid_plot(records: list[dict[str, Any]], config: Config, out_dir: Path) -> None:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(10, 8), constrained_layout=True)
    for row, game in enumerate(GAMES):
        for col, system in enumerate(("q-learning", "curb")):
            axis = axes[row, col]
            cells = _grid_cells(records, config, game, system)
            values = np.full((len(config.grid_alphas), len(config.grid_betas)), np.nan)
            for cell in cells:
                i = config.grid_alphas.index(cell["alpha"])
                values[i, config.grid_betas.index(cell["beta"])] = cell["collusion"]
            image = axis.imshow(values, vmin=-0.2, vmax=1.0, cmap="viridis", origin="lower")
            for (i, j), value in np.ndenumerate(values):
                axis.text(j, i, f"{value:.2f}", ha="center", va="center", color="w", fontsize=8)
            axis.set_xticks(range(len(config.grid_betas)), [f"{b:g}" for b in config.grid_betas])
            axis.set_yticks(range(len(config.grid_alphas)), [f"{a:g}" for a in config.grid_alphas])
            axis.set_xlabel("β")
            axis.set_ylabel("α")
            axis.set_title(f"{game} {system}: mean Δ")
    figure.colorbar(image, ax=axes, shrink=0.6, label="collusion index Δ")
    save_figure(figure, out_dir / "grid_collusion.png")
