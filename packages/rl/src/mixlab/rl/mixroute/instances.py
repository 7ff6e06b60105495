"""Routing instances: uniform training data and distribution-shifted test families (spec §3b).

Coordinates live in [0, 1]². :func:`coordinates` draws ``n`` points from a family:

- ``uniform``;
- ``cluster`` (Bi et al. 2022, AMDKD / RL4CO): ``n_c`` centres ~ U[0.2, 0.8]², sd 0.07, nodes
  split evenly; ``mixed``: half uniform, half from ``n_c`` clusters;
- ``gaussian_mixture`` (Zhang et al. 2022, Omni-VRP): ``m`` modes with centres ~ U(0, c)²,
  unit covariance, then min-max scaling;
- tspgen's mutation operators (Bossek et al. 2019, Omni-VRP's settings), applied once to uniform
  points, then rescaled as netgen's ``rescaleNetworkGlobal2``: ``explosion``, ``implosion``,
  ``expansion``, ``compression`` (ε = 0.3), ``rotation``, ``cluster_mutation``,
  ``linear_projection`` (pm = 0.4) and ``grid`` (a 0.3 box snapped to a lattice).

:func:`tsp`, :func:`cvrp` and :func:`vrptw` build :class:`RoutingInstances`: CVRP adds a depot
(the first point) and integer demands (POMO's randint(1, 9) with capacity 30/40/50 for
N = 20/50/100, or a shifted demand family); VRPTW adds RouteFinder's time windows.
:func:`generate` reads a family spec (``"cluster:n_c=5+demand-large"``). Everything is seeded by
a ``numpy.random.Generator``; configs are stored, never the data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mixlab.shared.checks import check_count

CAPACITY = {10: 20, 20: 30, 50: 40, 100: 50}
"""POMO's vehicle capacity per customer count (CVRProblemDef.py); other sizes interpolate"""
COORDINATE_FAMILIES = (
    "uniform", "cluster", "mixed", "gaussian_mixture", "explosion", "implosion", "expansion",
    "compression", "rotation", "cluster_mutation", "linear_projection", "grid",
)  # fmt: skip
DEMAND_FAMILIES = ("uniform", "small", "large", "lognormal", "bimodal", "distance")

__all__ = [
    "CAPACITY",
    "COORDINATE_FAMILIES",
    "DEMAND_FAMILIES",
    "PROBLEMS",
    "WINDOW_DEFAULTS",
    "RoutingInstances",
    "coordinates",
    "cvrp",
    "generate",
    "parse_family",
    "tsp",
    "vrptw",
]


def parse_family(name: str) -> tuple[str, dict[str, float]]:
    """``"cluster:n_c=5,sd=0.05"`` → ``("cluster", {"n_c": 5.0, "sd": 0.05})``."""
    kind, _, rest = name.partition(":")
    options: dict[str, float] = {}
    for part in filter(None, rest.split(",")):
        key, _, value = part.partition("=")
        try:
            options[key.strip()] = float(value)
        except ValueError:
            raise ValueError(
                f"family options must be key=number, got {part!r} in {name!r}"
            ) from None
    return kind.strip(), options


def _rescale(points: np.ndarray) -> np.ndarray:
    """netgen's rescaleNetworkGlobal2: shift each axis to 0, divide by the largest range."""
    points = points - points.min(0)
    return points / max(float(points.max()), 1e-12)


