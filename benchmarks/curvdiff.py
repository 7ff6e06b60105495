"""Benchmark: training-step time and sampling throughput of CurvDiff against the DiGress-style
baseline and E-only latent diffusion, at 20, 64 and 128 nodes.

    uv run python benchmarks/curvdiff.py                  # -> benchmarks/results/curvdiff/
    uv run python benchmarks/curvdiff.py --nodes 20 64 --out /tmp/bench

Systems at the quick experiment's sizes (DiGress-style's width matched to CurvDiff's parameter
count, as in the experiment):

- ``curvdiff``: H×S×E latents with Ricci gating and c(G) conditioning (guidance w = 1, so two
  denoiser passes per sampling step);
- ``E``: Euclidean latents, no Ricci prior (one pass per step);
- ``digress``: discrete marginal-transition diffusion on the N×N edge set.

Per size: hetero-within graphs of exactly N nodes; the median time of one optimiser step of the
diffusion model (batch of 8 graphs; CurvDiff's autoencoder step is reported on its own), and
graphs generated per second (8 graphs, 50 diffusion steps, decoding included). Every figure is
measured in this run, one system after the other on one thread, and reported as a ratio to
DiGress-style (the fastest published peer) and to E-only.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch_geometric.data import Batch

from mixlab.graphs.curvdiff.config import Config
from mixlab.graphs.curvdiff.datasets import hetero_within
from mixlab.graphs.curvdiff.experiment import digress_model, latent_model
from mixlab.graphs.curvdiff.model import dense_adjacency, with_curvature
from mixlab.shared import Claim, median_seconds
from mixlab.shared.result import write_benchmark

SYSTEMS = ("curvdiff", "E", "digress")
BATCH, SAMPLING_STEPS, REPEATS = 8, 50, 5


def measure(system: str, nodes: int) -> dict[str, float]:
    config = Config(diffusion_steps=SAMPLING_STEPS, diffusion_iterations=1, ae_epochs=1)
    graphs = with_curvature(hetero_within(BATCH, seed=0, min_nodes=nodes, max_nodes=nodes))
    torch.manual_seed(0)
    if system == "digress":
        model = digress_model(config)
        model.fit(graphs, seed=0)  # one step: builds the network and its size table
        diffusion = model.model.train()
        adjacency, mask = dense_adjacency(graphs)
        optimizer = torch.optim.Adam(diffusion.parameters(), lr=1e-3)

        def train_step() -> None:
            loss = diffusion.loss(adjacency, mask)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        autoencoder_step = None
    else:
        model = latent_model(config, system)
        model.config.max_nodes = max(model.config.max_nodes, nodes)
        model.fit(graphs, seed=0)
        u, mask = model.encode(graphs)
        diffusion = model.diffusion.train()
        descriptors = torch.cat([g.curvature_descriptor for g in graphs])
        cond = descriptors if model.config.ricci_conditioning else None
        optimizer = torch.optim.Adam(diffusion.parameters(), lr=1e-3)
        ae_optimizer = torch.optim.Adam(model.autoencoder.parameters(), lr=1e-3)
        batch = Batch.from_data_list(graphs)

        def train_step() -> None:
            loss = diffusion.loss(u, mask, cond)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        def ae_step() -> None:
            loss, _ = model.autoencoder.loss(batch)
            ae_optimizer.zero_grad()
            loss.backward()
            ae_optimizer.step()

        autoencoder_step = median_seconds(ae_step, REPEATS)
    step = median_seconds(train_step, REPEATS)
    sampling = median_seconds(lambda: model.sample(BATCH, seed=0), 2)
    return {
        "train_step_ms": 1000 * step,
        "autoencoder_step_ms": None if autoencoder_step is None else 1000 * autoencoder_step,
        "graphs_per_s": BATCH / sampling,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[20, 64, 128])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/curvdiff"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    metrics: dict[str, dict[str, float | None]] = {}
    for nodes in args.nodes:
        rows = {system: measure(system, nodes) for system in SYSTEMS}
        for system, row in rows.items():
            for reference in ("digress", "E"):
                row[f"step_time_vs_{reference}"] = (
                    row["train_step_ms"] / rows[reference]["train_step_ms"]
                )
                row[f"throughput_vs_{reference}"] = (
                    row["graphs_per_s"] / rows[reference]["graphs_per_s"]
                )
            metrics[f"n{nodes}/{system}"] = row
            print(f"n={nodes} {system}: {row}")
    largest = max(args.nodes)
    ours, theirs = metrics[f"n{largest}/curvdiff"], metrics[f"n{largest}/digress"]
    claims = [
        Claim.compare(
            f"At {largest} nodes a CurvDiff diffusion training step is faster than DiGress-style's "
            "(node latents are O(N·d), DiGress's edge states O(N²·width))",
            ours["train_step_ms"],
            "<",
            theirs["train_step_ms"],
            value_label="CurvDiff ms/step",
            reference_label="DiGress-style ms/step",
        ),
        Claim.compare(
            f"At {largest} nodes CurvDiff samples more graphs per second than DiGress-style",
            ours["graphs_per_s"],
            ">",
            theirs["graphs_per_s"],
            value_label="CurvDiff graphs/s",
            reference_label="DiGress-style graphs/s",
        ),
    ]
    write_benchmark(
        args.out,
        method="curvdiff",
        metrics=metrics,
        claims=claims,
        config={"nodes": args.nodes, "batch": BATCH, "sampling_steps": SAMPLING_STEPS},
        started=started,
    )


if __name__ == "__main__":
    main()
