"""RND-RFF against RND, DRND, plain PPO and a count oracle (``mixlab run rnd_rff``).

Cells, every system with the same data, budget and seeds:

- ``probe``: per seed, the cluster probe (:func:`~.probe.cluster_probe`, drawn with the seed) and
  one bonus fitted on it: RND and DRND (random-MLP targets), RFF with the spectra of
  ``probe_targets`` at ``bandwidths`` × the median heuristic; near/far AUROC and FPR@95, ID
  error, Spearman with the exact GP posterior variance on held-out and near-OOD points (and with
  the far-OOD points, reported apart), σ²'s own near AUROC (RFF, and RND against the Gaussian σ²
  at the median ℓ).
- ``explore``: per seed, PPO with each bonus of ``explorers`` on CoordMaze with (x, y) and with
  one-hot observations (and the ``minigrid`` ids): distinct cells visited, seeds that reached the
  goal, success rate over the last fifth of training, steps to the first reward. The RFF
  bandwidth is the median rule on the observation-normalisation rollout, never tuned.

Regime (result.json's ``regime``, thresholds fixed before any run): on the probe RND separates
far-OOD (AUROC >= 0.95) but not near-OOD (<= 0.85), a collapse for the method to fix (gates 1–2);
in each maze PPO alone reaches the goal in at most a third of the seeds, the count oracle in at
least two thirds, and no explorer covers more than 90 % of the cells on any seed: the maze's
ceiling is out of reach, so coverage can separate the bonuses (gates 3 for (x, y), 4 for one-hot).

Claims (``Config.CLAIMS``) are judged seed by seed: a margin must hold on every seed (paired by
seed: same data and env), and a difference must clear noise in a one-sided paired t-test over the
seeds' differences. Each claim is judged again with its control in RND-RFF's place: RND for (1)
(its Spearman is taken against the same σ²), DRND for (2) and (3), PPO without a bonus for (4).
Claim (3) measures coverage between RND's cells (its floor) and the count oracle's (its ceiling,
the upper reference): RND-RFF must close half that gap on every seed, and the count oracle must
cover more than RND on every seed (a premise, as is an unsaturated maze for (3) and (4)).
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixlab.rl.rnd_rff.bonus import make_bonus
from mixlab.rl.rnd_rff.config import (
    COVERAGE_GAP,
    ID_ERROR_RATIO,
    METHOD,
    NEAR_GAIN,
    PROBE_BASELINES,
    PROBE_TARGETS,
    SATURATED,
    SPEARMAN,
    TIE,
    Config,
)
from mixlab.rl.rnd_rff.envs import CoordMazeVector, make_vector_env
from mixlab.rl.rnd_rff.ppo import PPOConfig, PPOLearner
from mixlab.rl.rnd_rff.probe import cluster_probe, score_bonus
from mixlab.shared import Claim, Result, mean_std, run_cells
from mixlab.shared.files import write_json_atomic

REGIME_FAR = 0.95
REGIME_NEAR = 0.85
TAIL = 0.2
"""share of training (the last iterations) over which the success rate is measured"""

__all__ = ["METHOD", "Config", "claims", "regime", "run", "summarise"]


# ------------------------------------------------------------------------------------ cells
def _cells(config: Config) -> list[dict[str, Any]]:
    seeds = [config.seed + s for s in range(config.n_seeds)]
    cells: list[dict[str, Any]] = []
    for seed in seeds:
        cells += [
            {"task": "probe", "system": s, "scale": 1.0, "seed": seed} for s in PROBE_BASELINES
        ]
        cells += [
            {"task": "probe", "system": s, "scale": float(m), "seed": seed}
            for s in config.probe_targets
            for m in config.bandwidths
        ]
    for env in ("maze-xy", "maze-onehot", *config.minigrid):
        cells += [
            {"task": "explore", "env": env, "system": s, "seed": seed}
            for seed in seeds
            for s in _explorers(config, env)
        ]
    return cells


def _explorers(config: Config, env: str) -> tuple[str, ...]:
    """The explorers run on ``env``: ``onehot_explorers`` on the one-hot maze, else all."""
    return config.onehot_explorers if env == "maze-onehot" else config.explorers


def _probe_cell(config: Config, cell: dict[str, Any]) -> dict[str, Any]:
    seed = cell["seed"]
    probe = cluster_probe(
        config.probe_grid, config.probe_sd, config.probe_train, config.probe_test, seed
    )
    bonus = make_bonus(cell["system"], (2,), seed=seed, lr=1e-3)
    rff = cell["system"] in PROBE_TARGETS  # ℓ = scale × the median heuristic on the training data
    scores = score_bonus(
        bonus, probe, bandwidth_scale=cell["scale"] if rff else None, steps=config.probe_steps,
        gp_points=config.gp_points, gp_noise=config.gp_noise,
        reference_kernel=cell["system"] == "rnd",  # claim 1's control, against the same σ²
    )  # fmt: skip
    if rff:
        scores["median"] = bonus.bandwidth / cell["scale"]
    return {**cell, **scores}


def _maze(config: Config, kind: str) -> CoordMazeVector:
    return CoordMazeVector(config.num_envs, config.rooms, config.room_size, kind, config.max_steps)


def _explore_cell(config: Config, cell: dict[str, Any]) -> dict[str, Any]:
    seed, system, env = cell["seed"], cell["system"], cell["env"]
    if env.startswith("maze-"):
        envs = _maze(config, env.removeprefix("maze-"))
        cells_total = envs.layout.n_cells
        steps = config.maze_steps if env == "maze-xy" else config.onehot_steps
        # one count cell per maze cell: (x, y) positions are 1/(side − 1) apart
        cell_size = 0.5 / (max(envs.layout.shape) - 1) if env == "maze-xy" else 0.5
    else:
        envs = make_vector_env(env, config.num_envs)
        cells_total, steps, cell_size = None, config.minigrid_steps, 1.0
    bonus = (
        None
        if system == "ppo"
        else make_bonus(system, envs.single_observation_space, cell_size=cell_size, seed=seed)
    )
    ppo = PPOConfig(num_steps=config.num_steps, learning_rate=config.learning_rate)
    history = PPOLearner(envs, bonus, ppo, seed=seed).learn(steps)
    envs.close()
    tail = history[-max(1, round(TAIL * len(history))) :]
    episodes = sum(row["episodes"] for row in tail)
    first = history[-1]["first_reward_step"]
    return {
        **cell,
        "cells": history[-1]["cells"],
        "cell_share": None if cells_total is None else history[-1]["cells"] / cells_total,
        "reached": first is not None,
        "first_reward_step": first,
        "success_rate": sum(row["successes"] for row in tail) / episodes if episodes else 0.0,
        "curve": [[row["step"], row["cells"]] for row in history],
        "bandwidth": None if bonus is None else bonus.bandwidth,
    }


def run_cell(config: Config, cell: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(1)  # small networks: one thread each, two workers side by side
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    outcome = _probe_cell(config, cell) if cell["task"] == "probe" else _explore_cell(config, cell)
    return {**outcome, "seconds": time.perf_counter() - started}


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    done = run_cells(
        out_dir, config, _cells(config), functools.partial(run_cell, config),
        resume=resume, label="rnd_rff", workers=config.workers,
    )  # fmt: skip
    write_json_atomic(out_dir / "cells.json", done, indent=1)
    metrics = summarise(done, config)
    _plot(done, metrics, config, out_dir)
    found = claims(metrics, config, done)
    medians = [c["median"] for c in done if "median" in c]
    bandwidths = [c["bandwidth"] for c in done if c.get("bandwidth") is not None]
    return Result(
        metrics=metrics,
        claims=found,
        regime=regime(metrics, config, found, done),
        env={
            "probe_median_bandwidth": float(np.mean(medians)) if medians else None,
            "explore_median_bandwidth": float(np.mean(bandwidths)) if bandwidths else None,
        },
    )


# ---------------------------------------------------------------------------------- summary
PROBE_KEYS = (
    "near_auroc", "far_auroc", "near_fpr95", "far_fpr95", "id_error", "spearman", "spearman_all",
    "gp_near_auroc",
)  # fmt: skip
EXPLORE_KEYS = ("cells", "cell_share", "success_rate")


def row_name(cell: dict[str, Any]) -> str:
    """``probe/rnd``, ``probe/rff-laplace@0.25``, ``maze-xy/count``, ``MiniGrid-…/rff``."""
    if cell["task"] == "probe":
        scale = "" if cell["system"] in PROBE_BASELINES else f"@{cell['scale']:g}"
        return f"probe/{cell['system']}{scale}"
    return f"{cell['env']}/{cell['system']}"


def summarise(done: list[dict[str, Any]], config: Config) -> dict[str, dict[str, Any]]:
    """One row per probe system × bandwidth and per env × explorer: mean and sample sd over
    seeds of every metric that applies (None elsewhere), ``reached`` (seeds that found the goal),
    ``first_reward_step`` (mean over those seeds), seeds and mean seconds."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for cell in done:
        groups.setdefault(row_name(cell), []).append(cell)
    rows = {}
    for name, cells in groups.items():
        row: dict[str, Any] = {}
        for key in (*PROBE_KEYS, *EXPLORE_KEYS):
            values = [c[key] for c in cells if c.get(key) is not None]
            row[key], row[f"{key}_std"] = mean_std(values) if values else (None, None)
        explore = cells[0]["task"] == "explore"
        firsts = [c["first_reward_step"] for c in cells if c.get("first_reward_step") is not None]
        row["reached"] = sum(bool(c.get("reached")) for c in cells) if explore else None
        row["first_reward_step"] = float(np.mean(firsts)) if firsts else None
        row["n"] = len(cells)
        row["seconds"] = float(np.mean([c["seconds"] for c in cells]))
        rows[name] = row
    return rows


