"""Time and peak memory of one attention layer, for the experiment and the benchmark.

Peak memory is measured in a fresh Python process, one configuration after another: after a
warm-up call the peak resident set (VmHWM) is reset, and the peak after one more call minus the
resident set before it is what the call added. Every allocation above 64 KiB is its own mapping
(``MALLOC_MMAP_THRESHOLD_``), so freed memory returns to the system and one measurement leaves
nothing for the next to reuse unseen; below a few MiB the figure is noise. run ``python -m mixlab.attention_arch.mita.profile '<json spec>'``
(a JSON list of specs) to see the measurements.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from mixlab.attention_arch.mita.swap import attention_class


def build_layer(spec: dict[str, Any]) -> torch.nn.Module:
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
    return layer


def layer_input(spec: dict[str, Any], *, requires_grad: bool) -> torch.Tensor:
    h, w = spec["grid"]
    tokens = h * w + spec.get("prefix", 0)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(
        spec.get("batch", 1), tokens, spec["heads"] * spec["head_dim"], generator=generator
    )
    return x.requires_grad_(requires_grad)


def run_once(layer: torch.nn.Module, x: torch.Tensor, backward: bool) -> None:
    if backward:
        layer(x).sum().backward()
    else:
        with torch.inference_mode():
            layer(x)


def time_layers(
    layers: dict[str, torch.nn.Module], x: torch.Tensor, *, backward: bool, repeats: int = 3
) -> dict[str, float]:
    """Median seconds per call of each layer on the same input, interleaved (one warm-up call
    each first) so that drifts of the machine hit every layer alike."""
    x = x.detach().requires_grad_(backward)
    times: dict[str, list[float]] = {name: [] for name in layers}
    for layer in layers.values():
        run_once(layer, x, backward)
    for _ in range(repeats):
        for name, layer in layers.items():
            start = time.perf_counter()
            run_once(layer, x, backward)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _reset_peak() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _peak_rss_bytes() -> int:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def peak_memory(specs: list[dict[str, Any]], *, timeout: float = 1800) -> list[int]:
    """Peak resident memory (bytes) one call of each layer spec adds (``"backward": true`` for
    forward + backward), measured one after another in one fresh process."""
    env = {
        **os.environ,
        # Every allocation above 64 KiB is its own mapping, returned to the system when freed, so
        # one measurement leaves no resident heap for the next to reuse unseen.
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "MALLOC_TRIM_THRESHOLD_": "0",
    }
    done = subprocess.run(
        [sys.executable, "-m", "mixlab.attention_arch.mita.profile", json.dumps(specs)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"memory probe failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _probe(spec: dict[str, Any]) -> int:
    layer = build_layer(spec)
    x = layer_input(spec, requires_grad=spec.get("backward", False))
    run_once(layer, x, spec.get("backward", False))  # one-time set-up (thread pools, kernels)
    layer.zero_grad(set_to_none=True)
    x.grad = None
    gc.collect()
    if not _reset_peak():  # else the peak of importing torch (or of the last probe) hides this one
        raise RuntimeError("cannot reset the peak resident set (/proc/self/clear_refs)")
    before = _peak_rss_bytes()
    run_once(layer, x, spec.get("backward", False))
    return max(0, _peak_rss_bytes() - before)


if __name__ == "__main__":
    torch.set_flush_denormal(True)
    print(json.dumps([_probe(spec) for spec in json.loads(sys.argv[1])]))
