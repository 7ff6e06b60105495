"""MixScentNet against POMMix-style, its own ablations and descriptor baselines on the published
olfaction data (``mixlab run mixscentnet``).

One-time work, cached (:func:`~mixlab.shared.cache.cached`, namespace ``mixscentnet``, keyed by
its config, its data and the source of the code that makes it): Mordred 2D descriptors of
``mordred_fraction`` of the GS-LF molecules (every one in the full profile) and of every mixture
component; the Mordred-pretrained encoder (those GS-LF training molecules and the components, no
labels); the label-pretrained encoder (POMMix-style: every GS-LF training label); and, per
leave-molecules-out fold, both again without the fold's held-out molecules (inductive
pretraining: no Mordred row, no GS-LF label of a held-out molecule reaches its encoder). GS-LF is
split once, 90/10 by molecule (seed 0); its test molecules score label AUROC, and the share of
them with Mordred descriptors scores Mordred R².

Cells, every neural system with the same encoder widths, step budget and early stopping:

- ``distance``: per split (``random``: stratified K-fold; ``molecules``: leave-some-molecules-out),
  fold and seed, fit on the training pairs (the ``FEW_PAIRS_SYSTEMS`` also on ``pair_fraction``
  of them) and score Pearson, RMSE and Kendall τ on the test pairs. A neural fit stops on 10 % of
  its training pairs (``patience`` checks without a fall of ``min_delta``) and records
  ``steps_run`` and ``best_step``;
- ``white``: per seed and system of ``white_systems``, fit on every pair but Snitz 1's
  non-overlapping ones, predict those (the out-of-fold predictions for the olfactory-white test)
  and random non-overlapping mixtures of ``white_sizes`` components from the component pool;
- ``labels``: GS-LF macro AUROC after training on ``label_fractions`` of the training labels:
  the Mordred-pretrained encoder, the encoder from scratch, and gradient boosting on RDKit
  descriptors (the control).

Regime (result.json's ``regime``): POMMix-style reaches the published level on the random split
(Pearson ≥ 0.81 − ``regime_margin``) and RMSE ≤ 0.85 × the mean predictor's; Mordred pretraining
reaches a median held-out R² ≥ 0.5; the GS-LF label model reaches macro AUROC ≥ 0.8. Each gates
the claims that rest on it.

Claims (:data:`~mixlab.graphs.mixscentnet.config.CLAIMS`) are judged again with each control in
the method's place (gradient boosting and the Snitz angle; a comparison of a control with itself
is left out; ``vacuous`` when a control passes too). a beats b when a one-sided paired t-test
over the cells that ran both (folds × seeds; seeds for GS-LF labels) says so at p < 0.05;
olfactory white must hold on every seed. The distance claims assume every neural fit stopped
early before its step budget (otherwise they are untested); claim 2 also that the
leave-molecules-out encoders never saw their fold's held-out molecules and fit them.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from mixlab.graphs.mixscentnet.baselines import (
    GradientBoostingDistance,
    GradientBoostingLabels,
    MeanDistance,
    SnitzAngle,
    mixture_descriptors,
)
from mixlab.graphs.mixscentnet.config import (
    FEW_PAIRS_SYSTEMS,
    LABEL_INITS,
    METHOD,
    NEURAL_SYSTEMS,
    PUBLISHED_POMMIX_PEARSON,
    SPLITS,
    WHITE_PEARSON,
    WHITE_STUDY,
    Config,
)
from mixlab.graphs.mixscentnet.data import (
    MixturePairs,
    OdourLabels,
    files_read,
    load_gslf,
    load_mixture_pairs,
    non_overlapping,
    split_pairs,
    unseen_molecules,
)
from mixlab.graphs.mixscentnet.featurize import mordred_targets, smiles_digest
from mixlab.graphs.mixscentnet.model import MixScentNet, MoleculeEncoder
from mixlab.graphs.mixscentnet.pretraining import (
    GSLF_TEST,
    gslf_split,
    mordred_smiles,
    pretrain_encoder,
    seeded_encoder,
)
from mixlab.graphs.mixscentnet.training import (
    FeaturizedMixtures,
    LabelModel,
    distance_metrics,
    fit_distance,
    macro_auroc,
    predict_distance,
)
from mixlab.shared import Claim, Result, mean_std, resolve_device, run_cells
from mixlab.shared.cache import cached
from mixlab.shared.claims import where_run
from mixlab.shared.files import write_json_atomic

REGIME_RMSE_RATIO = 0.85
REGIME_R2 = 0.5
REGIME_AUROC = 0.8

__all__ = ["METHOD", "Config", "claims", "regime", "run", "summarise"]


# ------------------------------------------------------------------------------------- data
@functools.cache
def load_data(data_dir: str) -> tuple[OdourLabels, MixturePairs]:
    """GS-LF and the mixture pairs from ``data_dir`` (a clear error naming it when absent)."""
    return load_gslf(data_dir), load_mixture_pairs(data_dir)


def _encoder(config: Config, seed: int) -> MoleculeEncoder:
    return seeded_encoder(config.hidden, config.embedding, config.layers, config.encoder, seed)


MORDRED_CODE = ("mixlab.graphs.mixscentnet.featurize",)
"""the modules whose source makes the Mordred table (the descriptor calculation)"""
ENCODER_CODE = (
    "mixlab.graphs.mixscentnet.featurize",
    "mixlab.graphs.mixscentnet.model",
    "mixlab.graphs.mixscentnet.pretraining",
    "mixlab.graphs.mixscentnet.training",
)
"""the modules whose source makes a pretrained encoder: featurization (and the Mordred targets),
the encoder, the pretraining recipe (:func:`pretrain_encoder`) and its training loops"""


def mordred_folder(config: Config) -> Path:
    """The cached raw Mordred descriptors (``mordred.npz``, read by :func:`mordred_targets`) of
    ``config.mordred_fraction`` of the GS-LF molecules
    (:func:`~mixlab.graphs.mixscentnet.pretraining.mordred_split`) and every mixture component: the
    one slow step, with ``workers`` processes."""
    labels, pairs = load_data(config.data_dir)
    every = mordred_smiles(labels, pairs, config.mordred_fraction)

    def build(folder: Path) -> None:
        mordred_targets(every, folder, workers=config.workers)

    key = {"smiles": smiles_digest(every), "molecules": len(every)}
    return cached("mixscentnet", "mordred", key, build, code=MORDRED_CODE)


def pretrained_encoder(
    config: Config, kind: str, exclude: Sequence[str] = ()
) -> tuple[MoleculeEncoder, dict[str, float]]:
    """The cached ``mordred`` or ``labels`` encoder (made once, seed 0, by
    :func:`pretrain_encoder`) and its held-out score: median R² of the Mordred targets, or GS-LF
    macro AUROC. ``exclude``: molecules its pretraining never sees (a leave-molecules-out fold's
    held-out molecules); each set of them is its own cache entry."""
    if kind not in ("mordred", "labels"):
        raise ValueError(f"kind must be 'mordred' or 'labels', got {kind!r}")
    labels, pairs = load_data(config.data_dir)
    fraction = config.mordred_fraction if kind == "mordred" else 1.0  # labels: every molecule
    key: dict[str, Any] = {
        "kind": kind,
        "encoder": config.encoder,
        "hidden": config.hidden,
        "embedding": config.embedding,
        "layers": config.layers,
        "pretrain_epochs": config.pretrain_epochs,
        "seed": 0,
        "test_fraction": GSLF_TEST,
        "smiles": smiles_digest(mordred_smiles(labels, pairs, fraction)),
    }
    if kind == "mordred":
        key["mordred_fraction"] = fraction
    if kind == "labels":
        key["labels"] = hashlib.sha256(labels.labels.tobytes()).hexdigest()[:16]
    if exclude:
        key["exclude"] = smiles_digest(sorted(exclude))

    def build(folder: Path) -> None:
        pretrain_encoder(
            folder, kind, labels, pairs, hidden=config.hidden, embedding=config.embedding,
            layers=config.layers, conv=config.encoder, epochs=config.pretrain_epochs,
            device=config.device, mordred=lambda: mordred_folder(config),
            mordred_fraction=fraction, exclude=exclude,
        )  # fmt: skip

    # one process builds it: a worker that asks meanwhile waits, then reads it (cached's lock)
    folder = cached("mixscentnet", f"encoder-{kind}", key, build, code=ENCODER_CODE)
    encoder = _encoder(config, 0)
    state = torch.load(folder / "encoder.pt", map_location="cpu", weights_only=True)
    encoder.load_state_dict(state)
    return encoder, json.loads((folder / "score.json").read_text())


def _start_encoder(
    config: Config, pretraining: str, seed: int, exclude: Sequence[str] = ()
) -> MoleculeEncoder:
    if pretraining == "none":
        return _encoder(config, seed)
    encoder, _ = pretrained_encoder(config, pretraining, exclude)
    return copy.deepcopy(encoder)


def held_out_molecules(data: MixturePairs, split: str, fold: int, folds: int) -> list[str]:
    """The molecules a pretrained encoder must not see on ``split``'s fold ``fold``: the
    leave-molecules-out fold's held-out ones (inductive pretraining, issue 69); none on the
    random split, where the test pairs' molecules occur in training pairs too."""
    if split != "molecules":
        return []
    return unseen_molecules(data, *split_pairs(data, split, fold, folds, seed=0))


