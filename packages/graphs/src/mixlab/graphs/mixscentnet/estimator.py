"""``MixtureDistanceModel``: MixScentNet as a scikit-learn-style estimator on your own mixtures.

    model = MixtureDistanceModel().pretrain(smiles, cache_dir="~/.cache/mixscentnet")
    model.fit(mixtures, pairs, distances)            # mixtures: tuples of SMILES
    model.predict(new_mixtures, new_pairs)           # distances in [0, 1]
    model.save("runs/model"); MixtureDistanceModel.load("runs/model")

Any SMILES works at prediction time: the encoder reads molecules, not a fixed vocabulary.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixlab.graphs.mixscentnet.featurize import mordred_targets
from mixlab.graphs.mixscentnet.model import AGGREGATORS, ENCODERS, MixScentNet, MoleculeEncoder
from mixlab.graphs.mixscentnet.training import (
    FeaturizedMixtures,
    MordredPretrainer,
    embed_mixtures,
    fit_distance,
    predict_distance,
)
from mixlab.shared.config import is_count, require
from mixlab.shared.device import resolve_device

__all__ = ["MixtureDistanceModel", "ModelConfig"]

Mixtures = Sequence[Sequence[str]]
Concentrations = Sequence[Sequence[float] | None] | None

WEIGHTS = "model.safetensors"
"""the file :meth:`MixtureDistanceModel.save` writes the weights to"""


@dataclass
class ModelConfig:
    """Architecture and training budget of a :class:`MixtureDistanceModel`."""

    encoder: str = "gatv2"
    aggregator: str = "graph"
    hidden: int = 64
    embedding: int = 96
    mixture_width: int = 32
    layers: int = 3
    pretrain_epochs: int = 60
    steps: int = 1000
    """the step budget of :meth:`MixtureDistanceModel.fit`; early stopping usually ends it first"""
    lr: float = 2e-3
    encoder_lr: float = 3e-4
    batch_size: int | None = 128
    """pairs per step (None: every training pair each step)"""
    patience: int = 10
    """validation checks (every 5 steps, on 10 % of the pairs) without improvement before
    :meth:`MixtureDistanceModel.fit` stops"""
    min_delta: float = 2e-3
    """the smallest fall of the validation MAE that counts as an improvement"""

    def __post_init__(self) -> None:
        require(self.encoder in ENCODERS, "encoder", f"one of {list(ENCODERS)}", self.encoder)
        require(
            self.aggregator in AGGREGATORS,
            "aggregator",
            f"one of {list(AGGREGATORS)}",
            self.aggregator,
        )
        if self.batch_size is not None:
            require(is_count(self.batch_size), "batch_size", "an integer >= 1 or None",
                    self.batch_size)  # fmt: skip
        ok = isinstance(self.min_delta, int | float) and self.min_delta >= 0
        require(ok, "min_delta", "a number >= 0", self.min_delta)
        names = ("hidden", "embedding", "mixture_width", "layers", "pretrain_epochs", "steps",
                 "patience")  # fmt: skip
        for name in names:
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        for name in ("hidden", "embedding", "mixture_width"):
            require(
                getattr(self, name) % 4 == 0,
                name,
                "a multiple of 4 (attention heads)",
                getattr(self, name),
            )
        for name in ("lr", "encoder_lr"):
            value = getattr(self, name)
            require(isinstance(value, int | float) and value > 0, name, "a number > 0", value)


def _as_mixtures(mixtures: Mixtures) -> list[tuple[str, ...]]:
    out = []
    for i, mixture in enumerate(mixtures):
        if isinstance(mixture, str) or len(mixture) == 0:
            raise ValueError(
                f"mixtures[{i}] must be a non-empty sequence of SMILES, got {mixture!r}"
            )
        out.append(tuple(mixture))
    return out


def _as_pairs(pairs: np.ndarray | Sequence[Sequence[int]], count: int) -> np.ndarray:
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if len(pairs) and (pairs.min() < 0 or pairs.max() >= count):
        raise ValueError(f"pairs must index the {count} mixtures (0 … {count - 1})")
    return pairs


class MixtureDistanceModel:
    """Perceptual distance between odour mixtures (see the module docstring)."""

    def __init__(self, device: str = "auto", seed: int = 0, **options) -> None:
        self.config = ModelConfig(**options)
        self.device, self.seed = resolve_device(device), seed
        torch.manual_seed(seed)
        c = self.config
        encoder = MoleculeEncoder(c.hidden, c.embedding, c.layers, c.encoder)
        self.network = MixScentNet(encoder, c.aggregator, width=c.mixture_width).to(self.device)
        self.history: dict[str, Any] = {}

    def pretrain(
        self, smiles: Sequence[str], cache_dir: str | os.PathLike[str], workers: int = 1
    ) -> MixtureDistanceModel:
        """Mordred pretraining of the encoder on ``smiles`` (no labels); descriptors cached in
        ``cache_dir``."""
        smiles = list(dict.fromkeys(smiles))
        if len(smiles) < 10:
            raise ValueError(f"smiles: pretraining needs at least 10 molecules, got {len(smiles)}")
        targets, _ = mordred_targets(smiles, Path(cache_dir).expanduser(), workers=workers)
        pretrainer = MordredPretrainer(self.network.encoder, targets.shape[1])
        pretrainer.network.to(self.device)
        self.history["pretrain"] = pretrainer.fit(
            smiles, targets, epochs=self.config.pretrain_epochs, seed=self.seed
        )["validation"]
        return self

    def fit(
        self, mixtures: Mixtures, pairs, distance, concentrations: Concentrations = None
    ) -> MixtureDistanceModel:
        """Fine-tune end to end on measured ``distance`` (in [0, 1]) of ``pairs`` of mixtures."""
        mixtures = _as_mixtures(mixtures)
        pairs = _as_pairs(pairs, len(mixtures))
        distance = np.asarray(distance, dtype=np.float64).reshape(-1)
        if len(distance) != len(pairs) or len(pairs) < 2:
            raise ValueError(
                f"distance: need one value per pair and >= 2 pairs, got {len(distance)} for {len(pairs)}"
            )
        if not np.all((distance >= 0) & (distance <= 1)):
            raise ValueError("distance: values must lie in [0, 1]")
        features = FeaturizedMixtures(mixtures, concentrations)
        c = self.config
        self.history |= fit_distance(
            self.network, features, pairs, distance, steps=c.steps, lr=c.lr,
            encoder_lr=c.encoder_lr, batch_size=c.batch_size, patience=c.patience,
            min_delta=c.min_delta, seed=self.seed,
        )  # fmt: skip
        return self

    def predict(
        self, mixtures: Mixtures, pairs, concentrations: Concentrations = None
    ) -> np.ndarray:
        """Predicted distances (P,) of ``pairs`` of ``mixtures``."""
        mixtures = _as_mixtures(mixtures)
        features = FeaturizedMixtures(mixtures, concentrations)
        return predict_distance(self.network, features, _as_pairs(pairs, len(mixtures)))

    def embed(self, mixtures: Mixtures, concentrations: Concentrations = None) -> np.ndarray:
        """Mixture embeddings (M, mixture_width)."""
        mixtures = _as_mixtures(mixtures)
        features = FeaturizedMixtures(mixtures, concentrations)
        return embed_mixtures(self.network, features, range(len(mixtures)))

    def save(self, folder: str | os.PathLike[str]) -> Path:
        """``model.safetensors`` (the weights) and ``config.json`` (the options) into ``folder``,
        each written to a temporary file and renamed into place, so a kill leaves the earlier
        file or the new one (no pickle: DESIGN.md's safetensors + JSON; issue 80). Other files
        in ``folder`` are left alone."""
        from safetensors.torch import save_file

        from mixlab.shared.files import write_json_atomic

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.network.state_dict().items()}
        partial = folder / f".{WEIGHTS}.partial"
        save_file(state, str(partial))
        os.replace(partial, folder / WEIGHTS)
        write_json_atomic(folder / "config.json", {**asdict(self.config), "seed": self.seed},
                          indent=1)  # fmt: skip
        return folder

    @classmethod
    def load(cls, folder: str | os.PathLike[str], device: str = "auto") -> MixtureDistanceModel:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        folder = Path(folder)
        weights = folder / WEIGHTS
        if not weights.is_file():
            weights = folder / "model.pt"  # what save wrote until issue 80
        if not weights.is_file() or not (folder / "config.json").is_file():
            raise FileNotFoundError(
                f"{str(folder)!r} is not a saved MixScentNet model ({WEIGHTS}, config.json)"
            )
        try:
            options = json.loads((folder / "config.json").read_text())
            model = cls(device=device, **options)
            if weights.suffix == ".safetensors":
                state = load_file(str(weights), device=str(model.device))
            else:
                state = torch.load(weights, map_location=model.device, weights_only=True)
            model.network.load_state_dict(state)
        except (
            TypeError, RuntimeError, json.JSONDecodeError, pickle.UnpicklingError, SafetensorError
        ) as error:  # fmt: skip
            raise ValueError(
                f"{str(folder)!r} holds a damaged or foreign MixScentNet model: {error}"
            ) from None
        model.network.eval()
        return model
