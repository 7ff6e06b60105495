"""Peak training memory and time per step of each mode, each spec in its own fresh process.

A spec is ``{"mode": "bp_high" | "bp_low" | "zo_high", "resolution", "low_resolution",
"batch_size", "channels", "text_dim", "rank", "steps", "device", "unet"}``; the UNet is
:func:`build_unet` (``"unet": "shapes"``) or Stable Diffusion 1.5's UNet layout
(``"unet": "sd15"``, :data:`SD15_UNET`, 860 M parameters: resolutions are then latent sizes, 64
for 512² images, and the text 77 CLIP states of width 768) with a LoRA adapter of ``rank``,
randomly initialised (weights do not change memory or time),
trained by :class:`MixOptTrainer` on ``device`` ("cpu", "cuda" or "cuda:N"). Two figures per mode
(:mod:`mixlab.shared.memory`):

- ``total_peak_bytes``: the peak from before the model is built to the end, so the model, the
  optimizer's state, the data and the activations: what a user's device must hold (on CUDA the
  allocator's ``max_memory_allocated``; on a CPU the resident set, less what the imports took);
- ``added_peak_bytes``: the peak one step adds after two warm-up steps (oneDNN or cuDNN set-up,
  AdamW state), what the mode itself costs.

Then the median time of ``steps`` more. A mixing schedule takes one mode per step, so its peak is
the larger of its modes' peaks. Run ``python -m mixlab.vision_mm.mix_opt.profile '<json list of
specs>'`` to see the measurements.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from mixlab.shared.config import is_count, require
from mixlab.shared.memory import measure_in_fresh_process
from mixlab.vision_mm.mix_opt.config import (
    BASE_CHANNELS,
    BASE_TEXT_DIM,
    check_base_unet,
    downsampling_factor,
)
from mixlab.vision_mm.mix_opt.schedule import BPHigh, Constant

MODE_SCHEDULES = {"bp_high": BPHigh(), "bp_low": Constant(0.0), "zo_high": Constant(1.0)}


SD15_UNET: dict[str, Any] = {
    "in_channels": 4, "out_channels": 4, "block_out_channels": (320, 640, 1280, 1280),
    "down_block_types": ("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    "up_block_types": ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3, "layers_per_block": 2,
    "cross_attention_dim": 768, "attention_head_dim": 8, "norm_num_groups": 32,
}  # fmt: skip
"""Stable Diffusion 1.5's UNet2DConditionModel configuration (its ``unet/config.json``, the
fields that differ from diffusers' defaults): the memory probe builds it without weights"""
SD15_TEXT = (77, 768)
"""the CLIP text states SD 1.5's UNet cross-attends to: tokens × width"""
UNETS = ("shapes", "sd15")

SPEC_DEFAULTS: dict[str, Any] = {
    "resolution": 32,
    "low_resolution": 16,
    "batch_size": 4,
    "channels": BASE_CHANNELS,
    "text_dim": BASE_TEXT_DIM,
    "rank": 4,
    "steps": 5,
    "device": "cpu",
    "unet": "shapes",
}
"""what a spec's missing keys default to (``low_resolution``: half the resolution)"""


def check_spec(spec: dict[str, Any], name: Callable[[str], str] = str) -> None:
    """Raise a ValueError naming the key (as ``name(key)``: the CLI passes its option names)
    unless ``spec`` is one :func:`profile_modes` can measure; run in the parent process, so bad
    input never reaches the probe."""
    require(isinstance(spec, dict), "spec", "a dict", spec)
    unknown = sorted(set(spec) - {"mode", *SPEC_DEFAULTS})
    require(not unknown, "spec keys", f"from {['mode', *SPEC_DEFAULTS]}", unknown)
    mode = spec.get("mode")
    require(mode in MODE_SCHEDULES, name("mode"), f"one of {list(MODE_SCHEDULES)}", mode)
    values = {**SPEC_DEFAULTS, **spec}
    if "low_resolution" not in spec and is_count(values["resolution"]):
        values["low_resolution"] = values["resolution"] // 2
    require(
        isinstance(values["device"], str) and re.fullmatch(r"cpu|cuda(:\d+)?", values["device"]),
        name("device"),
        "cpu, cuda or cuda:N",
        values["device"],
    )
    require(values["unet"] in UNETS, name("unet"), f"one of {list(UNETS)}", values["unet"])
    check_base_unet(values["channels"], values["text_dim"])
    for key in ("batch_size", "rank", "steps"):
        require(is_count(values[key]), name(key), "an integer >= 1", values[key])
    sd15 = values["unet"] == "sd15"
    factor = downsampling_factor(
        SD15_UNET["block_out_channels"] if sd15 else tuple(values["channels"])
    )
    resolution, low = values["resolution"], values["low_resolution"]
    for key, value in (("resolution", resolution), ("low_resolution", low)):
        require(is_count(value), name(key), "an integer >= 1", value)
        require(
            value % factor == 0,
            name(key),
            f"a multiple of the UNet's downsampling factor {factor}",
            value,
        )
    require(low <= resolution, name("low_resolution"), f"<= resolution {resolution}", low)


