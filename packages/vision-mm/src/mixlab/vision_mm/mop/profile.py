"""Time and peak memory of MoP's connector against one resampler and OneLLM's routed experts, on
random hidden states of a given encoder size (for ``benchmarks/mop.py``).

Every connector hands the LM the same number of tokens (K·T). Peak memory is measured in a fresh
Python process, one spec after another (:mod:`mixlab.shared.memory` says how); run ``python -m
mixlab.vision_mm.mop.profile '<json list of specs>'`` to see the measurements.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

import torch

from mixlab.shared.memory import added_peak_bytes, measure_in_fresh_process
from mixlab.shared.stats import interleaved_median_seconds
from mixlab.vision_mm.mop.probes import MixtureOfProbes, Resampler, RoutedResamplers

ENCODERS = {
    "toy": {"dim": 64, "heads": 4, "states": 7, "tokens": 65},
    # CLIP ViT-L/14 at 224²: width 1024, 16 heads, 24 layers (+ embeddings), 256 patches + class
    "vit-l14": {"dim": 1024, "heads": 16, "states": 25, "tokens": 257},
}
CONNECTORS = ("mop", "resampler", "onellm")
PROBES, QUERIES = 4, 8

__all__ = ["CONNECTORS", "ENCODERS", "build", "hidden_states", "peak_memory", "time_connectors"]


def build(kind: str, encoder: str) -> torch.nn.Module:
    """A connector of ``kind`` for ``encoder``'s size, with the experiment's settings."""
    size = ENCODERS[encoder]
    dim, heads, states = size["dim"], size["heads"], size["states"]
    torch.manual_seed(0)
    if kind == "mop":
        layers = [round(k * (states - 1) / (PROBES - 1)) for k in range(PROBES)]
        return MixtureOfProbes(dim, states, num_probes=PROBES, queries=QUERIES, heads=heads,
                               layers=layers, router_hidden=dim, combine="concat")  # fmt: skip
    if kind == "resampler":
        return Resampler(dim, queries=PROBES * QUERIES, heads=heads)
    return RoutedResamplers(dim, queries=PROBES * QUERIES, heads=heads, router_hidden=dim)


def hidden_states(encoder: str, batch: int) -> torch.Tensor:
    """Random stacked hidden states [L + 1, batch, N, D]."""
    size = ENCODERS[encoder]
    generator = torch.Generator().manual_seed(0)
    return torch.randn(size["states"], batch, size["tokens"], size["dim"], generator=generator)


def run_once(connector: torch.nn.Module, states: torch.Tensor, backward: bool) -> None:
    if backward:
        connector(states).prefix.sum().backward()
    else:
        with torch.inference_mode():
            connector(states)


def time_connectors(
    encoder: str, batch: int, *, backward: bool, repeats: int = 5
) -> dict[str, float]:
    """Median seconds per call of each connector on the same states, interleaved (one warm-up
    call each first, the order reversed every other round)."""
    states = hidden_states(encoder, batch)
    connectors = {kind: build(kind, encoder) for kind in CONNECTORS}
    calls = {
        kind: functools.partial(run_once, c, states, backward) for kind, c in connectors.items()
    }
    return interleaved_median_seconds(calls, repeats)


def peak_memory(specs: list[dict[str, Any]], *, timeout: float = 1800) -> list[int]:
    """Peak resident memory (bytes) one call of each ``{"kind", "encoder", "batch",
    "backward"}`` adds, measured one after another in one fresh process."""
    return measure_in_fresh_process("mixlab.vision_mm.mop.profile", specs, timeout=timeout)


def _probe(spec: dict[str, Any]) -> int:
    connector = build(spec["kind"], spec["encoder"])
    states = hidden_states(spec["encoder"], spec["batch"])
    run_once(connector, states, spec["backward"])  # one-time set-up (thread pools, kernels)
    connector.zero_grad(set_to_none=True)
    return added_peak_bytes(lambda: run_once(connector, states, spec["backward"]))


if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    print(json.dumps([_probe(spec) for spec in json.loads(sys.argv[1])]))
