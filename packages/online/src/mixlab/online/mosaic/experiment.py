"""MoSAIC against the paper's baselines on drifting unions of subspaces (``mixlab run mosaic``).

Every streamed system sees the same stream, prequentially: each batch is completed with the model
as it is, then the model adapts on it. Streams have five epochs
(:data:`~mixlab.online.mosaic.config.EPOCHS`: stationary, geodesic drift at ``drift_rate``, abrupt
switch of one subspace, slow drift at ``slow_drift_rate`` = 1e-4, a second switch), at several
observation rates and seeds. Streamed systems:

- ``mosaic``: pre-trained routed experts, each sample updates only its expert (ours, constant step);
- ``mosaic_decreasing``: the same with the decreasing step ``max(min_step, 1/(1 + t_k/τ))``, an
  expert's schedule restarted when the residual test detects a change (``detect_changes``: no
  oracle knowledge of the epochs);
- ``mosaic_decreasing_oracle_resets``: the same schedule restarted at the true epoch boundaries
  instead (the reference for the detector);
- ``mosaic_small_step`` / ``kgrouse_small_step``: MoSAIC and k-GROUSE at the constant step
  ``small_step`` (0.05), small enough for the pre-trained experts to keep what they learned longer;
- ``grouse_r`` / ``grouse_Kr``: one GROUSE subspace of rank r / K·r, initialised on the source batch;
- ``petrels_Kr``: PETRELS at rank K·r, initialised on the source batch;
- ``kgrouse``: MoSAIC's online phase from random experts (no pre-training), at MoSAIC's step;
- ``frozen``: the pre-trained experts, never updated;
- ``oracle``: MoSAIC's experts with the true routing (an upper bound, and the regret's reference);
- ``windowed``: batch k-subspaces re-fitted on a sliding window (offline reference).

Besides the streams, per rate and seed a contraction sweep (:func:`contraction_sweep`) runs the
pre-trained experts on a stationary-then-switch stream under the pure decreasing step at every τ of
``step_decay_sweep`` (``mosaic_tau{τ}``) and under GROUSE's own ``θ = η₀‖ρ‖‖p‖/t``
(``mosaic_grouse_schedule``, Balzano et al. 2010), each restarted by the residual test; and per
seed a routing sweep measures the routing accuracy of the true subspaces (matched subspace
detection with missing data) and of MoSAIC's pre-trained experts as the observation rate varies
(``routing_fractions``).

Two references say whether the stream can be solved at all at each rate (the regime checks of
result.json; when one fails every claim is marked untested):

- ``true_subspaces``: each sample completed by least squares on its observed entries in the TRUE
  subspace it came from (true subspaces and labels), must reach NRMSE <= 0.05;
- ``grouse_static``: GROUSE at rank r, from a random start, on a static single-subspace stream of
  the same dimension, rank, rate, noise, step and batches, must reach NRMSE <= 0.1.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from mixlab.online.mosaic.config import (
    COMPARISON_WINDOW,
    DETECTED_SHARE,
    DETECTION_DELAY,
    EPOCHS,
    EXPONENT_SPREAD,
    HEAD_START,
    HIGH_ROUTING_ACCURACY,
    LOW_ROUTING_ACCURACY,
    MAX_FALSE_ALARMS,
    METHOD,
    TRACKS_DRIFT,
    Config,
    rate_key,
)
from mixlab.online.mosaic.diagnostics import (
    contraction_exponent,
    match_experts,
    pairwise_subspace_distances,
    power_law_fits_better,
    routing_accuracy,
)
from mixlab.online.mosaic.estimators import GROUSE, PETRELS, MoSAIC, WindowedKSubspaces
from mixlab.online.mosaic.stream import DriftingSubspaceStream, Epoch
from mixlab.online.mosaic.subspace import RIDGE, route
from mixlab.shared import Checkpointer, Claim, Result, progress, run_cells, save_figure
from mixlab.shared.claims import Comparison

__all__ = ["METHOD", "Config", "run", "system_names"]

SINGLE_SUBSPACE = ("grouse_r", "grouse_Kr", "petrels_Kr")
SWITCHES = tuple(i for i, epoch in enumerate(EPOCHS) if epoch.startswith("switch"))
DRIFTS = tuple(epoch for epoch in EPOCHS if epoch.endswith("drift"))
REFERENCES = ("true_subspaces", "grouse_static")
"""the regime references: the true-subspace oracle and GROUSE on one static subspace"""
ORACLE_MAX_NRMSE = 0.05
"""the true-subspace oracle must reach this NRMSE at every rate and epoch (fixed in advance)"""
STATIC_GROUSE_MAX_NRMSE = 0.1
"""GROUSE at rank r must track one static subspace to this NRMSE at every rate (fixed in advance)"""
WINDOW = COMPARISON_WINDOW
"""samples per window of the k-GROUSE comparison"""
SAME_STEP_KGROUSE = {"mosaic_small_step": "kgrouse_small_step"}
"""the k-GROUSE each system is compared with window by window (``kgrouse`` unless listed)"""


def sweep_names(config: Config) -> dict[float, str]:
    """System name per τ of the contraction sweep."""
    return {tau: f"mosaic_tau{tau:g}" for tau in sorted(config.step_decay_sweep)}


def system_names(config: Config) -> dict[str, tuple[str, ...]]:
    """The systems by role: ``streamed`` (run on the five-epoch streams, in table order), ``sweep``
    (run on the contraction sweep's stationary-then-switch stream), ``routed`` (K experts),
    ``tracked`` (MoSAIC variants whose subspace error is followed over time, switch decay fitted)
    and ``detecting`` (restarted by the residual test); ``all`` is streamed then sweep."""
    sweep = (*sweep_names(config).values(), "mosaic_grouse_schedule")
    streamed = (
        "mosaic",
        "mosaic_decreasing",
        "mosaic_decreasing_oracle_resets",
        "mosaic_small_step",
        *SINGLE_SUBSPACE,
        "kgrouse",
        "kgrouse_small_step",
        "frozen",
        "oracle",
        "windowed",
    )
    tracked = ("mosaic", "mosaic_decreasing", "mosaic_decreasing_oracle_resets")
    routed = (*tracked, "mosaic_small_step", "kgrouse", "kgrouse_small_step", "frozen", "oracle")
    return {
        "all": (*streamed, *sweep),
        "streamed": streamed,
        "sweep": sweep,
        "routed": (*routed, "windowed"),
        "tracked": (*tracked, *sweep),
        "detecting": ("mosaic_decreasing", *sweep),
    }


def pretrain(config: Config, source_X: np.ndarray, seed: int) -> MoSAIC:
    """MoSAIC's phase 1 on the source batch (k-subspaces with missing data), constant step."""
    return MoSAIC(
        config.n_subspaces,
        config.rank,
        step_size=config.step_size,
        n_init=config.n_init,
        random_state=seed,
    ).fit(source_X)


def _decreasing(mosaic: MoSAIC, tau: float, min_step: float, **params: Any) -> MoSAIC:
    """A copy of the pre-trained experts with the step ``max(min_step, 1/(1 + t_k/τ))``."""
    return copy.deepcopy(mosaic).set_params(
        step_size=1.0, step_decay=tau, min_step=min_step, **params
    )


def build_systems(
    config: Config, mosaic: MoSAIC, source_X: np.ndarray, seed: int
) -> dict[str, Any]:
    """Every streamed system, pre-trained on the same source batch where it has a pre-training
    phase; the MoSAIC variants are copies of ``mosaic``, pre-trained on it (:func:`pretrain`)."""
    total_rank = config.n_subspaces * config.rank
    return {
        "mosaic": copy.deepcopy(mosaic),
        "mosaic_decreasing": _decreasing(
            mosaic, config.step_decay, config.min_step, detect_changes=config.detect_changes
        ),
        "mosaic_decreasing_oracle_resets": _decreasing(mosaic, config.step_decay, config.min_step),
        "mosaic_small_step": copy.deepcopy(mosaic).set_params(step_size=config.small_step),
        "grouse_r": GROUSE(config.rank, step_size=config.step_size, random_state=seed).fit(
            source_X
        ),
        "grouse_Kr": GROUSE(total_rank, step_size=config.step_size, random_state=seed).fit(
            source_X
        ),
        "petrels_Kr": PETRELS(
            total_rank, forgetting=config.petrels_forgetting, random_state=seed
        ).fit(source_X),
        "kgrouse": MoSAIC(
            config.n_subspaces, config.rank, step_size=config.step_size, random_state=seed
        ),
        "kgrouse_small_step": MoSAIC(
            config.n_subspaces, config.rank, step_size=config.small_step, random_state=seed
        ),
        "frozen": copy.deepcopy(mosaic).set_params(adapt=False),
        "oracle": copy.deepcopy(mosaic),
        "windowed": WindowedKSubspaces(
            config.n_subspaces,
            config.rank,
            window=config.window,
            refit_every=config.refit_every,
            init=mosaic.bases_,
            random_state=seed,
        ).fit(source_X),
    }


def contraction_sweep(
    config: Config, observed_fraction: float, seed: int, mosaic: MoSAIC | None = None
) -> dict[str, Any]:
    """The switch decay as a function of the step schedule, where nothing else moves: a stream
    of the first (stationary) epoch then the first switch epoch, same rate and seed (so the same
    initial subspaces and source batch), run by the pre-trained experts under the pure decreasing
    step ``1/(1 + t_k/τ)`` for each τ of ``step_decay_sweep`` and under GROUSE's own
    ``θ = η₀‖ρ‖‖p‖/t`` (no floor: the schedule alone sets the decay), every one restarted by the
    residual test. Each decay is fitted over the whole switch epoch, the same stretch for every
    schedule. ``mosaic``: the experts :func:`pretrain` gives on this seed's source batch (fitted
    here when None). Returns the switch fit and the detections per system."""
    base = config.stream(observed_fraction)
    stream = replace(
        base, epochs=(base.epochs[0], base.epochs[2]), snapshot_every=config.batch_size
    ).generate(seed)
    if mosaic is None:
        mosaic = pretrain(config, stream.source_X_observed, seed)
    systems = {
        name: _decreasing(mosaic, tau, 0.0, detect_changes=config.detect_changes)
        for tau, name in sweep_names(config).items()
    }
    systems["mosaic_grouse_schedule"] = copy.deepcopy(mosaic).set_params(
        step_rule="sigma",
        step_size=config.sigma_step,
        step_decay=1.0,  # η₀/(1 + t): GROUSE's η₀/t
        min_step=0.0,
        detect_changes=config.detect_changes,
    )
    distances: dict[str, list[np.ndarray]] = {name: [] for name in systems}
    detections: dict[str, list[int]] = {name: [] for name in systems}
    X = stream.X
    starts = range(0, len(X), config.batch_size)
    with progress(len(starts), "contraction sweep batches") as bar:
        for index, start in enumerate(starts):
            for name, model in systems.items():
                detections[name].extend(_learn(model, X[start : start + config.batch_size], start))
                distances[name].append(
                    pairwise_subspace_distances(stream.snapshots[index], model.bases_).min(axis=1)
                )
            bar.advance()
    switch = int(stream.epoch_starts[1])
    return {
        "contraction": {
            name: [_switch_contraction(np.asarray(d), stream, config, 1, whole_epoch=True)]
            for name, d in distances.items()
        },
        "detections": {
            name: _detection_summary(times, [switch], len(X)) for name, times in detections.items()
        },
    }


def _learn(model: MoSAIC, X: np.ndarray, start: int, **options: Any) -> list[int]:
    """``model.partial_fit`` on the batch that starts at stream index ``start``; returns the stream
    index of each change the residual test detected in it (the newest per expert)."""
    before = model.n_changes_.copy()
    model.partial_fit(X, **options)
    fired = model.n_changes_ > before
    offset = model.n_samples_seen_ - start - len(X)  # samples seen before the stream (source)
    return (model.last_change_[fired] - offset).tolist()


def _nrmse(squared_error: np.ndarray, missing_energy: np.ndarray) -> float:
    return float(np.sqrt(squared_error.sum() / missing_energy.sum()))


def run_stream(config: Config, observed_fraction: float, seed: int) -> dict[str, Any]:
    """Run every streamed system on one stream, and the contraction sweep at the same rate and
    seed; return per-system, per-epoch numbers and the diagnostics."""
    names = system_names(config)
    stream = config.stream(observed_fraction).generate(seed)
    pretrained = pretrain(config, stream.source_X_observed, seed)
    systems = build_systems(config, pretrained, stream.source_X_observed, seed)
    tracked = [name for name in names["tracked"] if name in systems]
    # The oracle routes each sample to the pre-trained expert matched to its true subspace.
    assignment, _ = match_experts(systems["oracle"].bases_, stream.snapshots[0])
    oracle_expert = np.argsort(assignment)

    n_samples = len(stream.labels)
    observed_X = stream.X
    squared_error = {name: np.zeros(n_samples) for name in systems}
    routes = {name: np.zeros(n_samples, dtype=int) for name in names["routed"]}
    # per tracked system and batch: distance of each true subspace to its nearest expert (the
    # switch fits), and for mosaic_decreasing of each expert to its nearest true subspace (the plot)
    distances: dict[str, list[np.ndarray]] = {name: [] for name in tracked}
    expert_distances = []
    detections: dict[str, list[int]] = {n: [] for n in names["detecting"] if n in systems}
    epoch_starts = set(stream.epoch_starts.tolist())
    missing_energy = ((stream.X_full * ~stream.mask) ** 2).sum(axis=1)

    starts = range(0, n_samples, config.batch_size)
    with progress(len(starts), "stream batches") as bar:
        for start in starts:
            batch = slice(start, start + config.batch_size)
            X, mask, truth = observed_X[batch], stream.mask[batch], stream.X_full[batch]
            if epoch_starts & set(range(start, start + config.batch_size)):
                systems["mosaic_decreasing_oracle_resets"].reset_steps()
            for name, model in systems.items():
                started = hasattr(model, "n_features_in_")
                completed = model.transform(X, mask=mask) if started else np.where(mask, X, 0.0)
                if name == "windowed":  # routes of the batch with the experts it was completed with
                    routes[name][batch] = model.route(X, mask=mask)
                if name == "oracle":
                    model.partial_fit(X, mask=mask, experts=oracle_expert[stream.labels[batch]])
                elif name in detections:
                    detections[name].extend(_learn(model, X, start, mask=mask))
                else:
                    model.partial_fit(X, mask=mask)
                if name in routes and name != "windowed":
                    routes[name][batch] = model.last_routes_
                squared_error[name][batch] = (((completed - truth) * ~mask) ** 2).sum(axis=1)
            true_bases = stream.snapshots[np.searchsorted(stream.snapshot_times, start)]
            for name in tracked:
                pairwise = pairwise_subspace_distances(true_bases, systems[name].bases_)
                distances[name].append(pairwise.min(axis=1))
                if name == "mosaic_decreasing":
                    expert_distances.append(pairwise.min(axis=0))
            bar.advance()

    epoch_bounds = [*stream.epoch_starts.tolist(), n_samples]
    windows = list(itertools.pairwise(range(0, n_samples + 1, WINDOW)))
    cell: dict[str, Any] = {
        "kind": "stream",
        "observed_fraction": observed_fraction,
        "seed": seed,
        "systems": {},
    }
    for name in systems:
        row: dict[str, Any] = {}
        for epoch, lo, hi in zip(EPOCHS, epoch_bounds[:-1], epoch_bounds[1:], strict=True):
            row[f"nrmse_{epoch}"] = _nrmse(squared_error[name][lo:hi], missing_energy[lo:hi])
            row[f"routing_{epoch}"] = (
                routing_accuracy(routes[name][lo:hi], stream.labels[lo:hi], config.n_subspaces)
                if name in routes
                else None
            )
        row["window_nrmse"] = [
            _nrmse(squared_error[name][lo:hi], missing_energy[lo:hi]) for lo, hi in windows
        ]
        row["regret"] = float(
            (squared_error[name].sum() - squared_error["oracle"].sum()) / missing_energy.sum()
        )
        cell["systems"][name] = row
    # Per-bin sums for the plots: NRMSE over time and cumulative regret to the oracle.
    edges = np.arange(0, n_samples + 1, max(config.batch_size, n_samples // 100))
    cell["bin_edges"] = edges.tolist()
    cell["bin_missing_energy"] = [
        float(missing_energy[a:b].sum()) for a, b in itertools.pairwise(edges)
    ]
    cell["bin_squared_error"] = {
        name: [float(squared_error[name][a:b].sum()) for a, b in itertools.pairwise(edges)]
        for name in systems
    }
    cell["epoch_starts"] = stream.epoch_starts.tolist()
    switch_starts = [epoch_bounds[i] for i in SWITCHES]
    cell["contraction"] = {
        name: [
            _switch_contraction(np.asarray(distances[name]), stream, config, index)
            for index in SWITCHES
        ]
        for name in tracked
    }
    cell["detections"] = {
        name: _detection_summary(times, switch_starts, n_samples)
        for name, times in detections.items()
    }
    sweep = contraction_sweep(config, observed_fraction, seed, pretrained)
    cell["contraction"] |= sweep["contraction"]
    cell["detections"] |= sweep["detections"]
    # each expert's distance to its nearest true subspace after each batch, for the plot
    cell["distance_t"] = (np.arange(1, len(expert_distances) + 1) * config.batch_size).tolist()
    cell["distances"] = np.asarray(expert_distances).T.tolist()
    cell["reference"] = {
        "true_subspaces": true_subspace_oracle(stream, epoch_bounds),
        "grouse_static": {"nrmse": static_grouse(config, observed_fraction, seed)},
    }
    return cell


def _detection_summary(
    times: list[int], switch_starts: list[int], n_samples: int
) -> dict[str, Any]:
    """Delay from each switch to the residual test's first detection (None if it fired not within
    :data:`DETECTION_DELAY` samples), and the detections far from any switch (false alarms)."""
    times_array = np.asarray(sorted(times), dtype=int)
    delays = []
    near = np.zeros(len(times_array), bool)
    for switch in switch_starts:
        inside = (times_array >= switch) & (times_array < switch + DETECTION_DELAY)
        delays.append(int(times_array[inside][0] - switch) if inside.any() else None)
        near |= inside
    return {"delays": delays, "false_alarms": int((~near).sum()), "n_samples": n_samples}


def true_subspace_oracle(stream: Any, epoch_bounds: list[int]) -> dict[str, float]:
    """NRMSE per epoch of the oracle that knows each sample's true subspace: the sample completed
    by least squares on its observed entries in the basis it was drawn from.

    Measured on the samples at which the stream recorded its true bases (the first of each batch),
    where that basis is exact: in the drift epochs the subspaces move between records."""
    times = stream.snapshot_times
    bases = stream.snapshots[np.arange(len(times)), stream.labels[times]]  # (S, n, r)
    mask = stream.mask[times]
    truth = stream.X_full[times]
    observed = mask.astype(float)
    gram = np.einsum("snr,sn,snq->srq", bases, observed, bases)
    rhs = np.einsum("snr,sn->sr", bases, truth * observed)
    weights = np.linalg.solve(gram + RIDGE * np.eye(bases.shape[2]), rhs[..., None])[..., 0]
    completed = np.einsum("snr,sr->sn", bases, weights)
    squared_error = (((completed - truth) * ~mask) ** 2).sum(axis=1)
    missing_energy = ((truth * ~mask) ** 2).sum(axis=1)
    row = {}
    for epoch, lo, hi in zip(EPOCHS, epoch_bounds[:-1], epoch_bounds[1:], strict=True):
        inside = (times >= lo) & (times < hi)
        row[f"nrmse_{epoch}"] = _nrmse(squared_error[inside], missing_energy[inside])
    return row


def static_grouse(config: Config, observed_fraction: float, seed: int) -> float:
    """NRMSE of GROUSE at rank r on one static subspace: a stream of the experiment's dimension,
    rank, rate and noise as long as its stationary epoch, from a random start (no source batch), with
    its step and batches, prequential; the NRMSE over the second half, once it has had the first
    half to converge."""
    length = config.epoch_lengths[0]
    stream = DriftingSubspaceStream(
        n_features=config.n_features,
        n_subspaces=1,
        rank=config.rank,
        observed_fraction=observed_fraction,
        noise=config.noise,
        n_source=0,
        epochs=(Epoch("stationary", length),),
        snapshot_every=length,
    ).generate(seed)
    tracker = GROUSE(config.rank, step_size=config.step_size, random_state=seed)
    X = stream.X
    squared_error = np.zeros(length)
    for start in range(0, length, config.batch_size):
        batch = slice(start, start + config.batch_size)
        started = hasattr(tracker, "n_features_in_")
        completed = tracker.transform(X[batch]) if started else np.nan_to_num(X[batch])
        tracker.partial_fit(X[batch])
        missing = ~stream.mask[batch]
        squared_error[batch] = (((completed - stream.X_full[batch]) * missing) ** 2).sum(axis=1)
    missing_energy = ((stream.X_full * ~stream.mask) ** 2).sum(axis=1)
    half = length // 2
    return _nrmse(squared_error[half:], missing_energy[half:])


def routing_sweep(config: Config, seed: int) -> dict[str, Any]:
    """Routing accuracy against the observation rate: the true subspaces (matched subspace
    detection with missing data, Balzano, Recht, Nowak 2010) and MoSAIC's experts pre-trained at
    that rate, on ``routing_samples`` stationary samples per rate."""
    cell: dict[str, Any] = {"kind": "routing", "seed": seed, "true_subspaces": {}, "mosaic": {}}
    with progress(len(config.routing_fractions), "routing sweep rates") as bar:
        for rate in config.routing_fractions:
            stream = replace(
                config.stream(rate),
                epochs=(Epoch("stationary", config.routing_samples),),
                snapshot_every=config.routing_samples,
            ).generate(seed)
            X = np.where(stream.mask, stream.X_full, 0.0)
            by_truth = route(stream.snapshots[0], X, stream.mask)[0]
            by_experts = pretrain(config, stream.source_X_observed, seed).route(stream.X)
            key = rate_key(rate)
            truth_accuracy = routing_accuracy(by_truth, stream.labels, config.n_subspaces)
            cell["true_subspaces"][key] = truth_accuracy
            cell["mosaic"][key] = routing_accuracy(by_experts, stream.labels, config.n_subspaces)
            bar.advance()
    return cell


def _switch_contraction(
    distances: np.ndarray, stream: Any, config: Config, epoch: int, *, whole_epoch: bool = False
) -> dict[str, Any]:
    """How the replaced subspace's error (distance to its nearest expert) decays after a switch.

    The switch counts as recovered when the error at the end of the epoch (median of its last
    fifth, the floor) is below a quarter of the error right after the switch. By default only a
    recovered switch is fitted, from the switch until the error first reaches twice the floor (past
    that, noise and routing set the error); with ``whole_epoch`` every switch is fitted over the
    whole epoch (the same stretch for every schedule, as the contraction sweep compares them). The
    fit: the power-law exponent a of ``error ∝ t^(−a)``, and whether a power law fits that stretch
    better than an exponential. No fit (None) when fewer than 3 points remain."""
    bounds = [*stream.epoch_starts.tolist(), len(stream.labels)]
    first, last = (bound // config.batch_size for bound in bounds[epoch : epoch + 2])
    errors = distances[first:last, stream.switched[epoch][0]]
    floor = np.median(errors[-max(3, len(errors) // 5) :])
    recovered = bool(floor <= errors[0] / 4)
    if whole_epoch:
        end = len(errors)
    elif recovered:
        end = int(np.flatnonzero(errors <= 2 * floor)[0])
    else:
        end = 0
    if end < 3:
        return {"recovered": recovered, "exponent": None, "power_law_fits_better": None}
    steps = np.arange(1, end + 1) * config.batch_size
    return {
        "recovered": recovered,
        "exponent": contraction_exponent(steps, errors[:end]),
        "power_law_fits_better": power_law_fits_better(steps, errors[:end]),
    }


def _cells(config: Config) -> list[dict[str, Any]]:
    """The run's cells in order: a routing sweep per seed, then a stream per rate and seed."""
    routing = [{"kind": "routing", "seed": config.seed + i} for i in range(config.n_seeds)]
    streams = [
        {"kind": "stream", "p": rate, "seed": config.seed + i}
        for rate in config.observed_fractions
        for i in range(config.n_seeds)
    ]
    return routing + streams


def _run_cell(config: Config, cell: dict[str, Any]) -> dict[str, Any]:
    if cell["kind"] == "routing":
        return routing_sweep(config, cell["seed"])
    return run_stream(config, cell["p"], cell["seed"])


def _refuse_old_checkpoints(out_dir: Path) -> None:
    """A checkpoint of a run from before :func:`run_cells` (its cells listed, not keyed) cannot be
    resumed: refuse it in one line instead of failing on its layout."""
    last = Checkpointer(out_dir, resume=True).load_latest()
    if last is not None and isinstance(last[1], dict) and "cells" in last[1]:
        raise ValueError(
            f"--resume: {out_dir} holds checkpoints of an older MoSAIC run (cells saved in a list); "
            "run again without --resume"
        )


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    if resume:
        _refuse_old_checkpoints(out_dir)
    planned = _cells(config)
    # Checkpointed after every cell; a resumed run must have the same config (device aside).
    outcomes = run_cells(
        out_dir, config, planned, partial(_run_cell, config), resume=resume, label="mosaic cells"
    )
    streams = [c for c, cell in zip(outcomes, planned, strict=True) if cell["kind"] == "stream"]
    sweeps = [c for c, cell in zip(outcomes, planned, strict=True) if cell["kind"] == "routing"]
    metrics = summarise(streams, sweeps, config)
    _plot_errors(streams, config, out_dir / "error_over_time.png")
    _plot_diagnostics(streams, metrics, config, out_dir / "diagnostics.png")
    return Result(
        metrics=metrics,
        claims=claims(metrics, streams, sweeps, config),
        regime=regime(metrics, config),
    )


def _mean(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def summarise(
    streams: list[dict[str, Any]], sweeps: list[dict[str, Any]], config: Config
) -> dict[str, dict[str, float | None]]:
    """One row per system (and regime reference); every row has the same keys, None where a
    number does not apply. Means are over seeds (per rate) or over rates and seeds:

    - ``nrmse_<rate>_<epoch>``; ``nrmse_mean`` over them and ``nrmse_seed_std`` (sample standard
      deviation over seeds of the epoch-mean NRMSE, averaged over rates);
    - ``nrmse_<rate>_first_window``: the first :data:`WINDOW` samples (pre-training's head start);
      ``windows_below_kgrouse``: share of windows where the NRMSE is below 0.95 × k-GROUSE's
      (at the same step: :data:`SAME_STEP_KGROUSE`);
    - ``regret``: cumulative squared error minus the oracle's, over the missing energy;
    - ``routing_accuracy_<epoch>``;
    - the worst single stream (rate and seed), for the claims that must hold on every seed:
      ``first_window_vs_kgrouse_worst`` (first-window NRMSE over the same-step k-GROUSE's, largest),
      ``drift_vs_frozen_worst`` (drift-epoch NRMSE over the frozen experts', largest) and
      ``routing_accuracy_worst_stream`` (smallest over streams and epochs);
    - for the tracked MoSAIC variants, the switch contraction fits: mean exponent, switches
      recovered and fitted, share of fits where a power law beats an exponential;
    - for the detecting variants, the residual test: share of switches found within
      :data:`DETECTION_DELAY` samples, mean delay, false alarms per 10,000 samples;
    - ``routing_sweep_<rate>`` (the ``mosaic`` row: pre-trained experts; ``true_subspaces``: the
      true subspaces).

    Speed is measured in ``benchmarks/mosaic.py``, not here, so that the same seed gives the same
    metrics."""
    names = system_names(config)
    metrics: dict[str, dict[str, float | None]] = {}
    for name in names["streamed"]:
        metrics[name] = _stream_fields(name, streams, config) | _switch_fields(name, streams, names)
    for name in names["sweep"]:  # not on the five-epoch streams: only the switch numbers apply
        metrics[name] = dict.fromkeys(metrics["mosaic"]) | _switch_fields(name, streams, names)
    keys = list(metrics[names["all"][0]])
    sweep_keys = [f"routing_sweep_{rate_key(rate)}" for rate in config.routing_fractions]
    for name in REFERENCES:
        metrics[name] = _reference_row(name, streams, config, keys)
    for name, row in metrics.items():
        for key in sweep_keys:
            row[key] = (
                _mean([s[name][key.removeprefix("routing_sweep_")] for s in sweeps])
                if name in ("mosaic", "true_subspaces")
                else None
            )
    return metrics


def _stream_fields(
    name: str, streams: list[dict[str, Any]], config: Config
) -> dict[str, float | None]:
    """A streamed system's NRMSE, window, regret and routing numbers (see :func:`summarise`)."""
    rows = [c["systems"][name] for c in streams]
    baseline = [c["systems"][SAME_STEP_KGROUSE.get(name, "kgrouse")] for c in streams]
    row: dict[str, float | None] = {}
    spreads = []
    for rate in config.observed_fractions:
        at_rate = [c["systems"][name] for c in streams if c["observed_fraction"] == rate]
        for epoch in EPOCHS:
            row[f"nrmse_{rate_key(rate)}_{epoch}"] = _mean([r[f"nrmse_{epoch}"] for r in at_rate])
        row[f"nrmse_{rate_key(rate)}_first_window"] = _mean([r["window_nrmse"][0] for r in at_rate])
        per_seed = [np.mean([r[f"nrmse_{e}"] for e in EPOCHS]) for r in at_rate]
        spreads.append(np.std(per_seed, ddof=1) if len(per_seed) > 1 else 0.0)
    row["nrmse_mean"] = _mean(list(_epoch_cases(row).values()))
    row["nrmse_seed_std"] = float(np.mean(spreads))
    row["windows_below_kgrouse"] = _mean(
        [
            np.mean(np.asarray(r["window_nrmse"]) < 0.95 * np.asarray(b["window_nrmse"]))
            for r, b in zip(rows, baseline, strict=True)
        ]
    )
    row["regret"] = _mean([r["regret"] for r in rows])
    for epoch in EPOCHS:
        row[f"routing_accuracy_{epoch}"] = _mean([r[f"routing_{epoch}"] for r in rows])
    # the worst single stream (rate and seed), for claims that must hold on every seed
    row["first_window_vs_kgrouse_worst"] = max(
        r["window_nrmse"][0] / b["window_nrmse"][0] for r, b in zip(rows, baseline, strict=True)
    )
    frozen = [c["systems"]["frozen"] for c in streams]
    row["drift_vs_frozen_worst"] = max(
        r[f"nrmse_{epoch}"] / f[f"nrmse_{epoch}"]
        for r, f in zip(rows, frozen, strict=True)
        for epoch in DRIFTS
    )
    routed = [r[f"routing_{epoch}"] for r in rows for epoch in EPOCHS]
    row["routing_accuracy_worst_stream"] = None if routed[0] is None else min(routed)
    return row


def _switch_fields(
    name: str, streams: list[dict[str, Any]], names: dict[str, tuple[str, ...]]
) -> dict[str, float | None]:
    """The switch decay fits (tracked systems) and the residual test's record (detecting ones);
    None where the system is neither (see :func:`summarise`)."""
    fits = [f for c in streams for f in c["contraction"].get(name, [])]
    fitted = [f["exponent"] for f in fits if f["exponent"] is not None]
    tracked, detecting = name in names["tracked"], name in names["detecting"]
    row: dict[str, float | None] = {
        "switch_contraction_exponent": _mean(fitted),
        "switch_contraction_exponent_std": float(np.std(fitted, ddof=1))
        if len(fitted) > 1
        else None,
        "switches_recovered": sum(f["recovered"] for f in fits) if tracked else None,
        "switches_fitted": len(fitted) if tracked else None,
        "switch_power_law_share": _mean(
            [f["power_law_fits_better"] for f in fits if f["exponent"] is not None]
        ),
    }
    records = [c["detections"][name] for c in streams if name in c["detections"]]
    delays = [delay for record in records for delay in record["delays"]]
    alarms = sum(record["false_alarms"] for record in records)
    seen = sum(record["n_samples"] for record in records)
    row["switches_detected_share"] = (
        float(np.mean([d is not None for d in delays])) if detecting else None
    )
    row["detection_delay"] = _mean(delays) if detecting else None
    row["false_alarms_per_10k"] = 1e4 * alarms / seen if detecting else None
    return row


def _reference_row(
    name: str, streams: list[dict[str, Any]], config: Config, keys: list[str]
) -> dict[str, float | None]:
    """A regime reference as a metrics row with the systems' keys: ``true_subspaces`` has the NRMSE
    per rate and epoch; ``grouse_static`` (one static subspace, no epochs) has its NRMSE under
    ``nrmse_<rate>_stationary``. The other numbers do not apply (None)."""
    row: dict[str, float | None] = dict.fromkeys(keys)
    spreads = []
    for rate in config.observed_fractions:
        at_rate = [c["reference"][name] for c in streams if c["observed_fraction"] == rate]
        if name == "true_subspaces":
            for epoch in EPOCHS:
                row[f"nrmse_{rate_key(rate)}_{epoch}"] = _mean(
                    [r[f"nrmse_{epoch}"] for r in at_rate]
                )
            per_seed = [np.mean([r[f"nrmse_{e}"] for e in EPOCHS]) for r in at_rate]
        else:
            per_seed = [r["nrmse"] for r in at_rate]
            row[f"nrmse_{rate_key(rate)}_stationary"] = float(np.mean(per_seed))
        spreads.append(np.std(per_seed, ddof=1) if len(per_seed) > 1 else 0.0)
    row["nrmse_mean"] = _mean(list(_epoch_cases(row).values()))
    row["nrmse_seed_std"] = float(np.mean(spreads))
    return row


def _epoch_cases(row: dict[str, float | None]) -> dict[str, float]:
    """The row's per-rate, per-epoch NRMSEs that were measured, keyed ``<rate> <epoch>``."""
    cases = {}
    for key, value in row.items():
        rate, _, epoch = key.removeprefix("nrmse_").partition("_")
        if key.startswith("nrmse_p") and epoch in EPOCHS and value is not None:
            cases[f"{rate} {epoch}"] = value
    return cases


def regime(metrics: dict[str, dict[str, Any]], config: Config) -> list[Claim]:
    """The stream can be solved at every chosen rate: the true-subspace oracle completes it to
    NRMSE <= 0.05 and GROUSE at rank r tracks one static subspace to NRMSE <= 0.1 (worst rate and
    epoch, mean over seeds; thresholds fixed in advance)."""
    oracle = _epoch_cases(metrics["true_subspaces"])
    grouse = _epoch_cases(metrics["grouse_static"])
    oracle_where, grouse_where = max(oracle, key=oracle.get), max(grouse, key=grouse.get)
    rates = ", ".join(str(rate) for rate in config.observed_fractions)
    return [
        Claim.compare(
            f"The oracle with the true subspaces (least squares on the observed entries) completes "
            f"the stream to NRMSE <= {ORACLE_MAX_NRMSE} at every rate p in ({rates}) and epoch",
            oracle[oracle_where],
            "<=",
            ORACLE_MAX_NRMSE,
            value_label=f"true-subspace oracle NRMSE, worst case {oracle_where}:",
        ),
        Claim.compare(
            f"GROUSE at rank r tracks a single static subspace to NRMSE <= {STATIC_GROUSE_MAX_NRMSE} "
            f"at every rate p in ({rates}) (second half of the stream, from a random start)",
            grouse[grouse_where],
            "<=",
            STATIC_GROUSE_MAX_NRMSE,
            value_label=f"static GROUSE NRMSE, worst case {grouse_where}:",
        ),
    ]


def _ratio(value: float, reference: float) -> float:
    """``value / reference``; infinite (or NaN for 0/0) when the reference is 0, so that a claim
    of ``ratio < 1`` fails where ``value < reference`` would."""
    if reference > 0:
        return value / reference
    return math.inf if value > 0 else math.nan


def _by_rate(streams: list[dict[str, Any]], config: Config) -> dict[float, list[dict[str, Any]]]:
    """The stream cells of each observation rate, in seed order."""
    return {
        rate: sorted(
            (c for c in streams if c["observed_fraction"] == rate), key=lambda c: c["seed"]
        )
        for rate in config.observed_fractions
    }


def _by_seed(cells: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """The cells of each seed (every rate of a seed's streams), seeds in order."""
    seeds = sorted({c["seed"] for c in cells})
    return {seed: [c for c in cells if c["seed"] == seed] for seed in seeds}


def _per_rate(
    text: str,
    streams: list[dict[str, Any]],
    config: Config,
    value: Callable[[dict[str, Any]], float],
    op: Comparison,
    reference: float,
    label: str,
) -> Claim:
    """``value(cell) op reference`` on every stream, judged seed by seed at each rate (one
    :meth:`Claim.worst_seed` per rate, all of which must hold)."""
    parts = [
        Claim.worst_seed(
            text,
            [value(c) for c in cells],
            op,
            reference,
            seeds=[c["seed"] for c in cells],
            value_label=f"{rate_key(rate)} {label}",
        )
        for rate, cells in _by_rate(streams, config).items()
    ]
    return Claim.all_of(text, parts)


def _with_context(claim: Claim, context: str) -> Claim:
    return replace(claim, evidence=f"{claim.evidence}; {context}")


def _closest_case(metrics: dict[str, dict[str, Any]], system: str, rivals: list[str]) -> str:
    """The rate and epoch where ``system``'s mean NRMSE over seeds comes closest to (or furthest
    past) the best rival's."""
    ours = _epoch_cases(metrics[system])
    ratios = {}
    for case, value in ours.items():
        theirs = {name: _epoch_cases(metrics[name])[case] for name in rivals}
        best = min(theirs, key=theirs.get)
        ratios[case] = (
            _ratio(value, theirs[best]),
            f"{system} {value:.4g} vs {best} {theirs[best]:.4g}",
        )
    case = max(ratios, key=lambda c: ratios[c][0])
    return f"closest case of the means over seeds {case}: {ratios[case][1]}"


def claims(
    metrics: dict[str, dict[str, Any]],
    streams: list[dict[str, Any]],
    sweeps: list[dict[str, Any]],
    config: Config,
) -> list[Claim]:
    """The experiment's claims (``Config.CLAIMS``), each judged seed by seed from the stream cells
    (``streams``) and routing-sweep cells (``sweeps``) of :func:`run`, on its system and again on
    its control; ``metrics`` (:func:`summarise`) adds the means to the evidence."""

    def beats_single_subspace(system: str) -> Claim:
        rivals = [name for name in SINGLE_SUBSPACE if name != system]

        def largest_ratio(cell: dict[str, Any]) -> float:
            rows = cell["systems"]
            return max(
                _ratio(
                    rows[system][f"nrmse_{epoch}"],
                    min(rows[name][f"nrmse_{epoch}"] for name in rivals),
                )
                for epoch in EPOCHS
            )

        label = f"{system} NRMSE over the best single-subspace baseline's, worst epoch"
        claim = _per_rate(system, streams, config, largest_ratio, "<", 1.0, label)
        return _with_context(claim, _closest_case(metrics, system, rivals))

    def head_start(system: str) -> Claim:
        baseline = SAME_STEP_KGROUSE.get(system, "kgrouse")

        def first_window_ratio(cell: dict[str, Any]) -> float:
            rows = cell["systems"]
            return _ratio(rows[system]["window_nrmse"][0], rows[baseline]["window_nrmse"][0])

        label = f"{system} first-window NRMSE over {baseline}'s"
        claim = _per_rate(system, streams, config, first_window_ratio, "<=", HEAD_START, label)
        below = metrics[system]["windows_below_kgrouse"]
        return _with_context(
            claim,
            f"{system} is more than 5 % below {baseline} in {below:.0%} of the {WINDOW}-sample "
            "windows",
        )

    def tracks_drift(system: str) -> Claim:
        def drift_ratio(cell: dict[str, Any]) -> float:
            rows = cell["systems"]
            return max(
                _ratio(rows[system][f"nrmse_{epoch}"], rows["frozen"][f"nrmse_{epoch}"])
                for epoch in DRIFTS
            )

        label = f"{system} drift-epoch NRMSE over the frozen experts', worst drift epoch"
        return _per_rate(system, streams, config, drift_ratio, "<=", TRACKS_DRIFT, label)

    def routing_stays_high(system: str) -> Claim:
        def worst_epoch(cell: dict[str, Any]) -> float:
            return min(cell["systems"][system][f"routing_{epoch}"] for epoch in EPOCHS)

        label = f"{system} routing accuracy, worst epoch"
        return _per_rate(system, streams, config, worst_epoch, ">=", HIGH_ROUTING_ACCURACY, label)

    sweep = sweep_names(config)
    taus = ", ".join(f"{tau:g}" for tau in sweep)
    return [
        config.judge("beats_single_subspace", beats_single_subspace),
        config.judge("head_start", head_start),
        config.judge("tracks_drift", tracks_drift),
        config.judge("routing_stays_high", routing_stays_high),
        config.judge("detects_switches", lambda system: _detection_test(system, streams, metrics)),
        config.judge(
            "sublinear_decay", lambda system: _decay_test(system, streams, metrics, config)
        ),
        config.judge(
            "exponent_not_schedule",
            lambda system: _spread_test(system, streams, metrics, config),
            text_values={"taus": taus},
        ),
        config.judge(
            "routing_transition", lambda system: _transition_test(system, sweeps, metrics, config)
        ),
    ]


def _detection_test(
    system: str, streams: list[dict[str, Any]], metrics: dict[str, dict[str, Any]]
) -> Claim:
    """The residual test's record, seed by seed (pooled over the seed's rates): the share of
    switches detected within :data:`DETECTION_DELAY` samples and the false alarms per 10,000
    samples. ``random_alarms``: on each stream as many alarms as ``mosaic_decreasing``'s residual
    test raised (the fewest that give its record: one per switch it found, plus its false alarms)
    at independent uniform times; its expected share found and false alarms."""
    shares, alarms = [], []
    for cells in _by_seed(streams).values():
        found = switches = false_alarms = seen = 0.0
        for cell in cells:
            detector = "mosaic_decreasing" if system == "random_alarms" else system
            record = cell["detections"][detector]
            caught = sum(delay is not None for delay in record["delays"])
            n_switches, n_samples = len(record["delays"]), record["n_samples"]
            if system == "random_alarms":
                n_alarms = caught + record["false_alarms"]
                # one alarm at a uniform time lands within DETECTION_DELAY after a given switch
                window = min(1.0, DETECTION_DELAY / n_samples)
                found += n_switches * (1 - (1 - window) ** n_alarms)
                false_alarms += n_alarms * (1 - min(1.0, n_switches * window))
            else:
                found += caught
                false_alarms += record["false_alarms"]
            switches += n_switches
            seen += n_samples
        shares.append(found / switches if switches else math.nan)
        alarms.append(1e4 * false_alarms / seen)
    seeds = list(_by_seed(streams))
    claim = Claim.all_of(
        system,
        [
            Claim.worst_seed(
                system,
                shares,
                ">=",
                DETECTED_SHARE,
                seeds=seeds,
                value_label=f"{system} share of switches found within {DETECTION_DELAY} samples",
            ),
            Claim.worst_seed(
                system,
                alarms,
                "<=",
                MAX_FALSE_ALARMS,
                seeds=seeds,
                value_label=f"{system} false alarms per 10,000 samples",
            ),
        ],
    )
    delay = metrics.get(system, {}).get("detection_delay")
    return claim if delay is None else _with_context(claim, f"mean delay {delay:.0f} samples")


def _decay_test(
    system: str, streams: list[dict[str, Any]], metrics: dict[str, dict[str, Any]], config: Config
) -> Claim:
    """Seed by seed, over the seed's recovered and fitted switches: the mean power-law exponent
    lies in (0, 1) and a power law fits better than an exponential in most of them (no fit on a
    seed: it fails)."""
    exponents, shares = [], []
    for cells in _by_seed(streams).values():
        fits = [f for c in cells for f in c["contraction"][system] if f["exponent"] is not None]
        exponents.append(float(np.mean([f["exponent"] for f in fits])) if fits else math.nan)
        shares.append(
            float(np.mean([f["power_law_fits_better"] for f in fits])) if fits else math.nan
        )
    seeds = list(_by_seed(streams))
    parts = [
        Claim.worst_seed(system, exponents, ">", 0.0, seeds=seeds, value_label=f"{system} a"),
        Claim.worst_seed(system, exponents, "<", 1.0, seeds=seeds, value_label=f"{system} a"),
        Claim.worst_seed(
            system,
            shares,
            ">",
            0.5,
            seeds=seeds,
            value_label=f"{system} share of fits where a power law is better",
        ),
    ]
    row = metrics[system]
    n_switches = len(SWITCHES) * len(config.observed_fractions) * config.n_seeds
    grouse = metrics["mosaic_grouse_schedule"]["switch_contraction_exponent"]
    return _with_context(
        Claim.all_of(system, parts),
        f"{row['switches_recovered']} of {n_switches} switches recovered, "
        f"{row['switches_fitted']} fitted; GROUSE's η₀/t schedule: a = "
        + (f"{grouse:.3g}" if grouse is not None else "no fit"),
    )


def _spread_test(
    system: str, streams: list[dict[str, Any]], metrics: dict[str, dict[str, Any]], config: Config
) -> Claim:
    """Seed by seed: how much the contraction exponent varies over τ (largest over smallest of
    the seed's mean exponents per τ; infinite when one τ gave no positive fit). Only the τ sweep
    runs at several τ: another system (the control, GROUSE's schedule) has no spread over τ and
    is not run (untested)."""
    if system != "mosaic_tau_sweep":
        return Claim.not_run(
            system, f"{system} runs one schedule, not one per τ: it has no spread over τ"
        )
    sweep = sweep_names(config)
    by_seed = _by_seed(streams)
    spreads = []
    for cells in by_seed.values():
        means = [
            _mean([f["exponent"] for c in cells for f in c["contraction"][name]])
            for name in sweep.values()
        ]
        measured = [a for a in means if a is not None and a > 0]
        complete = len(measured) == len(means)
        spreads.append(max(measured) / min(measured) if complete else math.inf)
    label = "spread of the exponent over τ (largest / smallest)"
    claim = Claim.worst_seed(
        system, spreads, "<", EXPONENT_SPREAD, seeds=list(by_seed), value_label=label
    )
    exponents = {tau: metrics[name]["switch_contraction_exponent"] for tau, name in sweep.items()}
    listed = ", ".join(
        f"τ={tau:g}: " + (f"{a:.3g}" if a is not None else "no fit") for tau, a in exponents.items()
    )
    measured = {tau: a for tau, a in exponents.items() if a is not None and a > 0}
    slope = (
        f", slope of log a against log τ "
        f"{np.polyfit(np.log(list(measured)), np.log(list(measured.values())), 1)[0]:.2f}"
        if len(measured) >= 2
        else ""
    )
    return _with_context(claim, f"means over seeds {listed}{slope}")


def _transition_test(
    system: str, sweeps: list[dict[str, Any]], metrics: dict[str, dict[str, Any]], config: Config
) -> Claim:
    """Matched subspace detection needs about r·log r observed entries (Balzano, Recht, Nowak 2010):
    seed by seed, ``system``'s routing accuracy on the routing sweep is below
    :data:`LOW_ROUTING_ACCURACY` at the smallest rate and first reaches
    :data:`HIGH_ROUTING_ACCURACY` at an expected observed count p·n within a factor 2 of r·ln r
    (infinite when it never does)."""
    target = config.rank * math.log(config.rank)
    rates = sorted(config.routing_fractions)
    cells = sorted(sweeps, key=lambda c: c["seed"])
    seeds = [c["seed"] for c in cells]
    lows, counts = [], []
    for cell in cells:
        accuracy = [cell[system][rate_key(rate)] for rate in rates]
        lows.append(accuracy[0])
        crossing = next(
            (rate for rate, value in zip(rates, accuracy, strict=True)
             if value >= HIGH_ROUTING_ACCURACY),
            None,
        )  # fmt: skip
        counts.append(math.inf if crossing is None else crossing * config.n_features)
    crossing_label = f"{system} p·n where accuracy first reaches {HIGH_ROUTING_ACCURACY}"
    parts = [
        Claim.worst_seed(
            system,
            lows,
            "<",
            LOW_ROUTING_ACCURACY,
            seeds=seeds,
            value_label=f"{system} accuracy at p={rates[0]:g}",
        ),
        Claim.worst_seed(system, counts, ">=", target / 2, seeds=seeds, value_label=crossing_label),
        Claim.worst_seed(system, counts, "<=", 2 * target, seeds=seeds, value_label=crossing_label),
    ]
    means = ", ".join(
        f"p={rate:g}: {metrics[system][f'routing_sweep_{rate_key(rate)}']:.2f}" for rate in rates
    )
    return _with_context(
        Claim.all_of(system, parts), f"r·ln r = {target:.3g}; means over seeds {means}"
    )


def _curve(cell: dict[str, Any], name: str) -> np.ndarray:
    return np.sqrt(
        np.asarray(cell["bin_squared_error"][name]) / np.asarray(cell["bin_missing_energy"])
    )


def _mark_epochs(axes: Any, cell: dict[str, Any]) -> None:
    for start, epoch in zip(cell["epoch_starts"], EPOCHS, strict=True):
        axes.axvline(start, color="grey", linestyle=":")
        axes.text(
            start, 1.0, f" {epoch}", transform=axes.get_xaxis_transform(), va="top", fontsize=7
        )


def _plot_errors(streams: list[dict[str, Any]], config: Config, path: Path) -> None:
    """Windowed NRMSE over the stream for the first seed at each rate, epochs marked."""
    shown = (  # mosaic last, on top of k-GROUSE's curve, which it equals once pre-training is forgotten
        "mosaic_decreasing",
        *SINGLE_SUBSPACE,
        "kgrouse",
        "frozen",
        "oracle",
        "windowed",
        "mosaic",
    )
    rates = config.observed_fractions
    figure = Figure(figsize=(5 * len(rates) + 1.5, 4), layout="constrained")
    for index, rate in enumerate(rates):
        cell = next(c for c in streams if c["observed_fraction"] == rate)
        axes = figure.add_subplot(1, len(rates), index + 1)
        for name in shown:
            axes.plot(
                cell["bin_edges"][1:],
                _curve(cell, name),
                label=name,
                linewidth=2 if name == "mosaic" else 1,
            )
        _mark_epochs(axes, cell)
        axes.set(
            yscale="log",
            xlabel="sample",
            ylabel="NRMSE on unobserved entries",
            title=f"p = {rate}, seed {cell['seed']}",
        )
        axes.grid(alpha=0.3)
    handles, labels = figure.axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside right upper", fontsize=7)  # off the curves
    save_figure(figure, path)


def _plot_diagnostics(
    streams: list[dict[str, Any]], metrics: dict[str, dict[str, Any]], config: Config, path: Path
) -> None:
    """Five panels: cumulative regret to the oracle and each mosaic_decreasing expert's distance to
    its nearest true subspace over time (first stream at the middle rate), the NRMSE ratio to
    k-GROUSE at the same step per window (mean over streams), routing accuracy against p, and the
    switch contraction exponent against τ."""
    rate = config.observed_fractions[len(config.observed_fractions) // 2]
    cell = next(c for c in streams if c["observed_fraction"] == rate)
    figure = Figure(figsize=(22, 4))
    regret, angles, windows, routing, sweep = (figure.add_subplot(1, 5, i + 1) for i in range(5))
    energy = np.cumsum(cell["bin_missing_energy"])
    oracle = np.cumsum(cell["bin_squared_error"]["oracle"])
    for name in ("mosaic", "mosaic_decreasing", *SINGLE_SUBSPACE, "kgrouse", "frozen", "windowed"):
        excess = np.cumsum(cell["bin_squared_error"][name]) - oracle
        regret.plot(cell["bin_edges"][1:], excess / energy, label=name)
    _mark_epochs(regret, cell)
    regret.set_yscale("symlog", linthresh=1e-2)
    regret.set(xlabel="sample", ylabel="cumulative regret to the oracle",
               title=f"p = {rate}, seed {cell['seed']}")  # fmt: skip
    regret.legend(fontsize=7)
    for k, distances in enumerate(cell["distances"]):
        angles.plot(cell["distance_t"], distances, label=f"expert {k}")
    _mark_epochs(angles, cell)
    angles.set(yscale="log", xlabel="sample", ylabel="‖sin Θ‖ to the nearest true subspace",
               title="mosaic_decreasing")  # fmt: skip
    angles.legend(fontsize=7)
    for name in ("mosaic", "mosaic_decreasing", "mosaic_small_step"):
        rival = SAME_STEP_KGROUSE.get(name, "kgrouse")
        ratios = np.mean(
            [
                np.asarray(c["systems"][name]["window_nrmse"])
                / np.asarray(c["systems"][rival]["window_nrmse"])
                for c in streams
            ],
            axis=0,
        )
        ends = WINDOW * np.arange(1, len(ratios) + 1)
        windows.plot(ends, ratios, marker=".", label=f"{name} / {rival}")
    windows.axhline(1.0, color="grey", linestyle=":")
    windows.set(yscale="log", xlabel=f"end of the {WINDOW}-sample window",
                ylabel="NRMSE ratio to k-GROUSE", title="mean over rates and seeds")  # fmt: skip
    windows.legend(fontsize=7)
    fractions = sorted(config.routing_fractions)
    for name, label in (("true_subspaces", "true subspaces"), ("mosaic", "pre-trained experts")):
        values = [metrics[name][f"routing_sweep_{rate_key(p)}"] for p in fractions]
        routing.plot([p * config.n_features for p in fractions], values, marker="o", label=label)
    routing.axvline(
        config.rank * math.log(config.rank), color="grey", linestyle=":", label="r·ln r"
    )
    routing.set(xlabel="expected observed entries p·n", ylabel="routing accuracy", ylim=(0, 1.02))
    routing.legend(fontsize=7)
    taus = list(sweep_names(config))
    means = [metrics[name]["switch_contraction_exponent"] for name in sweep_names(config).values()]
    spreads = [
        metrics[name]["switch_contraction_exponent_std"] for name in sweep_names(config).values()
    ]
    sweep.errorbar(
        taus,
        [np.nan if m is None else m for m in means],
        yerr=[0.0 if s is None else s for s in spreads],
        marker="o",
        capsize=3,
    )
    sweep.axhline(1.0, color="grey", linestyle=":")
    sweep.set(xscale="log", xlabel="τ of the decreasing step", ylabel="contraction exponent a")
    for axes in (regret, angles, windows, routing, sweep):
        axes.grid(alpha=0.3)
    save_figure(figure, path)