# ------------------------------------------------------------------------------------ cells
def _cells(config: Config, pairs: MixturePairs) -> list[dict[str, Any]]:
    seeds = [config.seed + s for s in range(config.n_seeds)]
    cells: list[dict[str, Any]] = [{"task": "pretrain", "kind": k} for k in ("mordred", "labels")]
    # the inductive encoders of the leave-molecules-out folds, built before their fits ask
    cells += [
        {"task": "pretrain", "kind": k, "split": "molecules", "fold": fold}
        for fold in config.fold_ids
        for k in ("mordred", "labels")
    ]
    # the label cells next: gradient boosting's are the run's longest after the encoders
    cells += [
        {"task": "labels", "seed": seed, "init": init, "fraction": fraction}
        for fraction in config.label_fractions
        for seed in seeds
        for init in LABEL_INITS
    ]
    distance = [
        {"task": "distance", "split": split, "fold": fold, "seed": seed, "system": system,
         "fraction": fraction}
        for split in SPLITS
        for fold in config.fold_ids
        for seed in seeds
        for system in config.systems
        for fraction in (1.0, config.pair_fraction)
        if fraction == 1.0 or system in FEW_PAIRS_SYSTEMS
    ]  # fmt: skip
    white = [
        {"task": "white", "seed": seed, "system": system}
        for seed in seeds[: config.white_seeds]
        for system in config.systems
        if system in config.white_systems and (pairs.study == WHITE_STUDY).any()
    ]
    # the neural fits before the descriptor models' seconds-long cells, which fill the end
    neural = [c for c in distance + white if c["system"] in NEURAL_SYSTEMS]
    return cells + neural + [c for c in distance + white if c["system"] not in NEURAL_SYSTEMS]


