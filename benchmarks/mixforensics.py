"""Benchmark: encoder passes and wall time per video of MixForensics (R = 4 fixed blends) against
per-frame voting on the same backbone (the peer), with TimeSformer beside them, as ratios
measured in one run.

    uv run python benchmarks/mixforensics.py                # -> benchmarks/results/mixforensics/
    uv run python benchmarks/mixforensics.py --repeats 1 --frames 8 --out /tmp/bench

Backbone: torchvision's ResNet-50 (random weights, built from config) at 224², the size
CNNSpot uses. Per video of T = 8, 16 and 32 frames: MixForensics blends the frames into 4
composites (4 passes), voting encodes every frame (T passes), TimeSformer (HF, the base config:
width 768, 12 layers, 16² patches, built for T frames) runs one pass over all T·196 patches.
Times: one video per call, the median of ``--repeats`` calls, the systems interleaved, one torch
thread, blending and decoding-free (the frames are already tensors).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from mixlab.shared import Claim
from mixlab.shared.result import write_benchmark
from mixlab.shared.stats import interleaved_median_seconds
from mixlab.vision_mm.mixforensics.model import (
    FrameVoting,
    MixForensicsDetector,
    TimeSformerDetector,
    build_backbone,
)

BLENDS = 4
SLACK = 1.25
"""MixForensics' time per video must stay within 1.25× R/T of voting's: blending costs little
beside the encoder"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--frames", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mixforensics"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    torch.manual_seed(0)
    backbone = build_backbone("torchvision/resnet50")
    systems = {
        "mixforensics": MixForensicsDetector(backbone, blends=BLENDS).eval(),
        "voting": FrameVoting(backbone).eval(),  # the same backbone object: the same weights
    }
    rows: dict[str, dict[str, float | None]] = {}
    for frames in args.frames:
        video = torch.rand(1, frames, 3, args.size, args.size)
        timesformer = TimeSformerDetector(image_size=args.size, frames=frames, patch_size=16, hidden_size=768,
                                          layers=12, heads=12).eval()  # fmt: skip
        models = {**systems, "timesformer": timesformer}

        def call(model, video=video):
            with torch.no_grad():
                model(video)

        times = interleaved_median_seconds(
            {k: (lambda m=m: call(m)) for k, m in models.items()}, args.repeats
        )
        for name, model in models.items():
            rows[f"T{frames}/{name}"] = {"passes": model.passes, "seconds_per_video": times[name],
                                         "vs_voting": times[name] / times["voting"],
                                         "passes_vs_voting": model.passes / frames}  # fmt: skip
        del timesformer, models
    for name, row in rows.items():
        print(f"{name}: {row}")
    claims = [
        Claim.compare(f"At T = {t}, MixForensics (R = {BLENDS}) takes <= {SLACK:g}× R/T of per-frame voting's time "
                      "per video on the same ResNet-50", rows[f"T{t}/mixforensics"]["vs_voting"], "<=",
                      SLACK * BLENDS / t, value_label="MixForensics / voting seconds", reference_label=f"{SLACK:g}·R/T")
        for t in args.frames
    ]  # fmt: skip
    write_benchmark(args.out, method="mixforensics", metrics=rows, claims=claims,
                    config={"repeats": args.repeats, "frames": args.frames, "size": args.size, "threads": 1,
                            "backbone": "torchvision resnet50 (random weights)", "blends": BLENDS,
                            "timesformer": "HF TimesformerConfig base (768 wide, 12 layers, patch 16)"},
                    started=started)  # fmt: skip


if __name__ == "__main__":
    main()
