"""CURB against Q-learning collusion in repeated Bertrand and Cournot games (``mixlab run curb``).

1. Tabular, both games, ``n_sessions`` seeded sessions per system at Calvano's (α, β):
   Q-learning (Calvano et al. 2020), penalty only, belief injection only, CURB (both), and the
   no-memory (k = 0) and myopic (δ = 0) references; every system plays the same session seeds.
   Per session: collusion index Δ over the converged cycle, impulse response to a one-period
   deviation (punishment, deviation gain), TV dependence of the greedy policies on the rival's
   history, convergence time, and whether it ended locked at the Eq. 8 start profile. Beside
   them the frozen-at-start control (:func:`~mixlab.rl.curb.analysis.frozen_start`: the outcome
   of never moving the initial greedy policy, Δ = −0.21 in Cournot).
2. Full profile: Q-learning and CURB on a coarse (α, β) grid, and CURB's λ_max swept.
3. Bertrand, DQN and CURB-DQN (``dqn_seeds`` sessions each, one batched loop per system, timed
   separately).

Claims are judged on the distribution of sessions, with thresholds fixed before the rerun that
introduced them: CURB unwinds a game when its median Δ is below 0.2, at least 70 % of sessions
lie in the competitive band [−0.1, 0.2], fewer than 10 % are locked at the start profile and at
most 25 % punish a deviation. Belief injection's own effect is CURB against penalty-only, paired
by session seed: a one-sided Wilcoxon signed-rank test on the sessions' distances to the band.
Every claim is declared in ``Config.CLAIMS`` and judged again with its control in CURB's place
(:mod:`mixlab.shared.claims`): the myopic learner (δ = 0), the competitive reference, or for the
grid claim Q-learning, the only other system on the grid. A claim's numbers (median Δ, shares,
the paired p-value) are statistics over independently seeded sessions, so their spread over seeds
is inside them: every claim's spec declares ``not_per_seed`` and is judged once per run.

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

import functools
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from mixlab.rl.curb.analysis import (
    analyse_sessions,
    band_distance,
    frozen_start,
    session_record,
    summarise_records,
)
from mixlab.rl.curb.config import (
    BELIEF_P,
    CALVANO_RANGE,
    COMPETITIVE_BAND,
    DQN_SYSTEMS,
    GAMES,
    IN_BAND,
    LEARNED_TV,
    LOCK_IN,
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
from mixlab.shared import Claim, Result, require, resolve_device, run_cells, save_figure
from mixlab.shared.claims import Comparison
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
    cells += [{"kind": "dqn", "game": "bertrand", "system": system} for system in DQN_SYSTEMS]
    return cells


def market_env(config: Config, game: str) -> RepeatedMarketEnv:
    """The repeated ``game`` on the configured action grid."""
    return RepeatedMarketEnv(MARKETS[game](), n_actions=config.n_actions)


def run_tabular(config: Config, cell: dict[str, Any]) -> dict[str, Any]:
    env = market_env(config, cell["game"])
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


def run_dqn(config: Config, cell: dict[str, Any]) -> dict[str, Any]:
    """``dqn_seeds`` sessions of one DQN system in one batched loop (the same seed for both
    systems, so session k of each starts alike), timed on its own. The first system's time also
    holds torch's one-time setup (negligible on a CPU: quick DQN 44.0 s, CURB-DQN 44.4 s)."""
    env = market_env(config, "bertrand")
    dqn_config = DQNConfig(steps=config.dqn_steps, beta=config.dqn_beta)
    if cell["system"] == "curb-dqn":
        dqn_config = DQNConfig(
            steps=config.dqn_steps, beta=config.dqn_beta, penalty=config.penalty, belief=True
        )
    start = time.perf_counter()
    trained = train_dqn(
        env, [dqn_config] * config.dqn_seeds, seed=config.seed, device=resolve_device(config.device)
    )
    seconds = time.perf_counter() - start
    return {
        **cell,
        "seconds": seconds,
        "dqn": asdict(dqn_config),
        "profit_trace": trained.reward_trace.mean(axis=0).tolist(),
        "sessions": [session_record(o, config.dqn_steps, None) for o in analyse_sessions(trained)],
    }


def frozen_start_record(config: Config, game: str) -> dict[str, Any]:
    """The frozen-at-start control of ``game`` as a one-session record."""
    return {
        "kind": "control",
        "game": game,
        "system": "frozen-start",
        "seconds": 0.0,
        "sessions": [session_record(frozen_start(market_env(config, game)), 0, None)],
    }


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
        return run_dqn(config, cell) if cell["kind"] == "dqn" else run_tabular(config, cell)

    records = run_cells(
        out_dir, config, _cells(config), run_cell, resume=resume, label="curb cells"
    )
    records += [frozen_start_record(config, game) for game in GAMES]
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
    """One row per game and system at Calvano's (α, β) and the configured λ_max (the frozen-start
    control included); CURB rows at other λ_max; on the grid rows of Q-learning and CURB (None
    elsewhere): the range of cell-median Δ, the cells with it below the "unwound" line, and for
    CURB the cells where it is below Q-learning's. On the main CURB rows (None elsewhere):
    belief injection's own effect, the mean paired reduction of the distance to the competitive
    band against penalty-only and its one-sided Wilcoxon signed-rank p-value; the same two numbers
    on every main tabular row as ``closer_than_penalty`` and ``closer_than_penalty_p`` (the belief
    claim's test run on its control)."""
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
        row["belief_effect"] = row["belief_effect_p"] = None
        row["closer_than_penalty"] = row["closer_than_penalty_p"] = None
        if record["kind"] == "tabular":
            # the belief claim's test for any tabular system (its control, myopic, included)
            row["closer_than_penalty"], row["closer_than_penalty_p"] = belief_effect(
                _main_record(records, record["game"], "penalty")["sessions"], record["sessions"]
            )
            if record["system"] == "curb":
                row["belief_effect"] = row["closer_than_penalty"]
                row["belief_effect_p"] = row["closer_than_penalty_p"]
        metrics[name] = row
    return metrics


