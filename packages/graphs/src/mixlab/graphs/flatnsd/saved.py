"""A model saved by ``mixlab-graphs flatnsd train``: ``model.safetensors`` and its sidecar
``metrics.json`` (what rebuilds the model, the measurements, and the SHA-256 of both files).

:func:`read_model_info` checks a saved folder without importing torch, so that a damaged or
foreign folder is refused before any heavy work; :func:`mixlab.graphs.flatnsd.training.load_trained`
then rebuilds the network.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mixlab.graphs.flatnsd.config import MAX_TREE_DEPTH, RING_CLASSES, RING_NOISE, SYSTEMS
from mixlab.shared.files import CheckpointError, read_sidecar

MODEL_FILE = "model.safetensors"
SIDECAR_FILE = "metrics.json"
MODEL_FORMAT = "mixlab.graphs.flatnsd.model/2"  # 2: rings carry random features
BUILD_KEYS = ("in_channels", "classes", "layers", "width", "stalk_dim")
"""the integers (each >= 1) that, with ``model``, rebuild a saved network with build_model"""


def task_shape(task: str, size: int) -> tuple[int, int] | None:
    """(node features, classes) of a benchmark task, or None for an unknown task or size."""
    if task == "ring" and size >= 3:
        return RING_CLASSES + RING_NOISE, RING_CLASSES
    if task == "tree" and 2 <= size <= MAX_TREE_DEPTH:
        return 2 * (2**size + 1), 2**size
    return None


def read_model_info(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The sidecar of a saved model folder, checked: it and the weights it covers are intact (by
    SHA-256), and it names a known model, task and size with build integers >= 1.

    Raises :class:`CheckpointError` naming the file otherwise."""
    folder = Path(folder)
    sidecar = folder / SIDECAR_FILE
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a folder (a saved flatnsd model is a folder)")
    if not sidecar.is_file():
        raise CheckpointError(f"{folder}: not a saved flatnsd model (no {SIDECAR_FILE})")
    expect: dict[str, type] = {"format": str, "model": str, "task": str, "size": int}
    info = read_sidecar(sidecar, expect={**expect, **dict.fromkeys(BUILD_KEYS, int)})
    if info["format"] != MODEL_FORMAT:
        raise CheckpointError(f"{sidecar}: not a saved flatnsd model (format {info['format']!r})")
    if info["model"] not in SYSTEMS:
        raise CheckpointError(f"{sidecar}: unknown model {info['model']!r}")
    task, size = info["task"], info["size"]
    shape = task_shape(task, size)
    if shape is None:
        raise CheckpointError(f"{sidecar}: unknown task {task!r} of size {size}")
    for key in BUILD_KEYS:
        if info[key] < 1:
            raise CheckpointError(f"{sidecar}: {key} must be >= 1, got {info[key]}")
    if (info["in_channels"], info["classes"]) != shape:
        raise CheckpointError(
            f"{sidecar}: in_channels {info['in_channels']} and classes {info['classes']} do not "
            f"fit the {task} task of size {size} ({shape[0]} features, {shape[1]} classes)"
        )
    if not (folder / MODEL_FILE).is_file():
        raise CheckpointError(f"{folder / MODEL_FILE}: missing (a saved flatnsd model needs it)")
    return info


__all__ = [
    "BUILD_KEYS",
    "MODEL_FILE",
    "MODEL_FORMAT",
    "SIDECAR_FILE",
    "read_model_info",
    "task_shape",
]
