"""Training loops of MixScentNet: Mordred pretraining, odour-label training, and end-to-end
distance fine-tuning with early stopping, plus the metrics they report.

All loops are full-batch over the training items they are given (the mixture sets hold under a
thousand pairs; POMMix uses batches of 500), seeded, and restore the weights of the best
validation step (early stopping with ``patience`` evaluations).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.data import Batch

from mixlab.graphs.mixscentnet.featurize import ecfp4, smiles_to_data, tanimoto
from mixlab.graphs.mixscentnet.model import MixScentNet, MixtureGraph, MoleculeEncoder
from mixlab.shared.progress_report import progress

__all__ = [
    "FeaturizedMixtures",
    "LabelModel",
    "MordredPretrainer",
    "distance_metrics",
    "embed_mixtures",
    "fit_distance",
    "macro_auroc",
    "median_r2",
    "predict_distance",
]


def _validation_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    held = max(1, round(fraction * n)) if n > 1 and fraction > 0 else 0
    return np.sort(order[held:]), np.sort(order[:held])


def _batches(graphs: Sequence, size: int) -> list[Batch]:
    return [Batch.from_data_list(graphs[i : i + size]) for i in range(0, len(graphs), size)]


class _EarlyStopping:
    """Keeps the weights of the best validation error seen; :meth:`step` says to stop after
    ``patience`` evaluations without an improvement larger than ``min_delta``."""

    def __init__(self, module: nn.Module, patience: int, min_delta: float) -> None:
        self.module, self.patience, self.min_delta = module, patience, min_delta
        self.best, self.state, self.waited = np.inf, copy.deepcopy(module.state_dict()), 0
        self.evaluations = self.best_evaluation = 0

    def step(self, error: float) -> bool:
        self.evaluations += 1
        if error < self.best - self.min_delta:
            self.best, self.state, self.waited = error, copy.deepcopy(self.module.state_dict()), 0
            self.best_evaluation = self.evaluations
            return False
        self.waited += 1
        return self.waited >= self.patience

    def restore(self) -> None:
        self.module.load_state_dict(self.state)


class FeaturizedMixtures:
    """Mixtures ready for the network: the component table (one ``Batch`` of the distinct
    molecules) and one :class:`MixtureGraph` per mixture."""

    def __init__(
        self,
        mixtures: Sequence[tuple[str, ...]],
        concentrations: Sequence[tuple[float, ...] | None] | None = None,
    ) -> None:
        if any(len(m) == 0 for m in mixtures):
            raise ValueError("every mixture needs at least one component")
        concentrations = concentrations or [None] * len(mixtures)
        self.components = sorted({s for m in mixtures for s in m})
        index = {s: i for i, s in enumerate(self.components)}
        self.molecules = Batch.from_data_list([smiles_to_data(s) for s in self.components])
        transform = MixtureGraph(tanimoto(ecfp4(self.components)))
        self.graphs = [
            transform([index[s] for s in m], c)
            for m, c in zip(mixtures, concentrations, strict=True)
        ]

    def __len__(self) -> int:
        return len(self.graphs)

    def batch(self, mixtures: np.ndarray | Sequence[int]) -> Batch:
        return Batch.from_data_list([self.graphs[i] for i in mixtures])


def _pair_inputs(
    features: FeaturizedMixtures, pairs: np.ndarray, device: torch.device
) -> tuple[Batch, Batch, Tensor]:
    """The component table, the batch of the mixtures ``pairs`` use, and the pairs re-indexed
    into that batch."""
    used, inverse = np.unique(pairs, return_inverse=True)
    local = torch.as_tensor(inverse.reshape(pairs.shape), dtype=torch.long, device=device)
    return features.molecules.to(device), features.batch(used).to(device), local


@torch.no_grad()
def predict_distance(
    model: MixScentNet, features: FeaturizedMixtures, pairs: np.ndarray
) -> np.ndarray:
    """Predicted distances (P,) of ``pairs`` (P, 2) of mixture indices."""
    if len(pairs) == 0:
        return np.zeros(0)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = model(*_pair_inputs(features, np.asarray(pairs), device)).cpu().numpy()
    model.train(was_training)
    return out.astype(np.float64)


@torch.no_grad()
def embed_mixtures(
    model: MixScentNet, features: FeaturizedMixtures, mixtures: Sequence[int]
) -> np.ndarray:
    """Mixture embeddings (M, width) of the mixtures ``mixtures``."""
    device = next(model.parameters()).device
    model.eval()
    z = model.embed(features.molecules.to(device), features.batch(list(mixtures)).to(device))
    return z.cpu().numpy()


def fit_distance(
    model: MixScentNet,
    features: FeaturizedMixtures,
    pairs: np.ndarray,
    distance: np.ndarray,
    *,
    steps: int = 300,
    lr: float = 1e-3,
    encoder_lr: float | None = None,
    weight_decay: float = 0.0,
    validation: float = 0.1,
    eval_every: int = 5,
    patience: int = 10,
    min_delta: float = 1e-5,
    batch_size: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Fine-tune ``model`` end to end on the mean absolute error of ``distance`` (POMMix's loss)
    over ``pairs``, holding out ``validation`` of them for early stopping. ``encoder_lr`` (default
    ``lr``) sets the encoder's rate: a pretrained encoder usually wants a smaller one.
    ``batch_size``: at most this many pairs per step, drawn without replacement epoch by epoch in
    batches of near-equal size (None: every training pair each step). A step embeds only the mixtures its pairs use, so on large mixtures a
    mini-batch costs about its share of a full-batch step and takes as large a step.

    Every ``eval_every`` steps the validation MAE is measured; training stops after ``patience``
    measurements that do not improve on the best by more than ``min_delta``, and the best
    weights are restored. Returns the per-step training loss (``train``; its length is the steps
    run), the validation MAEs (``validation``) and ``best_step``, the step of the kept weights."""
    torch.manual_seed(seed)
    device = next(model.parameters()).device
    train, held = _validation_split(len(pairs), validation, seed)
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1 or None, got {batch_size!r}")
    full = batch_size is None or batch_size >= len(train)
    inputs = _pair_inputs(features, pairs[train], device) if full else None
    target = torch.as_tensor(distance[train], dtype=torch.float, device=device)
    generator = np.random.default_rng(seed)
    order: list[np.ndarray] = []
    groups = [
        {"params": model.encoder.parameters(), "lr": lr if encoder_lr is None else encoder_lr},
        {"params": [p for n, p in model.named_parameters() if not n.startswith("encoder.")]},
    ]
    optimizer = torch.optim.Adam(groups, lr=lr, weight_decay=weight_decay)
    history: dict[str, Any] = {"train": [], "validation": []}
    stopping = _EarlyStopping(model, patience, min_delta=min_delta)
    evaluated_at: list[int] = []
    model.train()
    with progress(steps, "distance steps") as bar:
        for step in range(1, steps + 1):
            if full:
                loss = F.l1_loss(model(*inputs), target)
            else:
                if not order:  # a new epoch: the training pairs in a fresh order, in batches
                    # of near-equal size (155 pairs make 78 + 77, not 128 + a noisy 27)
                    shuffled = generator.permutation(len(train))
                    order = np.array_split(shuffled, math.ceil(len(train) / batch_size))
                chosen = order.pop()
                loss = F.l1_loss(
                    model(*_pair_inputs(features, pairs[train][chosen], device)), target[chosen]
                )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            history["train"].append(loss.item())
            bar.advance(loss=history["train"][-1])
            if len(held) and (step % eval_every == 0 or step == steps):
                error = float(
                    np.abs(predict_distance(model, features, pairs[held]) - distance[held]).mean()
                )
                history["validation"].append(error)
                evaluated_at.append(step)
                if stopping.step(error):
                    break
    history["best_step"] = len(history["train"])
    if len(held):
        stopping.restore()
        best = stopping.best_evaluation  # 0: no finite validation error, the initial weights
        history["best_step"] = evaluated_at[best - 1] if best else 0
    model.eval()
    return history