def _main_record(records: list[dict[str, Any]], game: str, system: str) -> dict[str, Any]:
    return next(
        r for r in records if r["kind"] == "tabular" and r["game"] == game and r["system"] == system
    )


def belief_effect(penalty: list[dict[str, Any]], curb: list[dict[str, Any]]) -> tuple[float, float]:
    """Belief injection's own effect, paired by session seed: the mean over sessions of
    penalty-only's distance to the competitive band minus CURB's (positive: CURB's sessions are
    closer), and the one-sided Wilcoxon signed-rank p-value of "CURB closer"
    (:func:`signed_rank_p`)."""
    require(
        len(penalty) == len(curb),
        "curb",
        f"as many sessions as penalty-only ({len(penalty)}): the test pairs them by seed",
        len(curb),
    )
    differences = band_distance(np.array([s["collusion"] for s in penalty])) - band_distance(
        np.array([s["collusion"] for s in curb])
    )
    return float(differences.mean()), signed_rank_p(differences)


def signed_rank_p(differences: np.ndarray) -> float:
    """One-sided Wilcoxon signed-rank p-value of "the differences are positive". Zero differences
    are dropped (Wilcoxon's rule), tied |d| share their average rank, and W⁺ (the rank sum of the
    positive ones) is standardised by its null mean n(n+1)/4 and tie-corrected variance
    n(n+1)(2n+1)/24 − Σ(t³ − t)/48: the normal approximation, written out so that the p-value does
    not depend on scipy's version-dependent choice between exact and approximate methods. 1 when
    every difference is zero (nothing to test)."""
    from scipy.stats import norm, rankdata

    nonzero = differences[differences != 0]
    n = nonzero.size
    if n == 0:
        return 1.0
    ranks = rankdata(np.abs(nonzero))
    _, ties = np.unique(np.abs(nonzero), return_counts=True)
    variance = n * (n + 1) * (2 * n + 1) / 24 - float((ties**3 - ties).sum()) / 48
    z = (ranks[nonzero > 0].sum() - n * (n + 1) / 4) / np.sqrt(variance)
    return float(norm.sf(z))


def _cells_below_q_learning(
    records: list[dict[str, Any]], config: Config, game: str, curb: list[dict[str, float]]
) -> float:
    """Grid cells where CURB's median Δ is below Q-learning's in the same (α, β) cell."""
    baseline = {
        (c["alpha"], c["beta"]): c["collusion"]
        for c in _grid_cells(records, config, game, "q-learning")
    }
    return float(sum(c["collusion"] < baseline[(c["alpha"], c["beta"])] for c in curb))


def _grid_cells(
    records: list[dict[str, Any]], config: Config, game: str, system: str
) -> list[dict[str, float]]:
    """Median Δ per (α, β) grid cell of a system (Calvano's cell comes from the main batch)."""
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
                    "collusion": float(np.median([s["collusion"] for s in record["sessions"]])),
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


def _compare(
    text: str,
    value: float | None,
    op: Comparison,
    reference: float | None,
    *,
    requires: Sequence[Claim] = (),
    **labels: str,
) -> Claim:
    """``value op reference`` on a statistic of the run's sessions (median Δ, a share of
    sessions, a p-value over sessions): the sessions are independently seeded, so the statistic
    holds its spread over seeds, and every claim's spec says so (``not_per_seed``). None (not
    defined) never holds."""
    return Claim.compare(text, _number(value), op, _number(reference), requires=requires, **labels)


def unwound(metrics: dict[str, dict[str, Any]], system: str, game: str) -> Claim:
    """``system`` unwinds collusion in ``game`` across its sessions: median Δ below 0.2, at least
    70 % of sessions in the competitive band, fewer than 10 % locked at the Eq. 8 start profile,
    at most 25 % punishing a deviation (the test of the claims ``unwinds_<game>``, for any
    tabular system)."""
    row = metrics[f"{game}/{system}"]
    low, high = COMPETITIVE_BAND
    return Claim.all_of(
        f"{system} unwinds collusion in {game} across sessions: median Δ < {UNWOUND}, at least "
        f"{IN_BAND:.0%} of sessions with Δ in [{low}, {high}], fewer than {LOCK_IN:.0%} locked "
        f"at the Eq. 8 start profile (the frozen control's outcome), at most {RARE:.0%} punishing",
        [
            _compare(
                "median unwound",
                row["collusion_median"],
                "<",
                UNWOUND,
                value_label="median Δ",
            ),
            _compare(
                "most sessions in the band",
                row["share_in_band"],
                ">=",
                IN_BAND,
                value_label="share in band",
            ),
            _compare(
                "not locked at the start",
                row["lock_in_share"],
                "<",
                LOCK_IN,
                value_label="lock-in share",
            ),
            _compare(
                "punishment removed",
                row["punished_share"],
                "<=",
                RARE,
                value_label="share punishing",
            ),
        ],
    )


