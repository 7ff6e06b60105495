"""Train any model of this package on a readout task (the prediction is read at ``target_mask``).

Every system gets the same budget: the same graphs, batches, optimiser, learning rate and epochs,
stopping early only once it fits the training set (Alon & Yahav's criterion, train accuracy
≥ ``fit_accuracy`` over an epoch).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader

from mixlab.graphs.flatnsd.config import FLAT_SYSTEMS, MP_SYSTEMS, SYSTEMS
from mixlab.graphs.flatnsd.layers import MessagePassingNet, SheafDiffusionNet
from mixlab.graphs.flatnsd.saved import (
    BUILD_KEYS,
    MODEL_FILE,
    MODEL_FORMAT,
    SIDECAR_FILE,
    read_model_info,
)
from mixlab.shared.files import CheckpointError, checkpoint_errors, write_sidecar
from mixlab.shared.progress_report import progress

DeviceLike = torch.device | str
__all__ = [
    "FLAT_SYSTEMS",
    "MP_SYSTEMS",
    "SYSTEMS",
    "TrainResult",
    "accuracy",
    "build_model",
    "load_trained",
    "save_trained",
    "train_readout",
]


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
    with progress(epochs, "training epochs") as bar:
        for epoch in range(1, epochs + 1):
            model.train()
            correct = 0
            total = 0.0
            for batch in loader:
                batch = batch.to(device)
                optimizer.zero_grad()
                logits = model(batch.x, batch.edge_index)[batch.target_mask]
                loss = F.cross_entropy(logits, batch.y)
                loss.backward()
                optimizer.step()
                correct += int((logits.argmax(-1) == batch.y).sum())
                total += loss.item() * len(batch.y)
            if on_epoch:
                history.append(on_epoch(epoch, model))
            bar.advance(loss=total / len(train), accuracy=correct / len(train))
            if correct / len(train) >= fit_accuracy:
                break
    train_accuracy = accuracy(model, train, device=device)
    return TrainResult(train_accuracy, accuracy(model, test, device=device), epoch, history)


def save_trained(network: nn.Module, folder: str | os.PathLike[str], info: dict[str, Any]) -> Path:
    """Save ``network`` as ``folder/model.safetensors`` and ``info`` (``model`` and the integers
    ``in_channels``, ``classes``, ``layers``, ``width``, ``stalk_dim`` that rebuild it, plus any
    measurements) as the sidecar ``folder/metrics.json``, which records the weights' SHA-256 and
    is written last. Returns the sidecar's path."""
    from safetensors.torch import save_file

    missing = [key for key in ("model", *BUILD_KEYS) if key not in info]
    if missing:
        raise ValueError(f"info must have the keys {missing} that rebuild the model")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sidecar, weights = folder / SIDECAR_FILE, folder / MODEL_FILE
    sidecar.unlink(missing_ok=True)  # never leave an older sidecar beside newer weights
    partial = folder / f".{MODEL_FILE}.partial"
    state = {
        name: tensor.detach().cpu().contiguous() for name, tensor in network.state_dict().items()
    }
    save_file(state, str(partial))
    os.replace(partial, weights)
    write_sidecar(sidecar, {**info, "format": MODEL_FORMAT}, covers=[weights])
    return sidecar


def load_trained(folder: str | os.PathLike[str]) -> tuple[nn.Module, dict[str, Any]]:
    """``(network, info)`` saved by :func:`save_trained` (``mixlab-graphs flatnsd train``).

    A missing, foreign, truncated or edited model folder raises :class:`CheckpointError` naming
    the file (the sidecar's SHA-256 covers the weights and its own content)."""
    folder = Path(folder)
    sidecar, weights = folder / SIDECAR_FILE, folder / MODEL_FILE
    info = read_model_info(folder)
    with checkpoint_errors(sidecar, "saved flatnsd model"):
        network = build_model(info["model"], *(info[key] for key in BUILD_KEYS))
    from safetensors.torch import load_file

    with checkpoint_errors(weights, "flatnsd model weights"):
        state = load_file(str(weights))
        try:
            network.load_state_dict(state)
        except RuntimeError as error:  # missing, unexpected or mis-shaped tensors
            raise CheckpointError(
                f"{weights}: does not fit the {info['model']} model that {SIDECAR_FILE} describes "
                f"({' '.join(str(error).split())[:200]})"
            ) from error
    return network, info