def _fit_system(
    config: Config, system: str, data: MixturePairs, train: np.ndarray, seed: int,
    featurized: FeaturizedMixtures, descriptors: np.ndarray, exclude: Sequence[str] = (),
):  # fmt: skip
    """A fitted predictor with ``.predict(pairs)`` for any system; a pretrained encoder never
    saw the molecules of ``exclude``."""
    if system in NEURAL_SYSTEMS:
        options = NEURAL_SYSTEMS[system]
        encoder = _start_encoder(config, options["pretraining"], seed, exclude)
        torch.manual_seed(seed)
        model = MixScentNet(
            encoder, options["aggregator"], width=config.mixture_width,
            graph_layers=config.graph_layers,
        )  # fmt: skip
        model.to(resolve_device(config.device))
        history = fit_distance(
            model, featurized, data.pairs[train], data.distance[train], steps=config.steps,
            lr=config.lr, encoder_lr=config.encoder_lr, eval_every=config.eval_every,
            patience=config.patience, min_delta=config.min_delta,
            batch_size=config.batch_size, seed=seed,
        )  # fmt: skip
        return _NeuralPredictor(
            model, featurized, steps_run=len(history["train"]), best_step=history["best_step"]
        )
    baseline = {"snitz": SnitzAngle, "hgb": GradientBoostingDistance}.get(system)
    model = baseline(descriptors) if baseline else MeanDistance()
    return model.fit(data.pairs[train], data.distance[train], seed=seed)


