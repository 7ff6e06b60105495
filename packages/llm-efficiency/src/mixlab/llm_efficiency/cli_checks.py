"""Checks of ``mixlab-llm`` options, run before any model is loaded (standard library only, so a
bad value is refused in a fraction of a second). Each raises a ValueError naming the option,
which the CLI prints as one line with exit code 2."""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path


def count(value: object, option: str, minimum: int = 1) -> None:
    """``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{option} must be an integer >= {minimum}, got {value!r}")


def positive(value: object, option: str) -> None:
    """``value`` is a finite number > 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{option} must be a finite number > 0, got {value!r}")


def input_file(path: Path, option: str) -> Path:
    """``path`` is a readable file."""
    if not path.exists():
        raise ValueError(f"{option}: {path} does not exist")
    if not path.is_file():
        raise ValueError(f"{option}: {path} is not a file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{option}: {path} cannot be read")
    return path


def model_folder(path: Path, option: str = "--model", *, needs: str = "config.json") -> Path:
    """``path`` is a folder holding ``needs``."""
    if not path.exists():
        raise ValueError(f"{option}: {path} does not exist")
    if not path.is_dir():
        raise ValueError(f"{option}: {path} is not a folder")
    if not (path / needs).is_file():
        kind = "model folder" if needs == "config.json" else f"folder with {needs}"
        raise ValueError(f"{option}: {path} is not a {kind} (no {needs})")
    return path


def output_folder(path: Path, option: str = "--out") -> Path:
    """``path`` is a folder, or can be created as one (it is not a file, and its nearest existing
    parent is a writable folder)."""
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{option}: {path} exists and is not a folder")
        if not os.access(path, os.W_OK):
            raise ValueError(f"{option}: {path} is not writable")
        return path
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{option}: cannot create {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{option}: cannot create {path}: {parent} is not writable")
    return path