def profile_modes(specs: list[dict[str, Any]], *, timeout: float = 1800) -> list[dict[str, float]]:
    """``{"total_peak_bytes", "added_peak_bytes", "seconds_per_step"}`` of each spec, each
    measured in a fresh process of its own (one mode's allocator state, thread pools or cached
    kernels never serve the next). Every spec is checked here first (:func:`check_spec`)."""
    for spec in specs:
        check_spec(spec)
    from mixlab.shared.progress_report import progress

    module = "mixlab.vision_mm.mix_opt.profile"
    measured = []
    with progress(len(specs), "memory probe (a process per mode)") as bar:
        for spec in specs:
            measured.append(measure_in_fresh_process(module, [spec], timeout=timeout)[0])
            bar.advance()
    return measured


def _probe(spec: dict[str, Any]) -> dict[str, float]:
    import torch
    from accelerate import Accelerator
    from diffusers import UNet2DConditionModel

    from mixlab.shared.memory import added_peak_bytes, current_bytes, peak_bytes, reset_peak
    from mixlab.vision_mm.mix_opt.lora import add_lora
    from mixlab.vision_mm.mix_opt.model import build_unet, noise_scheduler
    from mixlab.vision_mm.mix_opt.trainer import MixOptConfig, MixOptTrainer

    device = spec.get("device", SPEC_DEFAULTS["device"])
    memory_device = None
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device}: no CUDA device is available")
        memory_device = torch.device(device)
        if memory_device.index is not None:
            torch.cuda.set_device(memory_device)  # where accelerate places the model
        memory_device = torch.device("cuda", torch.cuda.current_device())
    reset_peak(memory_device)
    start = current_bytes(memory_device)
    torch.manual_seed(0)
    size = spec.get("resolution", SPEC_DEFAULTS["resolution"])
    if spec.get("unet", SPEC_DEFAULTS["unet"]) == "sd15":
        unet = UNet2DConditionModel(sample_size=size, **SD15_UNET)
        (tokens, text_dim), channels = SD15_TEXT, SD15_UNET["in_channels"]
    else:
        tokens, text_dim, channels = 3, spec.get("text_dim", SPEC_DEFAULTS["text_dim"]), 3
        unet = build_unet(size, tuple(spec.get("channels", SPEC_DEFAULTS["channels"])), text_dim)
    add_lora(unet, rank=spec.get("rank", SPEC_DEFAULTS["rank"]))
    n = spec.get("batch_size", SPEC_DEFAULTS["batch_size"])
    config = MixOptConfig(
        resolution=size,
        low_resolution=spec.get("low_resolution", size // 2),
        batch_size=n,
        steps=10_000,
        schedule=MODE_SCHEDULES[spec["mode"]],
    )
    images = torch.rand(n, channels, size, size) * 2 - 1
    text = torch.randn(n, tokens, text_dim)
    trainer = MixOptTrainer(
        unet,
        noise_scheduler(),
        images,
        text,
        config,
        accelerator=Accelerator(cpu=memory_device is None),
    )
    for _ in range(2):
        trainer.step()
    total = peak_bytes(memory_device)
    added = added_peak_bytes(trainer.step, memory_device)  # starts a new peak
    total = max(total, peak_bytes(memory_device)) - start
    times = []
    sync = (lambda: torch.cuda.synchronize(memory_device)) if memory_device else (lambda: None)
    for _ in range(spec.get("steps", SPEC_DEFAULTS["steps"])):
        sync()
        begin = time.perf_counter()
        trainer.step()
        sync()  # a ZO step queues its restore and update after the loss's last .item()
        times.append(time.perf_counter() - begin)
    return {
        "total_peak_bytes": total,
        "added_peak_bytes": added,
        "seconds_per_step": statistics.median(times),
    }


if __name__ == "__main__":
    import torch

    torch.set_flush_denormal(True)
    print(json.dumps([_probe(spec) for spec in json.loads(sys.argv[1])]))
