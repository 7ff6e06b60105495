"""``mixlab-graphs flatnsd``: find a graph's bottleneck edges, run the theory checks, train a model
on an over-squashing benchmark.

    mixlab-graphs flatnsd resistance edges.csv --out resistance.csv
    mixlab-graphs flatnsd resistance edges.npy --node-maps maps.npy     # a flat bundle [N, d, d]
    mixlab-graphs flatnsd theory --out theory.json
    mixlab-graphs flatnsd train --task ring --size 12 --model flatnsd_heat --out runs/ring12
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

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

    if not path.is_file():
        raise FileNotFoundError(f"edge list {str(path)!r} does not exist")
    if path.suffix == ".npy":
        edges = np.load(path, allow_pickle=False)
    elif path.suffix in (".csv", ".txt", ".tsv"):
        text = [line for line in path.read_text().splitlines() if line.strip()]
        if text and not text[0].replace(",", " ").split()[0].lstrip("-").isdigit():
            text = text[1:]  # a header
        edges = np.array([line.replace(",", " ").split()[:2] for line in text], dtype=np.int64)
    else:
        raise ValueError(f"edge list must be .csv, .txt, .tsv or .npy, got {str(path)!r}")
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
    import numpy as np
    import torch
    from torch_geometric.data import Data

    from mixlab.graphs.flatnsd.transforms import AddSheafResistance

    if top < 0:
        raise ValueError(f"--top must be >= 0, got {top}")
    edge_index, num_nodes = read_edges(edges)
    data = Data(edge_index=edge_index, num_nodes=num_nodes)
    if node_maps is not None:
        maps = np.load(node_maps, allow_pickle=False)
        if maps.ndim != 3 or maps.shape[1] != maps.shape[2] or maps.shape[0] != num_nodes:
            raise ValueError(
                f"--node-maps must be [num_nodes={num_nodes}, d, d], got {list(maps.shape)}"
            )
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
        out.parent.mkdir(parents=True, exist_ok=True)
        lines = ["u,v,resistance"] + [
            f"{int(pairs[0, k])},{int(pairs[1, k])},{float(values[k]):.10g}" for k in order.tolist()
        ]
        out.write_text("\n".join(lines) + "\n")
        typer.echo(f"wrote {out}")


@app.command()
def theory(
    stalk_dim: Annotated[int, typer.Option(help="stalk dimension of the random bundles")] = 3,
    seed: int = 0,
    out: Annotated[Path | None, typer.Option(help="write the measurements as JSON")] = None,
) -> None:
    """Resistance against sensitivity, and which sheaves move resistance, on five graph families."""
    from mixlab.graphs.flatnsd.theory import theory_checks

    if stalk_dim < 1:
        raise ValueError(f"--stalk-dim must be >= 1, got {stalk_dim}")
    checks = theory_checks(stalk_dim=stalk_dim, seed=seed)
    typer.echo("family   |R^F-R·I| orth  general   non-flat  Spearman lin  Spearman FlatNSD")
    for name, c in checks.items():
        typer.echo(
            f"{name:8s} {c['orthogonal_flat_deviation']:9.1e} {c['general_flat_deviation']:9.1e} "
            f"{c['non_flat_deviation']:9.3g} {c['spearman_linear']:13.3f} {c['spearman_nonlinear']:17.3f}"
        )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(checks, indent=2) + "\n")
        typer.echo(f"wrote {out}")


@app.command()
def train(
    task: Annotated[str, typer.Option(help="ring (RingTransfer) or tree (Tree-NeighborsMatch)")],
    size: Annotated[
        int, typer.Option(help="ring size n (layers n//2) or tree depth r (layers r+1)")
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
    """Train one model on a benchmark task and save its weights."""
    from safetensors.torch import save_file

    from mixlab.graphs.flatnsd.layers import parameter_count
    from mixlab.graphs.flatnsd.tasks import RING_CLASSES, ring_transfer, tree_neighbors_match
    from mixlab.graphs.flatnsd.training import build_model, train_readout
    from mixlab.shared import seed_everything

    if task == "ring":
        train_set = ring_transfer(graphs, size, seed=seed)
        test_set = ring_transfer(max(graphs // 5, 1), size, seed=seed + 10_000)
        classes, layers = RING_CLASSES, size // 2
    elif task == "tree":
        train_set, test_set = tree_neighbors_match(size, max_graphs=graphs, seed=seed), []
        classes, layers = 2**size, size + 1
    else:
        raise ValueError(f"--task must be ring or tree, got {task!r}")
    seed_everything(seed)
    network = build_model(model, train_set[0].num_features, classes, layers, width, stalk_dim)
    result = train_readout(network, train_set, test_set, epochs=epochs, lr=lr, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    # A plain state dict: rebuild with training.build_model(**metrics.json) and load_state_dict.
    save_file(network.state_dict(), str(out / "model.safetensors"))
    metrics = {
        "task": task,
        "size": size,
        "model": model,
        "width": width,
        "stalk_dim": stalk_dim,
        "layers": layers,
        "parameters": parameter_count(network),
        "train_accuracy": result.train_accuracy,
        "test_accuracy": result.test_accuracy,
        "epochs": result.epochs,
        "seed": seed,
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    test_text = (
        "" if result.test_accuracy is None else f", test accuracy {result.test_accuracy:.3f}"
    )
    typer.echo(
        f"{model} on {task} {size}: train accuracy {result.train_accuracy:.3f}{test_text} "
        f"after {result.epochs} epochs; wrote {out}"
    )
