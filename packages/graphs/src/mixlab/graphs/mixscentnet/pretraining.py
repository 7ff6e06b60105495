"""The encoder pretraining recipe of the MixScentNet experiment: the fixed GS-LF split, the seeded
encoder, and the Mordred (self-supervised) or odour-label (POMMix-style) pretraining that fills a
cache entry with ``encoder.pt`` and ``score.json``.

:func:`~mixlab.graphs.mixscentnet.experiment.pretrained_encoder` caches what
:func:`pretrain_encoder` writes, keyed by the source of this module (with ``featurize``, ``model``
and ``training``: its ``ENCODER_CODE``), so a change to the recipe here trains the encoders again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from mixlab.graphs.mixscentnet.data import MixturePairs, OdourLabels
from mixlab.graphs.mixscentnet.featurize import mordred_targets
from mixlab.graphs.mixscentnet.model import MoleculeEncoder
from mixlab.graphs.mixscentnet.training import (
    LabelModel,
    MordredPretrainer,
    macro_auroc,
    median_r2,
)
from mixlab.shared import resolve_device

GSLF_TEST = 0.1
"""the fraction of GS-LF molecules held out to score the pretrained encoders"""

__all__ = [
    "GSLF_TEST",
    "gslf_split",
    "mordred_smiles",
    "mordred_split",
    "pretrain_encoder",
    "seeded_encoder",
]


def gslf_split(labels: OdourLabels) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) molecule indices of GS-LF: 10 % test, seed 0, fixed for every run."""
    order = np.random.default_rng(0).permutation(len(labels))
    held = round(GSLF_TEST * len(labels))
    return np.sort(order[held:]), np.sort(order[:held])


def mordred_split(labels: OdourLabels, fraction: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices of the GS-LF molecules whose Mordred descriptors are computed:
    :func:`gslf_split`'s, or at ``fraction`` < 1 that share of each part (at least 2 molecules
    of each), drawn once (seed 0)."""
    train, test = gslf_split(labels)
    if fraction >= 1:
        return train, test
    rng = np.random.default_rng(0)

    def share(part: np.ndarray) -> np.ndarray:
        size = min(len(part), max(2, round(fraction * len(part))))
        return np.sort(rng.choice(part, size, replace=False))

    return share(train), share(test)


def mordred_smiles(labels: OdourLabels, pairs: MixturePairs, fraction: float = 1.0) -> list[str]:
    """The GS-LF molecules of :func:`mordred_split` (every one at ``fraction`` 1) and every
    mixture component, sorted: the rows of the Mordred table."""
    train, test = mordred_split(labels, fraction)
    return sorted({labels.smiles[i] for i in (*train, *test)} | set(pairs.components))


def seeded_encoder(
    hidden: int, embedding: int, layers: int, conv: str, seed: int
) -> MoleculeEncoder:
    """A fresh :class:`MoleculeEncoder`, its weights drawn after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return MoleculeEncoder(hidden, embedding, layers, conv)


def pretrain_encoder(
    folder: Path,
    kind: str,
    labels: OdourLabels,
    pairs: MixturePairs,
    *,
    hidden: int,
    embedding: int,
    layers: int,
    conv: str,
    epochs: int,
    device: str,
    mordred: Callable[[], Path],
    mordred_fraction: float = 1.0,
    exclude: Sequence[str] = (),
) -> None:
    """Pretrain an encoder (seed 0) as ``kind`` and write its weights (``folder/encoder.pt``, on
    the CPU) and held-out score (``folder/score.json``: median R² of the Mordred targets or GS-LF
    macro AUROC on :func:`gslf_split`'s test molecules, and the seconds it took).

    ``mordred``: the folder of the cached raw Mordred table, asked for (only by ``kind="mordred"``)
    after the encoder is drawn. ``mordred_fraction``: the share of GS-LF's training and test
    molecules (:func:`mordred_split`) that pretrain and score the Mordred encoder; the mixture
    components pretrain it at any share, but no GS-LF test molecule ever does.

    ``exclude``: molecules (canonical SMILES) no pretraining step may see, neither as a Mordred
    row nor as a GS-LF label: the held-out molecules of a leave-molecules-out fold, so that the
    encoder is inductive there. ``score.json`` then also holds ``excluded`` (how many), ``seen``
    (how many of them the fit set holds: 0 unless the recipe leaks) and, for ``mordred``,
    ``r2_excluded``: the median R² of the Mordred targets on those molecules."""
    train, test = gslf_split(labels)
    excluded = set(exclude)
    train = np.array([i for i in train if labels.smiles[i] not in excluded], dtype=np.int64)
    encoder = seeded_encoder(hidden, embedding, layers, conv, 0)
    started = time.perf_counter()
    options = {"epochs": epochs, "seed": 0}
    train_smiles = [labels.smiles[i] for i in train]
    test_smiles = [labels.smiles[i] for i in test]
    if kind == "mordred":
        every = mordred_smiles(labels, pairs, mordred_fraction)
        chosen_train, chosen_test = mordred_split(labels, mordred_fraction)
        # self-supervised: the (chosen) GS-LF training molecules and the mixture components (no
        # labels, no distances), which also set the targets' scaling; the chosen GS-LF test
        # molecules score it, and no GS-LF test molecule pretrains it
        fit_smiles = sorted(
            ({labels.smiles[i] for i in chosen_train} | set(pairs.components))
            - set(test_smiles)
            - excluded
        )
        held_smiles = [labels.smiles[i] for i in chosen_test]
        targets, _ = mordred_targets(every, mordred(), workers=1, reference=fit_smiles)
        row = {s: i for i, s in enumerate(every)}
        pretrainer = MordredPretrainer(encoder, targets.shape[1])
        pretrainer.network.to(resolve_device(device))
        pretrainer.fit(fit_smiles, targets[[row[s] for s in fit_smiles]], **options)
        held = targets[[row[s] for s in held_smiles]]
        score = {"r2": median_r2(pretrainer.predict(held_smiles), held)}
        fitted = set(fit_smiles)
        if excluded:
            unseen = sorted(excluded & set(every))
            rows = targets[[row[s] for s in unseen]]
            score["r2_excluded"] = median_r2(pretrainer.predict(unseen), rows)
    elif kind == "labels":
        model = LabelModel(encoder, labels.labels.shape[1])
        model.network.to(resolve_device(device))
        model.fit(train_smiles, labels.labels[train], **options)
        score = {"auroc": macro_auroc(model.predict_proba(test_smiles), labels.labels[test])}
        fitted = set(train_smiles)
    else:
        raise ValueError(f"kind must be 'mordred' or 'labels', got {kind!r}")
    if excluded:
        score |= {"excluded": len(excluded), "seen": len(excluded & fitted)}
    score["seconds"] = time.perf_counter() - started
    torch.save({k: v.cpu() for k, v in encoder.state_dict().items()}, folder / "encoder.pt")
    (folder / "score.json").write_text(json.dumps(score))
