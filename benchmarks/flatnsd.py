"""Benchmark: time per training epoch and peak memory of FlatNSD against GCN and NSD.

    uv run python benchmarks/flatnsd.py                   # -> benchmarks/results/flatnsd/
    uv run python benchmarks/flatnsd.py --nodes 2000 --edges 10000 --small-nodes 400 --out /tmp/b

A full-batch node-classification epoch (forward, cross-entropy, backward, Adam step) of a
2-layer model with 64 input features and hidden width 32 (stalk dim 2 × 16 channels), on two
random graphs: large, 20,000 nodes and 10^5 directed edges; small, 2,000 nodes and 10^4 edges
(``--small-nodes``; the edges scale with the nodes). Every system runs at both sizes:

- ``gcn``: PyG GCNConv, hidden 32. The first reference: the cheapest message passing a user
  would pick, so every time is also given relative to it;
- ``flatnsd`` / ``flatnsd_heat``: FlatNSDConv as the experiment trains it (``config.SYSTEMS``):
  discrete with BuNN's one-layer GraphSAGE φ, and heat (12 Taylor terms, concat + FFN, two
  bundles);
- ``nsd_diag`` / ``nsd_bundle`` / ``nsd_general``: NSDConv, per-edge maps, by message passing;
- ``nsd_authors``: general NSD as its authors run it (twitter-research/neural-sheaf-diffusion,
  ``GeneralLaplacianBuilder`` and ``torch_sparse.spmm``): the index of every nonzero of the
  (N·d)² normalised Laplacian built once with the graph, only the values computed per forward,
  and the product by gather and scatter-add, whose gradient is one number per nonzero. The
  second reference: what a user of NSD runs. It computes what ``nsd_general`` computes (tested
  in float64), so the two differ only in how the Laplacian is applied.

An earlier ``nsd_sparse_laplacian`` built a COO Laplacian, coalesced every forward, and
multiplied with ``torch.sparse.mm``, whose backward allocates a dense (N·d)² gradient (6.4 GB at
20,000 nodes): its 143× GCN figure, and FlatNSD's 28× lead over it, measured that proxy, not NSD.

Each system runs in its own subprocess, one after the other, so that its peak resident memory
(ru_maxrss above the resident memory after building the data) is its own. A subprocess times the
median of 5 epochs after 2 warm-up epochs; the systems run in ``--repeats`` interleaved rounds and
each reports the median over rounds (one round let a transient slowdown of the shared machine
put FlatNSD at 297 ms where three further runs gave 187–197 ms), its peak the largest. Times are
reported as ratios to GCN and to ``nsd_authors`` measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mixlab.graphs.flatnsd import MessagePassingNet, SheafDiffusionNet
from mixlab.graphs.flatnsd.config import SYSTEMS as EXPERIMENT_SYSTEMS
from mixlab.graphs.flatnsd.layers import NSDConv, Operator
from mixlab.graphs.flatnsd.sheaf import laplacian_blocks, laplacian_index
from mixlab.shared import Claim, bar_plot
from mixlab.shared.memory import current_bytes
from mixlab.shared.result import write_benchmark

FEATURES, CLASSES, STALK, CHANNELS, LAYERS = 64, 8, 2, 16, 2
SYSTEMS = (
    "gcn",
    "flatnsd",
    "flatnsd_heat",
    "nsd_diag",
    "nsd_bundle",
    "nsd_general",
    "nsd_authors",
)
MEMORY_LIMIT_MB = 1024


def spmm(rows: Tensor, cols: Tensor, values: Tensor, dense: Tensor, size: int) -> Tensor:
    """``torch_sparse.spmm``: the sparse matrix (rows, cols, values) of ``size`` rows times
    ``dense``, as out[rows] += values · dense[cols] by gather and scatter-add.

    Autograd then keeps one gradient per nonzero, where ``torch.sparse.mm`` materialises the
    gradient of the sparse matrix as a dense size² one."""
    return dense.new_zeros(size, dense.size(1)).index_add_(0, rows, values[:, None] * dense[cols])


class AuthorsNSDConv(NSDConv):
    """General NSD with the Laplacian applied as its authors apply it: a sparse matrix whose
    index is built once for the graph it is constructed with, values per forward, :func:`spmm`.

    Same parameters (and ``state_dict``) and same output as ``NSDConv(maps="general")``, so the
    benchmark compares two ways of applying one operator. Left out from the authors' builder: the
    random jitter of the normaliser during training and the clamp of the normalised blocks to
    [−1, 1], which ``NSDConv`` does not have either."""

    def __init__(self, channels: int, stalk_dim: int, edge_index: Tensor, num_nodes: int) -> None:
        super().__init__(channels, stalk_dim, maps="general")
        edge_index = edge_index.long()
        rows, cols = laplacian_index(edge_index, num_nodes, stalk_dim)
        # not persistent: the state_dict stays NSDConv's, so weights load either way
        self.register_buffer("graph", edge_index, persistent=False)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        self.num_nodes = num_nodes

    def laplacian_values(self, x: Tensor, edge_index: Tensor, weight: Tensor) -> Tensor:
        """The entries of (D+I)^{-1/2} L_F (D+I)^{-1/2} in :func:`laplacian_index`'s order, from
        the maps F = tanh(W[x_i ‖ x_j]): what the authors' builder computes every forward."""
        diagonal, off = laplacian_blocks(
            edge_index,
            edge_maps=self.sheaf(x, edge_index),
            num_nodes=x.size(0),
            edge_weight=weight,
            normalization="augmented",
        )
        return torch.cat([diagonal, off]).reshape(-1)

    def operator(self, x: Tensor, edge_index: Tensor, reverse: Tensor, weight: Tensor) -> Operator:
        if x.size(0) != self.num_nodes or not torch.equal(edge_index, self.graph):
            raise ValueError("AuthorsNSDConv runs only on the graph it was built with")
        values = self.laplacian_values(x, edge_index, weight)
        size = x.size(0) * self.stalk_dim

        def apply(y: Tensor) -> Tensor:
            return spmm(self.rows, self.cols, values, y.reshape(size, -1), size).view_as(y)

        return apply


