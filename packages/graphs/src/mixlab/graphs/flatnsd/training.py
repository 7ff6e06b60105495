"""Train any model of this package on a readout task (the prediction is read at ``target_mask``).

Every system gets the same budget: the same graphs, batches, optimiser, learning rate and epochs,
stopping early only once it fits the training set (Alon & Yahav's criterion, train accuracy
≥ ``fit_accuracy`` over an epoch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader

from mixlab.graphs.flatnsd.layers import MessagePassingNet, SheafDiffusionNet

DeviceLike = torch.device | str

SYSTEMS = {
    # name: (family, options)
    "gcn": ("mp", {"conv": "gcn"}),
    "gin": ("mp", {"conv": "gin"}),
    "gat": ("mp", {"conv": "gat"}),
    "nsd_diag": ("sheaf", {"sheaf": "diag"}),
    "nsd_bundle": ("sheaf", {"sheaf": "bundle"}),
    "nsd_general": ("sheaf", {"sheaf": "general"}),
    "flatnsd": ("sheaf", {"sheaf": "flat"}),
    "flatnsd_heat": ("sheaf", {"sheaf": "flat", "update": "heat"}),
}
FLAT_SYSTEMS = ("flatnsd", "flatnsd_heat")
MP_SYSTEMS = tuple(name for name, (family, _) in SYSTEMS.items() if family == "mp")


def build_model(
    system: str, in_channels: int, out_channels: int, num_layers: int, width: int, stalk_dim: int
) -> nn.Module:
    """One system by name; ``width`` is the hidden size (message passing) or the channels f per
    stalk dimension (sheaf models, hidden size d·f)."""
    if system not in SYSTEMS:
        raise ValueError(f"system must be one of {sorted(SYSTEMS)}, got {system!r}")
    family, options = SYSTEMS[system]
    if family == "mp":
        return MessagePassingNet(
            in_channels, out_channels, hidden=width, num_layers=num_layers, **options
        )
    return SheafDiffusionNet(
        in_channels,
        out_channels,
        stalk_dim=stalk_dim,
        channels=width,
        num_layers=num_layers,
        **options,
    )


@dataclass
class TrainResult:
    train_accuracy: float
    test_accuracy: float | None
    """None without test graphs"""
    epochs: int
    history: list[dict[str, float]] = field(default_factory=list)


def accuracy(
    model: nn.Module, graphs: Sequence[Data], batch_size: int = 512, device: DeviceLike = "cpu"
) -> float | None:
    """Share of graphs whose target node is classified right (None for no graphs)."""
    if not graphs:
        return None
    model.eval()
    correct = 0
    with torch.no_grad():
        for batch in DataLoader(list(graphs), batch_size=batch_size):
            batch = batch.to(device)
            logits = model(batch.x, batch.edge_index)[batch.target_mask]
            correct += int((logits.argmax(-1) == batch.y).sum())
    return correct / len(graphs)


def train_readout(
    model: nn.Module,
    train: Sequence[Data],
    test: Sequence[Data],
    *,
    epochs: int,
    lr: float = 3e-3,
    batch_size: int = 64,
    seed: int = 0,
    fit_accuracy: float = 0.999,
    on_epoch: Callable[[int, nn.Module], dict[str, float]] | None = None,
    device: DeviceLike = "cpu",
) -> TrainResult:
    """Adam on cross-entropy at the target node, on ``device``; ``on_epoch(epoch, model)`` may
    record numbers (epoch 0 is before training) into ``history``."""
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(list(train), batch_size=batch_size, shuffle=True, generator=generator)
    history = [on_epoch(0, model)] if on_epoch else []
    epoch = 0
    for epoch in range(1, epochs + 1):
        model.train()
        correct = 0
        for batch in loader:
            batch = batch.to(device)
            optimizer.zero_grad()
            logits = model(batch.x, batch.edge_index)[batch.target_mask]
            loss = F.cross_entropy(logits, batch.y)
            loss.backward()
            optimizer.step()
            correct += int((logits.argmax(-1) == batch.y).sum())
        if on_epoch:
            history.append(on_epoch(epoch, model))
        if correct / len(train) >= fit_accuracy:
            break
    train_accuracy = accuracy(model, train, device=device)
    return TrainResult(train_accuracy, accuracy(model, test, device=device), epoch, history)
