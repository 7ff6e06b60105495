"""Benchmark: time per sample of MoSAIC's single-sample partial_fit against GROUSE and PETRELS.

    uv run python benchmarks/mosaic.py          # the 3 x 3 grid -> benchmarks/results/mosaic/
    uv run python benchmarks/mosaic.py --dims 100 300 --ranks 2 3 --sample-scale 0.25 --out /tmp/b

Grid: ambient dimension n in {100, 1,000, 10,000} (``--dims``) by expert rank r in {5, 10, 20}
(``--ranks``); K = 4 subspaces, 30 % of the entries observed, a stationary stream from
:class:`DriftingSubspaceStream` (seed 0). At each (n, r) cell every system runs side by side in one
process on the same stream, fed one sample at a time (``partial_fit(X[t : t + 1])``, batches of 1:
the exact online algorithm, with the library's per-call input checks included, as a user pays them):

- ``mosaic``: MoSAIC, K experts of rank r;
- ``grouse_r``: GROUSE at rank r;
- ``grouse_Kr``: GROUSE at rank K·r, the single tracker of equal capacity (K rank-r bases hold as
  many numbers as one rank-K·r basis): the reference every ratio names;
- ``petrels_Kr``: PETRELS at rank K·r, only where affordable: its state holds one (K·r)² inverse
  correlation per row, n·(K·r)² floats, so it runs only where that is below ``--petrels-max-mb``
  (50 MB: at K = 4 every r at n = 100, r <= 10 at n = 1,000, r = 5 at n = 10,000); elsewhere its
  metrics are null.

Time per sample: the cost of a step does not depend on how well the model fits, so nothing is
pre-trained (k-subspaces with ``fit`` is slow on 10^4-dimensional data). Each system starts from a
random subspace and takes ``partial_fit`` on a warm-up prefix of the stream (``--warmup``, 20
samples); that state is deep-copied, and every pass feeds the next ``samples`` samples one at a
time to a fresh copy (the copy is not timed). One untimed pass warms the caches, then ``--repeats``
(3) timed passes run interleaved over the systems (the order reversed every other round, so that
drift in the machine's speed falls on all alike); the time per sample is the median pass over its
length. The stream length scales down with n so that the default grid runs in a few minutes on one
core: 400 samples at n <= 100, 200 at n <= 1,000, 60 above (``--samples`` sets one length per
``--dims`` entry; ``--sample-scale`` multiplies them, for a quick check). BLAS runs on one thread
(``threadpoolctl.threadpool_limits(1)``; the setting is recorded in the config).

Metrics, per system and cell (null where a system did not run): ``ms_per_sample_n{n}_r{r}``,
``vs_grouse_Kr_n{n}_r{r}`` (time per sample over grouse_Kr's, measured in the same run),
``state_vs_grouse_Kr_n{n}_r{r}`` (the learned state that ``save`` writes, over grouse_Kr's) and
``peak_mb_n{n}_r{r}`` (the peak of Python-tracked allocations, NumPy buffers included, during one
more untimed pass, by ``tracemalloc``: the working memory a step adds above the model).

Cost slopes, for mosaic, grouse_r and grouse_Kr: the least-squares slope of log(time) against
log(n) at each r (``slope_n_r{r}``) and of log(time) against log(r) at each n (``slope_r_n{n}``),
each summarised by its mean, min and max over the other dimension (``slope_n_mean``,
``slope_n_min``, ``slope_n_max``, ``slope_r_mean``, ...). What theory predicts: a GROUSE step costs
O(|Ω| r² + n r) (least-squares weights on the |Ω| observed rows, then a rank-one update of the n×r
basis; Balzano, Nowak, Recht 2010), and MoSAIC's adds to one rank-r step the routing,
O(|Ω|·K·r²) (a least-squares fit in each of the K experts). With |Ω| = 0.3 n every term is linear in
n, so the slope in n should approach 1 as n grows, and the slope in r should lie between 1 and 2;
at small n and r the per-call overhead (input checks, constant in n and r) flattens both. GROUSE at
rank K·r pays O(|Ω| K² r² + n K r) where MoSAIC pays O(|Ω| K r² + n r): where the arithmetic
dominates, MoSAIC should cost no more than its equal-capacity reference.

Observed fraction: at the largest cell the systems run again with 10 % and 90 % of the entries
observed (``ms_per_sample_p10_...``, ``ms_per_sample_p90_...``). Routing from the observed rows
costs O(|Ω|·K·r²), so MoSAIC's time should grow with p; routing over all n rows (the code before
v2) would cost about the same at any p.

Claims, at the largest cell measured (n = 10,000, r = 20 on the default grid): MoSAIC's time per
sample is within 3× of grouse_Kr's; and it costs at least 2× more at p = 0.9 than at p = 0.1 (the
cost follows |Ω|; fixed before measuring). The plot ``cost_vs_n.png`` shows time per sample against
n (log-log), one panel per r, one line per system.
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
from matplotlib.figure import Figure

from mixlab.online.mosaic import GROUSE, PETRELS, DriftingSubspaceStream, Epoch, MoSAIC
from mixlab.shared import Claim, save_figure
from mixlab.shared.result import write_benchmark
from mixlab.shared.stats import loglog_slope

N_SUBSPACES, OBSERVED, SEED = 4, 0.3, 0
SYSTEMS = ("mosaic", "grouse_r", "grouse_Kr", "petrels_Kr")
REFERENCE = "grouse_Kr"
SLOPE_SYSTEMS = ("mosaic", "grouse_r", "grouse_Kr")
MAX_CLAIMED_RATIO = 3.0
OBSERVED_SWEEP = (0.1, 0.9)
"""observation rates of the extra runs at the largest cell"""
MIN_RATE_SCALING = 2.0
"""MoSAIC's time at the highest rate of OBSERVED_SWEEP over the lowest must reach this"""