def build(system: str, edge_index: Tensor, num_nodes: int) -> nn.Module:
    """The 2-layer model of ``system``, with the experiment's options (``config.SYSTEMS``: FlatNSD
    with BuNN's GNN φ, FlatNSD-heat on two bundles); ``nsd_authors`` is general NSD built for the
    graph, as the authors' models are."""
    family, options = EXPERIMENT_SYSTEMS["nsd_general" if system == "nsd_authors" else system]
    if family == "mp":
        return MessagePassingNet(
            FEATURES, CLASSES, hidden=STALK * CHANNELS, num_layers=LAYERS, **options
        )
    model = SheafDiffusionNet(
        FEATURES, CLASSES, stalk_dim=STALK, channels=CHANNELS, num_layers=LAYERS, **options
    )
    if system == "nsd_authors":
        model.convs = nn.ModuleList(
            AuthorsNSDConv(CHANNELS, STALK, edge_index, num_nodes) for _ in range(LAYERS)
        )
    return model


def random_graph(nodes: int, directed_edges: int, seed: int = 0):
    from torch_geometric.utils import coalesce, remove_self_loops, to_undirected

    g = torch.Generator().manual_seed(seed)
    pairs = torch.randint(0, nodes, (2, directed_edges // 2 + directed_edges // 20), generator=g)
    edge_index = coalesce(to_undirected(remove_self_loops(pairs)[0]), num_nodes=nodes)
    edge_index = edge_index[:, edge_index[0] < edge_index[1]][:, : directed_edges // 2]
    edge_index = torch.cat([edge_index, edge_index.flip(0)], 1)
    x = torch.randn(nodes, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (nodes,), generator=g)
    return x, coalesce(edge_index, num_nodes=nodes), y


def worker(system: str, nodes: int, edges: int) -> dict:
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    x, edge_index, y = random_graph(nodes, edges)
    before = current_bytes() / 1024  # not ru_maxrss: building the data left temporaries above
    model = build(system, edge_index, nodes)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def epoch() -> float:
        tic = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x, edge_index), y).backward()
        optimizer.step()
        return time.perf_counter() - tic

    for _ in range(2):
        epoch()
    times = [epoch() for _ in range(5)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "epoch_s": statistics.median(times),
        "peak_mb": (peak - before) / 1024,
        "edges": int(edge_index.size(1)),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def run_worker(system: str, nodes: int, edges: int) -> dict:
    """One :func:`worker` measurement in a fresh subprocess."""
    command = [sys.executable, __file__, "--worker", system]
    command += ["--nodes", str(nodes), "--edges", str(edges)]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def measure(systems: tuple[str, ...], nodes: int, edges: int, repeats: int) -> dict[str, dict]:
    """Every system ``repeats`` times in interleaved rounds: median epoch time, largest peak."""
    runs: dict[str, list[dict]] = {system: [] for system in systems}
    for _ in range(repeats):
        for system in systems:
            runs[system].append(run_worker(system, nodes, edges))
            row = runs[system][-1]
            print(
                f"N={nodes:>6} E={row['edges']:>7} {system:14s} "
                f"{row['epoch_s'] * 1e3:9.1f} ms/epoch  peak +{row['peak_mb']:8.1f} MB",
                flush=True,
            )
    return {
        system: {
            **rows[0],
            "epoch_s": statistics.median(row["epoch_s"] for row in rows),
            "epoch_s_runs": [row["epoch_s"] for row in rows],
            "peak_mb": max(row["peak_mb"] for row in rows),
        }
        for system, rows in runs.items()
    }


def size_metrics(rows: dict[str, dict], size: str) -> dict[str, dict[str, float]]:
    """Per system at one size: epoch ms (median and range over rounds), time relative to each
    reference, peak MB."""
    return {
        system: {
            f"epoch_ms_{size}": row["epoch_s"] * 1e3,
            f"epoch_ms_{size}_min": min(row["epoch_s_runs"]) * 1e3,
            f"epoch_ms_{size}_max": max(row["epoch_s_runs"]) * 1e3,
            f"time_vs_gcn_{size}": row["epoch_s"] / rows["gcn"]["epoch_s"],
            f"time_vs_nsd_authors_{size}": row["epoch_s"] / rows["nsd_authors"]["epoch_s"],
            f"peak_mb_{size}": row["peak_mb"],
        }
        for system, row in rows.items()
    }


def claims_at(large: dict[str, dict], nodes: int) -> list[Claim]:
    """The claims, at the large size: NSD as its authors run it fits in memory, and FlatNSD's
    epoch time as a ratio to both ways of running general NSD (the measurement decides)."""
    edges = large["gcn"]["edges"]
    return [
        Claim.compare(
            f"NSD as its authors run it (Laplacian index built once, values per forward, "
            f"gather/scatter-add product) trains on {nodes} nodes and {edges} directed edges "
            f"within {MEMORY_LIMIT_MB} MB",
            large["nsd_authors"]["peak_mb"],
            "<",
            MEMORY_LIMIT_MB,
            value_label="nsd_authors peak MB",
            reference_label="limit",
        ),
        Claim.compare(
            "FlatNSD is faster per epoch than general NSD as its authors run it",
            large["flatnsd"]["epoch_s"] / large["nsd_authors"]["epoch_s"],
            "<",
            1.0,
            value_label="flatnsd / nsd_authors epoch time",
        ),
        Claim.compare(
            "FlatNSD is faster per epoch than general NSD (per-edge d×d maps) by message passing",
            large["flatnsd"]["epoch_s"] / large["nsd_general"]["epoch_s"],
            "<",
            1.0,
            value_label="flatnsd / nsd_general epoch time",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--edges", type=int, default=100_000, help="directed edges")
    parser.add_argument("--small-nodes", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds per size")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "flatnsd")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.nodes, args.edges)))
        return

    start = time.perf_counter()
    sizes = {
        "large": (args.nodes, args.edges),
        "small": (args.small_nodes, args.edges * args.small_nodes // args.nodes),
    }
    if args.repeats < 1:
        parser.error(f"--repeats must be an integer >= 1, got {args.repeats}")
    measured = {name: measure(SYSTEMS, n, e, args.repeats) for name, (n, e) in sizes.items()}
    metrics = {system: {} for system in SYSTEMS}
    for size, rows in measured.items():
        for system, row in size_metrics(rows, size).items():
            metrics[system].update(row)
    write_benchmark(
        args.out,
        method="flatnsd-benchmark",
        metrics=metrics,
        claims=claims_at(measured["large"], args.nodes),
        config={
            "sizes": {name: {"nodes": n, "directed_edges": e} for name, (n, e) in sizes.items()},
            "systems": list(SYSTEMS),
            "features": FEATURES,
            "stalk_dim": STALK,
            "channels": CHANNELS,
            "layers": LAYERS,
            "repeats": args.repeats,
            "torch_threads": torch.get_num_threads(),
        },
        started=start,
    )
    bar_plot(
        args.out / "time_vs_gcn.png",
        {system: metrics[system]["time_vs_gcn_large"] for system in SYSTEMS},
        ylabel=f"epoch time relative to GCN ({args.nodes} nodes, {args.edges} edges)",
        title="full-batch training epoch, 2 layers",
    )


if __name__ == "__main__":
    main()
