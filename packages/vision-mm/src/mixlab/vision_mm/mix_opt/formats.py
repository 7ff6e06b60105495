"""What Mix-Opt writes to disk, checked without torch, so the CLI refuses damaged files before any
model loads: LoRA adapters (:func:`lora_file`) and training checkpoints (:func:`check_checkpoint`).

A LoRA folder holds ``pytorch_lora_weights.safetensors`` (the diffusers pipeline format) and, when
:func:`~mixlab.vision_mm.mix_opt.lora.save_lora` wrote it, the sidecar ``mixlab_lora.json`` (the
adapter's rank, alpha and targets, the SHA-256 of the weights file and of itself). A folder without
the sidecar (diffusers' ``save_lora_adapter``, another trainer) is accepted when its file is intact
safetensors.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any

from mixlab.shared.files import CheckpointError, read_sidecar

WEIGHT_NAME = "pytorch_lora_weights.safetensors"
SIDECAR_NAME = "mixlab_lora.json"
"""beside the weights: their SHA-256 and the adapter's settings (diffusers ignores it)"""
LORA_FORMAT = "mixlab.lora/1"
SIDECAR_KEYS: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "weight_name": str,
    "rank": int,
    "alpha": (int, float),
    "targets": list,
    "tensors": int,
}
MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header


def check_safetensors(path: str | os.PathLike[str], what: str = "safetensors file") -> int:
    """The number of tensors in the safetensors file ``path``, after checking its header and that
    the file is exactly as long as the header says (a truncated or padded file is refused).
    Raises :class:`CheckpointError` naming the file."""
    path = Path(path)
    size = path.stat().st_size

    def damaged(reason: str) -> CheckpointError:
        return CheckpointError(f"{path}: damaged or not a {what} ({reason})")

    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise damaged(f"{size} bytes, shorter than a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(MAX_HEADER, size - 8):
            raise damaged(f"header of {length} bytes in a file of {size}")
        try:
            header = json.loads(handle.read(length).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise damaged(f"unreadable header: {error}") from error
    if not isinstance(header, dict):
        raise damaged("the header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise damaged("its metadata is not a map of strings")
    end = 0
    for name, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise damaged(f"tensor {name!r} has no valid data_offsets")
        end = max(end, offsets[1])
    if end != size - 8 - length:
        raise damaged(
            f"the header describes {end} bytes of data, the file holds {size - 8 - length}"
        )
    return len(header)


def lora_file(folder: str | os.PathLike[str]) -> Path:
    """The adapter file of ``folder`` (a folder holding ``pytorch_lora_weights.safetensors``, or
    the ``.safetensors`` file itself), checked: it exists and is intact safetensors with tensors,
    and when our sidecar ``mixlab_lora.json`` is beside it, the sidecar is intact and the file's
    SHA-256 is the one it records. Raises ValueError (:class:`CheckpointError` when damaged)."""
    given = Path(folder)
    path = given / WEIGHT_NAME if given.is_dir() else given
    if not path.is_file():
        if given.is_dir():
            raise ValueError(f"LoRA folder {given} must hold {WEIGHT_NAME}, and it does not")
        raise ValueError(f"LoRA {given} does not exist (a folder holding {WEIGHT_NAME})")
    sidecar = path.parent / SIDECAR_NAME
    if sidecar.exists():
        data = read_sidecar(sidecar, expect=SIDECAR_KEYS)
        if data["format"] != LORA_FORMAT:
            raise CheckpointError(
                f"{sidecar}: not a mixlab LoRA sidecar (format {data['format']!r})"
            )
        if data["weight_name"] != path.name:
            raise CheckpointError(f"{sidecar}: describes {data['weight_name']}, not {path.name}")
    if check_safetensors(path, "LoRA safetensors file") == 0:
        raise CheckpointError(f"{path}: damaged or not a LoRA safetensors file (no tensors)")
    return path


CHECKPOINT_WHAT = "Mix-Opt training checkpoint"
_STEP_FILE = re.compile(r"^step_(\d{8})\.json$")  # mixlab.shared.checkpoint.Checkpointer's names


def check_settings(saved: Any, mine: dict[str, Any], where: str | os.PathLike[str]) -> None:
    """Raise a ValueError naming the fields when a checkpoint's recorded ``saved`` settings are not
    ``mine`` (:func:`~mixlab.vision_mm.mix_opt.settings.recorded_settings`)."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"{where}: damaged or not a {CHECKPOINT_WHAT} (no settings)")
    changed = sorted(k for k in mine if saved.get(k) != mine[k])
    if changed:
        raise ValueError(
            f"{where}: the checkpoint was written with other values of {changed}; "
            "rerun without --resume to start over"
        )


def check_checkpoint(
    checkpoint_dir: str | os.PathLike[str], settings: dict[str, Any]
) -> int | None:
    """Before any model loads: the step of the newest checkpoint that
    :meth:`~mixlab.vision_mm.mix_opt.trainer.MixOptTrainer.train` left in ``checkpoint_dir``
    (None when there is none), after checking that its sidecar and tensors file are intact
    (:class:`CheckpointError` naming the file) and that it was written under ``settings``
    (a ValueError naming the fields that differ)."""
    folder = Path(checkpoint_dir) / "checkpoints"
    steps = sorted(
        int(match.group(1))
        for entry in (folder.iterdir() if folder.is_dir() else ())
        if (match := _STEP_FILE.match(entry.name)) and entry.with_suffix(".safetensors").exists()
    )
    if not steps:
        return None
    sidecar = folder / f"step_{steps[-1]:08d}.json"
    data = read_sidecar(sidecar, expect={"format": str, "state": dict})
    check_safetensors(sidecar.with_suffix(".safetensors"), CHECKPOINT_WHAT)
    state = data["state"]
    try:
        saved = json.loads(state["settings"])
        if not isinstance(state["step"], int) or not isinstance(state["history"], list):
            raise TypeError("step or history of the wrong type")
    except (KeyError, TypeError, json.JSONDecodeError) as error:
        raise CheckpointError(
            f"{sidecar}: damaged or not a {CHECKPOINT_WHAT} ({type(error).__name__}: {error})"
        ) from error
    check_settings(saved, settings, sidecar)
    return steps[-1]


__all__ = [
    "CHECKPOINT_WHAT",
    "LORA_FORMAT",
    "SIDECAR_NAME",
    "WEIGHT_NAME",
    "check_checkpoint",
    "check_safetensors",
    "check_settings",
    "lora_file",
]
