"""``mixlab-graphs flatnsd``: find a graph's bottleneck edges, run the theory checks, train a model
on an over-squashing benchmark.

    mixlab-graphs flatnsd resistance edges.csv --out resistance.csv
    mixlab-graphs flatnsd resistance edges.npy --node-maps maps.npy     # a flat bundle [N, d, d]
    mixlab-graphs flatnsd theory --out theory.json
    mixlab-graphs flatnsd train --task ring --size 12 --model flatnsd_heat --out runs/ring12
    mixlab-graphs flatnsd evaluate runs/ring12 --graphs 500

Every verb checks all its inputs (paths, ranges) before it loads or computes anything; a bad
value is one line on stderr and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mixlab.graphs.flatnsd.config import MAX_TREE_DEPTH, SYSTEMS
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

EDGE_SUFFIXES = (".csv", ".txt", ".tsv", ".npy")
MAX_THEORY_STALK_DIM = 16
"""the theory checks form dense (N·d)² matrices on graphs of up to 40 nodes"""

app = typer.Typer(
    help="FlatNSD: sheaf effective resistance and flat-bundle Neural Sheaf Diffusion.",
    no_args_is_help=True,
)


def read_edges(path: Path):
    """An edge list from .csv / .txt (two integer columns, optional header) or .npy ([E, 2] or
    [2, E]), made undirected without self-loops, and the node count."""
    import numpy as np
    import torch
    from torch_geometric.utils import coalesce, remove_self_loops, to_undirected

    check_input_file(path, "EDGES", suffixes=EDGE_SUFFIXES)
    try:
        if path.suffix == ".npy":
            edges = np.load(path, allow_pickle=False)
        else:
            text = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            if text and not text[0].replace(",", " ").split()[0].lstrip("-").isdigit():
                text = text[1:]  # a header
            rows = [line.replace(",", " ").split()[:2] for line in text]
            edges = np.array(rows, dtype=np.int64)
    except (ValueError, EOFError) as error:  # not integers, not UTF-8, a damaged .npy
        raise ValueError(
            f"{path}: not an edge list ({' '.join(str(error).split())[:200]})"
        ) from None
    edges = np.asarray(edges)
    if edges.ndim != 2 or 2 not in edges.shape or not np.issubdtype(edges.dtype, np.integer):
        raise ValueError(f"{path} must hold integer node pairs, shape [E, 2] or [2, E]")
    edge_index = torch.as_tensor(edges if edges.shape[0] == 2 else edges.T, dtype=torch.long)
    if edge_index.numel() and int(edge_index.min()) < 0:
        raise ValueError(f"{path} has negative node indices")
    num_nodes = int(edge_index.max()) + 1 if edge_index.numel() else 0
    edge_index, _ = remove_self_loops(edge_index)
    return coalesce(to_undirected(edge_index, num_nodes=num_nodes), num_nodes=num_nodes), num_nodes


@app.command()
def resistance(
    edges: Annotated[Path, typer.Argument(help="edge list: .csv/.txt (u v per line) or .npy")],
    node_maps: Annotated[
        Path | None, typer.Option(help="a flat bundle: .npy of [N, d, d] invertible maps")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="write u,v,resistance per edge (CSV)")] = None,
    top: Annotated[int, typer.Option(help="bottleneck edges to print")] = 5,
) -> None:
    """Effective resistance of every edge (of the graph, or of a flat bundle over it) and the total:
    the most resistive edges are the graph's bottlenecks."""
    check_input_file(edges, "EDGES", suffixes=EDGE_SUFFIXES)
    if node_maps is not None:
        check_input_file(node_maps, "--node-maps", suffixes=(".npy",))
    if out is not None:
        check_output_file(out, "--out")
        if out.exists() and out.resolve() == edges.resolve():
            raise ValueError(f"--out: {out} is the input edge list; give another file")
    check_count(top, "--top", minimum=0)

    import numpy as np
    import torch
    from torch_geometric.data import Data

    from mixlab.graphs.flatnsd.transforms import AddSheafResistance
    from mixlab.shared.files import write_text_atomic

    edge_index, num_nodes = read_edges(edges)
    data = Data(edge_index=edge_index, num_nodes=num_nodes)
    if node_maps is not None:
        try:
            maps = np.load(node_maps, allow_pickle=False)
        except (ValueError, EOFError) as error:
            detail = " ".join(str(error).split())[:200]
            raise ValueError(f"--node-maps: {node_maps} is not a NumPy array ({detail})") from None
        if maps.ndim != 3 or maps.shape[1] != maps.shape[2] or maps.shape[0] != num_nodes:
            raise ValueError(
                f"--node-maps must be [num_nodes={num_nodes}, d, d], got {list(maps.shape)}"
            )
        if not (np.issubdtype(maps.dtype, np.number) and np.isfinite(maps).all()):
            raise ValueError(f"--node-maps must hold finite numbers ({node_maps})")
        if maps.shape[1] < 1:
            raise ValueError(f"--node-maps must have d >= 1, got {list(maps.shape)}")
        data.node_maps = torch.as_tensor(maps, dtype=torch.float64)
        singular = torch.linalg.cond(data.node_maps) > 1e12
        if bool(singular.any()):
            node = int(singular.nonzero()[0])
            raise ValueError(f"--node-maps must be invertible; the map of node {node} is singular")
    data = AddSheafResistance()(data)
    once = edge_index[0] < edge_index[1]
    pairs, values = edge_index[:, once], data.edge_resistance[once]
    order = torch.argsort(values, descending=True)
    typer.echo(
        f"{num_nodes} nodes, {int(once.sum())} edges; total effective resistance "
        f"{float(data.total_resistance):.6g}"
    )
    for k in order[:top].tolist():
        typer.echo(f"  edge ({int(pairs[0, k])}, {int(pairs[1, k])}): {float(values[k]):.6g}")
    if out is not None:
        lines = ["u,v,resistance"] + [
            f"{int(pairs[0, k])},{int(pairs[1, k])},{float(values[k]):.10g}" for k in order.tolist()
        ]
        write_text_atomic(out, "\n".join(lines) + "\n")
        typer.echo(f"wrote {out}")