def _per_seed(done: list[dict[str, Any]], row: str, key: str) -> dict[int, float]:
    return {c["seed"]: float(c[key]) for c in done if row_name(c) == row and c.get(key) is not None}


def _seed_values(
    done: list[dict[str, Any]], *columns: tuple[str, str]
) -> tuple[list[int], list[list[float]]]:
    """The seeds that every (row, key) of ``columns`` has, and each column's values on them, in
    seed order; a KeyError when no seed has them all (a system the run did not measure)."""
    per_seed = [_per_seed(done, row, key) for row, key in columns]
    seeds = sorted(set.intersection(*(set(values) for values in per_seed)))
    if not seeds:
        raise KeyError(f"no seed measured all of {list(columns)}")
    return seeds, [[values[s] for s in seeds] for values in per_seed]


def _probe_row(system: str, scale: float) -> str:
    """The probe row of ``system`` at ``scale`` × the median ℓ (a random-MLP target has one row:
    its bandwidth is the architecture's)."""
    return f"probe/{system}@{scale:g}" if system in PROBE_TARGETS else f"probe/{system}"


def _mean(metrics: dict[str, Any], row: str, key: str) -> float:
    value = metrics.get(row, {}).get(key)
    return float("nan") if value is None else float(value)


def _variants(config: Config) -> list[tuple[str, str]]:
    """(tag, system) of the median rule and of multiscale around it."""
    out = [("a", "rff")]
    if "rff-multiscale" in config.explorers:
        out.append(("b", "rff-multiscale"))
    return out