class _NeuralPredictor:
    def __init__(
        self, model: MixScentNet, featurized: FeaturizedMixtures, steps_run: int, best_step: int
    ) -> None:
        self.model, self.featurized = model, featurized
        self.steps_run = steps_run  # fewer than the budget: early stopping fired
        self.best_step = best_step  # the step whose weights were kept

    def predict(self, pairs: np.ndarray) -> np.ndarray:
        return predict_distance(self.model, self.featurized, pairs)


def _white_pool(data: MixturePairs, config: Config) -> tuple[list[tuple[str, ...]], np.ndarray]:
    """Random non-overlapping mixture pairs of each size in ``white_sizes`` from the component
    pool (seed 0: every system and seed sees the same pairs), as extra mixtures and pairs
    indexing them after ``data.mixtures``."""
    pool = data.components
    rng = np.random.default_rng(0)
    mixtures, pairs = [], []
    for n in config.white_sizes:
        if 2 * n > len(pool):
            raise ValueError(f"white_sizes: {n} needs {2 * n} components, the pool has {len(pool)}")
        for _ in range(config.white_pairs):
            drawn = rng.choice(len(pool), size=2 * n, replace=False)
            base = len(data.mixtures) + len(mixtures)
            mixtures += [tuple(pool[i] for i in drawn[:n]), tuple(pool[i] for i in drawn[n:])]
            pairs.append([base, base + 1])
    return mixtures, np.asarray(pairs, dtype=np.int64)


def slope_with_interval(
    x: np.ndarray, y: np.ndarray, samples: int, seed: int = 0
) -> tuple[float, float, float]:
    """Least-squares slope of y on x and its 95 % percentile-bootstrap interval (pairs resampled)."""
    slope = float(np.polyfit(x, y, 1)[0])
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(samples):
        pick = rng.integers(len(x), size=len(x))
        if np.ptp(x[pick]) > 0:
            draws.append(np.polyfit(x[pick], y[pick], 1)[0])
    low, high = np.percentile(draws, [2.5, 97.5])
    return slope, float(low), float(high)


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    return distance_metrics(x, y)["pearson"]


