"""Step time and peak memory of MoH and its peers at a token count, for ``benchmarks/moh.py``.

A model here is the quick experiment's backbone on a square grid of ``tokens`` tokens (patch 2,
one channel, images of side 2·√tokens): MoH at ``width``, every other system at the width whose
parameters come closest to MoH's (:func:`.experiment.matched_width`). A step is a zero-argument
call: :func:`train_step` (forward, the diffusion loss with the routing losses, backward, AdamW)
or :func:`sample_step` (one no-grad forward at one timestep for the batch, MoH's routes
precomputed for it or computed in the call).

Peak memory is measured in a fresh Python process, one spec after another
(:mod:`mixlab.shared.memory` says how): ``python -m mixlab.attention_arch.moh.profile '<json
list of specs>'`` prints the bytes one step adds for each spec ``{system, tokens, mode: "train" |
"sample", batch, width, depth, d_state, expand, backend}`` (``top_k``, default 1: the routed
systems' hard routes, null for soft; sample steps also take ``t``, default 500, and
``precomputed``, default true), after one warm-up step.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from mixlab.attention_arch.moh.config import MATCHED_IN_FLOPS, MOH, system_architecture
from mixlab.attention_arch.moh.experiment import (
    architecture_flops,
    costliest_route_flops,
    matched_width,
    parameter_count,
)
from mixlab.attention_arch.moh.model import MoHDiffusion
from mixlab.attention_arch.moh.training import TrainSpec, training_loss
from mixlab.shared import added_peak_bytes, is_count, require

__all__ = ["MODES", "build", "grid_side", "make_step", "median_times", "sample_step", "train_step"]

MODES = ("train", "sample")
PATCH = 2
MAX_LEVEL = 4
"""MoH's coarsest level pools the token grid by 4: its side must be a multiple of 4"""


def grid_side(tokens: int) -> int:
    """The side of the square token grid of ``tokens`` tokens."""
    side = math.isqrt(tokens) if is_count(tokens) else 0
    require(side >= 1 and side * side == tokens and side % MAX_LEVEL == 0, "tokens",
            f"a square whose side is a multiple of {MAX_LEVEL} (16, 64, 256, 1024, ...)",
            tokens)  # fmt: skip
    return side


def build(
    system: str,
    tokens: int,
    *,
    width: int,
    depth: int,
    d_state: int,
    expand: float,
    backend: str,
    top_k: int | None = 1,
    seed: int = 0,
) -> MoHDiffusion:
    """``system`` (a name of :mod:`.config`) on ``tokens`` tokens; MoH at ``width``, plain Mamba
    (equal FLOPs) at the width whose forward FLOPs match MoH's costliest route, any other system
    at the width that matches MoH's parameters. ``backend``: the selective scan's; ``top_k``: the
    routed systems' hard routes (None: soft). The routers' output layers are drawn at random
    (std 1) instead of zero, so that routes differ across timesteps as a trained model's do
    (zero-initialised, every top-1 router ties and sends every sample to the first level and
    expert: one dispatch group per block, a best case)."""
    base = {"sample_size": PATCH * grid_side(tokens), "in_channels": 1, "patch_size": PATCH,
            "depth": depth, "d_state": d_state, "expand": expand, "backend": backend}  # fmt: skip
    arguments = {**base, **system_architecture(system, expand, top_k), "width": width}
    moh = {**base, **system_architecture(MOH, expand, top_k), "width": width}
    if system in MATCHED_IN_FLOPS:
        target = costliest_route_flops(moh)
        arguments["width"] = matched_width(arguments, target, width, architecture_flops)
    elif system != MOH:
        arguments["width"] = matched_width(arguments, parameter_count(moh), width)
    torch.manual_seed(seed)
    model = MoHDiffusion(**arguments)
    for block in model.blocks:
        if block.router.net is not None:
            routed = slice(None, -1) if block.router.depth_gate else slice(None)
            with torch.no_grad():  # the gate's row stays zero: open at every t (bias 3)
                block.router.net[2].weight[routed].normal_()
    return model


def train_step(model: MoHDiffusion, batch: int, *, seed: int = 0) -> Callable[[], None]:
    """One training step of ``model`` as a call: random images ``[batch, 1, S, S]`` (made once),
    fresh timesteps and noise each call, the loss of :func:`.training.training_loss` (MSE on ε,
    plus the balance and depth terms at :class:`.training.TrainSpec`'s weights), backward and an
    AdamW step; gradients are freed after it, so that between calls only AdamW's state stays."""
    spec = TrainSpec()
    scheduler = spec.scheduler()
    size = model.config.sample_size
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 1, size, size, generator=generator).clamp(-1, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    model.train()

    def step() -> None:
        loss, _ = training_loss(model, scheduler, images, spec, generator)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def sample_step(
    model: MoHDiffusion, batch: int, t: int, *, precomputed: bool = True, seed: int = 0
) -> Callable[[], None]:
    """One sampling forward of ``model`` at timestep ``t`` as a call (no grad, eval mode) on
    random latents ``[batch, 1, S, S]``. ``precomputed``: fix the routes of ``t`` first
    (:meth:`.model.MoHDiffusion.precompute_routes`), so that the call runs no router and skips
    what has weight 0; otherwise every call routes from scratch."""
    model.eval()
    if precomputed:
        model.precompute_routes(torch.tensor([t]))
    else:
        model.clear_routes()
    size = model.config.sample_size
    x = torch.randn(batch, 1, size, size, generator=torch.Generator().manual_seed(seed))

    def step() -> None:
        with torch.no_grad():
            model(x, t)

    return step


def median_times(steps: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median seconds of each step over ``repeats`` rounds after one warm-up call each; a round
    calls every step once, so that drifts of the machine hit every step alike."""
    require(is_count(repeats), "repeats", "an integer >= 1", repeats)
    for step in steps.values():
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def make_step(spec: dict[str, Any]) -> tuple[MoHDiffusion, Callable[[], None]]:
    """The model of a spec (module docstring) and its step; sample steps run at timestep
    ``spec.get("t", 500)`` with the routes precomputed unless ``spec["precomputed"]`` is false."""
    require(spec["mode"] in MODES, "mode", f"one of {MODES}", spec["mode"])
    model = build(spec["system"], spec["tokens"], width=spec["width"], depth=spec["depth"],
                  d_state=spec["d_state"], expand=spec["expand"], backend=spec["backend"],
                  top_k=spec.get("top_k", 1))  # fmt: skip
    if spec["mode"] == "train":
        return model, train_step(model, spec["batch"])
    precomputed = spec.get("precomputed", True)
    return model, sample_step(model, spec["batch"], spec.get("t", 500), precomputed=precomputed)


def _probe(spec: dict[str, Any]) -> int:
    _, step = make_step(spec)
    step()  # warm-up: thread pools, AdamW's state
    return added_peak_bytes(step)


if __name__ == "__main__":
    torch.set_flush_denormal(True)  # exp(ΔA) decays the scan states into denormals (scan.py)
    torch.set_num_threads(1)
    print(json.dumps([_probe(spec) for spec in json.loads(sys.argv[1])]))