def _unsaturated(done: list[dict[str, Any]], config: Config, kind: str) -> Claim:
    """No explorer covers more than :data:`SATURATED` of the ``kind`` maze's cells on any seed."""
    columns = [
        (f"maze-{kind}/{system}", "cell_share") for system in _explorers(config, f"maze-{kind}")
    ]
    seeds, shares = _seed_values(done, *columns)
    largest = [max(values) for values in zip(*shares, strict=True)]
    return Claim.worst_seed(
        f"no explorer covers more than {SATURATED:.0%} of the {kind} maze's cells on any seed",
        largest,
        "<=",
        SATURATED,
        seeds=seeds,
        value_label=f"largest share of the {kind} maze's cells covered",
    )


def claims(metrics: dict[str, Any], config: Config, done: list[dict[str, Any]]) -> list[Claim]:
    """Every claim of ``Config.CLAIMS``, judged on the seeds' values in ``done`` (the cells, not
    ``metrics``' means over seeds) with its control in RND-RFF's place."""

    def tracks_gp(system: str) -> Claim:
        median, quarter = _probe_row(system, 1), _probe_row(system, 0.25)
        seeds, (rho, low, high) = _seed_values(
            done, (median, "spearman"), (quarter, "id_error"), (median, "id_error")
        )
        return Claim.all_of(
            f"{system} tracks σ²",
            [
                Claim.worst_seed("Spearman", rho, ">=", SPEARMAN, seeds=seeds,
                                 value_label=f"{median} Spearman(bonus, σ²_ℓ)"),
                Claim.worst_seed("ID error", low, ">=", [ID_ERROR_RATIO * h for h in high],
                                 seeds=seeds, value_label=f"{quarter} ID error",
                                 reference_label=f"{ID_ERROR_RATIO:g} × {median}'s"),
                Claim.paired("spread", [a - ID_ERROR_RATIO * b for a, b in zip(low, high, strict=True)],
                             label=f"{quarter} − {ID_ERROR_RATIO:g} × {median} ID error"),
            ],
        )  # fmt: skip

    def near_ood(system: str) -> Claim:
        row = _probe_row(system, 1)
        seeds, (ours, rnd) = _seed_values(done, (row, "near_auroc"), ("probe/rnd", "near_auroc"))
        return Claim.all_of(
            f"{system} beats RND near the data",
            [
                Claim.worst_seed("gain", ours, ">=", [r + NEAR_GAIN for r in rnd], seeds=seeds,
                                 value_label=f"{row} near AUROC", reference_label=f"RND + {NEAR_GAIN}"),
                Claim.paired("spread", [a - b for a, b in zip(ours, rnd, strict=True)],
                             label=f"{row} − probe/rnd near AUROC"),
            ],
        )  # fmt: skip

    def coverage(system: str) -> Claim:
        a = f"maze-xy/{system}"
        seeds, (cells, rnd, count, reached, rnd_reached) = _seed_values(
            done, (a, "cells"), ("maze-xy/rnd", "cells"), ("maze-xy/count", "cells"),
            (a, "reached"), ("maze-xy/rnd", "reached"),
        )  # fmt: skip
        bar = [r + COVERAGE_GAP * (c - r) for r, c in zip(rnd, count, strict=True)]
        return Claim.all_of(
            f"{system} closes the gap to the count oracle",
            [
                Claim.worst_seed("cells", cells, ">=", bar, seeds=seeds, value_label=f"{a} cells",
                                 reference_label=f"RND + {COVERAGE_GAP:g} × (count − RND)"),
                Claim.paired("spread", [c - b for c, b in zip(cells, bar, strict=True)],
                             label=f"{a} − (RND + {COVERAGE_GAP:g} × (count − RND)) cells"),
                Claim.worst_seed("goal", reached, ">=", rnd_reached, seeds=seeds,
                                 value_label=f"{a} reached the goal (1 = yes)",
                                 reference_label="RND's"),
            ],
        )  # fmt: skip

    def tie(system: str) -> Claim:
        parts = []
        for env in ["maze-onehot", *config.minigrid]:
            seeds, (ours, rnd) = _seed_values(
                done, (f"{env}/{system}", "cells"), (f"{env}/rnd", "cells")
            )
            parts.append(Claim.worst_seed(
                env, [abs(o - r) / r if r > 0 else float("nan") for o, r in zip(ours, rnd, strict=True)],
                "<=", TIE, seeds=seeds, value_label=f"{env} |{system} − RND| / RND cells",
            ))  # fmt: skip
        return Claim.all_of(f"{system} ties RND", parts)

    found = [config.judge("tracks_gp", tracks_gp)]
    # (2)'s threshold, RND's near AUROC + the gain, must lie below a perfect detector's 1
    _, (rnd_near,) = _seed_values(done, ("probe/rnd", "near_auroc"))
    found += [
        config.judge(f"near_ood_{tag}", near_ood, threshold=float(np.mean(rnd_near)) + NEAR_GAIN,
                     floor=0.5, ceiling=1.0)
        for tag, _ in _variants(config)
    ]  # fmt: skip
    # (3)'s floor is RND's cells, its ceiling the count oracle's: the oracle must cover more
    seeds, (rnd_cells, count_cells) = _seed_values(
        done, ("maze-xy/rnd", "cells"), ("maze-xy/count", "cells")
    )
    oracle = Claim.worst_seed(
        "the count oracle (the upper reference) covers more of the xy maze than RND on every seed",
        count_cells, ">", rnd_cells, seeds=seeds,
        value_label="maze-xy/count cells", reference_label="RND's",
    )  # fmt: skip
    found += [
        config.judge(
            f"coverage_{tag}", coverage,
            premises={"xy_maze_unsaturated": _unsaturated(done, config, "xy"),
                      "oracle_above_rnd": oracle},
        )
        for tag, _ in _variants(config)
    ]  # fmt: skip
    note = "" if config.minigrid else " (MiniGrid runs in the full profile)"
    found.append(config.judge(
        "tie_onehot", tie,
        premises={"onehot_maze_unsaturated": _unsaturated(done, config, "onehot")},
        text_values={"minigrid_note": note},
    ))  # fmt: skip
    return found


