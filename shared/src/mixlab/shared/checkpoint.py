"""Checkpoints as safetensors + JSON (never pickle), and resuming from the last one in an out folder.

A checkpoint is any nested state: dicts (keys of any JSON scalar type, as in an optimizer's state),
lists, tuples, torch tensors, NumPy arrays and JSON scalars. Tensors and arrays go to
``step_<8-digit step>.safetensors``; the structure around them goes to ``step_<8-digit step>.json``, written last,
so a checkpoint counts only once both files are complete. A killed run therefore loses at most the
steps since its last save. A state of NumPy arrays and JSON values is written and read with
``safetensors.numpy`` and never imports torch (a NumPy-only domain installs without it); loading
gives back each array of the kind it was saved as::

    checkpoints = Checkpointer(out_dir, resume=resume)
    start = 0
    if (last := checkpoints.load_latest()) is not None:
        start, state = last
        model.load_state_dict(state["model"]); optimizer.load_state_dict(state["optimizer"])
        restore_rng_state(state["rng"])
    for step in range(start, total_steps):
        ...
        if (step + 1) % save_every == 0:
            checkpoints.save(step + 1, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                        "rng": capture_rng_state()})
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mixlab.shared.files import CheckpointError, checkpoint_errors, read_sidecar, write_sidecar

if TYPE_CHECKING:
    import torch

    from mixlab.shared.config import ExperimentConfig

_STEP_FILE = re.compile(r"^step_(\d{8})\.json$")

_NUMPY_DTYPES = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
    | {"float16", "float32", "float64", "complex64"}
)
"""the NumPy dtypes a safetensors file holds"""


def _torch_tensor_type() -> type | None:
    """``torch.Tensor`` when torch is imported, else None: a state can hold a tensor only once torch
    is imported, so checking for one never imports torch (NumPy-only methods run without it)."""
    torch_module = sys.modules.get("torch")
    return getattr(torch_module, "Tensor", None)


def flatten_state(state: Any) -> tuple[dict[str, Any], Any]:
    """Split nested ``state`` into named arrays and a JSON-ready skeleton that refers to them.

    Each array keeps its kind: torch tensors (moved to the CPU) under ``{"__tensor__": name}``,
    NumPy arrays under ``{"__ndarray__": name}``.
    """
    tensor_type = _torch_tensor_type()
    arrays: dict[str, Any] = {}

    def name_for(path: str) -> str:
        key = base = path or "tensor"
        suffix = 1
        while key in arrays:  # {1: a, "1": b} or {"a.b": x, "a": {"b": y}} give the same path
            key, suffix = f"{base}#{suffix}", suffix + 1
        return key

    def walk(value: Any, path: str) -> Any:
        if tensor_type is not None and isinstance(value, tensor_type):
            key = name_for(path)
            arrays[key] = value.detach().to("cpu").contiguous()
            return {"__tensor__": key}
        if isinstance(value, np.ndarray):
            if value.dtype.name not in _NUMPY_DTYPES:
                raise TypeError(
                    f"cannot checkpoint a NumPy array of dtype {value.dtype} at {path or 'the top'!r} "
                    f"(safetensors holds {', '.join(sorted(_NUMPY_DTYPES))})"
                )
            key = name_for(path)
            arrays[key] = np.ascontiguousarray(value)
            return {"__ndarray__": key}
        if isinstance(value, np.generic):
            return walk(value.item(), path)
        if isinstance(value, float) and not math.isfinite(value):
            return {"__float__": repr(value)}
        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, tuple | list):
            items = [walk(item, f"{path}.{i}" if path else str(i)) for i, item in enumerate(value)]
            return {"__tuple__": items} if isinstance(value, tuple) else items
        if isinstance(value, Mapping):
            if all(isinstance(key, str) and not key.startswith("__") for key in value):
                return {
                    key: walk(item, f"{path}.{key}" if path else key) for key, item in value.items()
                }
            return {
                "__items__": [
                    [key, walk(item, f"{path}.{key}" if path else str(key))]
                    for key, item in value.items()
                ]
            }
        raise TypeError(
            f"cannot checkpoint a value of type {type(value).__name__} at {path or 'the top'!r}"
        )

    return arrays, walk(state, "")


def unflatten_state(arrays: Mapping[str, Any], skeleton: Any) -> Any:
    """Inverse of :func:`flatten_state`: ``arrays`` maps each name to the tensor or array stored."""
    if isinstance(skeleton, list):
        return [unflatten_state(arrays, item) for item in skeleton]
    if not isinstance(skeleton, dict):
        return skeleton
    if "__tensor__" in skeleton:
        return arrays[skeleton["__tensor__"]]
    if "__ndarray__" in skeleton:
        return arrays[skeleton["__ndarray__"]]
    if "__float__" in skeleton:
        return float(skeleton["__float__"])
    if "__tuple__" in skeleton:
        return tuple(unflatten_state(arrays, item) for item in skeleton["__tuple__"])
    if "__items__" in skeleton:
        return {key: unflatten_state(arrays, item) for key, item in skeleton["__items__"]}
    return {key: unflatten_state(arrays, item) for key, item in skeleton.items()}


def _stored_names(skeleton: Any) -> tuple[list[str], list[str]]:
    """The names of the torch tensors and of the NumPy arrays that ``skeleton`` refers to."""
    tensors: list[str] = []
    ndarrays: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item)
        elif isinstance(node, dict):
            if "__tensor__" in node:
                tensors.append(node["__tensor__"])
            elif "__ndarray__" in node:
                ndarrays.append(node["__ndarray__"])
            elif "__tuple__" in node:
                visit(node["__tuple__"])
            elif "__items__" in node:
                for pair in node["__items__"]:
                    visit(pair[1])
            elif "__float__" not in node:
                for item in node.values():
                    visit(item)

    visit(skeleton)
    return tensors, ndarrays


def _write_arrays(arrays: dict[str, Any], file: Path) -> None:
    """One safetensors file of ``arrays``: with ``safetensors.numpy`` when all are NumPy arrays
    (no torch needed), else with ``safetensors.torch`` (the arrays as tensors sharing their memory).
    The file format is the same either way, so either reader opens either file."""
    if all(isinstance(array, np.ndarray) for array in arrays.values()):
        from safetensors.numpy import save_file as save_numpy

        save_numpy(arrays, str(file))
        return
    import torch
    from safetensors.torch import save_file as save_torch

    tensors: dict[str, torch.Tensor] = {}
    seen_storage: set[int] = set()
    for key, array in arrays.items():
        tensor = torch.from_numpy(array) if isinstance(array, np.ndarray) else array
        # safetensors.torch refuses tensors that share memory (tied weights): copy the repeats.
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in seen_storage and tensor.numel() > 0:
            tensor = tensor.clone()
        seen_storage.add(pointer)
        tensors[key] = tensor
    save_torch(tensors, str(file))


def _read_arrays(
    file: Path, tensors: list[str], ndarrays: list[str], map_location: str | torch.device
) -> dict[str, Any]:
    """The named arrays of a safetensors file, each of the kind it was saved as: NumPy arrays
    (on the CPU) through ``safetensors.numpy``, torch tensors on ``map_location``."""
    from safetensors import safe_open

    read: dict[str, Any] = {}
    if ndarrays:
        with safe_open(str(file), framework="numpy") as handle:
            for name in ndarrays:
                read[name] = handle.get_tensor(name)
    if tensors:
        try:
            import torch  # noqa: F401  (safetensors' "pt" framework needs it)
        except ImportError as error:
            raise ModuleNotFoundError(
                f"{file}: holds torch tensors, and torch is not installed here: install torch "
                "(the mixlab domain that wrote it depends on it) to load it",
                name="torch",
            ) from error
        with safe_open(str(file), framework="pt", device=str(map_location)) as handle:
            for name in tensors:
                read[name] = handle.get_tensor(name)
    return read


STATE_FORMAT = "mixlab.state/1"


def save_state(state: Any, path: str | os.PathLike[str]) -> None:
    """Write ``state`` to ``path.safetensors`` and ``path.json`` (JSON last, each written atomically).

    NumPy arrays and JSON values need no torch (``safetensors.numpy``); torch tensors are written
    with ``safetensors.torch``. The JSON sidecar records the SHA-256 of the tensors file and of its
    own content (:func:`mixlab.shared.files.write_sidecar`), which :func:`load_state` checks.
    """
    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    arrays, skeleton = flatten_state(state)
    tensor_file, json_file = base.with_suffix(".safetensors"), base.with_suffix(".json")
    partial = tensor_file.with_name(tensor_file.name + ".partial")
    _write_arrays(arrays, partial)
    os.replace(partial, tensor_file)
    write_sidecar(json_file, {"format": STATE_FORMAT, "state": skeleton}, covers=[tensor_file])


def load_state(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> Any:
    """Read a state written by :func:`save_state` (``path`` with or without a suffix).

    Arrays come back of the kind they were saved as: NumPy arrays (always on the CPU, and without
    importing torch) and torch tensors (on ``map_location``; loading those needs torch).
    A damaged, truncated, foreign or edited pair of files raises :class:`CheckpointError` naming
    the file.
    """
    base = Path(path)
    json_file, tensor_file = base.with_suffix(".json"), base.with_suffix(".safetensors")
    sidecar = read_sidecar(json_file, expect={"format": str}, covering=[tensor_file])
    if sidecar["format"] != STATE_FORMAT or "state" not in sidecar:
        raise CheckpointError(f"{json_file}: not a mixlab state (format {sidecar['format']!r})")
    with checkpoint_errors(json_file):
        tensors, ndarrays = _stored_names(sidecar["state"])
    with checkpoint_errors(tensor_file):
        arrays = _read_arrays(tensor_file, tensors, ndarrays, map_location)
    with checkpoint_errors(json_file):
        return unflatten_state(arrays, sidecar["state"])


class Checkpointer:
    """Numbered checkpoints in ``out_dir/checkpoints``, keeping the last ``keep_last``.

    With ``resume=False`` a run starts over: checkpoints an earlier run left in the folder are
    removed, so that a later ``--resume`` can never pick up a stale one.
    """

    def __init__(
        self, out_dir: str | os.PathLike[str], *, resume: bool = False, keep_last: int = 2
    ) -> None:
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be an integer >= 1, got {keep_last!r}")
        self.directory = Path(out_dir) / "checkpoints"
        self.resume = resume
        self.keep_last = keep_last
        if not resume and self.directory.exists():
            shutil.rmtree(self.directory)

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints in the folder, oldest first."""
        if not self.directory.is_dir():
            return []
        found = []
        for entry in self.directory.iterdir():
            match = _STEP_FILE.match(entry.name)
            if match and entry.with_suffix(".safetensors").exists():
                found.append(int(match.group(1)))
        return sorted(found)

    def path(self, step: int) -> Path:
        return self.directory / f"step_{step:08d}"

    def save(self, step: int, state: Any) -> Path:
        """Save ``state`` as the checkpoint of ``step`` and drop all but the last ``keep_last``."""
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 10**8:
            raise ValueError(f"step must be an integer in [0, 1e8), got {step!r}")
        path = self.path(step)
        save_state(state, path)
        for old in self.steps()[: -self.keep_last]:
            self.path(old).with_suffix(".json").unlink(missing_ok=True)
            self.path(old).with_suffix(".safetensors").unlink(missing_ok=True)
        return path

    def save_run(self, step: int, config: ExperimentConfig, **state: Any) -> Path:
        """Save an experiment's progress with the config it was made under (see :meth:`load_run`)."""
        return self.save(step, {"config": _recorded(config), **state})

    def load_run(self, config: ExperimentConfig) -> dict[str, Any] | None:
        """The newest state :meth:`save_run` wrote when resuming, else None.

        A checkpoint made under another config (the execution settings aside,
        :data:`EXECUTION_SETTINGS`: a run may move to another device or worker count) is refused
        with a ValueError naming the fields that differ, so a resumed run never mixes two configs.
        """
        last = self.load_latest()
        if last is None:
            return None
        state = last[1]
        saved = state.get("config") if isinstance(state, dict) else None
        where = self.directory.parent
        if not isinstance(saved, dict):
            raise ValueError(f"--resume: {where} holds checkpoints of another experiment")
        recorded = _recorded(config)
        if saved != recorded:
            changed = sorted(
                k for k in recorded.keys() | saved.keys() if saved.get(k) != recorded.get(k)
            )
            raise ValueError(
                f"--resume: the checkpoint in {where} was written with other values of {changed} "
                "(another config)"
            )
        return state

    def load_latest(self, map_location: str | torch.device = "cpu") -> tuple[int, Any] | None:
        """``(step, state)`` of the newest complete checkpoint when resuming, else None."""
        if not self.resume:
            return None
        steps = self.steps()
        if not steps:
            return None
        return steps[-1], load_state(self.path(steps[-1]), map_location=map_location)