def claims(metrics: dict[str, dict[str, Any]], config: Config) -> list[Claim]:
    """Every claim of ``Config.CLAIMS``, judged with its control in the method's place (the grid
    claim only when the grid ran)."""
    result = [
        config.judge(f"unwinds_{game}", functools.partial(unwound, metrics, game=game))
        for game in GAMES
    ]

    def closer_than_penalty(system: str) -> Claim:
        rows = {game: metrics[f"{game}/{system}"] for game in GAMES}
        return Claim.all_of(
            f"{system}'s sessions lie closer to the band than penalty-only's",
            [
                _compare(
                    f"{game} paired test",
                    rows[game]["closer_than_penalty_p"],
                    "<",
                    BELIEF_P,
                    value_label=f"{game} p (mean distance reduction "
                    f"{_number(rows[game]['closer_than_penalty']):.3f})",
                )
                for game in GAMES
            ],
        )

    result.append(config.judge("belief_adds", closer_than_penalty))
    if config.grid_alphas:

        def grid(system: str) -> Claim:
            return Claim.all_of(
                f"{system} unwinds collusion across the grid",
                [
                    part
                    for game in GAMES
                    for part in (
                        _compare(
                            f"{game}: {system}'s worst cell unwound",
                            metrics[f"{game}/{system}"]["grid_collusion_max"],
                            "<",
                            UNWOUND,
                            value_label=f"{game} {system} max cell-median Δ",
                        ),
                        _compare(
                            f"{game}: {system}'s worst cell below Q-learning's best",
                            metrics[f"{game}/{system}"]["grid_collusion_max"],
                            "<",
                            metrics[f"{game}/q-learning"]["grid_collusion_min"],
                            value_label=f"{game} {system} max cell-median Δ",
                            reference_label="Q-learning min cell-median Δ",
                        ),
                    )
                ],
            )

        result.append(
            config.judge(
                "grid_unwinds",
                grid,
                text_values={
                    "n_alphas": len(config.grid_alphas),
                    "n_betas": len(config.grid_betas),
                },
            )
        )
    dqn = metrics["bertrand/dqn"]
    learned = [dqn_learned(metrics)]

    def colludes(system: str) -> Claim:
        return _compare(
            f"{system} colludes on Bertrand",
            metrics[f"bertrand/{system}"]["collusion_median"],
            ">=",
            UNWOUND,
            value_label=f"{system} median Δ",
            requires=learned,
        )

    def unwinds_dqn(system: str) -> Claim:
        median = metrics[f"bertrand/{system}"]["collusion_median"]
        return Claim.all_of(
            f"{system} unwinds DQN collusion",
            [
                _compare(
                    f"{system} unwound",
                    median,
                    "<",
                    UNWOUND,
                    value_label=f"{system} median Δ",
                ),
                _compare(
                    f"{system} below DQN",
                    median,
                    "<",
                    dqn["collusion_median"],
                    value_label=f"{system} median Δ",
                    reference_label="DQN median Δ",
                ),
            ],
            requires=learned,
        )

    result += [
        config.judge("dqn_colludes", colludes),
        config.judge("curb_dqn_unwinds", unwinds_dqn),
    ]
    return result


def _number(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def _plots(records: list[dict[str, Any]], config: Config, out_dir: Path) -> None:
    import matplotlib.pyplot as plt

    main = [r for r in records if r["kind"] in ("tabular", "dqn", "control")]
    low, high = COMPETITIVE_BAND
    figure, axes = plt.subplots(1, 2, figsize=(12, 4))
    for axis, game in zip(axes, GAMES, strict=True):
        mine = [r for r in main if r["game"] == game]
        axis.boxplot(
            [[s["collusion"] for s in r["sessions"]] for r in mine],
            tick_labels=[r["system"] for r in mine],
        )
        axis.axhspan(low, high, color="tab:green", alpha=0.12, label="competitive band")
        axis.axhline(0, color="grey", lw=0.8)
        axis.axhline(1, color="grey", lw=0.8, ls="--")
        axis.set_title(f"{game}: collusion index Δ per session")
        axis.margins(y=0.08)  # whiskers at the data's extremes stay off the frame
        axis.legend(fontsize=7, loc="upper right")  # above frozen-start, which sits at its start
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
            axis.set_title(f"{game} {system}: median Δ")
    figure.colorbar(image, ax=axes, shrink=0.6, label="collusion index Δ")
    save_figure(figure, out_dir / "grid_collusion.png")