def regime(
    metrics: dict[str, Any],
    config: Config,
    found: list[Claim] | None = None,
    done: list[dict[str, Any]] | None = None,
) -> list[Claim]:
    """The checks of the module docstring; each gates the claims that rest on it. The mazes'
    ceiling check (no explorer above :data:`SATURATED` of the cells on any seed) reads the
    seeds' cells in ``done``; without them only the goal checks run."""
    n = config.n_seeds
    collapse = Claim.all_of(
        f"On the probe RND separates far-OOD (AUROC >= {REGIME_FAR}) but collapses near the data "
        f"(near-OOD AUROC <= {REGIME_NEAR})",
        [
            Claim.compare("far", _mean(metrics, "probe/rnd", "far_auroc"), ">=", REGIME_FAR,
                          value_label="RND far AUROC"),
            Claim.compare("near", _mean(metrics, "probe/rnd", "near_auroc"), "<=", REGIME_NEAR,
                          value_label="RND near AUROC"),
        ],
    )  # fmt: skip
    mazes = []
    for kind in ("xy", "onehot"):
        checks = [
            Claim.compare("PPO", _mean(metrics, f"maze-{kind}/ppo", "reached"), "<=", n // 3,
                          value_label="PPO seeds reaching the goal"),
            Claim.compare("count", _mean(metrics, f"maze-{kind}/count", "reached"), ">=",
                          math.ceil(2 * n / 3), value_label="count-oracle seeds reaching the goal"),
        ]  # fmt: skip
        ceiling = ""
        if done is not None:
            checks.append(_unsaturated(done, config, kind))
            ceiling = f", and no explorer covers more than {SATURATED:.0%} of its cells on any seed"
        mazes.append(Claim.all_of(
            f"In the {kind} maze PPO alone reaches the goal in <= {n // 3} of {n} seeds and the "
            f"count oracle in >= {math.ceil(2 * n / 3)}{ceiling}",
            checks,
        ))  # fmt: skip
    if found is None:
        return [collapse, *mazes]
    by_number = {c.text[: c.text.index(")") + 1]: c for c in found}
    pick = lambda *keys: [by_number[k] for k in keys if k in by_number]  # noqa: E731
    return [
        collapse.gating(*pick("(1)", "(2a)", "(2b)")),
        mazes[0].gating(*pick("(3a)", "(3b)")),
        mazes[1].gating(*pick("(4)")),
    ]


