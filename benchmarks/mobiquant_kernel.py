"""Benchmark: MoBiQuant's nested bit-slice matmul kernel against fp16 and dequantize-then-matmul.

    uv run python benchmarks/mobiquant_kernel.py              # CUDA -> results/mobiquant/kernel_gpu.json
    uv run python benchmarks/mobiquant_kernel.py --cpu-smoke  # tiny shapes on CPU: checks the script

One linear layer, 4096 inputs x 11008 outputs (LLaMA-7B's MLP up-projection), SliceSpec(2, 4, 128),
a random weight sliced with ``slices.group_range`` / ``slice_codes``. Batches M in {1, 8, 64}:
every token at depth d for d = 1..4, and a mixed batch (depths drawn uniformly, M > 1). On the
same fp16 x, side by side in one process:

(a) ``fp16``: ``F.linear`` with the dense fp16 weight (what the quantized layer replaces);
(b) ``dequant``: per depth present, unpack and dequantize W_d to fp16 (PyTorch), then ``F.linear``;
(c) ``nested``: ``nested_matmul_triton`` (host sort and tile table, then the kernel), for each
    block configuration; ``nested_kernel`` is the kernel alone on a prepared tile table (what a
    model pays if it sorts once per forward and reuses the table across layers).

Timing: CUDA events, warm-up calls, median of repeats; the L2 cache is flushed (a 256 MiB write)
before each timed call, because a depth-1 weight (11 MB) would otherwise stay in L2 and the
bandwidth would be L2's. Effective weight GB/s = the weight bytes a system must read / time:
2 bytes per weight for (a); for (b) and (c), per depth present, ``d * bits / 8`` bytes per
weight plus the fp16 scale and zero (one pass per depth segment; L2 reuse not counted).
Ratios are ``t(baseline) / t(nested)``: above 1 means the kernel is faster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from mixlab.llm_efficiency.mobiquant import kernel as mk
from mixlab.llm_efficiency.mobiquant.slices import (
    SliceSpec,
    dequantize,
    group_range,
    pack,
    slice_codes,
    unpack,
)
from mixlab.shared.result import environment

# (block_m, block_n, block_k, num_warps); the first is nested_matmul_triton's default
CONFIGS = [(16, 32, 64, 4), (16, 64, 128, 4), (16, 128, 64, 4), (64, 64, 64, 4), (64, 128, 64, 8)]


def make_layer(n: int, k: int, spec: SliceSpec, device: torch.device, seed: int = 0):
    """A random weight [n, k] (std 0.02), its dense fp16 copy, and its planes, scale and zero."""
    g = torch.Generator(device).manual_seed(seed)
    weight = torch.randn(n, k, generator=g, device=device) * 0.02
    scale, zero = group_range(weight, spec)
    scale, zero = scale.half(), zero.half()  # stored as fp16: slice with the rounded values
    planes = pack(slice_codes(weight, scale, zero, spec), spec.bits)
    return weight.half(), planes, scale, zero


def dequant_then_linear(x, planes, scale, zero, depth, spec):
    """Baseline (b): one fp16 W_d per depth present, materialised every call, then F.linear."""
    y = torch.empty(x.shape[0], planes.shape[1], dtype=x.dtype, device=x.device)
    for d in depth.unique().tolist():
        rows = (depth == d).nonzero().squeeze(1)
        weight = dequantize(unpack(planes[:d], spec.bits), scale, zero, spec, d, torch.float16)
        y[rows] = F.linear(x[rows], weight)
    return y


def time_ms(fn, device: torch.device, warmup: int, repeats: int) -> float:
    """Median milliseconds of ``fn()``: CUDA events after an L2 flush, or wall time on CPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device)
        for _ in range(repeats):
            flush.zero_()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def weight_bytes(n: int, k: int, spec: SliceSpec, depths: list[int]) -> int:
    """Bytes of planes, scales and zeros read for one pass per depth in ``depths``."""
    scale_zero = 2 * n * (k // spec.group_size) * 2
    return sum(n * k * spec.bits * d // 8 + scale_zero for d in depths)


def depth_cases(m: int, slices: int, device: torch.device) -> dict[str, torch.Tensor]:
    cases = {f"uniform{d}": torch.full((m,), d, device=device) for d in range(1, slices + 1)}
    if m > 1:  # one token has one depth: "mixed" would repeat a uniform case
        g = torch.Generator().manual_seed(m)
        cases["mixed"] = torch.randint(1, slices + 1, (m,), generator=g).to(device)
    return cases


def run_case(args, layer, spec, x, depth, device) -> dict:
    dense, planes, scale, zero = layer
    n, k = dense.shape
    present = depth.unique().tolist()
    row = {
        "m": x.shape[0],
        "depth_counts": torch.bincount(depth, minlength=spec.slices + 1)[1:].tolist(),
    }

    def timed(fn) -> float:
        return time_ms(fn, device, args.warmup, args.repeats)

    row["fp16_ms"] = timed(lambda: F.linear(x, dense))
    row["dequant_ms"] = timed(lambda: dequant_then_linear(x, planes, scale, zero, depth, spec))
    row["fp16_gbps"] = n * k * 2 / row["fp16_ms"] / 1e6
    row["weight_bytes"] = weight_bytes(n, k, spec, present)
    row["dequant_gbps"] = row["weight_bytes"] / row["dequant_ms"] / 1e6

    expected = mk.nested_matmul_reference(x, planes, scale, zero, depth, spec).float()
    row["ref_max_abs"] = expected.abs().max().item()
    if device.type != "cuda":  # the smoke run: the reference path stands in for the kernel
        row["nested_backend"] = "reference"
        row["nested_ms"] = timed(
            lambda: mk.nested_matmul(x, planes, scale, zero, depth, spec, backend="reference")
        )
        row["max_abs_err"] = 0.0
        row["configs"] = {}
    else:
        row["nested_backend"] = "triton"
        row["configs"] = {}
        for bm, bn, bk, warps in CONFIGS:
            name = f"m{bm}_n{bn}_k{bk}_w{warps}"
            blocks = {"block_m": bm, "block_n": bn, "block_k": bk, "num_warps": warps}
            try:
                got = mk.nested_matmul_triton(x, planes, scale, zero, depth, spec, **blocks)
                y = torch.empty_like(got)
                order, table, tiles = mk._tile_table(depth, spec.slices, bm)
                row["configs"][name] = {
                    "max_abs_err": (got.float() - expected).abs().max().item(),
                    "ms": timed(
                        lambda b=blocks: mk.nested_matmul_triton(
                            x, planes, scale, zero, depth, spec, **b
                        )
                    ),
                    "kernel_ms": timed(
                        lambda b=blocks, o=order, t=table, nt=tiles, y=y: mk._launch(
                            x, planes, scale, zero, y, o, t, nt, spec, **b
                        )
                    ),
                }
            except Exception as error:  # e.g. out of shared memory: report, keep the others
                row["configs"][name] = {"error": f"{type(error).__name__}: {error}"[:300]}
        ok = {c: r for c, r in row["configs"].items() if "ms" in r}
        if not ok:
            return row
        best = min(ok, key=lambda c: ok[c]["ms"])
        row["nested_config"] = best
        row["nested_ms"] = ok[best]["ms"]
        row["nested_kernel_ms"] = min(r["kernel_ms"] for r in ok.values())
        row["max_abs_err"] = max(r["max_abs_err"] for r in ok.values())
    row["nested_gbps"] = row["weight_bytes"] / row["nested_ms"] / 1e6
    row["speedup_vs_fp16"] = row["fp16_ms"] / row["nested_ms"]
    row["speedup_vs_dequant"] = row["dequant_ms"] / row["nested_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes, reference path")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()

    if args.cpu_smoke:
        device, (n, k), spec = torch.device("cpu"), (48, 128), SliceSpec(2, 4, 64)
        args.batch_sizes, args.warmup, args.repeats = [1, 8], 1, 3
        out = args.out or Path(tempfile.mkdtemp()) / "kernel_smoke.json"
    elif torch.cuda.is_available():
        device, (n, k), spec = torch.device("cuda"), (11008, 4096), SliceSpec(2, 4, 128)
        out = args.out or Path("benchmarks/results/mobiquant/kernel_gpu.json")
    else:
        print("mobiquant_kernel: needs CUDA (use --cpu-smoke to check the script on CPU)")
        return

    started = time.perf_counter()
    layer = make_layer(n, k, spec, device)
    g = torch.Generator().manual_seed(1)
    rows = []
    for m in args.batch_sizes:
        x = torch.randn(m, k, generator=g).half().to(device)
        for case, depth in depth_cases(m, spec.slices, device).items():
            row = {"case": case, **run_case(args, layer, spec, x, depth, device)}
            rows.append(row)
            print(
                f"M={m:3d} {case:9s} fp16 {row['fp16_ms']:8.4f} ms  dequant "
                f"{row['dequant_ms']:8.4f} ms  nested {row.get('nested_ms', float('nan')):8.4f} ms"
                f" ({row.get('nested_gbps', float('nan')):7.1f} GB/s, "
                f"x{row.get('speedup_vs_fp16', float('nan')):.2f} vs fp16, "
                f"x{row.get('speedup_vs_dequant', float('nan')):.2f} vs dequant)  "
                f"err {row.get('max_abs_err', float('nan')):.2e} of {row['ref_max_abs']:.2f}",
                flush=True,
            )

    env = environment(device)
    if device.type == "cuda":
        import triton

        env |= {"gpu": torch.cuda.get_device_name(device), "triton": triton.__version__}
    result = {
        "benchmark": "mobiquant_kernel",
        "smoke": args.cpu_smoke,
        "layer": {"in_features": k, "out_features": n, "dtype": "float16"},
        "spec": spec.to_dict(),
        "timing": {
            "warmup": args.warmup,
            "repeats": args.repeats,
            "statistic": "median",
            "l2_flush": device.type == "cuda",
            "threads": torch.get_num_threads(),
        },
        "configs": [
            dict(zip(("block_m", "block_n", "block_k", "num_warps"), c, strict=True))
            for c in CONFIGS
        ],
        "rows": rows,
        "env": env,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out} ({result['wall_s']} s)")


if __name__ == "__main__":
    sys.exit(main())
