"""Descriptor baselines: of mixture similarity, the Snitz angle model, gradient boosting on
mixture descriptors and the training-mean predictor; of odour labels, gradient boosting on each
molecule's descriptors.

Each mixture is the mean of its components' standardised RDKit 2D descriptors (POMMix's
``run_snitz.py`` and ``run_xgb.py`` use the same mean-RDKit mixture vector). Fitting sees only
training pairs; the descriptor standardisation uses the components' descriptors alone (no
targets).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mixlab.graphs.mixscentnet.featurize import rdkit_descriptors

__all__ = [
    "GradientBoostingDistance",
    "GradientBoostingLabels",
    "MeanDistance",
    "SnitzAngle",
    "mixture_descriptors",
    "snitz_angle",
]


def mixture_descriptors(mixtures: Sequence[tuple[str, ...]]) -> np.ndarray:
    """(M, D) mean standardised RDKit descriptors of each mixture's components."""
    components = sorted({s for m in mixtures for s in m})
    index = {s: i for i, s in enumerate(components)}
    table = rdkit_descriptors(components)
    scale = table.std(axis=0)
    keep = scale > 0
    table = (table[:, keep] - table[:, keep].mean(axis=0)) / scale[keep]
    return np.stack([table[[index[s] for s in m]].mean(axis=0) for m in mixtures])


def snitz_angle(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The angle (radians, in [0, π]) between rows of ``u`` and ``v``: Snitz et al. (2013)'s
    mixture distance, arccos of the cosine of the mean descriptor vectors."""
    cosine = (u * v).sum(-1) / (np.linalg.norm(u, axis=-1) * np.linalg.norm(v, axis=-1) + 1e-12)
    return np.arccos(np.clip(cosine, -1.0, 1.0))


class SnitzAngle:
    """Snitz angle, mapped to the distance scale by a least-squares line fitted on the training
    pairs (the angle is unitless; the line changes RMSE, not Pearson or Kendall)."""

    def __init__(self, descriptors: np.ndarray) -> None:
        self.descriptors = descriptors
        self.slope, self.intercept = 1.0, 0.0

    def angles(self, pairs: np.ndarray) -> np.ndarray:
        return snitz_angle(self.descriptors[pairs[:, 0]], self.descriptors[pairs[:, 1]])

    def fit(self, pairs: np.ndarray, distance: np.ndarray, seed: int = 0) -> SnitzAngle:
        self.slope, self.intercept = np.polyfit(self.angles(pairs), distance, 1)
        return self

    def predict(self, pairs: np.ndarray) -> np.ndarray:
        return np.clip(self.slope * self.angles(pairs) + self.intercept, 0.0, 1.0)


class GradientBoostingDistance:
    """``HistGradientBoostingRegressor`` on symmetric pair features of the mixture descriptors:
    |u − v|, u + v and the Snitz angle (POMMix's XGBoost baseline, with scikit-learn's
    histogram boosting offline)."""

    def __init__(self, descriptors: np.ndarray, max_iter: int = 300) -> None:
        self.descriptors, self.max_iter = descriptors, max_iter
        self.model = None

    def features(self, pairs: np.ndarray) -> np.ndarray:
        u, v = self.descriptors[pairs[:, 0]], self.descriptors[pairs[:, 1]]
        return np.concatenate([np.abs(u - v), u + v, snitz_angle(u, v)[:, None]], axis=1)

    def fit(
        self, pairs: np.ndarray, distance: np.ndarray, seed: int = 0
    ) -> GradientBoostingDistance:
        from sklearn.ensemble import HistGradientBoostingRegressor

        self.model = HistGradientBoostingRegressor(
            max_iter=self.max_iter, learning_rate=0.05, early_stopping=True, random_state=seed
        ).fit(self.features(pairs), distance)
        return self

    def predict(self, pairs: np.ndarray) -> np.ndarray:
        return np.clip(self.model.predict(self.features(pairs)), 0.0, 1.0)


class MeanDistance:
    """The training mean for every pair: the floor every model must beat."""

    def __init__(self) -> None:
        self.mean = 0.5

    def fit(self, pairs: np.ndarray, distance: np.ndarray, seed: int = 0) -> MeanDistance:
        self.mean = float(np.mean(distance))
        return self

    def predict(self, pairs: np.ndarray) -> np.ndarray:
        return np.full(len(pairs), self.mean)


class GradientBoostingLabels:
    """Odour labels from a molecule's RDKit 2D descriptors: one ``HistGradientBoostingClassifier``
    per label (the descriptor control of Mordred pretraining's label efficiency: no GNN, no
    pretraining). A label with one class among the training molecules predicts its training rate.
    ``max_iter`` boosting rounds and ``max_bins`` histogram bins per label (50 and 32: at 100 and
    255 the 138 labels took 90 s a seed, the quick run's longest cell; on 448 molecules 32 bins
    gave the same test AUROC, 0.746 against 0.745, in a pilot)."""

    def __init__(self, max_iter: int = 50, max_bins: int = 32) -> None:
        self.max_iter, self.max_bins = max_iter, max_bins
        self.models: list = []

    def fit(
        self, smiles: Sequence[str], labels: np.ndarray, seed: int = 0
    ) -> GradientBoostingLabels:
        from sklearn.ensemble import HistGradientBoostingClassifier

        features = rdkit_descriptors(smiles)
        self.models = []
        for column in np.asarray(labels).T:
            if 0 < column.sum() < len(column):
                model = HistGradientBoostingClassifier(
                    max_iter=self.max_iter, max_bins=self.max_bins, learning_rate=0.1,
                    early_stopping=False, random_state=seed,
                )  # fmt: skip
                self.models.append(model.fit(features, column))
            else:
                self.models.append(float(column.mean()))
        return self

    def predict_proba(self, smiles: Sequence[str]) -> np.ndarray:
        """(n, L) probabilities of each label."""
        features = rdkit_descriptors(smiles)
        columns = [
            np.full(len(features), m) if isinstance(m, float) else m.predict_proba(features)[:, 1]
            for m in self.models
        ]
        return np.stack(columns, axis=1)