# ------------------------------------------------------------------------------------- plot
def _plot(
    done: list[dict[str, Any]], metrics: dict[str, Any], config: Config, out_dir: Path
) -> None:
    from matplotlib.figure import Figure

    from mixlab.shared import save_figure

    envs = ["maze-xy", "maze-onehot", *config.minigrid]
    figure = Figure(figsize=(4.2 * (len(envs) + 1), 3.8), layout="constrained")
    axes = figure.subplots(1, len(envs) + 1)
    for ax, env in zip(axes, envs, strict=False):
        for system in _explorers(config, env):
            curves = [
                c["curve"]
                for c in done
                if c["task"] == "explore" and c["env"] == env and c["system"] == system
            ]
            if curves:
                steps = np.array(curves[0])[:, 0]
                ax.plot(steps, np.mean([np.array(c)[:, 1] for c in curves], axis=0), label=system)
        ax.set(xlabel="env steps", ylabel="distinct cells visited", title=env)
        ax.legend(fontsize=7)
    ax = axes[-1]
    for system in PROBE_TARGETS:
        points = [
            (m, metrics.get(f"probe/{system}@{m:g}", {}).get("near_auroc"))
            for m in config.bandwidths
        ]
        points = [(m, v) for m, v in points if v is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=f"{system} near")
    for baseline in PROBE_BASELINES:
        value = metrics.get(f"probe/{baseline}", {}).get("near_auroc")
        if value is not None:
            ax.axhline(
                value,
                ls="--",
                lw=1,
                color="grey" if baseline == "rnd" else "black",
                label=f"{baseline} near",
            )
    ax.set_xscale("log", base=2)
    ax.set(xlabel="ℓ / median", ylabel="near-OOD AUROC", title="probe")
    ax.legend(fontsize=7)
    save_figure(figure, out_dir / "exploration.png")
