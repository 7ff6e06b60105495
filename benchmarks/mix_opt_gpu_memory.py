"""GPU memory probe: peak allocator memory of Mix-Opt's modes on Stable Diffusion 1.5's UNet.

    uv run python benchmarks/mix_opt_gpu_memory.py                # on a CUDA machine
    uv run python benchmarks/mix_opt_gpu_memory.py --image-sizes 512 768 --batch-size 1

SD 1.5's UNet2DConditionModel layout (860 M parameters, randomly initialised: no weights are
downloaded, and weights do not change memory) with a rank-4 LoRA on the attention projections,
trained on 8×-VAE latents of ``--image-sizes`` (64² latents for 512² images) and 77 CLIP states;
BP-low at half the image size. Each mode at each size runs in a fresh process
(:mod:`mixlab.vision_mm.mix_opt.profile`): the allocator's ``max_memory_allocated`` from before
the model is built (``peak_mb``) and what one step adds after two warm-up steps (``added_mb``),
then the median time of three steps. Written to ``--out`` as result.json (claim: Mix-Opt's peak,
the larger of BP-low's and ZO-high's, at most half of BP-high's at every size). fp32, as the
experiment trains; the VAE and text encoder are not loaded (their memory is the same for every
mode).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mixlab.shared import Claim
from mixlab.shared.result import write_benchmark
from mixlab.vision_mm.mix_opt.profile import profile_modes

MODES = ("bp_high", "bp_low", "zo_high")
VAE_FACTOR = 8
"""SD's VAE shrinks images 8× per side"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-sizes", type=int, nargs="+", default=[512])
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (a slow check)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mix_opt_gpu_memory"))
    args = parser.parse_args()
    for size in args.image_sizes:
        if size <= 0 or size % (2 * VAE_FACTOR * 8):
            raise SystemExit(f"--image-sizes must be multiples of 128, got {size}")
    started = time.perf_counter()
    rows = {}
    for size in args.image_sizes:
        latent = size // VAE_FACTOR
        specs = [{"mode": mode, "unet": "sd15", "resolution": latent, "low_resolution": latent // 2,
                  "batch_size": args.batch_size, "rank": 4, "steps": 3, "device": args.device}
                 for mode in MODES]  # fmt: skip
        measured = profile_modes(specs)
        row = {}
        for mode, m in zip(MODES, measured, strict=True):
            row[f"{mode}_peak_mb"] = m["total_peak_bytes"] / 2**20
            row[f"{mode}_added_mb"] = m["added_peak_bytes"] / 2**20
            row[f"{mode}_seconds_per_step"] = m["seconds_per_step"]
        mix = max(row["bp_low_peak_mb"], row["zo_high_peak_mb"])
        row["mix_opt_peak_mb"] = mix
        row["mix_opt_vs_bp_high"] = mix / row["bp_high_peak_mb"]
        row["mix_opt_vs_zo_high"] = mix / row["zo_high_peak_mb"]
        rows[f"{size}px"] = row
        print(f"{size}²: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()), flush=True)
    claims = [
        Claim.all_of(
            "At every image size Mix-Opt's peak training memory on SD 1.5's UNet (the larger of "
            "BP-low's and ZO-high's) is at most half of BP-high's",
            [
                Claim.compare(
                    name,
                    row["mix_opt_vs_bp_high"],
                    "<=",
                    0.5,
                    value_label=f"{name}: Mix-Opt peak / BP-high peak",
                )
                for name, row in rows.items()
            ],
        )
    ]
    write_benchmark(
        args.out,
        method="mix_opt",
        metrics=rows,
        claims=claims,
        config=vars(args) | {"out": str(args.out)},
        started=started,
        device=args.device,
    )


if __name__ == "__main__":
    main()
