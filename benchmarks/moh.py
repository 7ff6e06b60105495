"""Benchmark: train- and sample-step time and peak memory of MoH (top-1 and soft routes) against
plain bidirectional Mamba and DiT, as ratios to the plain block.

    uv run python benchmarks/moh.py                      # -> benchmarks/results/moh/
    uv run python benchmarks/moh.py --tokens 64 256 --repeats 3 --out /tmp/bench

The quick experiment's backbones (width 64, 4 blocks, d_state 4, expand 1; patch 2 on one
channel) on square grids of N = 64, 256 and 1,024 tokens, the baselines' widths matched to MoH's
parameters (:mod:`mixlab.attention_arch.moh.profile`). Systems: MoH with the scan backend
``auto`` (``ref`` on a CPU), routed top-1 as in the experiment (each sample runs one expert at one
level per block, dispatched) and softly (every level runs every expert: 12 expert calls per block,
the routing issue 67 found); the plain bidirectional Mamba block on both CPU backends, mambapy's
parallel scan and the per-step ``ref`` loop (about 3x faster than the parallel scan in forward
at 16 and 64 tokens here, not necessarily in backward or at 1,024 tokens); DiT's SDPA blocks.
Ratios (``*_vs_plain``) are to the *faster* plain Mamba at the same N and mode, whichever
backend that is (``config.reference`` says which). A train step is forward, the diffusion loss
with the routing losses, backward and AdamW at batch ``--train-batch`` (default 8: the parallel
scan keeps several ``[batch, L, d_inner, d_state]`` tensors per block and direction for backward,
18 MB each at batch 8 and 1,024 tokens); a sample step is one no-grad forward at t = 500 at batch ``--sample-batch``
(default 64), MoH's routes precomputed for that t. Times are medians of ``--repeats`` rounds
after a warm-up, every system called once per round, side by side in one process; peak memory
is what one step adds to the resident set, every (system, N, mode) one after another in one
fresh process (``python -m mixlab.attention_arch.moh.profile``).

What MoH runs depends on training, and this benchmark builds untrained models whose routers'
output layers are drawn at random (:func:`mixlab.attention_arch.moh.profile.build`), so that
routes differ across timesteps as a trained model's do: a top-1 training batch (random t) is split
into several dispatch groups per block, each a separate expert call; the depth gates stay open
(bias 3). Soft routing runs every level (x1, x1/2, x1/4) and every expert. The experiment reports
each trained system's FLOPs per step and expert calls. Loading a trained model (``--model DIR``)
is not implemented.

Claims: (1) top-1 routing makes MoH's train step at least 2x faster than soft routing at every N
(one expert call per block against 12: the compute issue 67 asks to match); (2) the analytic
point of precomputing routes: a sample step with the routes of its t fixed in advance runs no
router, so it is not slower than one that routes in the call (within 5 %, at every N). The
routers are small (about 0.2 ms per block at batch 64, under 1 % of the step at 16 tokens), so
(2) checks that the route table costs nothing; the saving it can show is within the timing noise.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from mixlab.attention_arch.moh.config import DIT, MOH, PLAIN
from mixlab.attention_arch.moh.profile import MODES, grid_side, make_step, median_times
from mixlab.shared import Claim, line_plot, measure_in_fresh_process
from mixlab.shared.result import write_benchmark

SOFT = "MoH (soft routes)"
SYSTEMS = {
    "MoH": (MOH, "auto"),
    SOFT: (MOH, "auto"),
    "plain Mamba (mambapy)": (PLAIN, "mambapy"),
    "plain Mamba (ref)": (PLAIN, "ref"),
    "DiT": (DIT, "auto"),
}
"""benchmark name -> (system of :mod:`mixlab.attention_arch.moh.config`, scan backend); every
routed system top-1 but the soft one"""
PLAINS = ("plain Mamba (mambapy)", "plain Mamba (ref)")
ON_THE_FLY = "MoH (routes on the fly)"
METRICS = ("params", "width", "train_ms", "train_vs_plain", "train_peak_mib", "sample_ms",
           "sample_vs_plain", "sample_peak_mib", "sample_precomputed_vs_on_the_fly")  # fmt: skip
"""every row's keys (None where they do not apply)"""
SAMPLE_T = 500
SOFT_MIN = 2.0
"""claim: MoH's train step with soft routes takes at least this x the top-1 one"""
PRECOMPUTED_MAX = 1.05
"""claim: MoH's sample step with precomputed routes takes at most this x one routing in the call"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 256, 1024],
                        help="square token grids whose side is a multiple of 4")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--sample-batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=64, help="MoH's; the others' are matched")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--d-state", type=int, default=4)
    parser.add_argument("--expand", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "moh")
    args = parser.parse_args()
    torch.set_flush_denormal(True)  # exp(ΔA) decays the scan states into denormals
    torch.set_num_threads(1)
    started = time.perf_counter()
    tokens = sorted(args.tokens)
    for n in tokens:
        grid_side(n)  # fail before measuring anything
    shape = {"width": args.width, "depth": args.depth, "d_state": args.d_state,
             "expand": args.expand}  # fmt: skip
    batch = {"train": args.train_batch, "sample": args.sample_batch}

    def spec(name: str, n: int, mode: str) -> dict:
        system, backend = SYSTEMS[name]
        return {"system": system, "backend": backend, "tokens": n, "mode": mode,
                "batch": batch[mode], "t": SAMPLE_T, "top_k": None if name == SOFT else 1,
                **shape}  # fmt: skip

    seconds: dict[tuple[str, int, str], float] = {}
    sizes: dict[str, dict[str, float | None]] = {}
    for n in tokens:
        for mode in MODES:
            steps = {}
            for name in SYSTEMS:
                model, steps[name] = make_step(spec(name, n, mode))
                params = sum(p.numel() for p in model.parameters())
                sizes[name] = {"params": params, "width": model.config.width}
            if mode == "sample":
                _, steps[ON_THE_FLY] = make_step({**spec("MoH", n, mode), "precomputed": False})
            for name, s in median_times(steps, args.repeats).items():
                seconds[name, n, mode] = s
            shown = ", ".join(f"{name} {seconds[name, n, mode] * 1e3:.1f} ms" for name in steps)
            print(f"N={n:>5} {mode:>6}: {shown}", flush=True)
    keys = [(n, mode, name) for n in tokens for mode in MODES for name in SYSTEMS]
    peaks = measure_in_fresh_process(
        "mixlab.attention_arch.moh.profile", [spec(name, n, mode) for n, mode, name in keys]
    )
    mib = {key: peak / 2**20 for key, peak in zip(keys, peaks, strict=True)}

    reference = {(n, mode): min(PLAINS, key=lambda p: seconds[p, n, mode])
                 for n in tokens for mode in MODES}  # fmt: skip
    metrics: dict[str, dict[str, float | None]] = {}
    for n in tokens:
        for name in (*SYSTEMS, ON_THE_FLY):
            row = dict.fromkeys(METRICS) | sizes.get(name, {})
            for mode in MODES:
                if (name, n, mode) not in seconds:
                    continue
                row[f"{mode}_ms"] = seconds[name, n, mode] * 1e3
                row[f"{mode}_vs_plain"] = (
                    seconds[name, n, mode] / seconds[reference[n, mode], n, mode]
                )
                if name in SYSTEMS:
                    row[f"{mode}_peak_mib"] = mib[n, mode, name]
            if name == "MoH":
                row["sample_precomputed_vs_on_the_fly"] = (
                    seconds["MoH", n, "sample"] / seconds[ON_THE_FLY, n, "sample"]
                )
            metrics[f"{name}, N={n}"] = row

    for mode, label in (("train", f"train step, batch {args.train_batch}"),
                        ("sample", f"sample step, batch {args.sample_batch}")):  # fmt: skip
        names = [*SYSTEMS, ON_THE_FLY] if mode == "sample" else list(SYSTEMS)
        line_plot(
            args.out / f"time_{mode}.png",
            {name: (tokens, [seconds[name, n, mode] * 1e3 for n in tokens]) for name in names},
            xlabel="tokens N",
            ylabel="ms per step",
            title=f"MoH and peers (untrained), {label}",
            logx=True,
            logy=True,
        )
        line_plot(
            args.out / f"memory_{mode}.png",
            {name: (tokens, [max(mib[n, mode, name], 1e-2) for n in tokens]) for name in SYSTEMS},
            xlabel="tokens N",
            ylabel="peak MiB added",
            title=f"Peak memory of one {label}",
            logx=True,
            logy=True,
        )
    claims = [
        Claim.all_of(
            f"MoH's train step with soft routes takes at least {SOFT_MIN:g}x the top-1 one "
            "(12 expert calls per block against 1), at every N",
            [
                Claim.compare(
                    f"N={n}",
                    seconds[SOFT, n, "train"] / seconds["MoH", n, "train"],
                    ">=",
                    SOFT_MIN,
                    value_label=f"N={n}: soft / top-1 train step time",
                )
                for n in tokens
            ],
        ),
        Claim.all_of(
            f"MoH's sample step with its routes precomputed takes at most {PRECOMPUTED_MAX}x "
            "the step that routes in the call (no router runs), at every N",
            [
                Claim.compare(
                    f"N={n}",
                    metrics[f"MoH, N={n}"]["sample_precomputed_vs_on_the_fly"],
                    "<=",
                    PRECOMPUTED_MAX,
                    value_label=f"N={n}: precomputed / on-the-fly time",
                )
                for n in tokens
            ],
        ),
    ]
    config = {
        "tokens": tokens,
        "grids": {n: [grid_side(n)] * 2 for n in tokens},
        "systems": {name: {"system": s, "backend": b} for name, (s, b) in SYSTEMS.items()},
        "reference": {f"{mode}, N={n}": name for (n, mode), name in reference.items()},
        **shape,
        "patch_size": 2,
        "sample_t": SAMPLE_T,
        "train_batch": args.train_batch,
        "sample_batch": args.sample_batch,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "trained": False,
    }
    write_benchmark(
        args.out, method="moh", metrics=metrics, claims=claims, config=config, started=started
    )


if __name__ == "__main__":
    main()
