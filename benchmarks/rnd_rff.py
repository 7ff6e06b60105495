"""Benchmark: env steps per second of PPO+RND-RFF and PPO+RND against Stable-Baselines3's PPO
without a bonus (the fastest peer), and bonus throughput of the RFF, MLP and conv targets.

    uv run python benchmarks/rnd_rff.py                  # -> benchmarks/results/rnd_rff/
    uv run python benchmarks/rnd_rff.py --steps 8192 --out /tmp/bench

Training: the quick experiment's CoordMaze ((4, 4) rooms of 7 cells, (x, y) observations), 8 envs,
128 steps per env per iteration, 4 epochs of 4 minibatches, the same 64-64 tanh actor and
critic networks. SB3 steps 8 ``CoordMaze`` envs in a ``DummyVecEnv`` (its usual setup);
``ppo`` is our learner without a bonus, so ``ppo+rff / ppo`` is the bonus's own cost. Each system
trains ``--steps`` env steps per round after one warm-up iteration, on one thread, every system
in turn each round (order reversed every other round); the median over ``--rounds`` rounds, as
ratios to SB3's PPO.

Bonus throughput: observations scored per second (``bonus``) and trained on per second
(``update``, one epoch of minibatches of 256 at update proportion 1) for 2-D inputs (RFF D = 1024,
k = 64 against RND's MLP target; both with the MLP predictor) and 84×84 frames (CleanRL's conv
target against RFF on a frozen conv embedding; both with the conv predictor). Median of repeats.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from mixlab.rl.rnd_rff.bonus import make_bonus
from mixlab.rl.rnd_rff.config import Config
from mixlab.rl.rnd_rff.envs import CoordMaze, CoordMazeVector
from mixlab.rl.rnd_rff.ppo import PPOConfig, PPOLearner
from mixlab.shared import Claim, median_seconds
from mixlab.shared.result import write_benchmark

NUM_ENVS, NUM_STEPS = 8, 128
REPEATS = 5


def _maze_options() -> dict:
    config = Config()
    return {"rooms": config.rooms, "room_size": config.room_size, "max_steps": config.max_steps}


def ours(bonus_kind: str | None):
    """A warmed-up trainer of our PPO learner (with a bonus, or none): ``train(steps)``."""
    envs = CoordMazeVector(NUM_ENVS, obs="xy", **_maze_options())
    bonus = (
        None
        if bonus_kind is None
        else make_bonus(bonus_kind, envs.single_observation_space, seed=0)
    )
    learner = PPOLearner(envs, bonus, PPOConfig(num_steps=NUM_STEPS, learning_rate=2.5e-4), seed=0)
    learner.learn(NUM_ENVS * NUM_STEPS)  # warm-up: the normalisation rollout and one iteration
    return lambda steps: learner.learn(learner.global_step + steps)


def sb3_ppo():
    """A warmed-up trainer of SB3's PPO on the same envs and networks: ``train(steps)``."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    venv = make_vec_env(lambda: CoordMaze(obs="xy", **_maze_options()), n_envs=NUM_ENVS, seed=0)
    model = PPO("MlpPolicy", venv, n_steps=NUM_STEPS, batch_size=NUM_ENVS * NUM_STEPS // 4, n_epochs=4,
                learning_rate=2.5e-4, seed=0, device="cpu")  # fmt: skip
    model.learn(NUM_ENVS * NUM_STEPS)  # warm-up
    return lambda steps: model.learn(steps, reset_num_timesteps=False)


def training_rates(steps: int, rounds: int) -> dict[str, float]:
    """Env steps per second of every trainer: ``rounds`` rounds, each training every system for
    ``steps`` steps in turn (the order reversed every other round), the median over rounds, so
    that a slow spell of a shared machine falls on every system alike."""
    trainers = {"sb3-ppo": sb3_ppo(), "ppo": ours(None)}
    trainers |= {f"ppo+{kind}": ours(kind) for kind in ("rnd", "rff", "rff-multiscale", "drnd")}
    seconds: dict[str, list[float]] = {name: [] for name in trainers}
    for round_ in range(rounds):
        names = list(trainers) if round_ % 2 == 0 else list(reversed(trainers))
        for name in names:
            started = time.perf_counter()
            trainers[name](steps)
            seconds[name].append(time.perf_counter() - started)
    return {name: steps / float(np.median(values)) for name, values in seconds.items()}


def bonus_throughput(kind: str, shape: tuple[int, ...], batch: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(batch, *shape)).astype(np.float32)
    bonus = make_bonus(kind, shape, seed=0, update_proportion=1.0, epochs=1)
    bonus.init_normalization(obs)
    score_s = median_seconds(lambda: bonus.bonus(obs), REPEATS)
    update_s = median_seconds(lambda: bonus.update(obs, update_stats=False), REPEATS)
    return {"bonus_obs_per_s": batch / score_s, "update_obs_per_s": batch / update_s}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8192, help="env steps per system per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/rnd_rff"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    training = training_rates(args.steps, args.rounds)
    sb3 = training["sb3-ppo"]
    rows: dict[str, dict[str, float | None]] = {}
    for name, rate in training.items():
        rows[f"train/{name}"] = {"env_steps_per_s": rate, "vs_sb3_ppo": rate / sb3,
                                 "bonus_obs_per_s": None, "update_obs_per_s": None}  # fmt: skip
    for name, kind, shape, batch in (
        ("vector/rff", "rff", (2,), 4096),
        ("vector/rnd-mlp", "rnd", (2,), 4096),
        ("pixels/rff-on-conv", "rff", (1, 84, 84), 256),
        ("pixels/rnd-conv", "rnd", (1, 84, 84), 256),
    ):
        rows[name] = {
            "env_steps_per_s": None,
            "vs_sb3_ppo": None,
            **bonus_throughput(kind, shape, batch),
        }
    for name, row in rows.items():
        print(f"{name}: {row}")
    claims = [
        Claim.compare(
            "PPO+RND-RFF trains at >= 0.5× the env steps per second of SB3's PPO without a bonus",
            rows["train/ppo+rff"]["vs_sb3_ppo"], ">=", 0.5, value_label="PPO+RND-RFF / SB3 PPO",
        ),
        Claim.compare(
            "The RFF target scores 2-D observations at least as fast as RND's MLP target",
            rows["vector/rff"]["bonus_obs_per_s"], ">=", rows["vector/rnd-mlp"]["bonus_obs_per_s"],
            value_label="RFF obs/s", reference_label="MLP obs/s",
        ),
    ]  # fmt: skip
    write_benchmark(
        args.out,
        method="rnd_rff",
        metrics=rows,
        claims=claims,
        config={
            "steps": args.steps,
            "num_envs": NUM_ENVS,
            "num_steps": NUM_STEPS,
            "rounds": args.rounds,
            **_maze_options(),
            "threads": 1,
        },
        started=started,
    )


if __name__ == "__main__":
    main()