def run_cell(config: Config, out_dir: Path, cell: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(1)  # small graphs: one thread is as fast, and safe beside a worker
    threadpool_limits(1)  # scikit-learn's OpenMP too: gradient boosting ran 1.4× faster alone
    torch.set_flush_denormal(True)
    labels, data = load_data(config.data_dir)
    started = time.perf_counter()
    if cell["task"] == "pretrain":
        exclude = held_out_molecules(data, cell.get("split", "random"), cell.get("fold", 0),
                                     config.folds)  # fmt: skip
        _, score = pretrained_encoder(config, cell["kind"], exclude)
        return {**cell, **score}
    if cell["task"] == "labels":
        return {
            **cell,
            **_label_cell(config, labels, cell),
            "seconds": time.perf_counter() - started,
        }
    seed, system = cell["seed"], cell["system"]
    if cell["task"] == "distance":
        train, test = split_pairs(data, cell["split"], cell["fold"], config.folds, seed=0)
        if cell["fraction"] < 1:
            rng = np.random.default_rng(seed)
            train = np.sort(rng.choice(train, round(cell["fraction"] * len(train)), replace=False))
        mixtures, extra_pairs = data.mixtures, np.zeros((0, 2), dtype=np.int64)
        exclude = held_out_molecules(data, cell["split"], cell["fold"], config.folds)
    else:
        exclude = []
        white = (data.study == WHITE_STUDY) & non_overlapping(data)
        train, test = np.flatnonzero(~white), np.flatnonzero(white)
        extra, extra_pairs = _white_pool(data, config)
        mixtures = [*data.mixtures, *extra]
    featurized = FeaturizedMixtures(mixtures) if system in NEURAL_SYSTEMS else None
    descriptors = mixture_descriptors(mixtures) if system in ("snitz", "hgb") else None
    model = _fit_system(config, system, data, train, seed, featurized, descriptors, exclude)
    predicted = model.predict(data.pairs[test])
    result: dict[str, Any] = {**cell, **distance_metrics(predicted, data.distance[test])}
    result["n_test"] = len(test)
    if isinstance(model, _NeuralPredictor):
        result |= {"steps_run": model.steps_run, "best_step": model.best_step}
    result["predicted"] = [round(float(p), 5) for p in predicted]
    result["measured"] = [round(float(d), 5) for d in data.distance[test]]
    if cell["task"] == "white":
        sizes = np.array([len(mixtures[a]) * len(mixtures[b]) for a, b in data.pairs[test]])
        result["white_r"] = _pearson(predicted, np.sqrt(sizes))
        result["white_r_measured"] = _pearson(data.distance[test], np.sqrt(sizes))
        curve = model.predict(extra_pairs)
        n = np.repeat(np.asarray(config.white_sizes, dtype=float), config.white_pairs)
        slope, low, high = slope_with_interval(n, curve, config.bootstrap, seed=seed)
        result |= {"white_slope": slope, "white_slope_low": low, "white_slope_high": high}
        result["white_curve"] = [
            float(curve[k * config.white_pairs : (k + 1) * config.white_pairs].mean())
            for k in range(len(config.white_sizes))
        ]
    result["seconds"] = time.perf_counter() - started
    return result


def _label_cell(config: Config, labels: OdourLabels, cell: dict[str, Any]) -> dict[str, float]:
    train, test = gslf_split(labels)
    rng = np.random.default_rng(cell["seed"])
    chosen = np.sort(rng.choice(train, max(2, round(cell["fraction"] * len(train))), replace=False))
    chosen_smiles = [labels.smiles[i] for i in chosen]
    if cell["init"] == "hgb":  # the descriptor control: no encoder at all
        model = GradientBoostingLabels().fit(chosen_smiles, labels.labels[chosen], cell["seed"])
    else:
        encoder = _start_encoder(config, cell["init"], cell["seed"])
        torch.manual_seed(cell["seed"])  # the head: a fresh draw per seed, whatever the encoder
        model = LabelModel(encoder, labels.labels.shape[1])
        model.network.to(resolve_device(config.device))
        model.fit(chosen_smiles, labels.labels[chosen], epochs=config.label_epochs,
                  seed=cell["seed"])  # fmt: skip
    probabilities = model.predict_proba([labels.smiles[i] for i in test])
    return {"auroc": macro_auroc(probabilities, labels.labels[test])}


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    torch.set_flush_denormal(True)
    _, data = load_data(config.data_dir)
    mordred_folder(config)  # the one slow step, with every core, before the workers start
    cell_fn = functools.partial(run_cell, config, out_dir)
    done = run_cells(
        out_dir, config, _cells(config, data), cell_fn,
        resume=resume, label="mixscentnet", workers=config.workers,
    )  # fmt: skip
    write_json_atomic(out_dir / "cells.json", done, indent=1)
    metrics = summarise(done, config)
    _plot(done, metrics, config, out_dir)
    found = claims(done, config)
    return Result(
        metrics=metrics,
        claims=found,
        regime=regime(metrics, config, found),
        env={"data_files": files_read(config.data_dir)},  # SHA-256 of each file read
    )


# ---------------------------------------------------------------------------------- summary
METRIC_KEYS = (
    "pearson", "rmse", "kendall", "white_r", "white_slope", "auroc", "r2", "r2_excluded",
    "steps_run", "best_step",
)  # fmt: skip
EXTRA_KEYS = ("white_slope_low", "white_slope_high", "white_r_measured", "excluded", "seen")


def _empty_row() -> dict[str, float | None]:
    row: dict[str, float | None] = {}
    for key in METRIC_KEYS:
        row[key], row[f"{key}_std"] = None, None
    row |= {key: None for key in EXTRA_KEYS}
    row |= {"n": 0, "seconds": 0.0}
    return row


def _fill(row: dict[str, Any], cells: list[dict[str, Any]]) -> dict[str, Any]:
    for key in METRIC_KEYS:
        values = [c[key] for c in cells if c.get(key) is not None]
        if values:
            row[key], row[f"{key}_std"] = mean_std(values)
    for key in EXTRA_KEYS:
        values = [c[key] for c in cells if c.get(key) is not None]
        if values:
            row[key] = float(np.mean(values))
    row["n"] = len(cells)
    row["seconds"] = float(np.mean([c.get("seconds", 0.0) for c in cells]))
    return row


def summarise(done: list[dict[str, Any]], config: Config) -> dict[str, dict[str, Any]]:
    """Rows ``split/system`` (``@25`` for the pair fraction), ``white/system``,
    ``labels/init@fraction``, ``pretrain/kind`` and ``pretrain/kind@molecules`` (the inductive
    encoders of the leave-molecules-out folds): mean and sample sd over seeds × folds of every
    metric that applies (None elsewhere), the number of cells and mean seconds."""
    rows: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[dict[str, Any]]] = {}
    for cell in done:
        task = cell["task"]
        if task == "distance":
            tag = "" if cell["fraction"] == 1.0 else f"@{round(cell['fraction'] * 100)}"
            name = f"{cell['split']}/{cell['system']}{tag}"
        elif task == "white":
            name = f"white/{cell['system']}"
        elif task == "labels":
            name = f"labels/{cell['init']}@{round(cell['fraction'] * 100)}"
        else:  # the shared encoder, or a leave-molecules-out fold's inductive one
            name = f"pretrain/{cell['kind']}" + (f"@{cell['split']}" if "split" in cell else "")
        groups.setdefault(name, []).append(cell)
    for name, cells in groups.items():
        rows[name] = _fill(_empty_row(), cells)
    return rows


