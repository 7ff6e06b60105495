"""Benchmark: peak training memory and time per step of Mix-Opt's modes (BP-high, BP-low, ZO-high).

    uv run python benchmarks/mix_opt.py                     # -> benchmarks/results/mix_opt/
    uv run python benchmarks/mix_opt.py --resolutions 32 64 --out /tmp/bench
    uv run python benchmarks/mix_opt.py --device cuda --resolutions 64 128 256 512

The experiment's UNet2DConditionModel (channels 32, 64, 64; cross-attention at the two lower
levels) with a rank-4 LoRA on to_q/k/v/out, batch ``--batch-size``, at each full resolution;
BP-low runs at half of it. Each mode at each resolution runs in a fresh process of its own
(``mixlab.vision_mm.mix_opt.profile``): the peak from before the model is built (model,
optimizer state, data and activations: ``peak_mb``), the peak one step adds after two warm-up
steps (``added_mb``), then the median time of five more steps. On CUDA the figures are the
allocator's (``max_memory_allocated``), on a CPU the resident set. The modes' times are measured
in the same run and reported as ratios to BP-high. A mixing schedule's peak is the larger of
BP-low's and ZO-high's.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mixlab.shared import Claim, line_plot, resolve_device
from mixlab.shared.result import write_benchmark
from mixlab.vision_mm.mix_opt.profile import profile_modes

MODES = ("bp_high", "bp_low", "zo_high")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolutions", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mix_opt"))
    args = parser.parse_args()
    if args.device not in ("auto", "cpu", "cuda"):
        raise SystemExit(f"--device must be auto, cpu or cuda, got {args.device!r}")
    device = resolve_device(args.device).type
    for r in args.resolutions:
        if r < 8 or r % 8:
            raise SystemExit(
                f"--resolutions must be multiples of 8 (the UNet's factor 4 at half size), got {r}"
            )
    started = time.perf_counter()
    specs = [
        {
            "mode": mode,
            "resolution": r,
            "low_resolution": r // 2,
            "batch_size": args.batch_size,
            "device": device,
        }
        for r in args.resolutions
        for mode in MODES
    ]
    measured = iter(profile_modes(specs))
    metrics: dict[str, dict[str, float | None]] = {mode: {} for mode in (*MODES, "mix_opt")}
    for r in args.resolutions:
        row = {mode: next(measured) for mode in MODES}
        for mode in MODES:
            metrics[mode][f"peak_mb_{r}"] = row[mode]["total_peak_bytes"] / 2**20
            metrics[mode][f"added_mb_{r}"] = row[mode]["added_peak_bytes"] / 2**20
            metrics[mode][f"ms_per_step_{r}"] = row[mode]["seconds_per_step"] * 1e3
            metrics[mode][f"time_vs_bp_high_{r}"] = (
                row[mode]["seconds_per_step"] / row["bp_high"]["seconds_per_step"]
            )
        mix_peak = max(row["bp_low"]["total_peak_bytes"], row["zo_high"]["total_peak_bytes"])
        mix_added = max(row["bp_low"]["added_peak_bytes"], row["zo_high"]["added_peak_bytes"])
        metrics["mix_opt"][f"peak_mb_{r}"] = mix_peak / 2**20
        metrics["mix_opt"][f"added_mb_{r}"] = mix_added / 2**20
        metrics["mix_opt"][f"ms_per_step_{r}"] = None
        metrics["mix_opt"][f"time_vs_bp_high_{r}"] = None
        for mode in (*MODES, "mix_opt"):
            peak = metrics[mode][f"peak_mb_{r}"]
            metrics[mode][f"memory_vs_bp_high_{r}"] = peak / metrics["bp_high"][f"peak_mb_{r}"]
            metrics[mode][f"memory_vs_zo_high_{r}"] = peak / metrics["zo_high"][f"peak_mb_{r}"]
    top = max(args.resolutions)
    claims = [
        Claim.all_of(
            "At every resolution Mix-Opt's peak training memory (the larger of BP-low's and "
            "ZO-high's) is at most half of BP-high's",
            [
                Claim.compare(
                    f"{r}²",
                    metrics["mix_opt"][f"memory_vs_bp_high_{r}"],
                    "<=",
                    0.5,
                    value_label="Mix-Opt peak / BP-high peak",
                )
                for r in args.resolutions
            ],
        ),
        Claim.compare(
            f"At {top}², a ZO-high step (two forwards, no activations kept) takes less time than "
            "a BP-high step (forward and backward)",
            metrics["zo_high"][f"time_vs_bp_high_{top}"],
            "<",
            1.0,
            value_label="ZO-high time / BP-high time",
        ),
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    line_plot(
        args.out / "peak_memory.png",
        {
            m: (args.resolutions, [metrics[m][f"peak_mb_{r}"] for r in args.resolutions])
            for m in (*MODES, "mix_opt")
        },
        xlabel="full resolution (pixels per side)",
        ylabel="peak training memory in all (MiB)",
        title=f"Peak training memory per mode, batch {args.batch_size}, {device}",
        logx=True,
        logy=True,
    )
    line_plot(
        args.out / "time_per_step.png",
        {
            m: (args.resolutions, [metrics[m][f"ms_per_step_{r}"] for r in args.resolutions])
            for m in MODES
        },
        xlabel="full resolution (pixels per side)",
        ylabel="ms per training step",
        title=f"Time per step per mode, batch {args.batch_size}, {device}",
        logx=True,
        logy=True,
    )
    config = {
        "resolutions": args.resolutions,
        "batch_size": args.batch_size,
        "rank": 4,
        "device": device,
    }
    write_benchmark(
        args.out, method="mix_opt", metrics=metrics, claims=claims, config=config, started=started
    )


if __name__ == "__main__":
    main()