def default_samples(n_features: int) -> int:
    """Samples per timed pass at ambient dimension ``n_features``."""
    if n_features <= 100:
        return 400
    return 200 if n_features <= 1000 else 60


def petrels_state_bytes(n_features: int, rank: int) -> int:
    """Bytes of PETRELS's per-row inverse correlations: n·rank² float64."""
    return 8 * n_features * rank**2


def state_bytes(model) -> int:
    """Bytes of the learned state that ``save`` writes."""
    return sum(np.asarray(getattr(model, name)).nbytes for name in model._state_attributes)


def make_systems(n_features: int, rank: int, petrels_max_bytes: float) -> dict:
    """Unfitted systems for the cell (n, r); PETRELS only where its state is affordable."""
    big = N_SUBSPACES * rank
    systems = {
        "mosaic": MoSAIC(N_SUBSPACES, rank, random_state=SEED),
        "grouse_r": GROUSE(rank, random_state=SEED),
        "grouse_Kr": GROUSE(big, random_state=SEED),
    }
    if petrels_state_bytes(n_features, big) < petrels_max_bytes:
        systems["petrels_Kr"] = PETRELS(big, random_state=SEED)
    return systems


def feed(model, X: np.ndarray) -> None:
    """``partial_fit`` one sample at a time."""
    for t in range(len(X)):
        model.partial_fit(X[t : t + 1])


