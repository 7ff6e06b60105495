"""RND-RFF against RND, DRND, plain PPO and a count oracle (``mixlab run rnd_rff``).

Cells, every system with the same data, budget and seeds:

- ``probe``: per seed, the cluster probe (:func:`~.probe.cluster_probe`, drawn with the seed) and
  one bonus fitted on it: RND and DRND (random-MLP targets), RFF with the Gaussian, Laplace and
  multiscale spectra at ``bandwidths`` × the median heuristic; near/far AUROC and FPR@95, ID
  error, Spearman with the exact GP posterior variance (RFF only).
- ``explore``: per seed, PPO with each bonus of ``explorers`` on CoordMaze with (x, y) and with
  one-hot observations (and the ``minigrid`` ids): distinct cells visited, seeds that reached the
  goal, success rate over the last fifth of training, steps to the first reward. The RFF
  bandwidth is the median rule on the observation-normalisation rollout, never tuned.

Regime (result.json's ``regime``, thresholds fixed before any run): on the probe RND separates
far-OOD (AUROC >= 0.95) but not near-OOD (<= 0.85), a collapse for the method to fix (gates 1–2);
in each maze PPO alone reaches the goal in at most a third of the seeds and the count oracle in
at least two thirds (gates 3 for (x, y), 4 for one-hot).

Differences count beyond 2 sd: over the seeds' paired differences d (same seed, same data and
env), mean(d) − 2·sd(d) > 0.
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
from mixlab.rl.rnd_rff.config import METHOD, PROBE_BASELINES, PROBE_TARGETS, Config
from mixlab.rl.rnd_rff.envs import CoordMazeVector, make_vector_env
from mixlab.rl.rnd_rff.ppo import PPOConfig, PPOLearner
from mixlab.rl.rnd_rff.probe import cluster_probe, score_bonus
from mixlab.shared import Claim, Result, mean_std, run_cells
from mixlab.shared.files import write_json_atomic

REGIME_FAR = 0.95
REGIME_NEAR = 0.85
NEAR_GAIN = 0.05
COVERAGE_RATIO = 1.25
TIE = 0.10
SPEARMAN = 0.9
ID_ERROR_RATIO = 10.0
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
            for s in PROBE_TARGETS
            for m in config.bandwidths
        ]
    for env in (*(f"maze-{o}" for o in ("xy", "onehot")), *config.minigrid):
        cells += [
            {"task": "explore", "env": env, "system": s, "seed": seed}
            for seed in seeds
            for s in config.explorers
        ]
    return cells


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
        regime=regime(metrics, config, found),
        env={
            "probe_median_bandwidth": float(np.mean(medians)) if medians else None,
            "explore_median_bandwidth": float(np.mean(bandwidths)) if bandwidths else None,
        },
    )


# ---------------------------------------------------------------------------------- summary
PROBE_KEYS = ("near_auroc", "far_auroc", "near_fpr95", "far_fpr95", "id_error", "spearman")
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


def _paired(done, a: str, b: str, key: str, factor: float = 1.0) -> np.ndarray:
    """d = a − factor·b per seed, over the seeds both rows have."""
    first, second = _per_seed(done, a, key), _per_seed(done, b, key)
    return np.array([first[s] - factor * second[s] for s in sorted(first.keys() & second.keys())])


def _beyond_2sd(done, a: str, b: str, key: str, label: str, factor: float = 1.0) -> Claim:
    """Paired over seeds: d = a − factor·b, mean(d) − 2·sd(d) > 0."""
    d = _paired(done, a, b, key, factor)
    low = float(d.mean() - 2 * d.std(ddof=1)) if len(d) > 1 else float("nan")
    ref = f"{factor:g} × {b}" if factor != 1 else b
    return Claim.compare(label, low, ">", 0.0, value_label=f"mean − 2 sd of {a} − {ref} {key}")


def _tie(done, metrics: dict[str, Any], env: str) -> Claim:
    """RND-RFF ties RND on ``env``: the paired differences of cells d = RFF − RND satisfy
    |mean(d)| + 2·sd(d) <= TIE × RND's mean cells."""
    d = _paired(done, f"{env}/rff", f"{env}/rnd", "cells")
    spread = float(abs(d.mean()) + 2 * d.std(ddof=1)) if len(d) > 1 else float("nan")
    rnd = _mean(metrics, f"{env}/rnd", "cells")
    return Claim.compare(
        env, spread / rnd, "<=", TIE, value_label=f"{env} (|mean d| + 2 sd) / RND cells"
    )


def _mean(metrics: dict[str, Any], row: str, key: str) -> float:
    value = metrics.get(row, {}).get(key)
    return float("nan") if value is None else float(value)