def _value(metrics: dict[str, Any], row: str, key: str) -> tuple[float, float, int]:
    values = metrics.get(row, {})
    mean, sd = values.get(key), values.get(f"{key}_std")
    return (
        float("nan") if mean is None else mean,
        0.0 if sd is None else sd,
        max(int(values.get("n", 1) or 1), 1),
    )


# ----------------------------------------------------------------------------------- claims


def _pearsons(
    done: list[dict[str, Any]], split: str, system: str, fraction: float = 1.0
) -> dict[tuple[int, int], float]:
    """``system``'s test Pearson on ``split`` per (fold, seed), at ``fraction`` of the pairs."""
    return {
        (c["fold"], c["seed"]): c["pearson"]
        for c in done
        if c["task"] == "distance"
        and c["split"] == split
        and c["system"] == system
        and c["fraction"] == fraction
    }


def _paired(text: str, ours: dict, theirs: dict, label: str) -> Claim:
    """``ours`` above ``theirs``: a one-sided paired t-test over the cells (folds × seeds, or
    seeds) that ran both."""
    shared = sorted(ours.keys() & theirs.keys())
    if not shared:
        return Claim.not_run(text, f"no fold or seed ran both sides of {label}")
    return Claim.paired(text, [ours[k] - theirs[k] for k in shared], 0.0, label=label)


def _beats(
    done: list[dict[str, Any]], split: str, a: str, b: str, fraction: float = 1.0, tag: str = ""
) -> Claim:
    """a's Pearson above b's on ``split``, paired by fold and seed."""
    return _paired(
        f"{split} {a}{tag} vs {b}{tag}",
        _pearsons(done, split, a, fraction),
        _pearsons(done, split, b, fraction),
        label=f"{split}: {a}{tag} − {b}{tag} Pearson",
    )


def neural_fits_converged(done: list[dict[str, Any]], config: Config) -> Claim:
    """The premise of the distance claims: every neural distance fit stopped early on its
    validation pairs (``patience`` evaluations without improvement) before ``config.steps``,
    rather than at the budget with its validation error possibly still falling."""
    fits = [c for c in done if c["task"] == "distance" and c["system"] in NEURAL_SYSTEMS]
    at_budget = [c for c in fits if c.get("steps_run") is None or c["steps_run"] >= config.steps]
    return Claim.compare(
        f"the neural distance fits converged: each stopped early on its validation pairs before "
        f"the {config.steps}-step budget",
        float(len(at_budget)),
        "<=",
        0.0,
        value_label=f"fits that did not stop before the budget (of {len(fits)}; "
        f"{', '.join(sorted({c['system'] for c in at_budget})) or 'none'})",
    )


