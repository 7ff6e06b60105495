"""Benchmark: time and peak memory per sample of MoP's connector (K = 4 probes × 8 queries on four
encoder layers) against one resampler on the last layer (the peer: current MLLMs' Q-Former /
Perceiver resampler) and OneLLM's routed resampler experts, as ratios measured in one run.

    uv run python benchmarks/mop.py                 # -> benchmarks/results/mop/
    uv run python benchmarks/mop.py --repeats 3 --out /tmp/bench

Sizes: the quick experiment's toy encoder (width 64, 7 hidden states, 65 tokens) and CLIP
ViT-L/14 at 224² from its config (width 1024, 25 hidden states, 257 tokens), random weights and
random hidden states; batch 1 and 16; inference (forward) and training (forward + backward).
Every connector hands the LM 32 tokens. The encoder and the LM are the same for every connector
and are left out: the figures are the connector's own cost. Times: the median of ``--repeats``
interleaved calls on one thread; memory: the peak resident memory one call adds, in a fresh
process per configuration list (:mod:`mixlab.shared.memory`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from mixlab.shared import Claim
from mixlab.shared.result import write_benchmark
from mixlab.vision_mm.mop.profile import CONNECTORS, ENCODERS, peak_memory, time_connectors

BATCHES = (1, 16)
SLOWDOWN_LIMIT = 4.0
"""MoP runs four probes where the resampler runs one, each over a quarter of the queries: its
training step at ViT-L size must stay within 4× the resampler's"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mop"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    rows: dict[str, dict[str, float | None]] = {}
    specs = []
    for encoder in ENCODERS:
        for batch in BATCHES:
            for backward in (False, True):
                mode = "train" if backward else "infer"
                times = time_connectors(encoder, batch, backward=backward, repeats=args.repeats)
                for kind, seconds in times.items():
                    rows[f"{encoder}/b{batch}/{mode}/{kind}"] = {
                        "ms_per_sample": 1e3 * seconds / batch,
                        "time_vs_resampler": seconds / times["resampler"],
                        "peak_mib_per_sample": None,
                        "memory_vs_resampler": None,
                    }
                    specs.append(
                        {"kind": kind, "encoder": encoder, "batch": batch, "backward": backward}
                    )
    for spec, peak in zip(specs, peak_memory(specs), strict=True):
        mode = "train" if spec["backward"] else "infer"
        rows[f"{spec['encoder']}/b{spec['batch']}/{mode}/{spec['kind']}"]["peak_mib_per_sample"] = (
            peak / 2**20 / spec["batch"]
        )
    for name, row in rows.items():
        reference = rows[name.rsplit("/", 1)[0] + "/resampler"]["peak_mib_per_sample"]
        row["memory_vs_resampler"] = row["peak_mib_per_sample"] / reference if reference else None
        print(f"{name}: {row}")
    claims = [
        Claim.compare(
            f"MoP's training step at ViT-L/14 size, batch {batch}, takes <= {SLOWDOWN_LIMIT:g}× one resampler's",
            rows[f"vit-l14/b{batch}/train/mop"]["time_vs_resampler"], "<=", SLOWDOWN_LIMIT,
            value_label="MoP / resampler seconds",
        )
        for batch in BATCHES
    ]  # fmt: skip
    write_benchmark(
        args.out,
        method="mop",
        metrics=rows,
        claims=claims,
        config={
            "repeats": args.repeats,
            "batches": list(BATCHES),
            "connectors": list(CONNECTORS),
            "encoders": ENCODERS,
            "probes": 4,
            "queries_per_probe": 8,
            "threads": 1,
        },
        started=started,
    )


if __name__ == "__main__":
    main()