@app.command()
def theory(
    stalk_dim: Annotated[
        int,
        typer.Option(help=f"stalk dimension of the random bundles (1 to {MAX_THEORY_STALK_DIM})"),
    ] = 3,
    seed: int = 0,
    out: Annotated[Path | None, typer.Option(help="write the measurements as JSON")] = None,
) -> None:
    """Resistance against sensitivity, and which sheaves move resistance, on five graph families
    (three or four graphs each); the bound S <= c/R is fitted on each family's first graph and
    tested on the others."""
    check_count(stalk_dim, "--stalk-dim", 1, MAX_THEORY_STALK_DIM)
    check_seed(seed)
    if out is not None:
        check_output_file(out, "--out")

    from mixlab.graphs.flatnsd.theory import SENSITIVITIES, json_ready, summary, theory_checks
    from mixlab.shared.files import write_json_atomic

    checks = theory_checks(stalk_dim=stalk_dim, seed=seed)
    typer.echo(
        "graph                      |R^F-R·I| orth  general  non-flat  |R~-R·I| orth  "
        "Spearman lin  general  FlatNSD"
    )
    for family, found in checks.items():
        for name, c in found["graphs"].items():
            typer.echo(
                f"{family + '/' + name:26s} {c['orthogonal_flat_deviation']:14.1e} "
                f"{c['general_flat_deviation']:8.1e} {c['non_flat_deviation']:9.3g} "
                f"{c['untransported_deviation']:14.3g} {c['spearman_linear']:13.3f} "
                f"{c['spearman_linear_general']:8.3f} {c['spearman_nonlinear']:8.3f}"
            )
    worst = summary(checks)
    typer.echo("bound S <= c/R (c from each family's first graph), over the held-out graphs:")
    for kind in SENSITIVITIES:
        violating = ", ".join(worst[f"bound_{kind}_violating"]) or "none"
        typer.echo(
            f"  {kind:15s} violating pairs {worst[f'bound_{kind}_violation_share']:.3f}, "
            f"worst max(S·R)/c {worst[f'bound_{kind}_worst_ratio']:.3g}, "
            f"max spread of S·R {worst[f'bound_{kind}_max_spread']:.3g}; violating: {violating}"
        )
    if out is not None:
        write_json_atomic(out, json_ready(checks))
        typer.echo(f"wrote {out}")


def _check_task_size(task: str, size: int) -> None:
    check_choice(task, "--task", ("ring", "tree"))
    if task == "ring":
        check_count(size, "--size", minimum=3)
    else:
        check_count(size, "--size", 2, MAX_TREE_DEPTH)