def inductive_pretraining(done: list[dict[str, Any]], config: Config) -> Claim:
    """The premise of claim 2 on the leave-molecules-out split: on every fold, both pretrained
    encoders saw none of its held-out molecules (``seen`` counted from the fit set, so a leak in
    the recipe shows), and the Mordred encoder still fits them (median R² of their targets >=
    the regime's bar)."""
    cells = [c for c in done if c["task"] == "pretrain" and c.get("split") == "molecules"]
    if not cells:
        return Claim.not_run("inductive pretraining", "the run has no leave-molecules-out encoders")
    seen = sum(int(c.get("seen", 0)) for c in cells)
    r2 = [c["r2_excluded"] for c in cells if c.get("r2_excluded") is not None]
    return Claim.all_of(
        "the leave-molecules-out encoders are inductive: pretrained without their fold's "
        f"held-out molecules, and the Mordred encoder fits them (median R² >= {REGIME_R2})",
        [
            Claim.compare("unseen", float(seen), "<=", 0.0,
                          value_label=f"held-out molecules the pretraining saw (of "
                          f"{sum(int(c.get('excluded', 0)) for c in cells)} over "
                          f"{len(cells)} encoders)"),
            Claim.compare("fits", min(r2) if r2 else float("nan"), ">=", REGIME_R2,
                          value_label="worst fold's median R² on its held-out molecules"),
        ],
    )  # fmt: skip


def claims(done: list[dict[str, Any]], config: Config) -> list[Claim]:
    """The claims of :data:`~mixlab.graphs.mixscentnet.config.CLAIMS`, judged fold by fold and
    seed by seed (paired over the cells) from the cells (``done``): each test runs on the claim's
    system and again on each control in its place, where a comparison of a control with itself
    is left out."""
    systems = set(config.systems)
    converged = {"neural_fits_converged": neural_fits_converged(done, config)}

    def against(system: str, references: tuple[str, ...], fraction: float = 1.0,
                tag: str = "") -> Claim:  # fmt: skip
        return Claim.all_of(system, [
            _beats(done, split, system, other, fraction, tag)
            for split in SPLITS
            for other in references
            if other != system
        ])  # fmt: skip

    pct = round(config.pair_fraction * 100)

    def mordred_beats_scratch(system: str) -> Claim:
        return Claim.all_of(system, [
            against(system, ("no-pretrain",), config.pair_fraction, f"@{pct}"),
            against(system, ("no-pretrain",)),
        ])  # fmt: skip

    low = min(config.label_fractions)
    tag = round(low * 100)

    def aurocs(init: str) -> dict[int, float]:
        return {
            c["seed"]: c["auroc"]
            for c in done
            if c["task"] == "labels" and c["init"] == init and c["fraction"] == low
        }

    def mordred_raises_auroc(system: str) -> Claim:
        """``system``'s label model (the Mordred-pretrained encoder, or gradient boosting on
        descriptors) against the encoder trained from scratch."""
        init = "hgb" if system == "hgb" else NEURAL_SYSTEMS[system]["pretraining"]
        return _paired(system, aurocs(init), aurocs("none"),
                       label=f"labels/{init}@{tag} − labels/none@{tag} AUROC")  # fmt: skip

    def olfactory_white(system: str) -> Claim:
        cells = sorted(
            (c for c in done if c["task"] == "white" and c["system"] == system),
            key=lambda c: c["seed"],
        )
        if not cells:
            return Claim.not_run(system, f"the run has no white cells of {system}")
        seeds = [c["seed"] for c in cells]
        return Claim.all_of(system, [
            Claim.worst_seed(WHITE_STUDY, [c["white_r"] for c in cells], "<=", WHITE_PEARSON,
                             seeds=seeds, value_label=f"{system}: Pearson(predicted, sqrt(n1·n2))"),
            Claim.worst_seed("curve", [c["white_slope_high"] for c in cells], "<", 0.0,
                             seeds=seeds, value_label=f"{system}: upper end of the slope's 95 % CI"),
        ])  # fmt: skip

    def no_white(system: str) -> Claim:
        return Claim.not_run(system, f"the data has no {WHITE_STUDY} pairs")

    white = any(c["task"] == "white" for c in done)
    pooling = ("mean-pool", "self-attention")
    white_text = {
        "study": WHITE_STUDY,
        "white_pearson": WHITE_PEARSON,
        "smallest": config.white_sizes[0],
        "largest": config.white_sizes[-1],
    }
    return [
        config.judge(
            "beats_pommix_snitz",
            where_run(lambda system: against(system, ("pommix", "snitz")), systems, "snitz"),
            premises=converged,
        ),
        config.judge(
            "mordred_beats_scratch",
            where_run(mordred_beats_scratch, systems, "no-pretrain"),
            premises={**converged, "inductive_pretraining": inductive_pretraining(done, config)},
            text_values={"pct": pct},
        ),
        config.judge(
            "graph_beats_pooling",
            where_run(lambda system: against(system, pooling), systems, *pooling),
            premises=converged,
        ),
        config.judge("mordred_raises_auroc", mordred_raises_auroc, text_values={"pct": tag}),
        config.judge(
            "olfactory_white",
            where_run(olfactory_white, systems) if white else no_white,
            text_values=white_text,
        ),
    ]


