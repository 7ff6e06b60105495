"""``mixlab-online mosaic``: generate drifting-subspace streams and complete your own partially
observed streams with MoSAIC.

    mixlab-online mosaic generate --observed-fraction 0.3 --seed 0 --out stream.npz
    mixlab-online mosaic complete stream.npz --pretrain 2000 --n-experts 4 --rank 5 --out completed.npy
    mixlab-online mosaic complete ratings.csv --pretrain 500 --save-model model --truth full.npy

Every option and path is checked before any work (bad input: one line on stderr, exit code 2).
``generate`` writes ``stream.npz`` and its sidecar ``stream.npz.json`` (format, shape and the
SHA-256 of the ``.npz``); ``complete`` checks the sidecar when there is one, so a damaged or edited
stream file is refused. A ``.npz`` you write yourself (an array ``X``, NaN where missing) needs no
sidecar; if it cannot be read it is refused in one line all the same. A ``.csv`` holds numbers
only: a header row is refused. ``complete`` warns in one stderr line (and still succeeds) when its
completion looks worse than predicting zeros, judged on observed entries it hides from itself.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mixlab.shared.checks import (
    check_count,
    check_input_file,
    check_number,
    check_output_file,
    check_seed,
)

if TYPE_CHECKING:
    import numpy as np

app = typer.Typer(
    help="MoSAIC: online matrix completion on a drifting union of subspaces.", no_args_is_help=True
)

STREAM_FORMAT = "mixlab.mosaic.stream/1"
"""the ``format`` of the sidecar that ``generate`` writes beside its ``.npz``"""
DATA_SUFFIXES = (".npy", ".npz", ".csv")


# --- checks of options and paths (no NumPy: they run before any work) -------------------------


def _data_file(path: Path, option: str) -> None:
    """``path`` is a readable data file of a known kind."""
    check_input_file(path, option)
    if path.suffix not in DATA_SUFFIXES:
        raise ValueError(
            f"{option} must be .npy, .npz (array 'X', or 'X_full' for --truth) or .csv "
            f"(empty cells = missing), got {str(path)!r}"
        )


def sidecar_of(path: Path) -> Path:
    """The sidecar of a stream file: ``stream.npz`` -> ``stream.npz.json``."""
    return path.with_name(path.name + ".json")


# --- stream files --------------------------------------------------------------------------------


def save_stream(path: Path, arrays: dict[str, Any], n_source: int) -> Path:
    """Write ``arrays`` to ``path`` (.npz, atomically), then its sidecar ``path.json`` covering it."""
    import numpy as np

    from mixlab.shared.files import write_sidecar

    path.parent.mkdir(parents=True, exist_ok=True)
    sidecar_of(path).unlink(missing_ok=True)  # a stale sidecar must never vouch for the new file
    partial = path.with_name(f".{path.name}.partial")
    try:
        with open(partial, "wb") as handle:
            np.savez_compressed(handle, **arrays)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    n_samples, n_features = arrays["X"].shape
    write_sidecar(
        sidecar_of(path),
        {
            "format": STREAM_FORMAT,
            "n_samples": int(n_samples),
            "n_features": int(n_features),
            "n_source": int(n_source),
            "arrays": sorted(arrays),
        },
        covers=[path],
    )
    return path


def read_matrix(path: Path, key: str = "X") -> np.ndarray:
    """A 2-D float matrix from ``.npy``, ``.npz`` (array ``key``) or ``.csv`` (empty cells: NaN).

    A ``.npz`` with a sidecar (as ``generate`` writes) is checked against it first. Anything
    damaged, truncated, foreign or edited raises a one-line :class:`CheckpointError` naming the file.
    """
    import numpy as np

    from mixlab.shared.files import CheckpointError, checkpoint_errors, read_sidecar

    expected_shape = None
    if path.suffix == ".npz" and sidecar_of(path).exists():
        sidecar = read_sidecar(
            sidecar_of(path),
            expect={"format": str, "n_samples": int, "n_features": int, "n_source": int},
            covering=[path],  # a sidecar copied beside another file vouches for nothing
        )
        if sidecar["format"] != STREAM_FORMAT:
            raise CheckpointError(
                f"{sidecar_of(path)}: not a mixlab stream (format {sidecar['format']!r})"
            )
        expected_shape = (sidecar["n_samples"], sidecar["n_features"])
    try:
        with checkpoint_errors(path, "numeric matrix"):
            if path.suffix == ".npy":
                matrix = np.load(path, allow_pickle=False)
            elif path.suffix == ".npz":
                with np.load(path, allow_pickle=False) as archive:
                    if key not in archive.files:
                        raise CheckpointError(
                            f"{path}: not a mixlab stream (no array {key!r}; it has {sorted(archive.files)})"
                        )
                    matrix = archive[key]
            else:
                header = _csv_header(path)
                if header is not None:  # genfromtxt would read it as a row of missing entries
                    raise CheckpointError(
                        f"{path}: the first row {header[:80]!r} is a header, and a header is not "
                        "allowed: remove it (numbers only, one sample per row, empty cells = missing)"
                    )
                # utf-8-sig: a spreadsheet's byte-order mark would otherwise turn the first cell to NaN
                matrix = np.genfromtxt(
                    path, delimiter=",", filling_values=np.nan, encoding="utf-8-sig"
                )
            matrix = np.asarray(matrix, dtype=np.float64)
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        detail = " ".join(str(error).split()) or type(error).__name__
        raise CheckpointError(
            f"{path}: damaged or not a numeric matrix ({type(error).__name__}: {detail[:200]})"
        ) from None
    if matrix.ndim != 2:
        raise ValueError(
            f"{path}: {key} must be a 2-D matrix (samples as rows), got shape {matrix.shape}"
        )
    if expected_shape is not None and key == "X" and matrix.shape != expected_shape:
        raise CheckpointError(
            f"{path}: X has shape {matrix.shape} but its sidecar records {expected_shape}"
        )
    return matrix


def _csv_header(path: Path) -> str | None:
    """The first row of a CSV file if it is a header (a cell neither empty nor a number), else None.

    The first row is the one ``np.genfromtxt`` reads first: blank lines and ``#`` comments are skipped.
    """
    with open(path, encoding="utf-8-sig") as handle:  # -sig: a spreadsheet's byte-order mark
        rows = (line.split("#")[0].strip() for line in handle)
        row = next(filter(None, rows), "")
    for cell in filter(None, (cell.strip() for cell in row.split(","))):
        try:
            float(cell)
        except ValueError:
            return row
    return None


# --- commands ------------------------------------------------------------------------------------


def _parse_epochs(text: str, drift_rate: float) -> tuple:
    from mixlab.online.mosaic.stream import Epoch

    epochs = []
    for part in text.split(","):
        kind, _, length = part.partition(":")
        if not length.strip().isdigit() or kind.strip() not in ("stationary", "drift", "switch"):
            raise ValueError(
                f"--epochs must look like stationary:2000,drift:3000,switch:2000, got {text!r}"
            )
        if int(length) < 1:
            raise ValueError(f"--epochs: every epoch needs at least 1 sample, got {text!r}")
        epochs.append(Epoch(kind.strip(), int(length), drift_rate=drift_rate))
    return tuple(epochs)


@app.command()
def generate(
    out: Annotated[
        Path,
        typer.Option(
            help="output .npz: X (NaN = missing), X_full, labels, n_source (source rows first); "
            "a sidecar OUT.json records its SHA-256"
        ),
    ],
    n_features: int = 100,
    n_subspaces: int = 4,
    rank: int = 5,
    observed_fraction: Annotated[
        float, typer.Option(help="probability that an entry is observed, in (0, 1]")
    ] = 0.3,
    noise: float = 1e-3,
    n_source: int = 2000,
    epochs: Annotated[
        str, typer.Option(help="kind:length,... with kinds stationary, drift, switch")
    ] = ("stationary:2000,drift:3000,switch:2000"),
    drift_rate: Annotated[float, typer.Option(help="radians per sample in drift epochs")] = 1e-3,
    seed: int = 0,
) -> None:
    """Write a synthetic stream on a union of drifting subspaces."""
    check_output_file(out, "--out", suffixes=(".npz",))
    check_output_file(sidecar_of(out), "--out (its sidecar)")
    check_count(n_features, "--n-features", 2)
    check_count(n_subspaces, "--n-subspaces")
    check_count(rank, "--rank")
    if rank >= n_features:
        raise ValueError(f"--rank must be smaller than --n-features={n_features}, got {rank}")
    check_number(observed_fraction, "--observed-fraction", 0 < observed_fraction <= 1, "in (0, 1]")
    check_number(noise, "--noise", noise >= 0, "a finite number >= 0")
    check_count(n_source, "--n-source", 0)
    check_number(drift_rate, "--drift-rate", drift_rate >= 0, "a finite number >= 0")
    check_seed(seed)
    parsed = _parse_epochs(epochs, drift_rate)

    import numpy as np

    from mixlab.online.mosaic.stream import DriftingSubspaceStream

    stream = DriftingSubspaceStream(
        n_features=n_features,
        n_subspaces=n_subspaces,
        rank=rank,
        observed_fraction=observed_fraction,
        noise=noise,
        n_source=n_source,
        epochs=parsed,
    ).generate(seed)
    save_stream(
        out,
        {
            "X": np.vstack([stream.source_X_observed, stream.X]),
            "X_full": np.vstack([stream.source_X, stream.X_full]),
            "labels": np.concatenate([stream.source_labels, stream.labels]),
            "n_source": np.asarray(n_source),
        },
        n_source,
    )
    typer.echo(
        f"wrote {out} (+ {sidecar_of(out).name}): {n_source} source + {len(stream.labels)} "
        f"stream samples of {n_features} features"
    )


@app.command()
def complete(
    data: Annotated[
        Path, typer.Argument(help="samples as rows, NaN (or empty CSV cells) where missing")
    ],
    out: Annotated[Path, typer.Option(help="completed matrix (.npy)")] = Path("completed.npy"),
    pretrain: Annotated[
        int, typer.Option(help="first rows used as the source batch (0: start from random experts)")
    ] = 0,
    n_experts: int = 4,
    rank: int = 5,
    step_size: Annotated[
        float, typer.Option(help="GROUSE step as a fraction of the greedy step, in (0, 1]")
    ] = 0.5,
    batch_size: Annotated[
        int, typer.Option(help="rows completed, then learned from, at a time")
    ] = 20,
    seed: int = 0,
    load_model: Annotated[
        Path | None,
        typer.Option(
            help="continue from a model saved with --save-model (its experts, rank and steps)"
        ),
    ] = None,
    save_model: Annotated[
        Path | None, typer.Option(help="save the adapted model here (.safetensors + .json)")
    ] = None,
    truth: Annotated[
        Path | None,
        typer.Option(help="full matrix (.npy/.npz X_full/.csv) to score the completion"),
    ] = None,
) -> None:
    """Complete a stream prequentially: each batch is completed with the current experts, then learned."""
    # 1. options and paths, before reading anything
    _data_file(data, "data")
    check_output_file(out, "--out", suffixes=(".npy",))
    check_count(pretrain, "--pretrain", 0)
    check_count(n_experts, "--n-experts")
    check_count(rank, "--rank")
    check_number(step_size, "--step-size", 0 < step_size <= 1, "in (0, 1]")
    check_count(batch_size, "--batch-size")
    check_seed(seed)
    if truth is not None:
        _data_file(truth, "--truth")
    if load_model is not None:
        if pretrain:
            raise ValueError(
                "--pretrain cannot be combined with --load-model: the loaded model is already trained"
            )
        for suffix in (".json", ".safetensors"):
            if not load_model.with_suffix(suffix).is_file():
                raise ValueError(
                    f"--load-model {str(load_model)!r}: no saved model there "
                    f"(expected {load_model.with_suffix(suffix)})"
                )
    if save_model is not None:
        for suffix in (".json", ".safetensors"):
            check_output_file(save_model.with_suffix(suffix), "--save-model")

    # 2. inputs, each checked, before any computing (files first: NumPy only, no scikit-learn/torch)
    import numpy as np

    from mixlab.shared.files import read_sidecar

    if load_model is not None:  # integrity of the saved model before anything loads it
        read_sidecar(load_model.with_suffix(".json"), expect={"format": str})
    X = read_matrix(data)
    if not 0 <= pretrain < len(X):
        raise ValueError(f"--pretrain must be in [0, {len(X)}) rows, got {pretrain}")
    full = None
    if truth is not None:
        full = read_matrix(truth, key="X_full")
        if full.shape != X.shape:
            raise ValueError(f"--truth must have the shape of the data {X.shape}, got {full.shape}")
    if load_model is None and rank >= X.shape[1]:
        raise ValueError(
            f"--rank must be smaller than the data's {X.shape[1]} features, got {rank}"
        )

    from mixlab.online.mosaic.estimators import MoSAIC, check_stream

    check_stream(X)  # every row observes something, no inf in observed entries
    if load_model is not None:
        model = MoSAIC.load(load_model)
        if model.n_features_in_ != X.shape[1]:
            raise ValueError(
                f"--load-model: the model was fitted on {model.n_features_in_} features, "
                f"the data has {X.shape[1]}"
            )
    else:
        model = MoSAIC(n_experts, rank, step_size=step_size, random_state=seed)

    # 3. the work
    completed = np.array(X, dtype=float)
    if pretrain:  # the source rows are completed by the model fitted on them
        completed[:pretrain] = model.fit(X[:pretrain]).transform(X[:pretrain])
    observed = ~np.isnan(X[pretrain:])
    # -score of each batch by the model that completed it, before it learns the batch: the model
    # at the end has drifted away from early batches, and has already learned every entry
    held_out = []
    for start in range(pretrain, len(X), batch_size):
        batch = X[start : start + batch_size]
        if hasattr(model, "n_features_in_"):
            completed[start : start + batch_size] = model.transform(batch)
            held_out.append(_held_out_nrmse(model, batch))
        else:
            completed[start : start + batch_size] = np.nan_to_num(batch)
        model.partial_fit(batch)
    _save_npy(out, completed)
    typer.echo(f"wrote {out}: {len(X)} rows, {int((~observed).sum())} stream entries completed")
    # the median over batches: a single batch's few held-out entries can be far off either way
    held_out = [error for error in held_out if not np.isnan(error)]
    held_out_error = np.median(held_out) if held_out else np.nan
    if held_out_error > 1:  # filling the missing entries with zeros has NRMSE exactly 1
        typer.echo(
            "mixlab-online: warning: the completion looks worse than filling the missing entries "
            f"with zeros (NRMSE {held_out_error:.3g} > 1 on observed entries hidden from the model, "
            "median over batches): too little data for these subspaces; try more --pretrain rows, "
            "a lower --rank or fewer --n-experts, or data with more observed entries",
            err=True,
        )
    if save_model is not None:
        typer.echo(f"saved model to {model.save(save_model)}")
    if full is not None:
        missing = np.isnan(X[pretrain:])
        error = np.linalg.norm((completed[pretrain:] - full[pretrain:])[missing]) / np.linalg.norm(
            full[pretrain:][missing]
        )
        typer.echo(f"NRMSE on the unobserved stream entries: {error:.4g}")


def _held_out_nrmse(model: Any, batch: np.ndarray) -> float:
    """``-model.score(batch)``: the NRMSE of completing a seeded share of the batch's observed entries
    from the rest (zeros score exactly 1); NaN when it can hide none (e.g. a single sample that
    observes a single entry)."""
    try:
        return -model.score(batch)
    except ValueError:  # the batch passed transform's checks: only "nothing to hide" is left
        return float("nan")


def _save_npy(path: Path, array: np.ndarray) -> None:
    """``np.save`` through a temporary file and ``os.replace``: the file is complete or absent."""
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    try:
        with open(partial, "wb") as handle:
            np.save(handle, array)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