def _task_graphs(task: str, size: int, graphs: int, seed: int) -> tuple[list, list, int, int]:
    """(train, test, classes, layers) of a task from ``seed``: ``graphs`` training rings and a
    fifth as many held-out test rings, or up to ``graphs`` training trees with a fifth of the
    distinct examples held out (no test graph equals a training graph)."""
    from mixlab.graphs.flatnsd.tasks import (
        RING_CLASSES,
        ring_transfer_split,
        tree_neighbors_match_split,
    )

    if task == "ring":
        train, test = ring_transfer_split(graphs, max(graphs // 5, 1), size, seed=seed)
        return train, test, RING_CLASSES, size // 2
    train, test = tree_neighbors_match_split(size, graphs, seed=seed)
    return train, test, 2**size, size + 1


@app.command()
def train(
    task: Annotated[str, typer.Option(help="ring (RingTransfer) or tree (Tree-NeighborsMatch)")],
    size: Annotated[
        int,
        typer.Option(
            help=f"ring size n >= 3 (layers n//2) or tree depth r in [2, {MAX_TREE_DEPTH}] (layers r+1)"
        ),
    ],
    out: Annotated[Path, typer.Option(help="folder for model.safetensors and metrics.json")],
    model: Annotated[str, typer.Option(help="flatnsd, flatnsd_heat, nsd_*, gcn, gin or gat")] = (
        "flatnsd"
    ),
    width: Annotated[int, typer.Option(help="channels per stalk dim (sheaf) or hidden size")] = 16,
    stalk_dim: int = 2,
    epochs: int = 30,
    lr: float = 3e-3,
    graphs: Annotated[int, typer.Option(help="training graphs")] = 1000,
    seed: int = 0,
) -> None:
    """Train one model on a benchmark task and save its weights (``evaluate`` loads them)."""
    _check_task_size(task, size)
    check_choice(model, "--model", SYSTEMS)
    check_count(width, "--width")
    check_count(stalk_dim, "--stalk-dim")
    check_count(epochs, "--epochs")
    check_number(lr, "--lr", lr > 0, "a finite number > 0")
    check_count(graphs, "--graphs")
    check_seed(seed)
    if seed + 10_000 >= 2**32:
        raise ValueError(
            f"--seed must be below 2**32 - 10000 (test graphs use seed + 10000), got {seed}"
        )
    check_output_folder(out, "--out")

    from mixlab.graphs.flatnsd.training import build_model, save_trained, train_readout
    from mixlab.shared import seed_everything
    from mixlab.shared.budget import parameter_count

    train_set, test_set, classes, layers = _task_graphs(task, size, graphs, seed)
    in_channels = train_set[0].num_features
    seed_everything(seed)
    network = build_model(model, in_channels, classes, layers, width, stalk_dim)
    result = train_readout(network, train_set, test_set, epochs=epochs, lr=lr, seed=seed)
    info = {
        "task": task,
        "size": size,
        "model": model,
        "in_channels": in_channels,
        "classes": classes,
        "width": width,
        "stalk_dim": stalk_dim,
        "layers": layers,
        "parameters": parameter_count(network),
        "train_accuracy": result.train_accuracy,
        "test_accuracy": result.test_accuracy,
        "epochs": result.epochs,
        "lr": lr,
        "graphs": graphs,
        "seed": seed,
    }
    # Rebuild with training.load_trained(out): metrics.json records the SHA-256 of the weights.
    save_trained(network, out, info)
    test_text = (
        "" if result.test_accuracy is None else f", test accuracy {result.test_accuracy:.3f}"
    )
    typer.echo(
        f"{model} on {task} {size}: train accuracy {result.train_accuracy:.3f}{test_text} "
        f"after {result.epochs} epochs; wrote {out}"
    )


@app.command()
def evaluate(
    model_dir: Annotated[Path, typer.Argument(help="a folder written by `train --out`")],
    graphs: Annotated[int, typer.Option(help="fresh graphs of the model's task to score")] = 200,
    seed: Annotated[int, typer.Option(help="seed of the fresh graphs")] = 123_456,
) -> None:
    """Load a model saved by ``train`` (checking its SHA-256) and score it on fresh graphs of its
    task and size that are not among its training graphs (rebuilt from the ``graphs`` and
    ``seed`` it was trained with; a depth-2 tree has only 96 distinct examples)."""
    check_input_folder(model_dir, "MODEL_DIR")
    check_count(graphs, "--graphs")
    check_seed(seed)

    from mixlab.graphs.flatnsd.saved import read_model_info

    read_model_info(model_dir)  # the sidecar and the weights' SHA-256, before torch loads

    from mixlab.graphs.flatnsd.tasks import ring_transfer, tree_neighbors_match, unseen
    from mixlab.graphs.flatnsd.training import accuracy, load_trained

    network, info = load_trained(model_dir)
    task, size = info["task"], info["size"]
    if task == "ring":
        fresh = ring_transfer(graphs, size, seed=seed)
    else:
        fresh = tree_neighbors_match(size, max_graphs=graphs, seed=seed)
    if isinstance(info.get("graphs"), int) and isinstance(info.get("seed"), int):
        trained_on = _task_graphs(task, size, info["graphs"], info["seed"])[0]
        scored = unseen(fresh, trained_on)
        which = f"graphs not seen in training ({len(fresh) - len(scored)} seen ones dropped)"
    else:  # saved by save_trained without the training set's recipe
        scored, which = fresh, "graphs (the training set is unknown: some may be training graphs)"
    if not scored:
        raise ValueError(f"every fresh graph is a training graph; pass another --seed than {seed}")
    score = accuracy(network, scored)
    typer.echo(f"{info['model']} on {task} {size}: accuracy {score:.3f} on {len(scored)} {which}")
