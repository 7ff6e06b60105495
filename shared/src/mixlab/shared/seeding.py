"""Seeding and random-number-generator state, so that runs repeat and resumed runs continue exactly."""

from __future__ import annotations

import os
import random
from types import ModuleType
from typing import Any

import numpy as np


def _torch() -> ModuleType | None:
    """torch if it is installed, else None: NumPy-only domains install without it."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def seed_everything(seed: int, *, deterministic: bool = False) -> None:
    """Seed Python's ``random``, NumPy's global generator and, when it is installed, torch (CPU and
    every CUDA device).

    With ``deterministic=True`` torch also picks deterministic kernels where it has them (slower on
    GPU; warns where none exists). On CPU, the same seed gives the same numbers either way.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    random.seed(seed)
    np.random.seed(seed)
    torch = _torch()
    if torch is None:
        return
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        # cuBLAS needs a fixed workspace for deterministic matmuls (CUDA docs, "Reproducibility").
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def capture_rng_state() -> dict[str, Any]:
    """The state of every global generator, in a form :mod:`mixlab.shared.checkpoint` can save
    (torch's only when torch is installed)."""
    numpy_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            **numpy_state,
            "state": {**numpy_state["state"], "key": numpy_state["state"]["key"].tolist()},
        },
    }
    torch = _torch()
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back the generator states recorded by :func:`capture_rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    key = np.asarray(numpy_state["state"]["key"], dtype=np.uint32)
    np.random.set_state({**numpy_state, "state": {**numpy_state["state"], "key": key}})
    if "torch" not in state:
        return  # captured without torch: torch's generator was not part of it
    torch = _torch()
    if torch is None:
        raise ModuleNotFoundError(
            "the saved generator state holds torch's, and torch is not installed here",
            name="torch",
        )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))
