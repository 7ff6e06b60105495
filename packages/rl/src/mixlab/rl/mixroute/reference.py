"""Reference and classical baselines: PyVRP's hybrid genetic search (HGS; the spec's stand-in for
LKH-3, which is not on PyPI) and Clarke–Wright savings.

PyVRP takes integers. By default each instance is scaled by its own coordinate range, so that it
spans 10⁴ integer units whatever its units (the unit square or VRPLIB's [0, 1000]), and distances
are rounded; for VRPTW travel and service times are rounded up and windows inward (early up, late
down), so a schedule PyVRP keeps is kept in real units too. The returned routes are re-costed on
the real coordinates by :func:`~.solver.check_routes`, so a reference cost carries no rounding.
With ``euc_2d=True`` the instance is solved as VRPLIB's EUC_2D defines it instead: no scaling,
every leg's length (and travel time) rounded to the nearest integer, the cost the sum of the
rounded legs, as CVRPLIB's best-known costs are stated.
"""

from __future__ import annotations

import hashlib
import math
from importlib.metadata import version
from pathlib import Path

import numpy as np

from mixlab.rl.mixroute.instances import RoutingInstances
from mixlab.rl.mixroute.solver import check_euc_2d_units, check_routes, leg_length
from mixlab.shared import progress
from mixlab.shared.cache import cached

SCALE = 10_000
"""integer units across the larger side of an instance's bounding box (without ``euc_2d``)"""

__all__ = ["SCALE", "pyvrp_routes", "pyvrp_solve", "savings", "scale_of"]


def scale_of(points: np.ndarray) -> float:
    """The factor that maps the larger side of ``points``' bounding box [N, 2] to :data:`SCALE`
    integer units (1 for coincident points)."""
    extent = float(np.ptp(points, axis=0).max())
    return SCALE / extent if extent > 0 else 1.0


def pyvrp_routes(
    instances: RoutingInstances,
    index: int,
    *,
    seconds: float = 1.0,
    seed: int = 0,
    euc_2d: bool = False,
) -> list[list[int]]:
    """HGS routes of instance ``index`` after ``seconds`` (customers 1..N; TSP: one tour of
    cities 0..N−1 from city 0); ``euc_2d``: on VRPLIB's integer distances (module docstring)."""
    from pyvrp import Model
    from pyvrp.stop import MaxRuntime

    tsp = instances.problem == "tsp"
    if euc_2d:
        check_euc_2d_units(instances[np.array([index])])
    points = instances.nodes[index]
    scale = 1.0 if euc_2d else scale_of(points)
    points = points * scale
    windows = instances.windows
    model = Model()
    locations = [model.add_location(x=round(float(x)), y=round(float(y))) for x, y in points]
    horizon = math.floor(windows[index, 0, 1] * scale) if windows is not None else None
    depot = model.add_depot(locations[0], **({"tw_late": horizon} if horizon else {}))
    for k, location in enumerate(locations[1:], start=1):
        options = {} if tsp else {"delivery": int(instances.demand[index, k - 1])}
        if windows is not None:
            options |= {
                "tw_early": math.ceil(windows[index, k, 0] * scale),
                "tw_late": math.floor(windows[index, k, 1] * scale),
                "service_duration": math.ceil(instances.service[index, k] * scale),
            }
        model.add_client(location, **options)
    vehicles = {"num_available": 1} if tsp else {
        "num_available": instances.n, "capacity": int(instances.capacity[index])
    }  # fmt: skip
    if horizon:
        vehicles["tw_late"] = horizon
    model.add_vehicle_type(**vehicles, start_depot=depot, end_depot=depot)
    lengths = np.linalg.norm(points[:, None] - points[None], axis=-1)
    for i, a in enumerate(locations):
        for j, c in enumerate(locations):
            if i != j:
                if euc_2d:  # TSPLIB's nint, as check_routes costs it: one integer for both
                    distance = duration = int(leg_length(points[i], points[j], euc_2d=True))
                else:  # times rounded up, so a schedule PyVRP keeps holds in real units
                    distance, duration = round(lengths[i, j]), math.ceil(lengths[i, j])
                model.add_edge(a, c, distance=distance, duration=duration)
    result = model.solve(MaxRuntime(seconds), seed=seed, display=False)
    if not result.is_feasible():
        raise ValueError(f"HGS found no feasible solution for instance {index} in {seconds} s")
    routes = [[int(a.idx) + 1 for a in route if a.is_client()] for route in result.best.routes()]
    return [[0, *routes[0]]] if tsp else routes


