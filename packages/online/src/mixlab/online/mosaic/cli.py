"""``mixlab-online mosaic``: generate drifting-subspace streams and complete your own partially
observed streams with MoSAIC.

    mixlab-online mosaic generate --observed-fraction 0.3 --seed 0 --out stream.npz
    mixlab-online mosaic complete stream.npz --pretrain 2000 --n-experts 4 --rank 5 --out completed.npy
    mixlab-online mosaic complete ratings.csv --pretrain 500 --save-model model --truth full.npy
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="MoSAIC: online matrix completion on a drifting union of subspaces.", no_args_is_help=True
)


def _parse_epochs(text: str) -> tuple:
    from mixlab.online.mosaic.stream import Epoch

    epochs = []
    for part in text.split(","):
        kind, _, length = part.partition(":")
        if not length.isdigit():
            raise ValueError(
                f"--epochs must look like stationary:2000,drift:3000,switch:2000, got {text!r}"
            )
        epochs.append((kind.strip(), int(length)))
    return tuple(Epoch(kind, length) for kind, length in epochs)


@app.command()
def generate(
    out: Annotated[
        Path,
        typer.Option(
            help="output .npz: X (NaN = missing), X_full, labels, n_source (source rows first)"
        ),
    ],
    n_features: int = 100,
    n_subspaces: int = 4,
    rank: int = 5,
    observed_fraction: float = 0.3,
    noise: float = 1e-3,
    n_source: int = 2000,
    epochs: Annotated[
        str, typer.Option(help="kind:length,... with kinds stationary, drift, switch")
    ] = ("stationary:2000,drift:3000,switch:2000"),
    drift_rate: Annotated[float, typer.Option(help="radians per sample in drift epochs")] = 1e-3,
    seed: int = 0,
) -> None:
    """Write a synthetic stream on a union of drifting subspaces."""
    import dataclasses

    import numpy as np

    from mixlab.online.mosaic.stream import DriftingSubspaceStream

    parsed = tuple(dataclasses.replace(e, drift_rate=drift_rate) for e in _parse_epochs(epochs))
    stream = DriftingSubspaceStream(
        n_features=n_features,
        n_subspaces=n_subspaces,
        rank=rank,
        observed_fraction=observed_fraction,
        noise=noise,
        n_source=n_source,
        epochs=parsed,
    ).generate(seed)
    if out.suffix != ".npz":
        raise ValueError(f"--out must end in .npz, got {str(out)!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out,
        X=np.vstack([stream.source_X_observed, stream.X]),
        X_full=np.vstack([stream.source_X, stream.X_full]),
        labels=np.concatenate([stream.source_labels, stream.labels]),
        n_source=n_source,
    )
    typer.echo(
        f"wrote {out}: {n_source} source + {len(stream.labels)} stream samples of {n_features} features"
    )


def _read_matrix(path: Path, key: str = "X"):
    import numpy as np

    if not path.exists():
        raise ValueError(f"data file {str(path)!r} does not exist")
    try:
        if path.suffix == ".npy":
            return np.asarray(np.load(path, allow_pickle=False), dtype=float)
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                if key not in archive:
                    raise ValueError(f"{path} has no array {key!r}; it has {sorted(archive.files)}")
                return np.asarray(archive[key], dtype=float)
        if path.suffix == ".csv":
            return np.genfromtxt(path, delimiter=",", filling_values=np.nan)
    except (OSError, zipfile.BadZipFile, TypeError) as error:
        raise ValueError(f"cannot read {str(path)!r} as a numeric matrix: {error}") from None
    raise ValueError(
        f"data file must be .npy, .npz (array 'X') or .csv (empty cells = missing), got {str(path)!r}"
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
    step_size: float = 0.5,
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
    import numpy as np

    from mixlab.online.mosaic.estimators import MoSAIC, check_stream

    X = _read_matrix(data)
    if X.ndim != 2:
        raise ValueError(f"data must be a 2-D matrix (samples as rows), got shape {X.shape}")
    if not 0 <= pretrain < len(X):
        raise ValueError(f"--pretrain must be in [0, {len(X)}) rows, got {pretrain}")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    if load_model is not None:
        if pretrain:
            raise ValueError(
                "--pretrain cannot be combined with --load-model: the loaded model is already trained"
            )
        if not load_model.with_suffix(".json").exists():
            raise ValueError(
                f"--load-model {str(load_model)!r}: no saved model there (expected {load_model.with_suffix('.json')})"
            )
        model = MoSAIC.load(load_model)
    else:
        model = MoSAIC(n_experts, rank, step_size=step_size, random_state=seed)
    completed = np.array(X, dtype=float)
    if pretrain:  # the source rows are completed by the model fitted on them
        completed[:pretrain] = model.fit(X[:pretrain]).transform(X[:pretrain])
    _, observed = check_stream(X[pretrain:])
    for start in range(pretrain, len(X), batch_size):
        batch = X[start : start + batch_size]
        if hasattr(model, "n_features_in_"):
            completed[start : start + batch_size] = model.transform(batch)
        else:
            completed[start : start + batch_size] = np.nan_to_num(batch)
        model.partial_fit(batch)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, completed)
    typer.echo(f"wrote {out}: {len(X)} rows, {int((~observed).sum())} stream entries completed")
    if save_model is not None:
        typer.echo(f"saved model to {model.save(save_model)}")
    if truth is not None:
        full = _read_matrix(truth, key="X_full")
        if full.shape != X.shape:
            raise ValueError(f"--truth must have the shape of the data {X.shape}, got {full.shape}")
        missing = np.isnan(X[pretrain:])
        error = np.linalg.norm((completed[pretrain:] - full[pretrain:])[missing]) / np.linalg.norm(
            full[pretrain:][missing]
        )
        typer.echo(f"NRMSE on the unobserved stream entries: {error:.4g}")