def measure(
    n_features: int,
    rank: int,
    samples: int,
    warmup: int,
    repeats: int,
    petrels_max_bytes: float,
    observed: float = OBSERVED,
) -> dict[str, dict[str, float]]:
    """Seconds per sample and state bytes of each system that runs at (n, r, observed fraction)."""
    stream = DriftingSubspaceStream(
        n_features=n_features,
        n_subspaces=N_SUBSPACES,
        rank=rank,
        observed_fraction=observed,
        n_source=0,
        epochs=(Epoch("stationary", warmup + samples),),
        snapshot_every=warmup + samples,
    ).generate(SEED)
    X = stream.X  # NaN where unobserved
    prefix, timed = X[:warmup], X[warmup:]
    started = {}
    for name, model in make_systems(n_features, rank, petrels_max_bytes).items():
        feed(model, prefix)  # from a random start: the per-sample cost does not depend on the fit
        started[name] = model
    for model in started.values():
        feed(copy.deepcopy(model), timed)  # warm-up pass, not timed
    times: dict[str, list[float]] = {name: [] for name in started}
    for round_ in range(repeats):
        for name in started if round_ % 2 == 0 else reversed(started):
            model = copy.deepcopy(started[name])
            tic = time.perf_counter()
            feed(model, timed)
            times[name].append(time.perf_counter() - tic)
    peaks = {}
    for name, model in started.items():  # one more pass, untimed: tracemalloc slows NumPy calls
        model = copy.deepcopy(model)
        tracemalloc.start()
        feed(model, timed)
        peaks[name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    rows = {
        name: {
            "seconds_per_sample": statistics.median(times[name]) / samples,
            "state_bytes": state_bytes(model),
            "peak_bytes": peaks[name],
        }
        for name, model in started.items()
    }
    for name, row in rows.items():
        print(
            f"n={n_features:>6} r={rank:>3} p={observed:.1f} {name:11s} "
            f"{1e3 * row['seconds_per_sample']:9.4f} ms/sample  "
            f"state {row['state_bytes'] / 1e6:9.3f} MB  peak {row['peak_bytes'] / 1e6:9.3f} MB"
        )
    return rows


def summarise(slopes: list[float | None], prefix: str) -> dict[str, float | None]:
    """Mean, min and max of ``slopes`` (None where there is none)."""
    values = [s for s in slopes if s is not None]
    if not values:
        return {f"{prefix}_mean": None, f"{prefix}_min": None, f"{prefix}_max": None}
    return {
        f"{prefix}_mean": float(np.mean(values)),
        f"{prefix}_min": min(values),
        f"{prefix}_max": max(values),
    }


def build_metrics(
    cells: dict[tuple[int, int], dict[str, dict[str, float]]], dims: list[int], ranks: list[int]
) -> dict[str, dict[str, float | None]]:
    metrics: dict[str, dict[str, float | None]] = {name: {} for name in SYSTEMS}
    for (n, r), rows in cells.items():
        reference = rows[REFERENCE]
        for name in SYSTEMS:
            row = rows.get(name)
            seconds = None if row is None else row["seconds_per_sample"]
            metrics[name][f"ms_per_sample_n{n}_r{r}"] = None if row is None else 1e3 * seconds
            metrics[name][f"vs_grouse_Kr_n{n}_r{r}"] = (
                None if row is None else seconds / reference["seconds_per_sample"]
            )
            metrics[name][f"state_vs_grouse_Kr_n{n}_r{r}"] = (
                None if row is None else row["state_bytes"] / reference["state_bytes"]
            )
            metrics[name][f"peak_mb_n{n}_r{r}"] = None if row is None else row["peak_bytes"] / 1e6
    for name in SYSTEMS:
        ms = metrics[name]
        fit = name in SLOPE_SYSTEMS
        slopes_n = {
            r: loglog_slope(dims, [ms[f"ms_per_sample_n{n}_r{r}"] for n in dims]) if fit else None
            for r in ranks
        }
        slopes_r = {
            n: loglog_slope(ranks, [ms[f"ms_per_sample_n{n}_r{r}"] for r in ranks]) if fit else None
            for n in dims
        }
        ms.update({f"slope_n_r{r}": slope for r, slope in slopes_n.items()})
        ms.update(summarise(list(slopes_n.values()), "slope_n"))
        ms.update({f"slope_r_n{n}": slope for n, slope in slopes_r.items()})
        ms.update(summarise(list(slopes_r.values()), "slope_r"))
    return metrics


def cost_plot(path: Path, metrics: dict, dims: list[int], ranks: list[int]) -> Path:
    """Time per sample against n (log-log), one panel per r, one line per system."""
    figure = Figure(figsize=(4 * len(ranks), 3.8))
    axes_row = figure.subplots(1, len(ranks), sharey=True, squeeze=False)[0]
    colours = {name: f"C{i}" for i, name in enumerate(SYSTEMS)}
    for axes, r in zip(axes_row, ranks, strict=True):
        for name in SYSTEMS:
            points = [(n, metrics[name][f"ms_per_sample_n{n}_r{r}"]) for n in dims]
            points = [(n, ms) for n, ms in points if ms is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                axes.plot(xs, ys, marker="o", color=colours[name], label=name)
        axes.set(xscale="log", yscale="log", xlabel="n (ambient dimension)", title=f"r = {r}")
        axes.grid(alpha=0.3, which="both")
    axes_row[0].set_ylabel("ms per sample (partial_fit, batch of 1)")
    axes_row[0].legend()
    figure.suptitle(f"time per sample, K = {N_SUBSPACES}, {OBSERVED:.0%} observed, 1 BLAS thread")
    return save_figure(figure, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--ranks", type=int, nargs="+", default=[5, 10, 20])
    parser.add_argument(
        "--samples",
        type=int,
        nargs="+",
        default=None,
        help="timed samples per pass, one per --dims entry (default: 400 at n <= 100, "
        "200 at n <= 1000, 60 above)",
    )
    parser.add_argument(
        "--sample-scale",
        type=float,
        default=1.0,
        help="multiply every sample count (e.g. 0.25 for a quick check)",
    )
    parser.add_argument("--warmup", type=int, default=20, help="partial_fit prefix before timing")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes (median)")
    parser.add_argument(
        "--petrels-max-mb",
        type=float,
        default=50.0,
        help="run PETRELS only where its n·(K·r)² state is below this many MB",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mosaic")
    args = parser.parse_args()
    dims, ranks = sorted(set(args.dims)), sorted(set(args.ranks))
    if args.samples is not None and len(args.samples) != len(args.dims):
        parser.error(f"--samples needs one length per --dims entry ({len(args.dims)})")
    if args.sample_scale <= 0:
        parser.error(f"--sample-scale must be > 0, got {args.sample_scale}")
    if min(ranks) < 1 or args.warmup < 1 or args.repeats < 1 or min(args.samples or [1]) < 1:
        parser.error(
            f"--ranks, --samples, --warmup and --repeats must be >= 1, got --ranks {args.ranks} "
            f"--samples {args.samples} --warmup {args.warmup} --repeats {args.repeats}"
        )
    if N_SUBSPACES * max(ranks) >= min(dims):
        parser.error(
            f"K·r = {N_SUBSPACES * max(ranks)} must be below every n (smallest {min(dims)})"
        )
    base = (
        dict(zip(args.dims, args.samples, strict=True))
        if args.samples is not None
        else {n: default_samples(n) for n in dims}
    )
    samples = {n: max(2, round(args.sample_scale * base[n])) for n in dims}

    start = time.perf_counter()
    with threadpoolctl.threadpool_limits(1):
        threads = [
            {key: info.get(key) for key in ("internal_api", "num_threads")}
            for info in threadpoolctl.threadpool_info()
        ]
        cells = {
            (n, r): measure(n, r, samples[n], args.warmup, args.repeats, args.petrels_max_mb * 1e6)
            for n in dims
            for r in ranks
        }
        n, r = max(dims), max(ranks)  # the largest cell measured: (10,000, 20) on the default grid
        by_rate = {
            rate: measure(
                n, r, samples[n], args.warmup, args.repeats, args.petrels_max_mb * 1e6, rate
            )
            for rate in OBSERVED_SWEEP
        }
    metrics = build_metrics(cells, dims, ranks)
    for name, row in metrics.items():
        for rate, rows in by_rate.items():
            seconds = rows.get(name, {}).get("seconds_per_sample")
            key = f"ms_per_sample_p{round(100 * rate):02d}_n{n}_r{r}"
            row[key] = None if seconds is None else 1e3 * seconds
    mosaic = metrics["mosaic"]
    low, high = (f"ms_per_sample_p{round(100 * rate):02d}_n{n}_r{r}" for rate in OBSERVED_SWEEP)
    claims = [
        Claim.compare(
            f"MoSAIC's single-sample partial_fit is within {MAX_CLAIMED_RATIO:g}× of GROUSE at "
            f"rank K·r in time per sample at n={n}, r={r}",
            mosaic[f"vs_grouse_Kr_n{n}_r{r}"],
            "<=",
            MAX_CLAIMED_RATIO,
            value_label="mosaic / grouse_Kr time per sample",
        ),
        Claim.compare(
            f"MoSAIC's cost follows the observed entries: at n={n}, r={r} a sample costs at least "
            f"{MIN_RATE_SCALING:g}× more with {OBSERVED_SWEEP[1]:.0%} observed than with "
            f"{OBSERVED_SWEEP[0]:.0%}",
            mosaic[high] / mosaic[low],
            ">=",
            MIN_RATE_SCALING,
            value_label=f"mosaic time at p={OBSERVED_SWEEP[1]} / p={OBSERVED_SWEEP[0]}",
        ),
    ]
    write_benchmark(
        args.out,
        method="mosaic-benchmark",
        metrics=metrics,
        claims=claims,
        config={
            "dims": dims,
            "ranks": ranks,
            "samples": [samples[n] for n in dims],
            "warmup_samples": args.warmup,
            "repeats": args.repeats,
            "n_subspaces": N_SUBSPACES,
            "observed_fraction": OBSERVED,
            "observed_sweep": list(OBSERVED_SWEEP),
            "batch_size": 1,
            "stream_seed": SEED,
            "petrels_max_mb": args.petrels_max_mb,
            "petrels_cells": [[n, r] for (n, r), rows in cells.items() if "petrels_Kr" in rows],
            "blas_thread_limit": 1,
            "blas_threads": threads,
        },
        started=start,
    )
    cost_plot(args.out / "cost_vs_n.png", metrics, dims, ranks)


if __name__ == "__main__":
    main()
