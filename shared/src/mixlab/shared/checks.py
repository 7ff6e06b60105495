"""Checks a CLI verb runs on its options before it loads a model or computes anything.

Each raises ``ValueError`` naming the option and what is allowed, which every mixlab CLI prints as
one line with exit code 2. Nothing here imports torch, so a verb can refuse bad input at once::

    check_count(heads, "--heads")
    check_seed(seed)
    check_input_file(calib, "--calib", suffixes=(".txt",))
    check_output_folder(out, "--out")
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def check_count(value: object, option: str, minimum: int = 1, maximum: int | None = None) -> None:
    """``value`` is an integer (not a bool) in ``[minimum, maximum]``."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum
    if maximum is None:
        allowed = f"an integer >= {minimum}"
    else:
        allowed = f"an integer in [{minimum}, {maximum}]"
        ok = ok and value <= maximum  # type: ignore[operator]
    if not ok:
        raise ValueError(f"{option} must be {allowed}, got {value!r}")


def check_seed(value: object, option: str = "--seed") -> None:
    """A seed NumPy and torch both accept: an integer in [0, 2**32)."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 <= value < 2**32
    if not ok:
        raise ValueError(f"{option} must be an integer in [0, 2**32), got {value!r}")


def check_number(value: object, option: str, ok: bool, allowed: str) -> None:
    """``value`` is a finite real number and ``ok`` (the range test the caller computed) holds."""
    finite = (
        isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    )
    if not (finite and ok):
        raise ValueError(f"{option} must be {allowed}, got {value!r}")


def check_choice(value: object, option: str, choices: Iterable[str]) -> None:
    """``value`` is one of ``choices``."""
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{option} must be one of {choices}, got {value!r}")


def check_input_file(path: Path, option: str, suffixes: Iterable[str] = ()) -> None:
    """``path`` is an existing, readable file (ending in one of ``suffixes`` when given)."""
    suffixes = tuple(suffixes)
    if not path.exists():
        raise ValueError(f"{option}: {str(path)!r} does not exist")
    if not path.is_file():
        raise ValueError(f"{option}: {str(path)!r} is not a file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{option}: {str(path)!r} is not readable")
    if suffixes and path.suffix not in suffixes:
        raise ValueError(f"{option} must be a {' or '.join(suffixes)} file, got {str(path)!r}")


def check_input_folder(path: Path, option: str, containing: Iterable[str] = ()) -> None:
    """``path`` is an existing, readable folder holding every file named in ``containing``."""
    if not path.exists():
        raise ValueError(f"{option}: {str(path)!r} does not exist")
    if not path.is_dir():
        raise ValueError(f"{option}: {str(path)!r} is not a folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ValueError(f"{option}: {str(path)!r} is not readable")
    for name in containing:
        if not (path / name).is_file():
            raise ValueError(f"{option}: {str(path)!r} has no {name}")


def check_creatable(path: Path, option: str) -> None:
    """``path`` exists or can be made: the nearest existing folder above it is writable."""
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{option}: cannot create {str(path)!r}: {str(parent)!r} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{option}: cannot create {str(path)!r}: {str(parent)!r} is not writable")


def check_output_file(path: Path, option: str, suffixes: Iterable[str] = ()) -> None:
    """``path`` can be written as a file: the right suffix, not a folder, its folder creatable."""
    suffixes = tuple(suffixes)
    if suffixes and path.suffix not in suffixes:
        raise ValueError(f"{option} must end in {' or '.join(suffixes)}, got {str(path)!r}")
    if path.is_dir():
        raise ValueError(f"{option}: {str(path)!r} is a folder, not a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{option}: {str(path)!r} is not writable")
    check_creatable(path, option)


def check_output_folder(path: Path, option: str) -> None:
    """``path`` can hold a run's files: an existing writable folder, or one that can be made."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} must be a folder, got the file {str(path)!r}")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{option}: {str(path)!r} is not writable")
    check_creatable(path, option)


def check_fresh_output(
    path: Path, option: str, *, resume: bool, made: Iterable[str] = ("checkpoints",)
) -> None:
    """``path`` holds nothing an earlier run left (``made``: glob patterns inside it, a training's
    checkpoints or model files) unless ``resume``: a fresh run does not overwrite a trained
    folder, and continuing one takes ``--resume``."""
    found = [name for pattern in made for name in sorted(p.name for p in path.glob(pattern))]
    if found and not resume:
        raise ValueError(
            f"{option} {str(path)!r} holds an earlier run ({found[0]}): pass --resume to continue "
            f"it, or another {option}"
        )


__all__ = [
    "check_choice",
    "check_count",
    "check_creatable",
    "check_fresh_output",
    "check_input_file",
    "check_input_folder",
    "check_number",
    "check_output_file",
    "check_output_folder",
    "check_seed",
]


def read_jsonl(
    path: Path,
    option: str,
    fields: tuple[str, ...],
    *,
    text: tuple[str, ...] = (),
    suffixes: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (named with one of ``suffixes``, when given), each an
    object with ``fields`` holding text (or a number; those in ``text`` non-empty text only,
    e.g. a prompt); a ValueError naming ``option`` and the line otherwise."""
    check_input_file(path, option, suffixes)
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{option}: {str(path)!r} is not JSON lines (line {number}: {error.msg})"
            ) from None
        if not isinstance(record, dict):
            raise ValueError(f"{option}: line {number} of {str(path)!r} is not a JSON object")
        for field in fields:
            if not isinstance(record.get(field), str | int | float) or isinstance(
                record.get(field), bool
            ):
                raise ValueError(
                    f"{option}: line {number} of {str(path)!r} has no {field!r} (text)"
                )
        for field in text:
            if not isinstance(record.get(field), str) or not record[field].strip():
                raise ValueError(
                    f"{option}: line {number} of {str(path)!r}: {field!r} must be non-empty text"
                )
        records.append(record)
    if not records:
        raise ValueError(f"{option}: {str(path)!r} holds no records")
    return records