def _variants(config: Config) -> list[tuple[str, str, str]]:
    """(label, probe row, explorer) of the median rule and of multiscale around it."""
    out = [("median rule", "probe/rff@1", "rff")]
    if "rff-multiscale" in config.explorers:
        out.append(("multiscale", "probe/rff-multiscale@1", "rff-multiscale"))
    return out


def claims(metrics: dict[str, Any], config: Config, done: list[dict[str, Any]]) -> list[Claim]:
    found = [
        Claim.all_of(
            f"(1) The RFF bonus (Gaussian, median ℓ) has Spearman >= {SPEARMAN} with the GP "
            f"posterior variance σ²_ℓ, and its ID error at ¼ × median is >= {ID_ERROR_RATIO:g}× "
            "that at the median (beyond 2 sd)",
            [
                Claim.compare(
                    "Spearman",
                    _mean(metrics, "probe/rff@1", "spearman"),
                    ">=",
                    SPEARMAN,
                    value_label="Spearman(bonus, σ²_ℓ)",
                ),
                Claim.compare(
                    "ID error",
                    _mean(metrics, "probe/rff@0.25", "id_error"),
                    ">=",
                    ID_ERROR_RATIO * _mean(metrics, "probe/rff@1", "id_error"),
                    value_label="ID error at ¼ × median",
                    reference_label=f"{ID_ERROR_RATIO:g} × at the median",
                ),
                _beyond_2sd(
                    done, "probe/rff@0.25", "probe/rff@1", "id_error", "spread", ID_ERROR_RATIO
                ),
            ],
        )
    ]
    for number, (label, probe_row, _) in enumerate(_variants(config)):
        tag = "ab"[number]
        found.append(Claim.all_of(
            f"(2{tag}) RND-RFF ({label})'s near-OOD AUROC beats RND's by >= {NEAR_GAIN} (beyond 2 sd)",
            [
                Claim.compare("gain", _mean(metrics, probe_row, "near_auroc"), ">=",
                              _mean(metrics, "probe/rnd", "near_auroc") + NEAR_GAIN,
                              value_label=f"{probe_row} near AUROC", reference_label=f"RND + {NEAR_GAIN}"),
                _beyond_2sd(done, probe_row, "probe/rnd", "near_auroc", "spread"),
            ],
        ))  # fmt: skip
    for number, (label, _, explorer) in enumerate(_variants(config)):
        tag, a, b = "ab"[number], f"maze-xy/{explorer}", "maze-xy/rnd"
        found.append(Claim.all_of(
            f"(3{tag}) On the (x, y) maze RND-RFF ({label}) visits >= {COVERAGE_RATIO}× RND's cells "
            "(beyond 2 sd) and reaches the goal in at least as many seeds",
            [
                Claim.compare("cells", _mean(metrics, a, "cells"), ">=",
                              COVERAGE_RATIO * _mean(metrics, b, "cells"),
                              value_label=f"{a} cells", reference_label=f"{COVERAGE_RATIO} × RND's"),
                _beyond_2sd(done, a, b, "cells", "spread", COVERAGE_RATIO),
                Claim.compare("goal", _mean(metrics, a, "reached"), ">=", _mean(metrics, b, "reached"),
                              value_label="seeds reaching the goal", reference_label="RND's"),
            ],
        ))  # fmt: skip
    envs = ["maze-onehot", *config.minigrid]
    found.append(Claim.all_of(
        f"(4) On the one-hot maze (nothing to overgeneralize) and MiniGrid RND-RFF's cells visited "
        f"stay within {TIE:.0%} of RND's (paired over seeds, |mean d| + 2 sd of d)"
        + ("" if config.minigrid else " (MiniGrid runs in the full profile)"),
        [_tie(done, metrics, env) for env in envs],
    ))  # fmt: skip
    return found


def regime(
    metrics: dict[str, Any], config: Config, found: list[Claim] | None = None
) -> list[Claim]:
    """The checks of the module docstring; each gates the claims that rest on it."""
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
        mazes.append(Claim.all_of(
            f"In the {kind} maze PPO alone reaches the goal in <= {n // 3} of {n} seeds and the "
            f"count oracle in >= {math.ceil(2 * n / 3)}",
            [
                Claim.compare("PPO", _mean(metrics, f"maze-{kind}/ppo", "reached"), "<=", n // 3,
                              value_label="PPO seeds reaching the goal"),
                Claim.compare("count", _mean(metrics, f"maze-{kind}/count", "reached"), ">=",
                              math.ceil(2 * n / 3), value_label="count-oracle seeds reaching the goal"),
            ],
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
        for system in config.explorers:
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
