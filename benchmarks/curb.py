"""Benchmark: CURB's compiled Q-learning loop against the plain-Python reference.

    uv run python benchmarks/curb.py                    # -> benchmarks/results/curb/
    uv run python benchmarks/curb.py --sessions 40 --out /tmp/bench

Every system plays seeded Calvano Bertrand sessions (Q-learning and CURB), side by side in one
process, on an env built before any timing (the payoff table is not part of a figure):

- ``python-lists``: :func:`mixlab.rl.curb.qlearning.reference_session`, the session loop written
  as plain Python on lists (``train_sessions(..., python=True)``), what a user would write
  without a compiler. It gives the compiled loop's Q tables bit for bit, which is why it draws
  from the same splitmix64 stream in Python integers (a little slower per draw than
  ``random.random()``, 2–4 draws per period). The reference.
- ``numba-1-thread``: the compiled loop on one thread.
- ``numba-N-threads``: the compiled loop on all threads (sessions run in parallel).

Two figures per system. Periods per second on one long capped session (``--periods`` periods,
the convergence stop switched off, so every system plays the same periods from the same seed):
the reference once, the compiled loop the median of 3 after a warm-up that compiles it; the
speed-up on this like-for-like run is ``capped_speed_vs_python``. Sessions per second on
``--sessions`` full sessions to Calvano's convergence rule (median of 3); the reference's is
extrapolated, its periods per second over the mean session length (a full session there takes
minutes), and ``speed_vs_python`` compares sessions per second (the all-threads row: N threads
against the reference's one). Both compiled figures are checked against each other: periods per
second implied by the full sessions (periods played / time) must agree with the capped one
within 20 %.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numba

from mixlab.rl.curb import LogitBertrand, QLearner, RepeatedMarketEnv, train_sessions
from mixlab.shared import Claim, bar_plot
from mixlab.shared.result import write_benchmark

LEARNERS = {"q-learning": QLearner(), "curb": QLearner.curb()}
AGREEMENT = 0.2  # per-period and per-session figures agree within this relative difference


def timed(function: Callable[[], object], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20, help="full sessions per timing")
    parser.add_argument(
        "--periods", type=int, default=2_000_000, help="periods of the capped session"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "curb")
    args = parser.parse_args()
    env = RepeatedMarketEnv(LogitBertrand())
    threads = numba.get_num_threads()
    parallel = f"numba-{threads}-threads"
    start = time.perf_counter()
    metrics: dict[str, dict[str, float | None]] = {}
    for name, learner in LEARNERS.items():
        # Capped: exactly --periods periods, the convergence stop out of reach.
        capped = dataclasses.replace(
            learner, max_periods=args.periods, stable_periods=args.periods + 1
        )
        train_sessions(env, learner, 2, seed=99)  # warm-up: compile
        python_s = timed(lambda c=capped: train_sessions(env, c, 1, python=True), repeats=1)
        numba.set_num_threads(1)
        capped_s = timed(lambda c=capped: train_sessions(env, c, 1))
        full_1 = timed(lambda lrn=learner: train_sessions(env, lrn, args.sessions))
        numba.set_num_threads(threads)
        full_all = timed(lambda lrn=learner: train_sessions(env, lrn, args.sessions))
        played = train_sessions(env, learner, args.sessions)
        mean_periods = float(played.periods.mean())
        total_periods = float(played.periods.sum())
        python_rate = args.periods / python_s
        rows = {
            "python-lists": (python_rate, python_rate / mean_periods, None),
            "numba-1-thread": (
                args.periods / capped_s,
                args.sessions / full_1,
                total_periods / full_1,
            ),
            parallel: (None, args.sessions / full_all, total_periods / full_all),
        }
        for system, (capped_rate, sessions_per_s, full_rate) in rows.items():
            metrics[f"{name}/{system}"] = {
                "periods_per_s_capped": capped_rate,
                "periods_per_s_full_sessions": full_rate,
                "capped_speed_vs_python": None
                if capped_rate is None
                else capped_rate / python_rate,
                "sessions_per_s": sessions_per_s,
                "seconds_per_session": 1 / sessions_per_s,
                "speed_vs_python": sessions_per_s / rows["python-lists"][1],
                "mean_periods_to_converge": mean_periods,
            }
            rate = capped_rate if capped_rate is not None else full_rate
            print(
                f"{name:10s} {system:16s} {rate:12.0f} periods/s {sessions_per_s:9.3f} "
                f"sessions/s ({sessions_per_s / rows['python-lists'][1]:7.1f}x python-lists)"
            )
    claims = []
    for name in LEARNERS:
        one = metrics[f"{name}/numba-1-thread"]
        claims += [
            Claim.compare(
                f"A full Calvano session ({name}) costs well under a second on one core (< 0.5 s)",
                one["seconds_per_session"],
                "<",
                0.5,
                value_label="seconds per session, 1 thread",
            ),
            Claim.compare(
                f"The compiled loop ({name}, one thread) runs at least 10x the periods per "
                "second of the plain-Python list loop on the same capped session",
                one["capped_speed_vs_python"],
                ">=",
                10,
                value_label="speed-up",
            ),
            Claim.compare(
                f"Per-period and per-session figures agree ({name}, one thread): periods per "
                f"second over full sessions within {AGREEMENT:.0%} of the capped session's",
                abs(one["periods_per_s_full_sessions"] / one["periods_per_s_capped"] - 1),
                "<=",
                AGREEMENT,
                value_label="relative difference",
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
            "reference": "python-lists (reference_session: the session loop on lists)",
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
