"""Solving a user's instances with a trained POMO model, checking routes, and VRPLIB files.

:func:`solve` takes :class:`~.instances.RoutingInstances` (arrays of any N), a mapping of their
fields, or VRPLIB files (``.vrp`` / ``.tsp``, read with ``vrplib``, which ships with PyVRP). Instances
outside the unit square the model was trained on are shifted and scaled into it (one factor for
both axes, times scaled alike); every route is then checked and costed on the original
coordinates by :func:`check_routes`, which shares no code with the rollout.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixlab.rl.mixroute.instances import RoutingInstances
from mixlab.rl.mixroute.pomo import POMOModel
from mixlab.rl.mixroute.training import evaluate

__all__ = [
    "Solutions",
    "check_euc_2d_units",
    "check_routes",
    "leg_length",
    "load_model",
    "read_vrplib",
    "save_model",
    "solve",
    "split_routes",
    "vrplib_paths",
    "write_vrplib",
]

PathLike = str | os.PathLike[str]


@dataclass
class Solutions:
    """Per instance: ``routes`` (lists of customer indices 1..N per vehicle; for TSP one list of
    cities 0..N−1), ``costs`` (total Euclidean length in the input's units) and ``feasible``."""

    routes: list[list[list[int]]] = field(default_factory=list)
    costs: np.ndarray = field(default_factory=lambda: np.zeros(0))
    feasible: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    names: list[str] = field(default_factory=list)

    def to_json(self, reference: Sequence[float] | None = None) -> dict[str, Any]:
        """JSON-able: per instance its name, cost, feasibility, routes and (with ``reference``
        costs) the gap in %."""
        rows = []
        for i, (routes, cost, ok) in enumerate(
            zip(self.routes, self.costs, self.feasible, strict=True)
        ):
            row = {"name": self.names[i] if self.names else str(i), "cost": float(cost),
                   "feasible": bool(ok), "routes": routes}  # fmt: skip
            if reference is not None:
                row["gap_percent"] = float(100 * (cost - reference[i]) / reference[i])
            rows.append(row)
        return {"instances": rows, "mean_cost": float(np.mean(self.costs)) if rows else None}


def split_routes(tour: Sequence[int], problem: str) -> list[list[int]]:
    """A rollout's node sequence as routes: VRP tours split at the depot (0), empty routes
    dropped; a TSP tour is one route."""
    tour = [int(x) for x in tour]
    if problem == "tsp":
        return [tour]
    routes, current = [], []
    for node in tour:
        if node == 0:
            if current:
                routes.append(current)
            current = []
        else:
            current.append(node)
    if current:
        routes.append(current)
    return routes


def leg_length(a: np.ndarray, b: np.ndarray, euc_2d: bool = False) -> float:
    """The Euclidean length from point ``a`` to ``b``; ``euc_2d``: rounded to the nearest
    integer as TSPLIB's EUC_2D defines it, nint(x) = ⌊x + 0.5⌋."""
    length = float(np.linalg.norm(b - a))
    return float(np.floor(length + 0.5)) if euc_2d else length


EUC_2D_MIN_EXTENT = 10.0
"""the smallest coordinate range that VRPLIB's integer rounding of legs can cost meaningfully"""


def check_euc_2d_units(instances: RoutingInstances) -> None:
    """Refuse ``euc_2d`` costing of instances whose coordinates span less than
    :data:`EUC_2D_MIN_EXTENT` (the unit square of ``generate``): rounding each leg to an integer
    would make every leg 0 or 1."""
    extent = float(np.ptp(instances.nodes, axis=1).max(-1).min())
    if extent < EUC_2D_MIN_EXTENT:
        raise ValueError(
            f"euc_2d rounds each leg to an integer and needs coordinates in VRPLIB's units "
            f"(a range of at least {EUC_2D_MIN_EXTENT:g}); these span {extent:.3g}"
        )


def check_routes(
    instances: RoutingInstances, index: int, routes: list[list[int]], *, euc_2d: bool = False
) -> tuple[float, bool]:
    """The cost of ``routes`` for instance ``index`` recomputed from the coordinates, and
    whether they are feasible: each customer (city) exactly once, every load within the
    capacity, every service inside its window and every vehicle back by the depot's horizon.
    ``euc_2d``: every leg (and travel time) rounded as VRPLIB's EUC_2D (:func:`leg_length`), the
    convention CVRPLIB's best-known costs use."""
    locs = instances.locs[index]
    if instances.problem == "tsp":
        tour = routes[0] if len(routes) == 1 else []
        cost = sum(leg_length(locs[tour[k - 1]], locs[tour[k]], euc_2d) for k in range(len(tour)))
        return cost, sorted(tour) == list(range(instances.n))
    points = instances.nodes[index]
    visits = sorted(node for route in routes for node in route)
    feasible = visits == list(range(1, instances.n + 1))
    cost = 0.0
    for route in routes:
        path = [0, *route, 0]
        legs = [leg_length(points[a], points[b], euc_2d) for a, b in itertools.pairwise(path)]
        cost += sum(legs)
        demand = sum(int(instances.demand[index, node - 1]) for node in route)
        feasible &= demand <= instances.capacity[index]
        if instances.windows is not None:
            windows, service, clock = instances.windows[index], instances.service[index], 0.0
            for leg, node in zip(legs, path[1:], strict=True):
                clock = max(clock + leg, windows[node, 0])
                feasible &= clock <= windows[node, 1] + 1e-6
                clock += service[node] if node else 0.0
    return cost, bool(feasible)


def normalise(instances: RoutingInstances) -> RoutingInstances:
    """``instances`` in the unit square the model was trained on: an instance with a point
    outside [0, 1]² is shifted and scaled, one factor for both axes (and its times), so that
    it spans [0, 1]; one inside is kept as it is. Routes do not change, only their units."""
    points = instances.nodes
    inside = ((points >= 0) & (points <= 1)).all((1, 2))[:, None, None]
    low = np.where(inside, 0.0, points.min(1, keepdims=True))
    scale = np.where(inside, 1.0, np.maximum((points - low).max((1, 2), keepdims=True), 1e-12))
    locs = (instances.locs - low) / scale
    if instances.depot is None:
        return RoutingInstances(locs)
    depot = (instances.depot[:, None] - low)[:, 0] / scale[:, 0]
    windows = None if instances.windows is None else instances.windows / scale
    service = None if instances.service is None else instances.service / scale[..., 0]
    return RoutingInstances(locs, depot, instances.demand, instances.capacity, windows, service)


def solve(
    model: POMOModel,
    instances: RoutingInstances | Mapping[str, Any] | PathLike | Sequence[PathLike],
    *,
    augment: bool = True,
    batch_size: int = 100,
    euc_2d: bool = False,
) -> Solutions:
    """Greedy multi-start (×8 augmentation unless ``augment=False``) routes for ``instances``:
    arrays as :class:`~.instances.RoutingInstances` or a mapping of its fields, or VRPLIB files
    (one path, a folder of them or a list; each is solved alone, so sizes may differ). Costs are
    Euclidean, or with ``euc_2d`` sums of legs rounded as VRPLIB's EUC_2D (to compare with
    CVRPLIB's best-known costs)."""
    if isinstance(instances, Mapping):
        instances = RoutingInstances(**instances)
    if not isinstance(instances, RoutingInstances):
        paths = vrplib_paths(instances)
        parts = [solve(model, read_vrplib(p), augment=augment, euc_2d=euc_2d) for p in paths]
        return Solutions(
            [r for part in parts for r in part.routes],
            np.concatenate([part.costs for part in parts]),
            np.concatenate([part.feasible for part in parts]),
            [p.stem for p in paths],
        )
    if instances.problem != model.problem:
        raise ValueError(f"instances are {instances.problem}, the model solves {model.problem}")
    if euc_2d:
        check_euc_2d_units(instances)
    _, tours = evaluate(model, normalise(instances), augment=augment, batch_size=batch_size)
    solutions = Solutions()
    costs, feasible = [], []
    for i, tour in enumerate(tours):
        routes = split_routes(tour, instances.problem)
        cost, ok = check_routes(instances, i, routes, euc_2d=euc_2d)
        solutions.routes.append(routes)
        costs.append(cost)
        feasible.append(ok)
    solutions.costs, solutions.feasible = np.asarray(costs), np.asarray(feasible)
    return solutions


# ------------------------------------------------------------------------------ model files
def save_model(model: POMOModel, folder: PathLike, **metadata: Any) -> Path:
    """``model.safetensors`` and ``config.json`` (the architecture and ``metadata``)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors"
    )
    config = {"problem": model.problem, "dim": model.dim, "layers": len(model.encoder),
              "heads": model.heads, "hidden": model.encoder[0].feed_forward[0].out_features,
              "norm": model.norm, "clip": model.clip, **metadata}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


MODEL_KEYS = ("problem", "dim", "layers", "heads", "hidden", "norm", "clip")


def load_model(folder: PathLike, device: str | torch.device = "cpu") -> POMOModel:
    """A model saved by :func:`save_model` (or the CLI's ``train``), in eval mode."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(f"{folder} has no config.json and model.safetensors of a model")
    config = json.loads((folder / "config.json").read_text())
    model = POMOModel(**{k: config[k] for k in MODEL_KEYS})
    model.load_state_dict(load_file(folder / "model.safetensors"))
    return model.to(device).eval()


# ---------------------------------------------------------------------------- VRPLIB files
def vrplib_paths(source: PathLike | Sequence[PathLike]) -> list[Path]:
    """The .vrp and .tsp files of ``source``: a file, a folder of them, or a list of either."""
    items = [source] if isinstance(source, str | os.PathLike) else list(source)
    paths: list[Path] = []
    for item in map(Path, items):
        if item.is_dir():
            paths += sorted(p for p in item.iterdir() if p.suffix in (".vrp", ".tsp"))
        elif item.is_file():
            paths.append(item)
        else:
            raise FileNotFoundError(f"instances: no such file or folder: {item}")
    if not paths:
        raise FileNotFoundError(f"instances: no .vrp or .tsp files in {items}")
    return paths


def read_vrplib(path: PathLike) -> RoutingInstances:
    """One VRPLIB instance (TSP, CVRP, or VRPTW with time-window and service sections) as a
    batch of one; the depot must be given (DEPOT_SECTION) for VRPs."""
    import vrplib

    data = vrplib.read_instance(path, compute_edge_weights=False)
    if "node_coord" not in data:
        raise ValueError(
            f"{path}: needs a NODE_COORD_SECTION (explicit edge weights are not supported)"
        )
    coords = np.asarray(data["node_coord"], dtype=np.float64)
    if "demand" not in data:
        return RoutingInstances(coords[None])
    depots = np.atleast_1d(data.get("depot", []))
    if len(depots) != 1:
        raise ValueError(
            f"{path}: a VRPLIB file needs exactly one depot in DEPOT_SECTION, got {len(depots)}"
        )
    depot = int(depots[0])
    order = [depot, *(i for i in range(len(coords)) if i != depot)]
    pick = lambda x: np.asarray(x)[order]  # noqa: E731
    windows = service = None
    if "time_window" in data:
        windows, service = pick(data["time_window"])[None], pick(data["service_time"])[None]
    return RoutingInstances(
        pick(coords)[None, 1:], pick(coords)[None, 0], pick(data["demand"]).astype(np.int64)[None, 1:],
        int(data["capacity"]), windows, service,
    )  # fmt: skip


def write_vrplib(
    instances: RoutingInstances, folder: PathLike, stem: str = "instance"
) -> list[Path]:
    """Each instance as ``<stem>-<i>.vrp`` (``.tsp`` for TSP) in VRPLIB's format, coordinates
    in full precision (EUC_2D, not rounded)."""
    import vrplib

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(len(instances)):
        name = f"{stem}-{i:04d}"
        data: dict[str, Any] = {"NAME": name, "TYPE": instances.problem.upper()}
        coords = instances.nodes[i]
        if instances.problem != "tsp":
            data["CAPACITY"] = int(instances.capacity[i])
        data |= {
            "DIMENSION": len(coords),
            "EDGE_WEIGHT_TYPE": "EUC_2D",
            "NODE_COORD_SECTION": coords,
        }
        if instances.problem != "tsp":
            data["DEMAND_SECTION"] = np.concatenate([[0], instances.demand[i]])
        if instances.windows is not None:
            data["TIME_WINDOW_SECTION"] = instances.windows[i]
            data["SERVICE_TIME_SECTION"] = instances.service[i]
        if instances.problem != "tsp":
            data["DEPOT_SECTION"] = np.array([1, -1])
        path = folder / f"{name}.{'tsp' if instances.problem == 'tsp' else 'vrp'}"
        vrplib.write_instance(path, data)
        paths.append(path)
    return paths
