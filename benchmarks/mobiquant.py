"""Benchmark: MoBiQuant's elasticity curve (the experiment) and its CPU read path against a dense layer.

    uv run python benchmarks/mobiquant.py                    # full profile -> benchmarks/results/mobiquant/
    uv run python benchmarks/mobiquant.py --profile quick --out /tmp/bench

1. The experiment (``mixlab run mobiquant``) at ``--profile``: perplexity against effective bits
   for every system, written to ``<out>/experiment-<profile>/`` (result.json, the plot, cells).
2. One linear layer (``--in-features`` x ``--out-features``, SliceSpec(2, 4, group 128)) on this
   machine's CPU at batch 1, 8 and 64, side by side in one process: a dense fp32 ``nn.Linear``
   (the layer it replaces), :class:`MoBiLinear` at a uniform depth 1..4 (the pure-torch path:
   dequantize W_d, then matmul) and with mixed per-token depths (the reference of the kernel:
   one dequantization per depth present). Times are medians of repeats after warm-up, reported
   as ratios to the dense layer; bytes of weight read per token are what a bit-plane kernel would
   read (``d * 2`` bits per weight plus the fp16 scale and zero per group). The Triton kernel's
   GPU throughput is ``benchmarks/mobiquant_kernel.py`` (CUDA only).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from mixlab.llm_efficiency.mobiquant import MoBiLinear, SliceSpec
from mixlab.shared import Claim
from mixlab.shared.result import write_benchmark

BATCHES = (1, 8, 64)


def _median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def layer_timings(in_features: int, out_features: int, repeats: int) -> dict[str, dict[str, float]]:
    torch.manual_seed(0)
    spec = SliceSpec(bits=2, slices=4, group_size=128)
    dense = torch.nn.Linear(in_features, out_features, bias=False)
    nested = MoBiLinear.from_linear(dense, spec)
    weights = in_features * out_features
    scale_bytes = 4 * weights / spec.group_size  # fp16 scale + zero per group
    systems = ["dense_fp32", *[f"depth_{d}" for d in range(1, 5)], "mixed_depths"]
    metrics: dict[str, dict[str, float]] = {s: {} for s in systems}
    with torch.inference_mode():
        for batch in BATCHES:
            x = torch.randn(batch, in_features)
            mixed = torch.randint(1, 5, (batch,), generator=torch.Generator().manual_seed(batch))
            runs = {"dense_fp32": lambda x=x: dense(x)}
            for d in range(1, 5):
                runs[f"depth_{d}"] = lambda x=x, d=d: nested(x, precision=d)

            def run_mixed(x=x, mixed=mixed) -> None:
                nested.token_depth = mixed
                nested(x)
                nested.token_depth = None

            runs["mixed_depths"] = run_mixed
            measured = {name: _median_ms(fn, repeats) for name, fn in runs.items()}
            for name, ms in measured.items():
                metrics[name][f"ms_batch{batch}"] = ms
                metrics[name][f"time_vs_dense_batch{batch}"] = ms / measured["dense_fp32"]
    for d in range(1, 5):
        metrics[f"depth_{d}"]["weight_bytes_per_token"] = weights * 2 * d / 8 + scale_bytes
    mean_depth = 2.5  # depths drawn uniformly from 1..4
    metrics["mixed_depths"]["weight_bytes_per_token"] = weights * 2 * mean_depth / 8 + scale_bytes
    metrics["dense_fp32"]["weight_bytes_per_token"] = weights * 4.0
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=("quick", "full"), default="full")
    parser.add_argument("--in-features", type=int, default=2048)
    parser.add_argument("--out-features", type=int, default=5504)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--skip-experiment", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mobiquant"))
    args = parser.parse_args()
    if args.in_features % 128:
        raise SystemExit(
            f"--in-features must be a multiple of 128 (the group size), got {args.in_features}"
        )
    started = time.perf_counter()
    if not args.skip_experiment:
        from mixlab.shared import get_method

        method = get_method("mobiquant")
        config = method.config.from_profile(args.profile)
        result = method.execute(config, args.out / f"experiment-{args.profile}", resume=True)
        print(f"experiment: {sum(c.holds for c in result.claims)}/{len(result.claims)} claims hold")
    torch.set_num_threads(torch.get_num_threads())
    metrics = layer_timings(args.in_features, args.out_features, args.repeats)
    dense_bytes = metrics["dense_fp32"]["weight_bytes_per_token"]
    claims = [
        Claim.compare(
            "A token read at 2 bits moves under a tenth of the dense fp32 weight bytes",
            metrics["depth_1"]["weight_bytes_per_token"],
            "<",
            dense_bytes / 10,
            value_label="depth-1 bytes",
            reference_label="dense bytes / 10",
        ),
        Claim.compare(
            "On CPU the pure-torch read (dequantize, then matmul) is NOT faster than the dense "
            "layer at batch 1: the bandwidth saving needs the fused kernel",
            metrics["depth_1"]["time_vs_dense_batch1"],
            ">=",
            1.0,
            value_label="depth-1 time / dense time",
        ),
    ]
    config = {
        "in_features": args.in_features,
        "out_features": args.out_features,
        "spec": "2 bits x 4 slices, group 128",
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "profile": args.profile,
    }
    write_benchmark(
        args.out, method="mobiquant", metrics=metrics, claims=claims, config=config, started=started
    )
    for system, row in metrics.items():
        ratios = "  ".join(f"b{b}: {row[f'time_vs_dense_batch{b}']:.2f}x" for b in BATCHES)
        print(f"{system:13s} {ratios}  bytes/token {row['weight_bytes_per_token'] / 2**20:.2f} MiB")


if __name__ == "__main__":
    main()
