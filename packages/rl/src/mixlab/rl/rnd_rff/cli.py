"""``mixlab-rl rnd_rff``: PPO with a novelty bonus, novelty scores of any array, the kernel toy.

mixlab-rl rnd_rff train --env CoordMaze --bonus rff --steps 50000 --out runs/maze-rff
mixlab-rl rnd_rff train --env MiniGrid-DoorKey-8x8-v0 --bonus rnd --steps 1000000 --out runs/dk
mixlab-rl rnd_rff novelty --train visited.npz --test new.npz --target rff --out scores.csv
mixlab-rl rnd_rff kernel --out runs/kernel
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mixlab.shared.checks import (
    check_choice,
    check_count,
    check_input_file,
    check_number,
    check_output_file,
    check_output_folder,
    check_seed,
)
from mixlab.shared.device import check_device_name

app = typer.Typer(
    help="RND-RFF: random network distillation with a random-Fourier-feature target.",
    no_args_is_help=True,
)

BONUSES = ("none", "rnd", "rff", "rff-multiscale", "rff-laplace", "drnd", "count")
TARGETS = ("rff", "rff-multiscale", "rff-laplace", "rnd", "drnd")


def _bandwidth(text: str) -> float | str:
    if text == "median":
        return text
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    check_number(value, "--bandwidth", value > 0, "'median' or a number > 0")
    return value


def _write_rows(path: Path, rows: list[dict]) -> None:
    from mixlab.shared.files import write_csv_atomic

    write_csv_atomic(path, list(rows[0]), [list(row.values()) for row in rows])


@app.command()
def train(
    env: Annotated[
        str, typer.Option(help="CoordMaze, a MiniGrid id or any registered gymnasium id")
    ] = "CoordMaze",
    bonus: Annotated[str, typer.Option(help=f"one of {', '.join(BONUSES)}")] = "rff",
    bandwidth: Annotated[
        str, typer.Option(help="RFF ℓ: 'median' (from the normalisation rollout) or a number")
    ] = "median",
    steps: int = 50_000,
    num_envs: int = 8,
    seed: int = 0,
    obs: Annotated[str, typer.Option(help="CoordMaze observations: xy or onehot")] = "xy",
    rooms: Annotated[str, typer.Option(help="CoordMaze rooms as ROWSxCOLS")] = "3x3",
    room_size: int = 7,
    max_steps: int = 250,
    update_proportion: Annotated[
        float, typer.Option(help="share of each rollout the predictor trains on")
    ] = 0.25,
    cell_size: Annotated[
        float, typer.Option(help="count bonus: the discretisation step (0: one cell per maze cell)")
    ] = 0.0,
    device: str = "cpu",
    out: Annotated[
        Path, typer.Option(help="folder for checkpoints, curves.csv and summary.json")
    ] = Path("runs/rnd_rff"),
    resume: Annotated[
        bool, typer.Option(help="continue from the last checkpoint in --out")
    ] = False,
) -> None:
    """Train PPO (two value heads, CleanRL's RND recipe) with a novelty bonus on a vector env."""
    check_choice(bonus, "--bonus", BONUSES)
    ell = _bandwidth(bandwidth)
    check_count(steps, "--steps")
    check_count(num_envs, "--num-envs")
    check_seed(seed)
    check_choice(obs, "--obs", ("xy", "onehot"))
    try:
        layout = tuple(int(r) for r in rooms.lower().split("x"))
    except ValueError:
        layout = ()
    if len(layout) != 2 or min(layout) < 1 or layout[0] * layout[1] < 2:
        raise ValueError(f"--rooms must be ROWSxCOLS with at least 2 rooms, got {rooms!r}")
    check_count(room_size, "--room-size", 2)
    check_count(max_steps, "--max-steps")
    check_number(
        update_proportion, "--update-proportion", 0 < update_proportion <= 1, "a number in (0, 1]"
    )
    check_number(cell_size, "--cell-size", cell_size >= 0, "a number >= 0")
    check_device_name(device, "--device")
    check_output_folder(out, "--out")

    import numpy as np

    from mixlab.rl.rnd_rff.bonus import make_bonus
    from mixlab.rl.rnd_rff.envs import make_vector_env
    from mixlab.rl.rnd_rff.ppo import PPOLearner
    from mixlab.shared.checkpoint import Checkpointer
    from mixlab.shared.device import resolve_device
    from mixlab.shared.files import write_json_atomic

    maze = env in ("CoordMaze", "mixlab/CoordMaze-v0")
    options = (
        {"rooms": layout, "room_size": room_size, "obs": obs, "max_steps": max_steps}
        if maze
        else {}
    )
    envs = make_vector_env(env, num_envs, **options)
    if not cell_size:
        cell_size = 0.5 / (max(envs.layout.shape) - 1) if maze and obs == "xy" else 0.5
    torch_device = resolve_device(device)
    novelty = None
    if bonus != "none":
        novelty = make_bonus(bonus, envs.single_observation_space, bandwidth=ell, cell_size=cell_size,
                             update_proportion=update_proportion, seed=seed, device=torch_device)  # fmt: skip
    learner = PPOLearner(envs, novelty, seed=seed, device=torch_device)
    run = {"env": env, "bonus": bonus, "bandwidth": bandwidth, "num_envs": num_envs, "seed": seed,
           "obs": obs, "rooms": rooms, "room_size": room_size, "max_steps": max_steps,
           "update_proportion": update_proportion, "cell_size": cell_size}  # fmt: skip
    checkpoints = Checkpointer(out, resume=resume, keep_last=1)
    if (last := checkpoints.load_latest()) is not None:
        saved = last[1].get("run", {})
        changed = sorted(k for k in run if saved.get(k) != run[k])
        if changed:
            options = ", ".join(f"--{k.replace('_', '-')}" for k in changed)
            raise ValueError(f"--resume: the checkpoint in {out} was written with other {options}")
        learner.load_state_dict(last[1])
        typer.echo(f"resumed at step {learner.global_step}")

    def save(current: PPOLearner) -> None:
        checkpoints.save(len(current.history), {**current.state_dict(), "run": run})
        row = current.history[-1]
        typer.echo(f"step {row['step']}: cells {row['cells']}, episodes {row['episodes']}, "
                   f"successes {row['successes']}, intrinsic {row['intrinsic']:.3f}")  # fmt: skip

    history = learner.learn(steps, callback=save)
    _write_rows(out / "curves.csv", history)
    summary = {
        "env": env, "bonus": bonus, "steps": learner.global_step, "seed": seed,
        "cells": history[-1]["cells"], "first_reward_step": learner.first_reward_step,
        "successes": int(np.sum([r["successes"] for r in history])),
        "episodes": int(np.sum([r["episodes"] for r in history])),
        "bandwidth": None if novelty is None else novelty.bandwidth,
    }  # fmt: skip
    write_json_atomic(out / "summary.json", summary)
    typer.echo(
        f"{env} {bonus}: {summary['cells']} cells, first reward at {summary['first_reward_step']}; wrote {out}"
    )


def _load_array(path: Path, option: str):
    import numpy as np

    check_input_file(path, option, (".npz", ".npy"))
    if path.suffix == ".npy":
        array = np.load(path, allow_pickle=False)
    else:
        with np.load(path, allow_pickle=False) as data:
            keys = list(data.keys())
            key = "x" if "x" in keys else keys[0] if len(keys) == 1 else None
            if key is None:
                raise ValueError(f"{option}: {path} holds {keys}; name the points 'x'")
            array = data[key]
    if array.ndim < 2 or len(array) < 2:
        raise ValueError(
            f"{option}: {path} must hold a [points, ...] array of at least 2 points, got shape {array.shape}"
        )
    return array.astype("float32")


@app.command()
def novelty(
    train: Annotated[
        Path, typer.Option("--train", help="visited points (.npz with one array or 'x', or .npy)")
    ],
    test: Annotated[Path, typer.Option("--test", help="points to score")],
    target: Annotated[str, typer.Option(help=f"one of {', '.join(TARGETS)}")] = "rff",
    bandwidth: str = "median",
    steps: int = 2000,
    held_out: Annotated[
        float,
        typer.Option(help="share of --train kept out of the fit: the AUROC's in-distribution side"),
    ] = 0.1,
    seed: int = 0,
    out: Annotated[Path, typer.Option(help="per-point bonus CSV")] = Path("novelty.csv"),
) -> None:
    """Fit a bonus on --train, score every --test point, and the AUROC of --test against held-out --train."""
    check_choice(target, "--target", TARGETS)
    ell = _bandwidth(bandwidth)
    check_count(steps, "--steps")
    check_number(held_out, "--held-out", 0 < held_out < 1, "a number in (0, 1)")
    check_seed(seed)
    check_output_file(out, "--out", (".csv",))
    import numpy as np

    from mixlab.rl.rnd_rff.bonus import make_bonus
    from mixlab.rl.rnd_rff.kernels import auroc

    visited, points = _load_array(train, "--train"), _load_array(test, "--test")
    for array, option in ((visited, "--train"), (points, "--test")):
        if not np.isfinite(array).all():  # a NaN reached the bandwidth as "unset" (issue 80)
            raise ValueError(f"{option} points must be finite numbers: the file holds NaN or inf")
    if visited.shape[1:] != points.shape[1:]:
        raise ValueError(
            f"--test points have shape {points.shape[1:]}, --train points {visited.shape[1:]}"
        )
    order = np.random.default_rng(seed).permutation(len(visited))
    cut = max(1, round(held_out * len(visited)))
    kept, fit_on = visited[order[:cut]], visited[order[cut:]]
    model = make_bonus(target, visited.shape[1:], bandwidth=ell, seed=seed, lr=1e-3).fit(
        fit_on, steps=steps
    )
    scores, reference = model.bonus(points), model.bonus(kept)
    _write_rows(out, [{"index": i, "bonus": float(s)} for i, s in enumerate(scores)])
    typer.echo(
        f"{target}: AUROC(test vs held-out train) = {auroc(reference, scores):.4f}; wrote {out}"
    )


@app.command()
def kernel(
    bandwidths: Annotated[
        str, typer.Option(help="ℓ as multiples of the median, comma-separated")
    ] = "0.125,0.25,0.5,1,2",
    spectrum: Annotated[str, typer.Option(help="gaussian, laplace or multiscale")] = "gaussian",
    steps: int = 2000,
    seed: int = 0,
    out: Annotated[Path, typer.Option(help="folder for kernel.csv")] = Path("runs/rnd_rff-kernel"),
) -> None:
    """The 2-D toy per ℓ: near/far AUROC, ID error and Spearman with the GP posterior variance."""
    try:
        scales = [float(b) for b in bandwidths.split(",")]
    except ValueError:
        scales = []
    if not scales or min(scales) <= 0:
        raise ValueError(
            f"--bandwidths must be numbers > 0 separated by commas, got {bandwidths!r}"
        )
    check_choice(spectrum, "--spectrum", ("gaussian", "laplace", "multiscale"))
    check_count(steps, "--steps")
    check_seed(seed)
    check_output_folder(out, "--out")

    from mixlab.rl.rnd_rff.bonus import make_bonus
    from mixlab.rl.rnd_rff.probe import cluster_probe, score_bonus

    kind = {"gaussian": "rff", "laplace": "rff-laplace", "multiscale": "rff-multiscale"}[spectrum]
    probe = cluster_probe(seed=seed)
    rows = []
    for scale in scales:
        bonus = make_bonus(kind, (2,), seed=seed, lr=1e-3)
        scores = score_bonus(bonus, probe, bandwidth_scale=scale, steps=steps)
        rows.append({"scale": scale, "bandwidth": bonus.bandwidth, **scores})
        row = rows[-1]
        typer.echo(f"ℓ = {scale:g} × median: near AUROC {row['near_auroc']:.3f}, far {row['far_auroc']:.3f}, "
                   f"ID error {row['id_error']:.4f}, Spearman(σ²) {row['spearman']:.3f}")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    _write_rows(out / "kernel.csv", rows)
    typer.echo(f"wrote {out / 'kernel.csv'}")