def checkpoint_spacing(steps: int) -> int:
    """Steps between a training's checkpoints: every 100, or twice in a run shorter than 200."""
    return max(1, min(100, steps // 2))


EXECUTION_SETTINGS = ("device", "workers")
"""config fields that say how a run executes, not what it computes: ``--resume`` accepts them
changed (issue 80: a run started with two workers may resume with one)"""


def _recorded(config: ExperimentConfig) -> dict[str, Any]:
    """The config as a checkpoint stores it: JSON values (tuples as lists), without the
    execution settings."""
    kept = {k: v for k, v in config.to_dict().items() if k not in EXECUTION_SETTINGS}
    return json.loads(json.dumps(kept))


def _run_named(run_cell: Callable[[dict[str, Any]], Any], name: str, cell: dict[str, Any]) -> Any:
    """``run_cell(cell)`` with the loops inside it named after the cell."""
    from mixlab.shared.progress_report import current_cell

    with current_cell(name):
        return run_cell(cell)


def run_cells(
    out_dir: str | os.PathLike[str],
    config: ExperimentConfig,
    planned: list[dict[str, Any]],
    run_cell: Callable[[dict[str, Any]], Any],
    *,
    resume: bool,
    label: str,
    workers: int = 1,
) -> list[Any]:
    """Run an experiment as independent cells (JSON-able dicts): ``run_cell(cell)`` for each
    planned cell not yet done, saving every outcome as it finishes; returns the outcomes in
    ``planned`` order. With ``resume`` the cells a killed run finished are not run again (a
    checkpoint made under another config is refused, see :meth:`Checkpointer.load_run`).

    ``workers`` > 1 runs the pending cells in that many fresh processes (``spawn``), in planned
    order as workers free up; ``run_cell`` must then be picklable (a module-level function or a
    ``functools.partial`` of one), and a script that calls this needs the usual
    ``if __name__ == "__main__":`` guard."""
    from mixlab.shared.progress_report import cell_name, lines_in_workers, progress

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    checkpoints = Checkpointer(out_dir, resume=resume, keep_last=1)
    done: dict[str, Any] = {}
    if (saved := checkpoints.load_run(config)) is not None:
        if "done" not in saved:  # saved by the experiment's own loop before it used run_cells
            raise ValueError(
                f"resume: {out_dir} holds checkpoints of an older layout (not run_cells'); "
                "run again without resume"
            )
        done = saved["done"]
    keys = [json.dumps(cell, sort_keys=True) for cell in planned]
    pending = [(key, cell) for key, cell in zip(keys, planned, strict=True) if key not in done]
    with progress(len(planned), label, completed=len(planned) - len(pending)) as bar:

        def finished(key: str, outcome: Any) -> None:
            done[key] = outcome
            checkpoints.save_run(len(done), config, done=done)
            bar.advance(line=True)

        if workers == 1 or len(pending) < 2:
            for key, cell in pending:
                name = cell_name(cell)
                bar.describe(f"{label} [{name}]")
                number = sum(k in done for k in keys) + 1  # done may hold another call's cells
                bar.note(f"{label}: cell {number}/{len(planned)} starts: {name}")
                finished(key, _run_named(run_cell, name, cell))
        else:
            context = multiprocessing.get_context("spawn")  # no forked torch or thread state
            workers = min(workers, len(pending))
            pool = ProcessPoolExecutor(workers, mp_context=context, initializer=lines_in_workers)
            restore_sigterm = _sigterm_raises()
            try:
                jobs = {
                    pool.submit(_run_named, run_cell, cell_name(cell), cell): key
                    for key, cell in pending
                }
                bar.note(f"{label}: {len(pending)} cells in {workers} worker processes")
                for job in as_completed(jobs):
                    finished(jobs[job], job.result())
            except BaseException:
                _stop_workers(pool)  # Ctrl-C, kill or a failed cell: the finished cells stay saved
                raise
            finally:
                restore_sigterm()
            pool.shutdown()
    return [done[key] for key in keys]


def _sigterm_raises() -> Callable[[], None]:
    """Until the returned function is called, SIGTERM (``kill``, ``timeout``, a cancelled job)
    raises SystemExit(143) in the main thread, so a killed run stops its worker processes
    instead of leaving them running (issue 80); off the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Drop the cells not started and end the running ones now: leaving the ``with`` block of
    a pool waits for every submitted cell, so Ctrl-C did not stop a run (issue 80). A resumed
    run starts the unfinished cells again."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=10)
