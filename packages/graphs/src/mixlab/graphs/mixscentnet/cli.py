"""``mixlab-graphs mixscentnet``: pretrain, train, predict mixture distances, olfactory white.

    mixlab-graphs mixscentnet pretrain --smiles molecules.smi --out runs/pretrained
    mixlab-graphs mixscentnet train --data ../shared/data/olfaction --split random \\
        --init runs/pretrained --out runs/model
    mixlab-graphs mixscentnet predict --model runs/model --mixtures mixtures.csv \\
        --pairs pairs.csv --out predicted.csv
    mixlab-graphs mixscentnet white --model runs/model --pool molecules.smi --out white.csv

A SMILES file holds one SMILES per line (anything after whitespace is a name). Mixtures CSV:
``mixture``, ``smiles`` (``;``-separated), optional ``concentrations``; pairs CSV:
``mixture_1``, ``mixture_2`` (and ``distance`` for training). Every verb checks its inputs
before it computes; a bad value is one line on stderr and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mixlab.shared.checks import (
    check_choice,
    check_count,
    check_input_file,
    check_input_folder,
    check_output_file,
    check_output_folder,
    check_seed,
)
from mixlab.shared.files import write_csv_atomic

app = typer.Typer(
    help="MixScentNet: perceptual distance between odour mixtures from SMILES.",
    no_args_is_help=True,
)
SMILES_SUFFIXES = (".smi", ".txt", ".csv")


def read_smiles_file(path: Path, option: str) -> list[str]:
    """Canonical SMILES of a one-per-line file; an unparsable line is named."""
    check_input_file(path, option, suffixes=SMILES_SUFFIXES)
    from mixlab.graphs.mixscentnet.featurize import canonical_smiles

    smiles = []
    for k, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        fields = line.split()
        if fields and fields[0].lower() != "smiles":
            smiles.append(canonical_smiles(fields[0], f" ({option} line {k})"))
    if not smiles:
        raise ValueError(f"{option}: {str(path)!r} holds no SMILES")
    return smiles


def _load_model(folder: Path, option: str):
    from mixlab.graphs.mixscentnet.estimator import WEIGHTS, MixtureDistanceModel

    check_input_folder(folder, option)
    if not any((folder / name).is_file() for name in (WEIGHTS, "model.pt")):
        raise ValueError(f"{option}: {str(folder)!r} has no {WEIGHTS} (not a saved model)")
    check_input_folder(folder, option, containing=("config.json",))

    return MixtureDistanceModel.load(folder)


@app.command()
def pretrain(
    smiles: Annotated[Path, typer.Option(help="molecules to pretrain on: one SMILES per line")],
    out: Annotated[Path, typer.Option(help="folder for the pretrained model")],
    epochs: Annotated[int, typer.Option(help="pretraining epochs")] = 60,
    cache: Annotated[Path, typer.Option(help="folder for the Mordred descriptor cache")] = Path(
        "~/.cache/mixlab/mixscentnet"
    ),
    workers: Annotated[int, typer.Option(help="processes computing Mordred descriptors")] = 1,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
) -> None:
    """Self-supervised Mordred pretraining of the molecule encoder."""
    check_count(epochs, "--epochs")
    check_count(workers, "--workers")
    check_seed(seed)
    check_output_folder(out, "--out")
    molecules = read_smiles_file(smiles, "--smiles")
    from mixlab.graphs.mixscentnet.estimator import MixtureDistanceModel

    model = MixtureDistanceModel(seed=seed, pretrain_epochs=epochs)
    model.pretrain(molecules, cache_dir=cache.expanduser(), workers=workers)
    model.save(out)
    typer.echo(f"pretrained on {len(set(molecules))} molecules; wrote {out}")


@app.command()
def train(
    data: Annotated[Path, typer.Option(help="the olfaction folder (gs-lf/, mixtures/)")],
    out: Annotated[Path, typer.Option(help="folder for the trained model")],
    split: Annotated[
        str, typer.Option(help="random or molecules (leave-molecules-out)")
    ] = "random",
    fold: Annotated[int, typer.Option(help="which of the 5 folds is held out")] = 0,
    init: Annotated[Path | None, typer.Option(help="a `pretrain` folder to start from")] = None,
    steps: Annotated[
        int, typer.Option(help="step budget; early stopping on 10 % of the pairs usually ends it")
    ] = 1000,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
) -> None:
    """Fit MixScentNet on a split's training pairs and report its test Pearson, RMSE, Kendall."""
    check_input_folder(data, "--data")
    check_choice(split, "--split", ("random", "molecules"))
    check_count(fold, "--fold", minimum=0, maximum=4)
    check_count(steps, "--steps")
    check_seed(seed)
    check_output_folder(out, "--out")
    from mixlab.graphs.mixscentnet.data import load_mixture_pairs, split_pairs
    from mixlab.graphs.mixscentnet.estimator import MixtureDistanceModel
    from mixlab.graphs.mixscentnet.training import distance_metrics
    from mixlab.shared.files import write_json_atomic

    pairs = load_mixture_pairs(data)
    model = _load_model(init, "--init") if init is not None else MixtureDistanceModel(seed=seed)
    model.config.steps, model.seed = steps, seed
    training, test = split_pairs(pairs, split, fold)
    model.fit(pairs.mixtures, pairs.pairs[training], pairs.distance[training])
    scores = distance_metrics(
        model.predict(pairs.mixtures, pairs.pairs[test]), pairs.distance[test]
    )
    model.save(out)
    write_json_atomic(out / "metrics.json", {"split": split, "fold": fold, **scores})
    typer.echo(
        f"{split} fold {fold}: Pearson {scores['pearson']:.3f}, RMSE {scores['rmse']:.3f}, "
        f"Kendall {scores['kendall']:.3f} on {len(test)} test pairs; wrote {out}"
    )


