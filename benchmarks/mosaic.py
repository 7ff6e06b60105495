"""Benchmark: throughput and memory of MoSAIC's partial_fit against GROUSE and PETRELS.

    uv run python benchmarks/mosaic.py                 # n = 100, 1,000, 10,000 -> benchmarks/results/mosaic/
    uv run python benchmarks/mosaic.py --dims 100 --out /tmp/bench

All systems run side by side in one process on the same stream (K = 4 subspaces of rank r = 5,
30 % observed), pre-trained on the same source batch, fed batches of 20 samples. Throughput is the
median of 3 timed passes after a warm-up; memory is the learned state's size and the peak of
Python-tracked allocations (tracemalloc, which sees NumPy buffers) during one partial_fit pass.
Both are reported as ratios to GROUSE at rank K·r (the single-subspace tracker of equal capacity).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import tracemalloc
from pathlib import Path

import numpy as np
import threadpoolctl

from mixlab.online.mosaic import GROUSE, PETRELS, DriftingSubspaceStream, Epoch, MoSAIC
from mixlab.shared import Claim, bar_plot
from mixlab.shared.result import write_benchmark

N_SUBSPACES, RANK, OBSERVED, BATCH = 4, 5, 0.3, 20


def state_bytes(model) -> int:
    """Bytes of the learned state that ``save`` writes."""
    return sum(np.asarray(getattr(model, name)).nbytes for name in model._state_attributes)


def make_systems(source: np.ndarray) -> dict:
    mosaic = MoSAIC(N_SUBSPACES, RANK, n_init=2, max_iter=10, random_state=0).fit(source)
    return {
        "mosaic": mosaic,
        "mosaic_batch1": copy.deepcopy(mosaic),  # the same model fed one sample at a time
        "grouse_r": GROUSE(RANK, random_state=0).fit(source),
        "grouse_Kr": GROUSE(N_SUBSPACES * RANK, random_state=0).fit(source),
        "petrels_Kr": PETRELS(N_SUBSPACES * RANK, random_state=0).fit(source),
    }


def feed(model, X: np.ndarray, batch: int) -> None:
    for start in range(0, len(X), batch):
        model.partial_fit(X[start : start + batch])


def measure(n_features: int, n_samples: int) -> dict[str, dict[str, float]]:
    stream = DriftingSubspaceStream(
        n_features=n_features,
        n_subspaces=N_SUBSPACES,
        rank=RANK,
        observed_fraction=OBSERVED,
        n_source=max(400, 40 * N_SUBSPACES * RANK),
        epochs=(Epoch("stationary", n_samples),),
        snapshot_every=n_samples,
    ).generate(0)
    systems = make_systems(stream.source_X_observed)
    X = stream.X
    rows: dict[str, dict[str, float]] = {}
    for name, model in systems.items():
        batch = 1 if name == "mosaic_batch1" else BATCH
        feed(copy.deepcopy(model), X[: 2 * BATCH], batch)  # warm-up
        times = []
        for _ in range(3):
            fresh = copy.deepcopy(model)
            tic = time.perf_counter()
            feed(fresh, X, batch)
            times.append(time.perf_counter() - tic)
        fresh = copy.deepcopy(model)
        tracemalloc.start()
        feed(fresh, X, batch)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rows[name] = {
            "samples_per_s": n_samples / statistics.median(times),
            "state_bytes": state_bytes(model),
            "peak_bytes": peak,
        }
        print(
            f"n={n_features:>6} {name:14s} {rows[name]['samples_per_s']:10.1f} samples/s  "
            f"state {rows[name]['state_bytes'] / 1e6:8.3f} MB  peak {peak / 1e6:8.3f} MB"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument(
        "--samples", type=int, nargs="+", default=[2000, 1000, 200], help="stream length per dim"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mosaic")
    args = parser.parse_args()
    if len(args.samples) != len(args.dims):
        parser.error(f"--samples needs one length per --dims entry ({len(args.dims)})")

    threads = threadpoolctl.threadpool_info()
    start = time.perf_counter()
    by_dim = {n: measure(n, samples) for n, samples in zip(args.dims, args.samples, strict=True)}
    systems = list(next(iter(by_dim.values())))
    metrics = {name: {} for name in systems}
    for n, rows in by_dim.items():
        reference = rows["grouse_Kr"]
        for name in systems:
            metrics[name][f"samples_per_s_n{n}"] = rows[name]["samples_per_s"]
            metrics[name][f"speed_vs_grouse_Kr_n{n}"] = (
                rows[name]["samples_per_s"] / reference["samples_per_s"]
            )
            metrics[name][f"state_vs_grouse_Kr_n{n}"] = (
                rows[name]["state_bytes"] / reference["state_bytes"]
            )
            metrics[name][f"peak_memory_vs_grouse_Kr_n{n}"] = (
                rows[name]["peak_bytes"] / reference["peak_bytes"]
            )
    largest = max(args.dims)
    claims = [
        Claim.compare(
            f"MoSAIC's state is within 1% of GROUSE at rank K·r (K rank-r bases hold as many numbers as one rank-K·r basis) at n={largest}",
            metrics["mosaic"][f"state_vs_grouse_Kr_n{largest}"],
            "<=",
            1.01,
        ),
        Claim.compare(
            f"MoSAIC's partial_fit is faster than PETRELS at rank K·r at n={largest}",
            metrics["mosaic"][f"samples_per_s_n{largest}"],
            ">",
            metrics["petrels_Kr"][f"samples_per_s_n{largest}"],
            value_label="mosaic samples/s",
            reference_label="petrels_Kr",
        ),
    ]
    write_benchmark(
        args.out,
        method="mosaic-benchmark",
        metrics=metrics,
        claims=claims,
        config={
            "dims": args.dims,
            "samples": args.samples,
            "n_subspaces": N_SUBSPACES,
            "rank": RANK,
            "observed_fraction": OBSERVED,
            "batch_size": BATCH,
            "blas_threads": [t.get("num_threads") for t in threads],
        },
        started=start,
    )
    bar_plot(
        args.out / "speed_vs_grouse_Kr.png",
        {name: metrics[name][f"speed_vs_grouse_Kr_n{largest}"] for name in systems},
        ylabel=f"samples/s relative to GROUSE rank K·r (n={largest})",
        title="partial_fit throughput, batches of 20",
    )


if __name__ == "__main__":
    main()
