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

Two measurements per system. A capped session: ``--periods`` periods from one seed with the
convergence stop out of reach, the same periods for every system (periods per second; the
speed-up on it is ``capped_speed_vs_python``). Full sessions to Calvano's convergence rule:
``--sessions`` of them for the compiled loop, the first ``--python-sessions`` seeds for the
reference (seconds per session; periods per second as periods played / time, which does not
depend on how long the chosen sessions happen to be, and ``speed_vs_python`` is its ratio; the
all-threads row compares N threads with the reference's one). Every timing is the median of 3
after a warm-up that compiles the loop, the reference's once. The two figures of each system are
checked against each other: the full-session periods per second must agree with the capped one
within 20 %.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numba

from mixlab.rl.curb import LogitBertrand, QLearner, RepeatedMarketEnv, train_sessions
from mixlab.shared import Claim, bar_plot
from mixlab.shared.result import write_benchmark
from mixlab.shared.stats import interleaved_median_seconds

LEARNERS = {"q-learning": QLearner(), "curb": QLearner.curb()}
AGREEMENT = 0.2  # per-period and per-session figures agree within this relative difference


def timed(function: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls; the loop is compiled before any timing."""
    return interleaved_median_seconds({"call": function}, repeats, warmup=False)["call"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20, help="full compiled sessions")
    parser.add_argument(
        "--python-sessions", type=int, default=3, help="full sessions of the Python reference"
    )
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

        def full(sessions: int, python: bool = False, lrn: QLearner = learner) -> tuple:
            """(seconds per session, periods per second) over full sessions."""
            played = []  # the seeded sessions play the same periods on every call
            seconds = timed(
                lambda: played.append(train_sessions(env, lrn, sessions, python=python)),
                1 if python else 3,
            )
            return seconds / sessions, float(played[0].periods.sum()) / seconds

        python_capped = args.periods / timed(
            lambda c=capped: train_sessions(env, c, 1, python=True), repeats=1
        )
        python_full = full(args.python_sessions, python=True)
        numba.set_num_threads(1)
        one_capped = args.periods / timed(lambda c=capped: train_sessions(env, c, 1), 3)
        one_full = full(args.sessions)
        numba.set_num_threads(threads)
        all_full = full(args.sessions)
        rows = {
            "python-lists": (python_capped, *python_full),
            "numba-1-thread": (one_capped, *one_full),
            parallel: (None, *all_full),
        }
        for system, (capped_rate, seconds_per_session, full_rate) in rows.items():
            metrics[f"{name}/{system}"] = {
                "periods_per_s_capped": capped_rate,
                "periods_per_s_full_sessions": full_rate,
                "capped_speed_vs_python": None
                if capped_rate is None
                else capped_rate / python_capped,
                "seconds_per_session": seconds_per_session,
                "speed_vs_python": full_rate / python_full[1],
            }
            print(
                f"{name:10s} {system:16s} {full_rate:12.0f} periods/s (full sessions) "
                f"{seconds_per_session:8.3f} s/session ({full_rate / python_full[1]:6.1f}x "
                "python-lists)"
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
        ]
        claims += [
            Claim.compare(
                f"Per-period and per-session figures agree ({name}, {system}): periods per "
                f"second over full sessions within {AGREEMENT:.0%} of the capped session's",
                abs(row["periods_per_s_full_sessions"] / row["periods_per_s_capped"] - 1),
                "<=",
                AGREEMENT,
                value_label="relative difference",
            )
            for system in ("python-lists", "numba-1-thread")
            for row in [metrics[f"{name}/{system}"]]
        ]
    write_benchmark(
        args.out,
        method="curb-benchmark",
        metrics=metrics,
        claims=claims,
        config={
            "sessions": args.sessions,
            "python_sessions": args.python_sessions,
            "capped_periods": args.periods,
            "numba_threads": threads,
            "reference": "python-lists (reference_session: the session loop on lists)",
        },
        started=start,
    )
    bar_plot(
        args.out / "periods_per_s.png",
        {key: row["periods_per_s_full_sessions"] for key, row in metrics.items()},
        ylabel="periods per second over full sessions",
        title=f"Calvano Bertrand, full sessions ({parallel}: all cores)",
    )


if __name__ == "__main__":
    main()
