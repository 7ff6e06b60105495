"""Benchmark: training-epoch time and inference throughput (mixtures embedded per second) of
MixScentNet's GATv2 mixture graph against mean pooling and POMMix-style self-attention.

    uv run python benchmarks/mixscentnet.py                      # -> benchmarks/results/mixscentnet/
    uv run python benchmarks/mixscentnet.py --data FOLDER --out /tmp/bench

Data: the published mixtures (``--data``, default ``../shared/data/olfaction``): 865 pairs over
mixtures of 1–43 components. Every system has the quick experiment's encoder (GATv2 node attention,
hidden 64, embedding 96, 3 layers) and mixture width (16), and differs only in the aggregator:

- ``mixscentnet``: 2 GATv2 layers on the complete component graph (O(n²) edges per mixture);
- ``mean-pool``: an MLP per component and the mean (the fastest peer);
- ``pommix``: CheMix self-attention over components and attention pooling.

An epoch is one full-batch optimiser step on the random split's training pairs (fold 0): the
component table is encoded, every training mixture embedded, the MAE backpropagated (the
experiment takes the epoch in mini-batches of 128 pairs, each encoding the table again). Throughput embeds every mixture once without gradients. Median of repeated calls,
one system after the other on one thread in this run; figures are ratios to mean pooling and to
POMMix-style.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from mixlab.graphs.mixscentnet.config import Config
from mixlab.graphs.mixscentnet.data import load_mixture_pairs, split_pairs
from mixlab.graphs.mixscentnet.model import MixScentNet, MoleculeEncoder
from mixlab.graphs.mixscentnet.training import FeaturizedMixtures, _pair_inputs
from mixlab.shared import Claim, median_seconds
from mixlab.shared.result import write_benchmark

SYSTEMS = {"mixscentnet": "graph", "mean-pool": "mean", "pommix": "attention"}
REPEATS = 7


def measure(aggregator: str, features: FeaturizedMixtures, pairs, distance) -> dict[str, float]:
    config = Config()
    torch.manual_seed(0)
    encoder = MoleculeEncoder(config.hidden, config.embedding, config.layers, config.encoder)
    model = MixScentNet(encoder, aggregator, width=config.mixture_width)
    inputs = _pair_inputs(features, pairs, torch.device("cpu"))
    target = torch.as_tensor(distance, dtype=torch.float)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def epoch() -> None:
        loss = F.l1_loss(model(*inputs), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    everything = features.batch(range(len(features)))

    @torch.no_grad()
    def embed() -> None:
        model.embed(features.molecules, everything)

    model.train()
    epoch_s = median_seconds(epoch, REPEATS)
    model.eval()
    embed_s = median_seconds(embed, REPEATS)
    return {
        "epoch_ms": 1000 * epoch_s,
        "mixtures_per_s": len(features) / embed_s,
        "parameters": float(sum(p.numel() for p in model.parameters())),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/olfaction"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mixscentnet"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    data = load_mixture_pairs(args.data)
    train, _ = split_pairs(data, "random", 0)
    features = FeaturizedMixtures(data.mixtures)
    rows = {
        name: measure(aggregator, features, data.pairs[train], data.distance[train])
        for name, aggregator in SYSTEMS.items()
    }
    for row in rows.values():
        for reference in ("mean-pool", "pommix"):
            row[f"epoch_time_vs_{reference}"] = row["epoch_ms"] / rows[reference]["epoch_ms"]
            row[f"throughput_vs_{reference}"] = (
                row["mixtures_per_s"] / rows[reference]["mixtures_per_s"]
            )
    for name, row in rows.items():
        print(f"{name}: {row}")
    ours = rows["mixscentnet"]
    claims = [
        Claim.compare(
            "A MixScentNet training epoch costs at most 2× a POMMix-style epoch on the same "
            "encoder",
            ours["epoch_time_vs_pommix"], "<=", 2.0,
            value_label="MixScentNet / POMMix-style epoch time",
        ),
        Claim.compare(
            "MixScentNet embeds at least half as many mixtures per second as mean pooling",
            ours["throughput_vs_mean-pool"], ">=", 0.5,
            value_label="MixScentNet / mean-pooling mixtures per second",
        ),
    ]  # fmt: skip
    write_benchmark(
        args.out,
        method="mixscentnet",
        metrics=rows,
        claims=claims,
        config={
            "data": str(args.data),
            "mixtures": len(features),
            "training_pairs": len(train),
            "components": len(features.components),
            "repeats": REPEATS,
        },
        started=started,
    )


if __name__ == "__main__":
    main()
