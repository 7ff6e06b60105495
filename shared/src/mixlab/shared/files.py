"""Files that are either complete or absent, and saved state that proves it is intact.

- :func:`write_text_atomic` / :func:`write_json_atomic` / :func:`write_csv_atomic`: write to a temporary name in the same folder,
  then ``os.replace`` it, so a killed run never leaves half a ``result.json`` behind.
- :func:`write_sidecar` / :func:`read_sidecar`: the JSON file beside a tensors file (a checkpoint, a
  quantized model, a LoRA) records the SHA-256 of every file it covers and of its own content; reading
  it checks both, so a truncated, foreign or hand-edited checkpoint is refused instead of loaded.
- :class:`CheckpointError` (a ``ValueError``): one line naming the damaged file. Every mixlab CLI
  prints it and exits with 2. :func:`checkpoint_errors` turns what loaders raise on damaged input
  (safetensors' ``SafetensorError``, ``KeyError``, ``TypeError``, bad JSON or UTF-8) into one.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

SIDECAR_KEY = "integrity"
"""the key of a sidecar that holds the SHA-256 of the files it covers and of its own content"""


class CheckpointError(ValueError):
    """A saved checkpoint, model folder or estimator is damaged, truncated, foreign or edited."""


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``: readers see the old
    file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual mode
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Write a folder whole or not at all: yields a fresh sibling folder to write into, which
    replaces ``path`` (an earlier one is moved aside, then removed) when the block finishes. A
    run killed while saving leaves the earlier folder or none, never half a model (issue 80)."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        yield partial
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    earlier = path.with_name(f".{path.name}.earlier-{os.getpid()}")
    if path.exists():
        os.replace(path, earlier)
    os.replace(partial, path)
    shutil.rmtree(earlier, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_csv_atomic(
    path: str | os.PathLike[str], header: Sequence[str], rows: Iterable[Sequence[Any]]
) -> Path:
    """:func:`write_text_atomic` of a CSV table: ``header``, then one line per row."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return write_text_atomic(path, buffer.getvalue())


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2) -> Path:
    """:func:`write_text_atomic` of ``data`` as JSON (NaN and infinity refused: JSON has neither)."""
    return write_text_atomic(path, json.dumps(data, indent=indent, allow_nan=False) + "\n")


def sha256_of_file(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sha256_of_data(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def write_sidecar(
    path: str | os.PathLike[str],
    data: Mapping[str, Any],
    *,
    covers: Iterable[str | os.PathLike[str]] = (),
) -> Path:
    """Write ``data`` (a JSON object) to ``path`` with an ``integrity`` entry: the SHA-256 of each
    file in ``covers`` (stored by name, so they must sit beside ``path``) and of ``data`` itself.

    Write the covered files first and the sidecar last: a sidecar then only exists for complete files.
    """
    path = Path(path)
    if SIDECAR_KEY in data:
        raise ValueError(f"sidecar data must not have a key {SIDECAR_KEY!r}: it is written here")
    files = {}
    for covered in covers:
        covered = Path(covered)
        if covered.parent.resolve() != path.parent.resolve():
            raise ValueError(f"covers must name files beside {path}, got {covered}")
        files[covered.name] = sha256_of_file(covered)
    integrity = {"files": files, "content_sha256": _sha256_of_data(dict(data))}
    return write_json_atomic(path, {**data, SIDECAR_KEY: integrity})


def read_sidecar(
    path: str | os.PathLike[str],
    *,
    expect: Mapping[str, type | tuple[type, ...]] | None = None,
    covering: Iterable[str | os.PathLike[str]] = (),
) -> dict[str, Any]:
    """Read a sidecar written by :func:`write_sidecar` and check it and the files it covers.

    ``expect`` maps required keys to their JSON types (``{"bits": int, "names": list}``);
    ``covering`` names files the sidecar must cover (so a sidecar copied beside another file, which
    checks the file it was written for, is refused). Raises
    :class:`CheckpointError` naming the file when it is missing a key, of the wrong type, edited,
    foreign (no integrity entry), or when a covered file is missing or changed.
    """
    path = Path(path)
    with checkpoint_errors(path):
        data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get(SIDECAR_KEY), dict):
        raise CheckpointError(
            f"{path}: not a mixlab checkpoint file (no {SIDECAR_KEY!r} entry: written by another "
            "program or an older mixlab; if it is a cache entry, delete it to recompute)"
        )
    integrity = data.pop(SIDECAR_KEY)
    if integrity.get("content_sha256") != _sha256_of_data(data):
        raise CheckpointError(f"{path}: its content was changed after it was saved")
    files = integrity.get("files")
    if not isinstance(files, dict):
        raise CheckpointError(f"{path}: damaged {SIDECAR_KEY!r} entry")
    for covered in covering:
        if Path(covered).name not in files:
            raise CheckpointError(
                f"{path}: does not cover {Path(covered).name} (a sidecar of another file)"
            )
    for name, digest in files.items():
        covered = path.parent / name
        if not covered.is_file():
            raise CheckpointError(f"{covered}: missing (listed in {path.name})")
        if sha256_of_file(covered) != digest:
            raise CheckpointError(
                f"{covered}: damaged or replaced (its SHA-256 differs from {path.name})"
            )
    for key, kind in (expect or {}).items():
        if key not in data:
            raise CheckpointError(f"{path}: missing key {key!r}")
        if not isinstance(data[key], kind) or (kind is int and isinstance(data[key], bool)):
            raise CheckpointError(f"{path}: key {key!r} has the wrong type ({data[key]!r})")
    return data


@contextlib.contextmanager
def checkpoint_errors(path: str | os.PathLike[str], what: str = "") -> Iterator[None]:
    """Inside the block, errors that loaders raise on damaged input become :class:`CheckpointError`
    ("<path>: damaged or not a <what> (<error>)"). Missing files keep their ``FileNotFoundError``."""
    try:
        yield
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise
    except (KeyError, TypeError, IndexError, AttributeError, EOFError, UnicodeDecodeError) as error:
        raise CheckpointError(_damaged(path, what, error)) from error
    except ValueError as error:  # json.JSONDecodeError, torch/NumPy shape mismatches
        raise CheckpointError(_damaged(path, what, error)) from error
    except Exception as error:
        # safetensors raises its own SafetensorError (not a ValueError) on truncated files, and
        # torch.load a RuntimeError naming its zip reader on a cut file (issue 80)
        if (
            type(error).__name__ in ("SafetensorError", "HeaderTooLarge", "HeaderTooSmall")
            or isinstance(error, pickle.UnpicklingError)  # torch.load of bytes that are no file
            or (isinstance(error, RuntimeError) and "PytorchStreamReader" in str(error))
        ):
            raise CheckpointError(_damaged(path, what, error)) from error
        raise


def _damaged(path: str | os.PathLike[str], what: str, error: BaseException) -> str:
    detail = " ".join(str(error).split()) or type(error).__name__
    return f"{path}: damaged or not a {what or 'mixlab checkpoint'} ({type(error).__name__}: {detail[:200]})"


__all__ = [
    "CheckpointError",
    "atomic_folder",
    "checkpoint_errors",
    "read_sidecar",
    "sha256_of_file",
    "write_json_atomic",
    "write_sidecar",
    "write_text_atomic",
]