def pyvrp_solve(
    instances: RoutingInstances,
    *,
    seconds: float = 1.0,
    seed: int = 0,
    euc_2d: bool = False,
    cache: bool = False,
) -> np.ndarray:
    """The HGS cost of each instance (``seconds`` each; ``euc_2d``: on VRPLIB's integer
    distances, costed as their sum). With ``cache`` the costs are kept in
    the mixlab cache (:func:`~mixlab.shared.cache.cached`, ``mixroute/pyvrp-…``), keyed by the
    instances' arrays, the time limit, the seed and PyVRP's version, and by the source of the
    code that solves and costs them (this module and :mod:`~.solver`)."""
    if not cache:
        return _solve_each(instances, seconds, seed, euc_2d)
    fingerprint = hashlib.sha256()  # the entry depends on the instances themselves
    for array in (instances.locs, instances.depot, instances.demand, instances.capacity,
                  instances.windows, instances.service):  # fmt: skip
        fingerprint.update(b"-" if array is None else np.ascontiguousarray(array).tobytes())
    key = {
        "problem": instances.problem,
        "n": instances.n,
        "count": len(instances),
        "instances_sha256": fingerprint.hexdigest(),
        "seconds": seconds,
        "seed": seed,
        "euc_2d": euc_2d,
        "pyvrp": version("pyvrp"),
    }

    def build(folder: Path) -> None:
        np.save(folder / "costs.npy", _solve_each(instances, seconds, seed, euc_2d))

    folder = cached(
        "mixroute",
        f"pyvrp-{instances.problem}{instances.n}",
        key,
        build,
        code=["mixlab.rl.mixroute.reference", "mixlab.rl.mixroute.solver"],
    )
    return np.load(folder / "costs.npy")


def _solve_each(instances: RoutingInstances, seconds: float, seed: int, euc_2d: bool) -> np.ndarray:
    """HGS on each instance in turn, its routes checked and costed by :func:`check_routes`."""
    costs = []
    with progress(len(instances), "pyvrp instances") as bar:
        for i in range(len(instances)):
            routes = pyvrp_routes(instances, i, seconds=seconds, seed=seed, euc_2d=euc_2d)
            cost, feasible = check_routes(instances, i, routes, euc_2d=euc_2d)
            if not feasible:
                raise RuntimeError(f"HGS routes of instance {i} fail the feasibility check")
            costs.append(cost)
            bar.advance()
    return np.asarray(costs)


def savings(instances: RoutingInstances, index: int) -> list[list[int]]:
    """Clarke–Wright parallel savings for CVRP instance ``index``: start from one route per
    customer, merge route ends i, j in decreasing order of s_ij = d₀ᵢ + d₀ⱼ − dᵢⱼ while the
    merged load fits the capacity."""
    if instances.problem != "cvrp":
        raise ValueError(f"savings solves CVRP instances, got {instances.problem}")
    points = instances.nodes[index]
    distance = np.linalg.norm(points[:, None] - points[None], axis=-1)
    n, demand = instances.n, instances.demand[index]
    route_of = {i: [i] for i in range(1, n + 1)}  # customer -> its route (shared lists)
    load = {id(r): int(demand[r[0] - 1]) for r in route_of.values()}
    pairs = [(distance[0, i] + distance[0, j] - distance[i, j], i, j)
             for i in range(1, n + 1) for j in range(i + 1, n + 1)]  # fmt: skip
    for saving, i, j in sorted(pairs, reverse=True):
        a, b = route_of[i], route_of[j]
        if saving <= 0 or a is b or load[id(a)] + load[id(b)] > instances.capacity[index]:
            continue
        if a[-1] != i and a[0] == i:
            a.reverse()  # i must end a, j must start b
        if b[0] != j and b[-1] == j:
            b.reverse()
        if a[-1] != i or b[0] != j:
            continue  # an interior customer cannot be joined
        merged_load = load.pop(id(a)) + load.pop(id(b))
        a.extend(b)
        load[id(a)] = merged_load
        for customer in b:
            route_of[customer] = a
    unique = {id(r): r for r in route_of.values()}
    return list(unique.values())
