"""Device selection: ``auto`` picks CUDA when present, else CPU; anything else is checked."""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads on first use (CLIs answer --help without it), if installed
    import torch

DEVICE_HELP = "auto, cpu, cuda, cuda:N or mps"
_DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|cuda:\d+|mps)$")


def check_device_name(device: str, option: str = "device") -> None:
    """Raise a ValueError naming ``option`` unless ``device`` is one of auto, cpu, cuda, cuda:N,
    mps (a CLI passes ``"--device"``)."""
    if not isinstance(device, str) or not _DEVICE_PATTERN.match(device):
        raise ValueError(f"{option} must be one of {DEVICE_HELP}, got {device!r}")


def resolve_device(device: str | torch.device = "auto") -> torch.device | str:
    """The torch device for ``device``: ``"auto"`` is CUDA when available, else CPU.

    Asking for a device this machine does not have is an error, not a silent fallback. Without
    torch installed (a NumPy-only domain such as mixlab-online) ``"auto"`` and ``"cpu"`` give the
    string ``"cpu"``, and any other device is a ValueError naming ``--device``.
    """
    loaded = sys.modules.get("torch")  # a torch.device exists only once torch is imported
    if loaded is not None and isinstance(device, loaded.device):
        device = str(device)
    check_device_name(device)
    try:
        import torch
    except ImportError:
        if device in ("auto", "cpu"):
            return "cpu"
        raise ValueError(
            f"device {device!r} needs torch, which is not installed here (this install computes "
            "with NumPy on the CPU): use --device cpu or auto"
        ) from None
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {device!r} was asked for but CUDA is not available here; use cpu or auto"
            )
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    if device == "mps" and not torch.backends.mps.is_available():
        raise ValueError(
            "device 'mps' was asked for but MPS is not available here; use cpu or auto"
        )
    return torch.device(device)