@app.command()
def predict(
    model: Annotated[Path, typer.Option(help="a `train` folder")],
    mixtures: Annotated[Path, typer.Option(help="mixtures CSV: mixture, smiles[, concentrations]")],
    pairs: Annotated[Path, typer.Option(help="pairs CSV: mixture_1, mixture_2")],
    out: Annotated[Path, typer.Option(help="CSV of predicted distances")],
) -> None:
    """Predicted perceptual distance of each pair."""
    network = _load_model(model, "--model")  # first: a bad folder is named before the files
    check_input_file(mixtures, "--mixtures", suffixes=(".csv",))
    check_input_file(pairs, "--pairs", suffixes=(".csv",))
    check_output_file(out, "--out", suffixes=(".csv",))
    from mixlab.graphs.mixscentnet.data import read_mixtures_csv, read_pairs_csv

    names, components, concentrations = read_mixtures_csv(mixtures)
    index, _ = read_pairs_csv(pairs, names, require_distance=False)
    predicted = network.predict(components, index, concentrations)
    rows = [[names[a], names[b], f"{d:.5f}"] for (a, b), d in zip(index, predicted, strict=True)]
    write_csv_atomic(out, ["mixture_1", "mixture_2", "predicted_distance"], rows)
    typer.echo(f"wrote {len(rows)} predictions to {out}")


@app.command()
def white(
    model: Annotated[Path, typer.Option(help="a `train` folder")],
    pool: Annotated[Path, typer.Option(help="component pool: one SMILES per line")],
    out: Annotated[Path, typer.Option(help="CSV: components, pair, predicted distance")],
    sizes: Annotated[
        str, typer.Option(help="comma-separated component counts")
    ] = "1,2,4,8,16,24,32,40",
    pairs_per_size: Annotated[int, typer.Option(help="random pairs per size")] = 40,
    seed: Annotated[int, typer.Option(help="random seed of the draws")] = 0,
) -> None:
    """The olfactory-white curve: predicted distance of random non-overlapping mixture pairs of
    growing size drawn from the pool, and the slope of distance on size."""
    try:
        counts = [int(s) for s in sizes.split(",")]
    except ValueError:
        raise ValueError(f"--sizes must be comma-separated integers, got {sizes!r}") from None
    network = _load_model(model, "--model")  # first: a bad folder is named before the files
    check_count(pairs_per_size, "--pairs-per-size")
    check_seed(seed)
    check_output_file(out, "--out", suffixes=(".csv",))
    components = sorted(set(read_smiles_file(pool, "--pool")))
    if len(counts) < 2 or min(counts) < 1 or 2 * max(counts) > len(components):
        raise ValueError(
            f"--sizes needs at least two counts >= 1 with 2 × the largest <= the pool's "
            f"{len(components)} molecules, got {sizes!r}"
        )
    import numpy as np

    rng = np.random.default_rng(seed)
    mixtures, index, size = [], [], []
    for n in counts:
        for _ in range(pairs_per_size):
            drawn = rng.choice(len(components), 2 * n, replace=False)
            index.append([len(mixtures), len(mixtures) + 1])
            mixtures += [[components[i] for i in drawn[:n]], [components[i] for i in drawn[n:]]]
            size.append(n)
    predicted = network.predict(mixtures, index)
    slope = float(np.polyfit(size, predicted, 1)[0])
    rows = [
        [n, k % pairs_per_size, f"{d:.5f}"]
        for k, (n, d) in enumerate(zip(size, predicted, strict=True))
    ]
    write_csv_atomic(out, ["components", "pair", "predicted_distance"], rows)
    typer.echo(f"slope of predicted distance on components: {slope:+.5f}; wrote {out}")