def distance_metrics(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """Pearson r, RMSE and Kendall τ (DREAM 2024, POMMix); a constant prediction has r = τ = 0."""
    from scipy.stats import kendalltau, pearsonr

    predicted, measured = np.asarray(predicted, float), np.asarray(measured, float)
    constant = np.ptp(predicted) < 1e-12 or np.ptp(measured) < 1e-12
    return {
        "pearson": 0.0 if constant else float(pearsonr(predicted, measured)[0]),
        "rmse": float(np.sqrt(np.mean((predicted - measured) ** 2))),
        "kendall": 0.0 if constant else float(kendalltau(predicted, measured)[0]),
    }


# ------------------------------------------------------------------------- molecule-level tasks
class _EncoderWithHead(nn.Module):
    """Encoder + a 2-layer MLP head (POM's readout MLP); the head is dropped after pretraining."""

    def __init__(self, encoder: MoleculeEncoder, outputs: int, hidden: int = 256) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Sequential(
            nn.ReLU(), nn.Linear(encoder.out_dim, hidden), nn.ReLU(), nn.Linear(hidden, outputs)
        )

    def forward(self, molecules: Batch) -> Tensor:
        return self.head(self.encoder(molecules))


def _fit_molecules(
    network: _EncoderWithHead,
    smiles: Sequence[str],
    targets: np.ndarray,
    loss_fn,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    validation: float,
    patience: int,
    seed: int,
    description: str = "epochs",
) -> dict[str, list[float]]:
    """Mini-batch training of encoder + head on per-molecule targets with early stopping;
    ``description`` names the loop in the progress display."""
    torch.manual_seed(seed)
    device = next(network.parameters()).device
    train, held = _validation_split(len(smiles), validation, seed)
    graphs = [smiles_to_data(s) for s in smiles]
    y = torch.as_tensor(targets, dtype=torch.float)
    held_batches = _batches([graphs[i] for i in held], 512)
    optimizer = torch.optim.Adam(network.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    history: dict[str, list[float]] = {"train": [], "validation": []}
    stopping = _EarlyStopping(network, patience, min_delta=1e-6)
    with progress(epochs, description) as bar:
        for _ in range(epochs):
            network.train()
            order = train[torch.randperm(len(train), generator=generator).numpy()]
            total = 0.0
            for start in range(0, len(order), batch_size):
                chunk = order[start : start + batch_size]
                batch = Batch.from_data_list([graphs[i] for i in chunk]).to(device)
                loss = loss_fn(network(batch), y[chunk].to(device))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += loss.item() * len(chunk)
            history["train"].append(total / max(len(train), 1))
            if not len(held):
                bar.advance(loss=history["train"][-1])
                continue
            network.eval()
            with torch.no_grad():
                out = torch.cat([network(b.to(device)).cpu() for b in held_batches])
            error = loss_fn(out, y[held]).item()
            history["validation"].append(error)
            bar.advance(loss=history["train"][-1], validation=error)
            if stopping.step(error):
                break
    if len(held):
        stopping.restore()
    network.eval()
    return history


@torch.no_grad()
def _predict_molecules(network: nn.Module, smiles: Sequence[str]) -> np.ndarray:
    device = next(network.parameters()).device
    network.eval()
    graphs = [smiles_to_data(s) for s in smiles]
    outputs = [network(b.to(device)).cpu() for b in _batches(graphs, 512)]
    return torch.cat(outputs).numpy() if outputs else np.zeros((0, 0))


class MordredPretrainer:
    """Self-supervised pretraining: regress robust-z Mordred 2D descriptors
    (:func:`~mixlab.graphs.mixscentnet.featurize.mordred_targets`) from the encoder's molecule
    embedding through a 2-layer head, with the Huber loss (robust to the targets' clipped
    tails). After :meth:`fit`, ``encoder`` holds the pretrained weights."""

    def __init__(self, encoder: MoleculeEncoder, num_targets: int) -> None:
        self.network = _EncoderWithHead(encoder, num_targets)
        self.encoder = encoder

    def fit(
        self, smiles: Sequence[str], targets: np.ndarray, *, epochs: int = 30, lr: float = 1e-3,
        batch_size: int = 128, validation: float = 0.1, patience: int = 5, seed: int = 0,
    ) -> dict[str, list[float]]:  # fmt: skip
        return _fit_molecules(
            self.network, smiles, targets, F.huber_loss, epochs=epochs, lr=lr,
            batch_size=batch_size, validation=validation, patience=patience, seed=seed,
            description="Mordred pretraining epochs",
        )  # fmt: skip

    def predict(self, smiles: Sequence[str]) -> np.ndarray:
        return _predict_molecules(self.network, smiles)


class LabelModel:
    """Odour labels from a molecule encoder: a 2-layer multi-label head trained with BCE (POM's
    GS-LF task, and POMMix's encoder pretraining)."""

    def __init__(self, encoder: MoleculeEncoder, num_labels: int) -> None:
        self.network = _EncoderWithHead(encoder, num_labels)
        self.encoder = encoder

    def fit(
        self, smiles: Sequence[str], labels: np.ndarray, *, epochs: int = 30, lr: float = 1e-3,
        batch_size: int = 128, validation: float = 0.1, patience: int = 5, seed: int = 0,
    ) -> dict[str, list[float]]:  # fmt: skip
        return _fit_molecules(
            self.network, smiles, labels, F.binary_cross_entropy_with_logits, epochs=epochs,
            lr=lr, batch_size=batch_size, validation=validation, patience=patience, seed=seed,
            description="label epochs",
        )  # fmt: skip

    def predict_proba(self, smiles: Sequence[str]) -> np.ndarray:
        return 1 / (1 + np.exp(-_predict_molecules(self.network, smiles)))


def median_r2(predicted: np.ndarray, targets: np.ndarray) -> float:
    """The median over targets of the coefficient of determination on held-out molecules."""
    residual = ((targets - predicted) ** 2).sum(axis=0)
    total = ((targets - targets.mean(axis=0)) ** 2).sum(axis=0)
    keep = total > 0
    return float(np.median(1 - residual[keep] / total[keep]))


def macro_auroc(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """Mean ROC AUC over the labels with both classes present in ``labels``."""
    from sklearn.metrics import roc_auc_score

    keep = [j for j in range(labels.shape[1]) if 0 < labels[:, j].sum() < len(labels)]
    if not keep:
        raise ValueError("macro_auroc needs a label with both classes among the molecules")
    return float(np.mean([roc_auc_score(labels[:, j], probabilities[:, j]) for j in keep]))