def regime(
    metrics: dict[str, dict[str, Any]], config: Config, found: list[Claim] | None = None
) -> list[Claim]:
    """The three checks of the module docstring; each gates the claims that rest on it."""
    mean_rmse = _value(metrics, "random/mean", "rmse")[0]
    bar = PUBLISHED_POMMIX_PEARSON - config.regime_margin
    learns = Claim.all_of(
        f"POMMix-style learns the distances at the published level (random split: Pearson >= "
        f"{bar:.2f}, POMMix's {PUBLISHED_POMMIX_PEARSON} minus {config.regime_margin}; RMSE <= "
        f"{REGIME_RMSE_RATIO} × the mean predictor's)",
        [
            Claim.compare("Pearson", _value(metrics, "random/pommix", "pearson")[0], ">=",
                          bar, value_label="POMMix-style Pearson"),
            Claim.compare("RMSE", _value(metrics, "random/pommix", "rmse")[0], "<=",
                          REGIME_RMSE_RATIO * mean_rmse, value_label="POMMix-style RMSE",
                          reference_label=f"{REGIME_RMSE_RATIO} × mean predictor's"),
        ],
    )  # fmt: skip
    mordred = Claim.compare(
        f"Mordred pretraining fits held-out molecules (median R² >= {REGIME_R2})",
        _value(metrics, "pretrain/mordred", "r2")[0], ">=", REGIME_R2,
        value_label="median held-out R²",
    )  # fmt: skip
    gslf = Claim.compare(
        f"The GS-LF label model reaches macro AUROC >= {REGIME_AUROC}",
        _value(metrics, "pretrain/labels", "auroc")[0], ">=", REGIME_AUROC,
        value_label="GS-LF test macro AUROC",
    )  # fmt: skip
    if found is None:
        return [learns, mordred, gslf]
    by_number = {c.text[:3]: c for c in found}
    pick = lambda *numbers: [by_number[f"({n})"] for n in numbers if f"({n})" in by_number]  # noqa: E731
    return [
        learns.gating(*pick(1, 2, 3, 5)),
        mordred.gating(*pick(1, 2, 3, 4, 5)),
        gslf.gating(*pick(1, 4)),
    ]


# ------------------------------------------------------------------------------------- plot
def _plot(
    done: list[dict[str, Any]], metrics: dict[str, Any], config: Config, out_dir: Path
) -> None:
    from matplotlib.figure import Figure

    from mixlab.shared import save_figure

    figure = Figure(figsize=(10, 4), layout="constrained")
    left, right = figure.subplots(1, 2)
    first = config.seed
    for system, colour in (("mixscentnet", "tab:blue"), ("pommix", "tab:orange")):
        cells = [c for c in done if c["task"] == "distance" and c["split"] == "random"
                 and c["system"] == system and c["seed"] == first and c["fraction"] == 1.0
                 and c["fold"] == config.fold_ids[0]]  # fmt: skip
        if cells:
            r = cells[0]["pearson"]
            left.scatter(cells[0]["measured"], cells[0]["predicted"], s=8, alpha=0.6,
                         color=colour, label=f"{system} (r = {r:.2f})")  # fmt: skip
    left.plot([0, 1], [0, 1], color="grey", lw=0.8)
    left.set(xlabel="measured distance", ylabel="predicted distance",
             title=f"random split, fold {config.fold_ids[0]}, seed {first}")  # fmt: skip
    left.legend(fontsize=8)
    for system in config.systems:
        curves = [c["white_curve"] for c in done if c["task"] == "white" and c["system"] == system]
        if curves:
            right.plot(config.white_sizes, np.mean(curves, axis=0), marker="o", ms=3, label=system)
    right.set(xlabel="components per mixture (non-overlapping pairs)",
              ylabel="mean predicted distance", title="olfactory white")  # fmt: skip
    right.legend(fontsize=7)
    save_figure(figure, out_dir / "distance.png")
