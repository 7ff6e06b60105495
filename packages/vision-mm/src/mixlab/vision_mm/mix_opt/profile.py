"""Peak training memory and time per step of each mode, each spec in a fresh process.

A spec is ``{"mode": "bp_high" | "bp_low" | "zo_high", "resolution", "low_resolution",
"batch_size", "channels", "text_dim", "rank", "steps"}``; the UNet is :func:`build_unet` with a
LoRA adapter of ``rank`` (weights do not change memory or time). After two warm-up steps
(oneDNN set-up, AdamW state) the peak resident memory one step adds is measured
(:mod:`mixlab.shared.memory`), then the median time of ``steps`` more. A mixing schedule takes
one mode per step, so its peak is the larger of its modes' peaks. Run ``python -m
mixlab.vision_mm.mix_opt.profile '<json list of specs>'`` to see the measurements.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import torch
from accelerate import Accelerator

from mixlab.shared.memory import added_peak_bytes, measure_in_fresh_process
from mixlab.vision_mm.mix_opt.lora import add_lora
from mixlab.vision_mm.mix_opt.model import build_unet, noise_scheduler
from mixlab.vision_mm.mix_opt.schedule import BPHigh, Constant
from mixlab.vision_mm.mix_opt.trainer import MixOptConfig, MixOptTrainer

MODE_SCHEDULES = {"bp_high": BPHigh(), "bp_low": Constant(0.0), "zo_high": Constant(1.0)}


def profile_modes(specs: list[dict[str, Any]], *, timeout: float = 1800) -> list[dict[str, float]]:
    """``{"peak_bytes", "seconds_per_step"}`` of each spec, measured in one fresh process."""
    for spec in specs:
        if spec.get("mode") not in MODE_SCHEDULES:
            raise ValueError(f"mode must be one of {list(MODE_SCHEDULES)}, got {spec.get('mode')}")
    return measure_in_fresh_process("mixlab.vision_mm.mix_opt.profile", specs, timeout=timeout)


def _probe(spec: dict[str, Any]) -> dict[str, float]:
    torch.manual_seed(0)
    size = spec.get("resolution", 32)
    unet = build_unet(size, tuple(spec.get("channels", (32, 64, 64))), spec.get("text_dim", 64))
    add_lora(unet, rank=spec.get("rank", 4))
    n = spec.get("batch_size", 4)
    config = MixOptConfig(
        resolution=size,
        low_resolution=spec.get("low_resolution", size // 2),
        batch_size=n,
        steps=10_000,
        schedule=MODE_SCHEDULES[spec["mode"]],
    )
    images = torch.rand(n, 3, size, size) * 2 - 1
    text = torch.randn(n, 3, spec.get("text_dim", 64))
    # On the CPU always: the figure is the process's resident memory, which GPU memory is not.
    trainer = MixOptTrainer(
        unet, noise_scheduler(), images, text, config, accelerator=Accelerator(cpu=True)
    )
    for _ in range(2):
        trainer.step()
    peak = added_peak_bytes(trainer.step)
    times = []
    for _ in range(spec.get("steps", 5)):
        start = time.perf_counter()
        trainer.step()
        times.append(time.perf_counter() - start)
    return {"peak_bytes": peak, "seconds_per_step": statistics.median(times)}


if __name__ == "__main__":
    torch.set_flush_denormal(True)
    print(json.dumps([_probe(spec) for spec in json.loads(sys.argv[1])]))
