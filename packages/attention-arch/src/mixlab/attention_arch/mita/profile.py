"""Time and peak memory of one attention layer, for the experiment and the benchmark.

Peak memory on a CPU is measured in a fresh Python process, one configuration after another
(:mod:`mixlab.shared.memory` says how); run ``python -m mixlab.attention_arch.mita.profile
'<json list of specs>'`` to see the measurements. On CUDA it is what users meet there:
``torch.cuda.max_memory_allocated`` over one call, less what was allocated before it.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import torch

from mixlab.attention_arch.mita.swap import attention_class
from mixlab.shared.memory import added_peak_bytes, measure_in_fresh_process


def build_layer(spec: dict[str, Any], device: torch.device | str = "cpu") -> torch.nn.Module:
    """An attention layer from ``{"kind", "heads", "head_dim", "grid": [h, w], "prefix",
    "config": {...}, "dense_limit"}`` (the last for MoBA and top-k, optional)."""
    kind = attention_class(spec["kind"])
    dim = spec["heads"] * spec["head_dim"]
    layer = kind(
        dim,
        spec["heads"],
        num_prefix_tokens=spec.get("prefix", 0),
        grid_size=tuple(spec["grid"]),
        **spec.get("config", {}),
    )
    if "dense_limit" in spec:
        layer.dense_limit = spec["dense_limit"]
    return layer.to(device)


def layer_input(
    spec: dict[str, Any], *, requires_grad: bool, device: torch.device | str = "cpu"
) -> torch.Tensor:
    h, w = spec["grid"]
    tokens = h * w + spec.get("prefix", 0)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(
        spec.get("batch", 1), tokens, spec["heads"] * spec["head_dim"], generator=generator
    )
    return x.to(device).requires_grad_(requires_grad)


def run_once(layer: torch.nn.Module, x: torch.Tensor, backward: bool) -> None:
    if backward:
        layer(x).sum().backward()
    else:
        with torch.inference_mode():
            layer(x)


def time_layers(
    layers: dict[str, torch.nn.Module], x: torch.Tensor, *, backward: bool, repeats: int = 3
) -> dict[str, float]:
    """Median seconds per call of each layer on the same input (:func:`time_layers_repeats`)."""
    times = time_layers_repeats(layers, x, backward=backward, repeats=repeats)
    return {name: statistics.median(values) for name, values in times.items()}


def time_layers_repeats(
    layers: dict[str, torch.nn.Module], x: torch.Tensor, *, backward: bool, repeats: int = 3
) -> dict[str, list[float]]:
    """Seconds of each of ``repeats`` calls of each layer on the same input, interleaved (one
    warm-up call each first) so that drifts of the machine hit every layer alike; on CUDA each
    call is timed to its last kernel."""
    x = x.detach().requires_grad_(backward)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in layers}
    for layer in layers.values():
        run_once(layer, x, backward)
    for _ in range(repeats):
        for name, layer in layers.items():
            sync()
            start = time.perf_counter()
            run_once(layer, x, backward)
            sync()
            times[name].append(time.perf_counter() - start)
    return times


def peak_memory(
    specs: list[dict[str, Any]], *, device: torch.device | str = "cpu", timeout: float = 1800
) -> list[int]:
    """Peak memory (bytes) one call of each layer spec adds (``"backward": true`` for forward +
    backward): on a CPU the resident set, measured one after another in one fresh process; on
    CUDA the allocator's peak over the call (layer and input already allocated)."""
    if torch.device(device).type == "cuda":
        return [_probe(spec, device) for spec in specs]
    return measure_in_fresh_process("mixlab.attention_arch.mita.profile", specs, timeout=timeout)


def _probe(spec: dict[str, Any], device: torch.device | str = "cpu") -> int:
    layer = build_layer(spec, device)
    backward = spec.get("backward", False)
    x = layer_input(spec, requires_grad=backward, device=device)
    run_once(layer, x, backward)  # one-time set-up (thread pools, kernels)
    layer.zero_grad(set_to_none=True)
    x.grad = None
    return added_peak_bytes(lambda: run_once(layer, x, backward), device)


if __name__ == "__main__":
    torch.set_flush_denormal(True)
    print(json.dumps([_probe(spec) for spec in json.loads(sys.argv[1])]))
