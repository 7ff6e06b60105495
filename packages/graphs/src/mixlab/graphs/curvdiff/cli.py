"""``mixlab-graphs curvdiff``: curvature of your graphs, train a generator, sample, evaluate.

    mixlab-graphs curvdiff curvature graphs.g6 --out edges.csv          # per-edge ORC and Forman
    mixlab-graphs curvdiff train --data graphs.g6 --geometry HSE --out runs/model
    mixlab-graphs curvdiff train --data molecules.smi --geometry HSE --out runs/mol
    mixlab-graphs curvdiff sample --model runs/model --num 100 --out generated.g6
    mixlab-graphs curvdiff evaluate --generated generated.g6 --reference test.g6 --train train.g6

Graphs are graph6 files (one graph per line); molecules are SMILES files (``.smi``: one SMILES
per line, optionally followed by a name). Every verb checks its inputs before it loads or
computes anything; a bad value is one line on stderr and exit code 2.
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
    check_number,
    check_output_file,
    check_output_folder,
    check_seed,
)

GRAPH_SUFFIXES = (".g6", ".smi")
PROTOCOLS = ("tv", "emd")
VALIDITY = ("none", "tree", "planar", "sbm")

app = typer.Typer(
    help="CurvDiff: mixed-curvature latent diffusion for graph and molecule generation.",
    no_args_is_help=True,
)


def read_graphs(path: Path, option: str, max_nodes: int | None = None):
    """Graphs from a .g6 file, or molecules (and their atom types) from a .smi file."""
    check_input_file(path, option, suffixes=GRAPH_SUFFIXES)
    from mixlab.graphs.curvdiff.datasets import read_graph6, validate_graphs

    if path.suffix == ".g6":
        graphs, atom_types = read_graph6(path), None
    else:
        from mixlab.graphs.curvdiff.molecules import read_smiles

        graphs = read_smiles(path)
        atom_types = tuple(graphs.atom_types)
    if not graphs:
        raise ValueError(f"{option}: {str(path)!r} holds no graphs")
    return validate_graphs(list(graphs), max_nodes=max_nodes), atom_types


@app.command()
def curvature(
    graphs: Annotated[Path, typer.Argument(help="graphs: .g6 (one graph per line) or .smi")],
    out: Annotated[Path | None, typer.Option(help="per-edge CSV (default: print it)")] = None,
    alpha: Annotated[float, typer.Option(help="Ollivier–Ricci laziness α in [0, 1)")] = 0.5,
) -> None:
    """Ollivier–Ricci (α-lazy random walks) and augmented Forman curvature of every edge."""
    check_input_file(graphs, "GRAPHS", suffixes=GRAPH_SUFFIXES)
    check_number(alpha, "--alpha", 0 <= alpha < 1, "a number in [0, 1)")
    if out is not None:
        check_output_file(out, "--out", suffixes=(".csv",))
    import csv
    import io

    from mixlab.graphs.curvdiff.curvature import curvature_table
    from mixlab.shared.files import write_text_atomic

    rows = curvature_table(read_graphs(graphs, "GRAPHS")[0], alpha=alpha)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["graph", "u", "v", "ollivier_ricci", "forman"])
    writer.writeheader()
    writer.writerows(rows)
    if out is None:
        typer.echo(buffer.getvalue(), nl=False)
    else:
        write_text_atomic(out, buffer.getvalue())
        typer.echo(f"wrote {len(rows)} edges to {out}")


@app.command()
def train(
    data: Annotated[Path, typer.Option(help="training graphs: .g6, or molecules: .smi")],
    out: Annotated[Path, typer.Option(help="folder for model.safetensors and config.json")],
    geometry: Annotated[str, typer.Option(help="latent components: letters from H, S, E")] = "HSE",
    ricci: Annotated[
        bool | None,
        typer.Option(help="Ricci gating and c(G) conditioning (default: on for HSE)"),
    ] = None,
    latent_dim: Annotated[int, typer.Option(help="total latent dimension")] = 12,
    ae_epochs: Annotated[int, typer.Option(help="autoencoder epochs")] = 200,
    iterations: Annotated[int, typer.Option(help="DDPM optimiser steps")] = 3000,
    steps: Annotated[int, typer.Option(help="DDPM diffusion steps T")] = 500,
    max_nodes: Annotated[int, typer.Option(help="largest graph accepted")] = 64,
    seed: int = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps")] = "auto",
) -> None:
    """Fit CurvDiff (autoencoder, then latent DDPM) on your graphs and save it."""
    check_input_file(data, "--data", suffixes=GRAPH_SUFFIXES)
    check_output_folder(out, "--out")
    for value, option in (
        (latent_dim, "--latent-dim"),
        (ae_epochs, "--ae-epochs"),
        (iterations, "--iterations"),
        (steps, "--steps"),
        (max_nodes, "--max-nodes"),
    ):
        check_count(value, option)
    check_seed(seed)
    from mixlab.graphs.curvdiff.latent import parse_geometry

    parse_geometry(geometry)
    use_ricci = sorted(geometry) == sorted("HSE") if ricci is None else ricci
    from mixlab.graphs.curvdiff.model import CurvDiff
    from mixlab.shared.device import resolve_device

    device = resolve_device(device)
    model = CurvDiff(
        geometry,
        latent_dim=latent_dim,
        ricci_gating=use_ricci and sorted(geometry) == sorted("HSE"),
        ricci_conditioning=use_ricci,
        ae_epochs=ae_epochs,
        diffusion_iterations=iterations,
        diffusion_steps=steps,
        max_nodes=max_nodes,
    )
    graphs, atom_types = read_graphs(data, "--data", max_nodes)
    model.fit(graphs, atom_types=atom_types, seed=seed, device=device)
    model.save(out)
    typer.echo(f"trained on {len(graphs)} graphs; curvatures {model.curvatures()}; saved to {out}")


@app.command()
def sample(
    model: Annotated[Path, typer.Option(help="a folder written by `train`")],
    num: Annotated[int, typer.Option(help="graphs to generate")],
    out: Annotated[Path, typer.Option(help=".g6 for graphs, .smi for molecules")],
    seed: int = 0,
    guidance: Annotated[
        float | None, typer.Option(help="classifier-free guidance weight (default: the model's)")
    ] = None,
) -> None:
    """Generate graphs (or molecules) from a trained model."""
    check_input_folder(model, "--model", containing=("config.json", "model.safetensors"))
    check_count(num, "--num")
    check_output_file(out, "--out", suffixes=(".g6", ".smi"))
    check_seed(seed)
    from mixlab.graphs.curvdiff.model import CurvDiff

    loaded = CurvDiff.load(model)
    molecules = loaded.atom_types is not None
    if out.suffix == ".smi" and not molecules:
        raise ValueError("--out: a .smi file needs a model trained on molecules; use .g6")
    graphs = loaded.sample(num, seed=seed, guidance=guidance)
    if out.suffix == ".g6":
        from mixlab.graphs.curvdiff.datasets import write_graph6

        write_graph6(graphs, out)
        typer.echo(f"wrote {len(graphs)} graphs to {out}")
        return
    from mixlab.shared.files import write_text_atomic

    smiles = [g.smiles for g in graphs]
    sanitized = [s for s in smiles if s is not None]  # fragmented ("C.C") ones included
    write_text_atomic(out, "".join(f"{s}\n" for s in sanitized))
    connected = sum("." not in s for s in sanitized)
    typer.echo(f"wrote the {len(sanitized)} of {num} molecules that sanitize to {out} "
               f"({connected} valid: one fragment)")  # fmt: skip


@app.command()
def evaluate(
    generated: Annotated[Path, typer.Option(help="generated graphs (.g6) or molecules (.smi)")],
    reference: Annotated[Path, typer.Option(help="held-out reference graphs, same format")],
    train: Annotated[
        Path | None, typer.Option(help="training graphs: the MMD floor and novelty")
    ] = None,
    validity: Annotated[
        str, typer.Option(help="V.U.N. validity test: " + ", ".join(VALIDITY))
    ] = "none",
    out: Annotated[Path | None, typer.Option(help="write the table as JSON")] = None,
) -> None:
    """MMD of degree, clustering, orbit, spectral and curvature statistics in both protocols,
    with the floor (train vs reference, or two halves of the reference); V.U.N.; for molecules
    validity, uniqueness and novelty."""
    check_input_file(generated, "--generated", suffixes=GRAPH_SUFFIXES)
    check_input_file(reference, "--reference", suffixes=(generated.suffix,))
    if train is not None:
        check_input_file(train, "--train", suffixes=(generated.suffix,))
    check_choice(validity, "--validity", VALIDITY)
    if out is not None:
        check_output_file(out, "--out", suffixes=(".json",))
    from mixlab.graphs.curvdiff.metrics import mmd_table, vun
    from mixlab.shared.files import write_json_atomic

    table: dict[str, dict[str, float]] = {}
    if generated.suffix == ".smi":
        from mixlab.graphs.curvdiff.molecules import molecule_metrics

        lines = generated.read_text(encoding="utf-8").split()
        known = train if train is not None else reference
        smiles = [
            line.split()[0]
            for line in known.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        table["molecules"] = molecule_metrics(lines, smiles)
    ours, _ = read_graphs(generated, "--generated")
    theirs, _ = read_graphs(reference, "--reference")
    if train is not None:
        seen, _ = read_graphs(train, "--train")
        floor_a, floor_b, floor_name = seen, theirs, "floor (train vs reference)"
    else:
        half = len(theirs) // 2
        if half < 1:
            raise ValueError("--reference needs at least 2 graphs for a floor; or pass --train")
        floor_a, floor_b, floor_name = theirs[:half], theirs[half:], "floor (reference halves)"
    for protocol in PROTOCOLS:
        table[f"generated ({protocol})"] = mmd_table(ours, theirs, protocol)
        table[f"{floor_name} ({protocol})"] = mmd_table(floor_a, floor_b, protocol)
    if validity != "none":
        table["vun"] = vun(ours, seen if train is not None else [], validity)
    for name, row in table.items():
        typer.echo(f"{name}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items()))
    if out is not None:
        write_json_atomic(out, table)
