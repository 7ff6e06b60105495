"""Benchmark: time and peak memory of one MiTA attention layer against SDPA, MoBA and top-k.

    uv run python benchmarks/mita.py                      # -> benchmarks/results/mita/
    uv run python benchmarks/mita.py --tokens 256 1024 --out /tmp/bench

One layer (``qkv`` and ``proj`` included: what a user swaps), batch 1, 6 heads of dimension 64,
no prefix token, N tokens on a patch grid (non-square grids for 512, 2048 and 8192). Every sparse
kind attends to the same 64 keys per query: MiTA 16 landmarks + 48 routed keys (its default fused
path, and ``impl="gather"``), MoBA 2 blocks of 32, top-k 64 (both on their gather path). Times are medians of ``--repeats`` interleaved calls after a warm-up, measured side
by side in one process and reported as ratios to SDPA; peak memory is what one call adds to the
resident set, measured in one fresh process (``mixlab.attention_arch.mita.profile``). The
log-log slope of each curve is fitted on N >= 1024, where the O(N) and O(N²) terms dominate the
constant ones; the crossover is the smallest N from which MiTA stays faster than SDPA.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from mixlab.attention_arch.mita.profile import build_layer, layer_input, peak_memory, time_layers
from mixlab.attention_arch.mita.swap import matched_config
from mixlab.shared import Claim, line_plot
from mixlab.shared.result import write_benchmark

GRIDS = {
    256: (16, 16),
    512: (16, 32),
    1024: (32, 32),
    2048: (32, 64),
    4096: (64, 64),
    8192: (64, 128),
    16384: (128, 128),
}
KINDS = ("full", "mita", "mita_gather", "moba", "topk")
MODES = {"fwd": False, "fwdbwd": True}


def layer_spec(system: str, budget: int) -> dict:
    """The layer of ``system``: MiTA fused (default) or gathered; MoBA and top-k always on their
    gather path (``dense_limit=0``), the linear-memory algorithm at every N, so that the curves
    do not switch algorithm at N ≈ 4700 where their masked-SDPA shortcut would stop."""
    kind = "mita" if system == "mita_gather" else system
    spec = {"kind": kind, "config": matched_config(kind, budget, 4)}
    if system == "mita_gather":
        spec["config"]["impl"] = "gather"
    if kind in ("moba", "topk"):
        spec["dense_limit"] = 0
    return spec


def slope(tokens: list[int], values: list[float]) -> float:
    keep = [(n, v) for n, v in zip(tokens, values, strict=True) if n >= 1024 and v > 0]
    if len(keep) < 2:
        return float("nan")
    x, y = np.log([n for n, _ in keep]), np.log([v for _, v in keep])
    return float(np.polyfit(x, y, 1)[0])


def crossover(tokens: list[int], mita: list[float], full: list[float]) -> int | None:
    """Smallest N from which MiTA is faster than SDPA at every larger N measured."""
    faster = [m < f for m, f in zip(mita, full, strict=True)]
    for i, n in enumerate(tokens):
        if all(faster[i:]):
            return n
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=list(GRIDS), choices=list(GRIDS))
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--budget", type=int, default=64, help="keys per query (MiTA: 16 + 48)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mita")
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    tokens = sorted(args.tokens)
    configs = {kind: layer_spec(kind, args.budget) for kind in KINDS}
    seconds = {(k, m): [] for k in KINDS for m in MODES}
    for n in tokens:
        spec = {"heads": args.heads, "head_dim": args.head_dim, "grid": list(GRIDS[n])}
        layers = {k: build_layer({**spec, **c}) for k, c in configs.items()}
        x = layer_input(spec, requires_grad=False)
        for mode, backward in MODES.items():
            times = time_layers(layers, x, backward=backward, repeats=args.repeats)
            for kind in KINDS:
                seconds[(kind, mode)].append(times[kind])
            shown = ", ".join(f"{k} {times[k] * 1e3:.0f} ms" for k in KINDS)
            print(f"N={n:>5} {mode:>6}: {shown}", flush=True)
    specs = [
        {"heads": args.heads, "head_dim": args.head_dim, "grid": list(GRIDS[n]), **configs[k],
         "backward": backward}
        for n in tokens
        for backward in MODES.values()
        for k in KINDS
    ]  # fmt: skip
    peaks = iter(peak_memory(specs))
    memory = {(k, m): [] for k in KINDS for m in MODES}
    for _n in tokens:
        for mode in MODES:
            for kind in KINDS:
                memory[(kind, mode)].append(next(peaks) / 2**20)
    metrics: dict[str, dict[str, float | None]] = {}
    for kind in KINDS:
        row: dict[str, float | None] = {}
        for mode in MODES:
            for n, s, mb, full_s in zip(
                tokens,
                seconds[(kind, mode)],
                memory[(kind, mode)],
                seconds[("full", mode)],
                strict=True,
            ):
                row[f"{mode}_ms_N{n}"] = s * 1e3
                row[f"{mode}_speed_vs_sdpa_N{n}"] = full_s / s
                row[f"{mode}_peak_mb_N{n}"] = mb
            row[f"{mode}_time_slope"] = slope(tokens, seconds[(kind, mode)])
            row[f"{mode}_memory_slope"] = slope(tokens, memory[(kind, mode)])
            row[f"{mode}_crossover_tokens"] = crossover(
                tokens, seconds[(kind, mode)], seconds[("full", mode)]
            )
        metrics[kind] = row
    for mode, label in (("fwd", "forward"), ("fwdbwd", "forward + backward")):
        line_plot(
            args.out / f"time_{mode}.png",
            {k: (tokens, [s * 1e3 for s in seconds[(k, mode)]]) for k in KINDS},
            xlabel="tokens N",
            ylabel="ms per call",
            title=f"One attention layer, {label} ({args.heads} heads × {args.head_dim}, batch 1)",
            logx=True,
            logy=True,
        )
        line_plot(
            args.out / f"memory_{mode}.png",
            {k: (tokens, [max(v, 1e-2) for v in memory[(k, mode)]]) for k in KINDS},
            xlabel="tokens N",
            ylabel="peak MiB added",
            title=f"Peak memory of one layer, {label}",
            logx=True,
            logy=True,
        )
    mita, full, largest = metrics["mita"], metrics["full"], max(tokens)
    claims = [
        Claim.all_of(
            "MiTA's time grows linearly in N (log-log slope <= 1.2) while SDPA's grows "
            "quadratically (>= 1.6), forward + backward",
            [
                Claim.compare("MiTA slope", mita["fwdbwd_time_slope"], "<=", 1.2),
                Claim.compare("SDPA slope", full["fwdbwd_time_slope"], ">=", 1.6),
            ],
        ),
        Claim.all_of(
            f"MiTA is faster than SDPA at N = {largest}, forward and forward + backward",
            [
                Claim.compare(
                    "forward",
                    mita[f"fwd_speed_vs_sdpa_N{largest}"],
                    ">",
                    1.0,
                    value_label="SDPA time / MiTA time",
                ),
                Claim.compare(
                    "forward + backward",
                    mita[f"fwdbwd_speed_vs_sdpa_N{largest}"],
                    ">",
                    1.0,
                    value_label="SDPA time / MiTA time",
                ),
            ],
        ),
        Claim.compare(
            "MiTA's peak memory (forward + backward) grows linearly in N (log-log slope <= 1.2)",
            mita["fwdbwd_memory_slope"],
            "<=",
            1.2,
        ),
    ]
    config = {
        "tokens": tokens,
        "grids": {n: GRIDS[n] for n in tokens},
        "heads": args.heads,
        "head_dim": args.head_dim,
        "batch": 1,
        "budget": args.budget,
        "attention_configs": configs,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
    }
    write_benchmark(
        args.out, method="mita", metrics=metrics, claims=claims, config=config, started=started
    )


if __name__ == "__main__":
    main()
