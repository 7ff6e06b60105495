"""Benchmark: sessions per second of CURB's compiled Q-learning against the plain-Python loop.

    uv run python benchmarks/curb.py                    # -> benchmarks/results/curb/
    uv run python benchmarks/curb.py --sessions 40 --out /tmp/bench

Every system plays the same seeded Calvano Bertrand sessions with the same function
(:func:`mixlab.rl.curb.train_sessions`); the plain-Python reference is that function run by the
interpreter (``python=True``), which gives the same Q tables bit for bit. Throughput on capped
sessions (``--periods`` periods each) is compared side by side in one process, as periods per
second and as a ratio to the reference; full sessions to Calvano's convergence rule are timed for
the compiled loop on one thread and on all threads, and the reference's sessions per second is its
periods per second divided by the mean session length (running it to convergence would take
minutes per session). Timings are the median of 3 runs after a warm-up that compiles the loop.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import numba

from mixlab.rl.curb import LogitBertrand, QLearner, RepeatedMarketEnv, train_sessions
from mixlab.shared import Claim, bar_plot
from mixlab.shared.result import write_benchmark

LEARNERS = {"q-learning": QLearner(), "curb": QLearner.curb()}


def timed(function, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20, help="full sessions per timing")
    parser.add_argument("--periods", type=int, default=20_000, help="periods per capped session")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "curb")
    args = parser.parse_args()
    env = RepeatedMarketEnv(LogitBertrand())
    threads = numba.get_num_threads()
    start = time.perf_counter()
    metrics: dict[str, dict[str, float]] = {}
    for name, learner in LEARNERS.items():
        capped = dataclasses.replace(learner, max_periods=args.periods)
        train_sessions(env, learner, 2, seed=99)  # warm-up: compile
        python_s = timed(lambda c=capped: train_sessions(env, c, 1, python=True), repeats=1)
        numba.set_num_threads(1)
        capped_s = timed(lambda c=capped: train_sessions(env, c, 1))
        full_1 = timed(lambda lrn=learner: train_sessions(env, lrn, args.sessions))
        numba.set_num_threads(threads)
        full_all = timed(lambda lrn=learner: train_sessions(env, lrn, args.sessions))
        periods = train_sessions(env, learner, args.sessions).periods.mean()
        python_rate = args.periods / python_s
        compiled_rate = args.periods / capped_s
        rows = {
            "python": (python_rate, python_rate / periods),
            "numba-1-thread": (compiled_rate, args.sessions / full_1),
            f"numba-{threads}-threads": (
                compiled_rate * full_1 / full_all,
                args.sessions / full_all,
            ),
        }
        for system, (rate, sessions_per_s) in rows.items():
            metrics[f"{name}/{system}"] = {
                "periods_per_s": rate,
                "sessions_per_s": sessions_per_s,
                "seconds_per_session": 1 / sessions_per_s,
                "speed_vs_python": sessions_per_s / rows["python"][1],
                "mean_periods_to_converge": float(periods),
            }
            print(
                f"{name:10s} {system:16s} {rate:12.0f} periods/s {sessions_per_s:9.3f} sessions/s "
                f"({sessions_per_s / rows['python'][1]:7.1f}x python)"
            )
    parallel = f"numba-{threads}-threads"
    claims = [
        Claim.compare(
            f"A full Calvano session ({name}) costs well under a second on one core (< 0.5 s)",
            metrics[f"{name}/numba-1-thread"]["seconds_per_session"],
            "<",
            0.5,
            value_label="seconds per session, 1 thread",
        )
        for name in LEARNERS
    ] + [
        Claim.compare(
            "The compiled loop is at least 50x faster than the plain-Python reference (Q-learning, one thread)",
            metrics["q-learning/numba-1-thread"]["speed_vs_python"],
            ">=",
            50,
            value_label="speed-up",
        ),
    ]
    write_benchmark(
        args.out,
        method="curb-benchmark",
        metrics=metrics,
        claims=claims,
        config={
            "sessions": args.sessions,
            "capped_periods": args.periods,
            "numba_threads": threads,
        },
        started=start,
    )
    bar_plot(
        args.out / "sessions_per_s.png",
        {key: row["sessions_per_s"] for key, row in metrics.items()},
        ylabel="converged sessions per second",
        title=f"Calvano Bertrand sessions per second ({parallel}: all cores)",
    )


if __name__ == "__main__":
    main()