def _force_to_bounds(points: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """tspgen's forceToBounds: points outside [0, 1]² are redrawn uniformly."""
    outside = ((points < 0) | (points > 1)).any(1)
    points[outside] = rng.random((int(outside.sum()), 2))
    return points


def _line(rng: np.random.Generator) -> tuple[float, float]:
    intercept = rng.random()
    slope = rng.uniform(0, 3) if intercept < 0.5 else rng.uniform(-3, 0)
    return intercept, slope


def _mutate(
    kind: str, points: np.ndarray, rng: np.random.Generator, options: dict[str, float]
) -> np.ndarray:
    eps, pm = options.get("eps", 0.3), options.get("pm", 0.4)
    n = len(points)
    if kind in ("explosion", "implosion"):
        centre = rng.random(2)
        offset = points - centre
        distance = np.linalg.norm(offset, axis=1)
        inside = distance < eps
        direction = offset[inside] / np.maximum(distance[inside, None], 1e-12)
        if kind == "explosion":  # pushed out to ε + Exp(rate 10)
            points[inside] = (
                centre + direction * (eps + rng.exponential(0.1, inside.sum()))[:, None]
            )
        else:  # pulled in by a factor min(|N(0, 1)|, ε)
            factor = np.minimum(np.abs(rng.normal(size=inside.sum())), eps)
            points[inside] = centre + offset[inside] * factor[:, None]
    elif kind in ("expansion", "compression"):
        intercept, slope = _line(rng)
        normal = np.array([-slope, 1.0]) / np.hypot(slope, 1.0)
        signed = (points[:, 1] - (intercept + slope * points[:, 0])) / np.hypot(slope, 1.0)
        inside = np.abs(signed) < eps
        foot = points[inside] - signed[inside, None] * normal
        if kind == "expansion":
            push = np.sign(signed[inside]) * (eps + rng.exponential(0.1, inside.sum()))
            points[inside] = foot + push[:, None] * normal
        else:
            factor = np.minimum(np.abs(rng.normal(size=inside.sum())), 1.0)
            points[inside] = foot + (signed[inside] * factor)[:, None] * normal
    else:
        chosen = rng.random(n) < pm
        k = int(chosen.sum())
        if kind == "rotation":
            angle = rng.uniform(0, 2 * np.pi)
            rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
            points[chosen] = points[chosen] @ rotation.T + rng.random(2)
        elif kind == "cluster_mutation":
            points[chosen] = rng.random(2) + rng.uniform(0.001, 0.3) * rng.normal(size=(k, 2))
        elif kind == "linear_projection":
            intercept, slope = _line(rng)
            points[chosen, 1] = intercept + slope * points[chosen, 0]
        elif kind == "grid":
            box = options.get("box", 0.3)
            corner = rng.random(2) * (1 - box)
            inside = ((points >= corner) & (points <= corner + box)).all(1)
            side = max(2, int(np.ceil(np.sqrt(inside.sum()))))
            lattice = np.round((points[inside] - corner) / box * (side - 1)) / (side - 1)
            points[inside] = corner + lattice * box
    return _rescale(_force_to_bounds(points, rng))


def coordinates(family: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` points in [0, 1]² from ``family`` (a name of :data:`COORDINATE_FAMILIES`, with
    ``:key=value`` options: ``n_c``, ``m``, ``c``, ``eps``, ``pm``, ``box``)."""
    kind, options = parse_family(family)
    if kind not in COORDINATE_FAMILIES:
        raise ValueError(
            f"coordinate family must be one of {list(COORDINATE_FAMILIES)}, got {kind!r}"
        )
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    if kind == "uniform":
        return rng.random((n, 2))
    if kind in ("cluster", "mixed"):
        n_c = int(options.get("n_c", 3 if kind == "cluster" else 1))
        n_clustered = n if kind == "cluster" else n // 2
        centres = rng.uniform(0.2, 0.8, (n_c, 2))
        which = np.arange(n_clustered) % n_c
        clustered = np.clip(
            centres[which] + options.get("sd", 0.07) * rng.normal(size=(n_clustered, 2)), 0, 1
        )
        points = np.concatenate([clustered, rng.random((n - n_clustered, 2))])
        return points[rng.permutation(n)]
    if kind == "gaussian_mixture":
        m, c = int(options.get("m", 3)), options.get("c", 20.0)
        centres = rng.uniform(0, c, (m, 2))
        points = centres[rng.integers(m, size=n)] + rng.normal(size=(n, 2))
        return _rescale(points)
    return _mutate(kind, rng.random((n, 2)), rng, options)


PROBLEMS = ("tsp", "cvrp", "vrptw")


def _fail(parameter: str, message: str) -> None:
    raise ValueError(f"{parameter}: {message}")


@dataclass
class RoutingInstances:
    """A batch of routing instances of one size N. TSP: ``locs`` only. CVRP: a ``depot``
    [B, 2], integer ``demand`` [B, N] and ``capacity`` [B] (a scalar is broadcast). VRPTW: also
    time ``windows`` [B, 1 + N, 2] and ``service`` times [B, 1 + N], the depot first, its window
    the horizon; travel time equals Euclidean distance (speed 1).

    Checked on construction: finite coordinates, N >= 2, capacity > 0, no demand above it, and
    every window reachable from the depot and left in time to return (else no fleet serves it).
    """

    locs: np.ndarray
    depot: np.ndarray | None = None
    demand: np.ndarray | None = None
    capacity: np.ndarray | None = None
    windows: np.ndarray | None = None
    service: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.locs = np.asarray(self.locs, dtype=np.float64)
        if self.locs.ndim != 3 or self.locs.shape[-1] != 2:
            _fail("locs", f"must have shape [batch, n, 2], got {self.locs.shape}")
        if self.locs.shape[1] < 2:
            _fail("locs", f"an instance needs n >= 2 nodes, got n = {self.locs.shape[1]}")
        if not np.isfinite(self.locs).all():
            _fail("locs", "coordinates must be finite (found NaN or inf)")
        if self.depot is None:
            if self.demand is not None or self.windows is not None:
                _fail("depot", "CVRP and VRPTW instances need a depot")
            return
        b, n = self.locs.shape[:2]
        self.depot = np.asarray(self.depot, dtype=np.float64)
        if self.depot.shape != (b, 2) or not np.isfinite(self.depot).all():
            _fail("depot", f"must be finite with shape [{b}, 2], got {self.depot.shape}")
        if self.demand is None or self.capacity is None:
            _fail("demand", "a routing instance with a depot needs demand and capacity")
        self.capacity = np.broadcast_to(np.asarray(self.capacity), (b,)).astype(np.int64)
        self.demand = np.asarray(self.demand)
        if self.demand.shape != (b, n) or not np.issubdtype(self.demand.dtype, np.integer):
            _fail("demand", f"must be integers with shape [{b}, {n}], got {self.demand.shape}")
        if (self.capacity <= 0).any():
            _fail("capacity", f"must be > 0, got {self.capacity.min()}")
        if (self.demand < 0).any():
            _fail("demand", "must be >= 0")
        over = np.argwhere(self.demand > self.capacity[:, None])
        if len(over):
            i, j = over[0]
            _fail(
                "demand",
                f"customer {j + 1} of instance {i} asks {self.demand[i, j]}, above the capacity "
                f"{self.capacity[i]}",
            )
        if self.windows is None:
            return
        self.windows = np.asarray(self.windows, dtype=np.float64)
        self.service = np.asarray(self.service, dtype=np.float64)
        if self.windows.shape != (b, n + 1, 2) or self.service.shape != (b, n + 1):
            _fail("windows", f"need shapes [{b}, {n + 1}, 2] and service [{b}, {n + 1}]")
        if not (np.isfinite(self.windows).all() and np.isfinite(self.service).all()):
            _fail("windows", "time windows and service times must be finite")
        if (self.windows[..., 0] > self.windows[..., 1]).any() or (self.service < 0).any():
            _fail("windows", "each window needs start <= end, each service time >= 0")
        travel = np.linalg.norm(self.locs - self.depot[:, None], axis=-1)
        arrive = np.maximum(travel, self.windows[:, 1:, 0])
        late = (arrive > self.windows[:, 1:, 1] + 1e-9) | (
            arrive + self.service[:, 1:] + travel > self.windows[:, :1, 1] + 1e-9
        )
        if late.any():
            i, j = np.argwhere(late)[0]
            _fail(
                "windows",
                f"customer {j + 1} of instance {i} cannot be reached in its window and left in "
                "time to return within the depot's horizon",
            )

    @property
    def problem(self) -> str:
        """``"tsp"``, ``"cvrp"`` or ``"vrptw"``."""
        if self.depot is None:
            return "tsp"
        return "cvrp" if self.windows is None else "vrptw"

    @property
    def n(self) -> int:
        """Customers (cities for TSP) per instance."""
        return self.locs.shape[1]

    @property
    def nodes(self) -> np.ndarray:
        """Every node's coordinates, [B, 1 + N, 2] with the depot first (node 0, as routes and
        windows number it); TSP: the cities, [B, N, 2]."""
        if self.depot is None:
            return self.locs
        return np.concatenate([self.depot[:, None], self.locs], 1)

    def __len__(self) -> int:
        return len(self.locs)

    def __getitem__(self, index) -> RoutingInstances:
        """The instances at ``index`` (an int keeps a batch of one)."""
        index = [index] if isinstance(index, int | np.integer) else index
        pick = lambda x: None if x is None else x[index]  # noqa: E731
        return RoutingInstances(
            self.locs[index], pick(self.depot), pick(self.demand), pick(self.capacity),
            pick(self.windows), pick(self.service),
        )  # fmt: skip


def _capacity(n: int) -> int:
    sizes = sorted(CAPACITY)
    return round(float(np.interp(n, sizes, [CAPACITY[s] for s in sizes])))


def _demands(
    family: str, locs: np.ndarray, depot: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    kind, _ = parse_family(family)
    if kind not in DEMAND_FAMILIES:
        raise ValueError(f"demand family must be one of {list(DEMAND_FAMILIES)}, got {kind!r}")
    n = len(locs)
    if kind == "uniform":
        return rng.integers(1, 10, n)
    if kind == "small":
        return rng.integers(1, 4, n)
    if kind == "large":
        return rng.integers(1, 21, n)
    if kind == "lognormal":
        return np.clip(np.round(rng.lognormal(1.0, 0.6, n)), 1, 9).astype(np.int64)
    if kind == "bimodal":
        small = rng.random(n) < 0.5
        return np.where(small, rng.integers(1, 4, n), rng.integers(7, 10, n))
    distance = np.linalg.norm(locs - depot, axis=1)  # far customers ask for more
    share = distance / max(float(distance.max()), 1e-12)
    return np.clip(np.round(1 + 8 * share + rng.normal(0, 1, n)), 1, 9).astype(np.int64)


def tsp(
    batch: int, n: int, rng: np.random.Generator, *, coords: str = "uniform"
) -> RoutingInstances:
    """``batch`` TSP instances of ``n`` cities drawn from the coordinate family ``coords``."""
    check_count(batch, "batch")
    return RoutingInstances(np.stack([coordinates(coords, n, rng) for _ in range(batch)]))


def cvrp(
    batch: int,
    n: int,
    rng: np.random.Generator,
    *,
    coords: str = "uniform",
    demand: str = "uniform",
    capacity: int | None = None,
) -> RoutingInstances:
    """``batch`` CVRP instances of ``n`` customers: the depot and customers from one draw of
    ``coords`` (the depot is its first point), demands from ``demand``, ``capacity`` POMO's for
    ``n`` unless given (a tightness shift)."""
    check_count(batch, "batch")
    check_count(n, "n", minimum=2)
    capacity = _capacity(n) if capacity is None else capacity
    check_count(capacity, "capacity")
    points = np.stack([coordinates(coords, n + 1, rng) for _ in range(batch)])
    depot, locs = points[:, 0], points[:, 1:]
    demands = np.stack([_demands(demand, locs[b], depot[b], rng) for b in range(batch)])
    if demands.max() > capacity:
        raise ValueError(f"capacity {capacity} is below the largest demand {int(demands.max())}")
    return RoutingInstances(locs, depot, demands.astype(np.int64), capacity)


WINDOW_DEFAULTS = {"length": 1.0, "service": 1.0, "horizon": 4.6, "wide": 0.0}
"""Time-window options: multipliers of RouteFinder's window length L ~ U[0.18, 0.2] and service
time s ~ U[0.15, 0.18], the horizon T, and the share of customers whose window is the horizon"""


def vrptw(
    batch: int,
    n: int,
    rng: np.random.Generator,
    *,
    coords: str = "uniform",
    demand: str = "uniform",
    capacity: int | None = None,
    length: float = 1.0,
    service: float = 1.0,
    horizon: float = 4.6,
    wide: float = 0.0,
) -> RoutingInstances:
    """CVRP instances with RouteFinder's time windows (``generate_time_windows``): s ~ U[0.15,
    0.18]·``service``, L ~ U[0.18, 0.2]·``length``, h_max = (T − s − L)/d₀ᵢ − 1, start =
    (1 + (h_max − 1)·U)·d₀ᵢ, end = start + L, so each customer is reachable from the depot and
    can return by T; a ``wide`` share of customers get the window [0, T − s − d₀ᵢ]."""
    base = cvrp(batch, n, rng, coords=coords, demand=demand, capacity=capacity)
    for name, value in (("length", length), ("service", service), ("horizon", horizon)):
        if isinstance(value, bool) or not np.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a number > 0, got {value!r}")
    if not 0 <= wide <= 1:
        raise ValueError(f"wide must be a share in [0, 1], got {wide!r}")
    d0 = np.linalg.norm(base.locs - base.depot[:, None], axis=-1)  # [B, N]
    s = rng.uniform(0.15, 0.18, d0.shape) * service
    window = rng.uniform(0.18, 0.2, d0.shape) * length
    if (2 * d0 + s + window > horizon).any():
        raise ValueError(f"horizon {horizon} is too short for these windows and service times")
    h_max = (horizon - s - window) / np.maximum(d0, 1e-9) - 1
    start = (1 + (h_max - 1) * rng.random(d0.shape)) * d0
    end = start + window
    is_wide = rng.random(d0.shape) < wide
    start, end = np.where(is_wide, 0.0, start), np.where(is_wide, horizon - s - d0, end)
    zeros = np.zeros((len(base), 1))
    windows = np.stack(
        [np.concatenate([zeros, start], 1), np.concatenate([zeros + horizon, end], 1)], -1
    )
    return RoutingInstances(
        base.locs, base.depot, base.demand, base.capacity, windows, np.concatenate([zeros, s], 1)
    )


def generate(
    problem: str, family: str, batch: int, n: int, rng: np.random.Generator
) -> RoutingInstances:
    """Instances of ``problem`` from a family spec: parts joined by ``+``, each a coordinate
    family (``"cluster:n_c=5"``), ``"demand-<kind>"`` (:data:`DEMAND_FAMILIES`),
    ``"capacity:c=<C>"`` or ``"windows:<option>=<x>,..."`` (:data:`WINDOW_DEFAULTS`); e.g.
    ``"uniform"``, ``"explosion:eps=0.2+demand-large"``."""
    if problem not in PROBLEMS:
        raise ValueError(f"problem must be one of {list(PROBLEMS)}, got {problem!r}")
    options: dict[str, Any] = {}
    for part in family.split("+"):
        kind, values = parse_family(part)
        if kind in COORDINATE_FAMILIES:
            options["coords"] = part
        elif kind.startswith("demand-") and problem != "tsp":
            options["demand"] = kind.removeprefix("demand-")
        elif kind == "capacity" and problem != "tsp" and "c" in values:
            options["capacity"] = int(values["c"])
        elif kind == "windows" and problem == "vrptw" and set(values) <= set(WINDOW_DEFAULTS):
            options.update(values)
        else:
            raise ValueError(
                f"family part {part!r} is unknown for {problem}: use a coordinate family of "
                f"{list(COORDINATE_FAMILIES)}"
                + ("" if problem == "tsp" else ", demand-<kind> of "
                   f"{list(DEMAND_FAMILIES)}, capacity:c=<C>")
                + (f", windows:<{'|'.join(WINDOW_DEFAULTS)}>=<x>" if problem == "vrptw" else "")
            )  # fmt: skip
    return {"tsp": tsp, "cvrp": cvrp, "vrptw": vrptw}[problem](batch, n, rng, **options)
