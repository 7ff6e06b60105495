"""Benchmark: MiTA's grouped path on a GPU, PyTorch against the Triton kernel, with SDPA as reference.

    uv run python benchmarks/mita_gpu.py                 # CUDA -> benchmarks/results/mita/gpu/kernel.json
    uv run python benchmarks/mita_gpu.py --tokens 4096 --batch 1 --dtype bfloat16 --out /tmp/mita

What is timed is the attention of one MiTA layer, ``attend``: landmarks, routing, the shared
expert and Eq. (5). The ``qkv`` and ``proj`` matmuls are the same for every system and are left
out. The layer has 6 heads of dimension 64, M = 16 landmarks (a 4×4 pool), k' = 48 routed keys
and top-1 routing, on square patch grids of N tokens with no prefix token. All systems run on
the same random q, k, v:

- ``torch``: ``MiTAAttention(impl="grouped")`` with ``kernel = False``, the PyTorch grouped path;
- ``triton``: the same layer as users get it on CUDA without gradients: Eq. (5) on the tiles
  computed by :func:`~mixlab.attention_arch.mita.kernels.grouped_tiles_forward`;
- ``sdpa``: ``F.scaled_dot_product_attention(q, k, v)``, full attention (the reference: what a
  user runs today);
- ``tiles_triton``: the kernel alone on the layer's tile tensors, so that the rest of the
  ``triton`` time (routing, layout, reading the slots back) shows.

Each time is the median of ``--repeats`` calls measured with CUDA events after ``--warmup``
calls. Ratios are t(sdpa) / t(system), so a value above 1 means faster than SDPA. For
correctness, the JSON records max |triton − torch| over the layer's outputs, and the error of
each path against the torch path run in float32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from mixlab.attention_arch.mita.attention import MiTAAttention
from mixlab.attention_arch.mita.kernels import grouped_tiles_forward, triton_available
from mixlab.shared.result import environment

HEADS, HEAD_DIM, POOL, PER_EXPERT = 6, 64, 4, 48  # M = POOL² = 16 landmarks, k' = 48
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def build(side: int, device: torch.device, *, kernel: bool) -> MiTAAttention:
    layer = MiTAAttention(
        HEADS * HEAD_DIM,
        HEADS,
        pool_size=POOL,
        top_k=PER_EXPERT,
        num_prefix_tokens=0,
        grid_size=(side, side),
        impl="grouped",
    )
    layer.kernel = kernel
    return layer.to(device).eval()


def time_ms(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """Median milliseconds of ``fn()`` between two CUDA events, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def tile_inputs(layer: MiTAAttention, q, k, v) -> dict:
    """The arguments of the tile step for ``q, k, v``, routed as ``layer`` routes them."""
    captured = {}

    def keep(queries, k, v, routes):
        captured.update(queries=queries, routes=routes)
        return queries

    layer._grouped = keep  # this instance only: the routing runs as in attend, then stops
    layer.attend(q, k, v, None, False)
    del layer._grouped
    routes = captured["routes"]
    tile, _, slot_query, tile_keys_index = layer.grouped_layout(routes)
    shared_keys = routes.landmarks * q.shape[-1] ** -0.5
    return {
        "queries": captured["queries"], "k": k, "v": v, "slot_query": slot_query,
        "tile_keys_index": tile_keys_index, "tile": tile, "shared_keys": shared_keys,
        "agent_values": routes.agent_values,
    }  # fmt: skip


def run_case(n: int, batch: int, dtype: torch.dtype, args, device: torch.device) -> dict:
    side = int(n**0.5)
    torch_layer, kernel_layer = build(side, device, kernel=False), build(side, device, kernel=True)
    g = torch.Generator(device).manual_seed(n + batch)
    q, k, v = (
        torch.randn(batch, HEADS, n, HEAD_DIM, generator=g, device=device).to(dtype)
        for _ in range(3)
    )
    tiles = tile_inputs(torch_layer, q, k, v)
    systems = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "torch": lambda: torch_layer.attend(q, k, v, None, False),
        "triton": lambda: kernel_layer.attend(q, k, v, None, False),
        "tiles_triton": lambda: grouped_tiles_forward(**tiles),
    }
    median = {name: time_ms(fn, args.warmup, args.repeats) for name, fn in systems.items()}
    exact = torch_layer.attend(q.float(), k.float(), v.float(), None, False)
    outputs = {name: systems[name]().float() for name in ("torch", "triton")}
    return {
        "n": n,
        "batch": batch,
        "tile": tiles["tile"],
        "tiles": tiles["tile_keys_index"].shape[2],
        "median_ms": median,
        "ratio_vs_sdpa": {name: median["sdpa"] / t for name, t in median.items()},
        "triton_speedup_vs_torch": median["torch"] / median["triton"],
        "max_abs_diff_triton_vs_torch": (outputs["triton"] - outputs["torch"]).abs().max().item(),
        "max_abs_err_vs_float32": {
            name: (out - exact).abs().max().item() for name, out in outputs.items()
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens", type=int, nargs="+", default=[1024, 4096, 16384], help="N, square numbers"
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float16", help="q, k, v dtype")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per system")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per system")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results" / "mita" / "gpu",
        help="folder for kernel.json",
    )
    args = parser.parse_args()
    for n in args.tokens:
        if int(n**0.5) ** 2 != n:
            parser.error(f"--tokens must be square numbers (a patch grid), got {n}")
    if not torch.cuda.is_available():
        print("mita_gpu: needs a CUDA device (this machine has none)", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    if not triton_available(device):
        print("mita_gpu: needs triton (pip install triton)", file=sys.stderr)
        return 2

    started = time.perf_counter()
    rows = []
    with torch.inference_mode():
        for n in args.tokens:
            for batch in args.batch:
                row = run_case(n, batch, DTYPES[args.dtype], args, device)
                rows.append(row)
                shown = ", ".join(f"{k} {t:.3f}" for k, t in row["median_ms"].items())
                print(
                    f"N={n:>5} B={batch}: {shown} ms; triton x{row['triton_speedup_vs_torch']:.2f} "
                    f"vs torch, diff {row['max_abs_diff_triton_vs_torch']:.1e}",
                    flush=True,
                )

    import triton

    result = {
        "benchmark": "mita_gpu",
        "reference": "sdpa",
        "ratios": "t(sdpa) / t(system): above 1 is faster than SDPA",
        "config": {
            "heads": HEADS,
            "head_dim": HEAD_DIM,
            "landmarks": POOL * POOL,
            "per_expert": PER_EXPERT,
            "router_top": 1,
            "dtype": args.dtype,
            "timed": "attend(q, k, v): routing and Eq. (5), without qkv / proj",
            "warmup": args.warmup,
            "repeats": args.repeats,
            "statistic": "median",
        },
        "rows": rows,
        "env": environment(device)
        | {"gpu": torch.cuda.get_device_name(device), "triton": triton.__version__},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    path = args.out / "kernel.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path} ({result['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
