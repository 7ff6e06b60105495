"""The solver on a user's instances (arrays, mappings, VRPLIB files of any size), the PyVRP
reference against brute force, Clarke–Wright savings, and model files."""

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from mixlab.rl.mixroute.instances import RoutingInstances, generate
from mixlab.rl.mixroute.pomo import POMOModel
from mixlab.rl.mixroute.reference import pyvrp_routes, pyvrp_solve, savings
from mixlab.rl.mixroute.solver import (
    check_routes,
    load_model,
    read_vrplib,
    save_model,
    solve,
    write_vrplib,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _brute_force_cvrp(instances: RoutingInstances, index: int) -> float:
    """Exact CVRP: Held–Karp for the best route over every subset that fits, then the best
    partition of the customers into such subsets."""
    points = np.concatenate([instances.depot[index][None], instances.locs[index]])
    d = np.linalg.norm(points[:, None] - points[None], axis=-1)
    n, demand, capacity = instances.n, instances.demand[index], instances.capacity[index]
    path = {}  # (subset mask, last customer) -> shortest depot..last path through the subset
    for mask in range(1, 1 << n):
        members = [i for i in range(n) if mask >> i & 1]
        for last in members:
            rest = mask & ~(1 << last)
            path[mask, last] = (
                d[0, last + 1]
                if not rest
                else min(path[rest, k] + d[k + 1, last + 1] for k in range(n) if rest >> k & 1)
            )
    route = {}
    for mask in range(1, 1 << n):
        if sum(demand[i] for i in range(n) if mask >> i & 1) <= capacity:
            route[mask] = min(path[mask, k] + d[k + 1, 0] for k in range(n) if mask >> k & 1)
    best = [0.0] + [math.inf] * ((1 << n) - 1)
    for mask in range(1, 1 << n):
        low = mask & -mask  # the lowest customer joins some route: enumerate the routes holding it
        sub = mask
        while sub:
            if sub & low and sub in route:
                best[mask] = min(best[mask], best[mask & ~sub] + route[sub])
            sub = (sub - 1) & mask
    return best[-1]


def test_pyvrp_matches_brute_force_on_eight_customers():
    instances = generate("cvrp", "uniform+capacity:c=15", 3, 8, np.random.default_rng(0))
    reference = pyvrp_solve(instances, seconds=0.2)
    exact = [_brute_force_cvrp(instances, i) for i in range(3)]
    np.testing.assert_allclose(reference, exact, rtol=1e-3)
    tsp = generate("tsp", "uniform", 1, 8, np.random.default_rng(1))
    shortest = min(
        check_routes(tsp, 0, [[0, *order]])[0] for order in itertools.permutations(range(1, 8))
    )
    assert check_routes(tsp, 0, pyvrp_routes(tsp, 0, seconds=0.2))[0] == pytest.approx(
        shortest, rel=1e-3
    )


def test_pyvrp_keeps_time_windows_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path))
    instances = generate("vrptw", "uniform+windows:length=0.5", 2, 10, np.random.default_rng(2))
    costs = pyvrp_solve(instances, seconds=0.1, cache=True)  # check_routes inside
    assert len(list(tmp_path.glob("mixroute/pyvrp-vrptw10-*/costs.npy"))) == 1
    np.testing.assert_array_equal(pyvrp_solve(instances, seconds=0.1, cache=True), costs)
    relaxed = RoutingInstances(
        instances.locs, instances.depot, instances.demand, instances.capacity
    )
    assert (costs >= pyvrp_solve(relaxed, seconds=0.1) - 1e-6).all()  # windows cost distance


DATA = Path(__file__).parent / "data"


def test_pyvrp_solves_a_vrplib_file_in_other_units_as_pyvrp_itself_does(tmp_path):
    """Coordinates in [0, 1000] (VRPLIB's X set): the instance is scaled by its own range, so HGS
    finds routes (a fixed ×10⁴ scale made it report no feasible solution), and on EUC_2D's
    integer distances it reaches the cost of PyVRP's own reader and solver."""
    from pyvrp import read as pyvrp_read
    from pyvrp import solve as pyvrp_own
    from pyvrp.stop import MaxRuntime

    unit = generate("cvrp", "uniform", 1, 12, np.random.default_rng(4))
    big = RoutingInstances(unit.locs * 1000, unit.depot * 1000, unit.demand, unit.capacity)
    path = write_vrplib(big, tmp_path, stem="thousands")[0]
    instance = read_vrplib(path)
    exact, feasible = check_routes(instance, 0, pyvrp_routes(instance, 0, seconds=0.2))
    assert feasible
    assert exact == pytest.approx(1000 * pyvrp_solve(unit, seconds=0.2)[0], rel=1e-3)
    rounded = pyvrp_solve(instance, seconds=0.2, euc_2d=True)[0]
    theirs = pyvrp_own(pyvrp_read(path, round_func="round"), MaxRuntime(0.2), display=False)
    assert rounded == theirs.cost()
    assert rounded == float(int(rounded))  # a sum of integer legs
    assert abs(rounded - exact) <= 0.5 * (instance.n + 4)  # each leg moves by at most 0.5


def test_a_cvrplib_instance_reaches_its_best_known_cost():
    """A-n32-k5 (Augerat et al. 1995, shipped in tests/data), optimal 784 on EUC_2D distances;
    unrounded, the same routes cost more than 784 (787.08 for the published optimum's)."""
    instance = read_vrplib(DATA / "A-n32-k5.vrp")
    routes = pyvrp_routes(instance, 0, seconds=1.0, euc_2d=True)
    assert check_routes(instance, 0, routes, euc_2d=True) == (784.0, True)
    legs = sum(len(route) + 1 for route in routes)
    assert 784 < check_routes(instance, 0, routes)[0] <= 784 + 0.5 * legs


def test_savings_is_feasible_and_beats_one_route_per_customer():
    instances = generate("cvrp", "cluster:n_c=3", 4, 20, np.random.default_rng(3))
    for i in range(4):
        cost, feasible = check_routes(instances, i, savings(instances, i))
        assert feasible
        star = check_routes(instances, i, [[k] for k in range(1, 21)])[0]
        assert cost < 0.7 * star


def test_solve_takes_arrays_mappings_and_vrplib_files_of_any_size(tmp_path):
    torch.manual_seed(0)
    model = POMOModel("cvrp", dim=16, layers=1, heads=2, hidden=32)
    small = generate("cvrp", "uniform", 3, 7, np.random.default_rng(4))
    solved = solve(model, small)
    assert solved.feasible.all()
    assert len(solved.routes) == 3
    fields = {
        "locs": small.locs,
        "depot": small.depot,
        "demand": small.demand,
        "capacity": small.capacity,
    }
    np.testing.assert_allclose(solve(model, fields).costs, solved.costs)

    # outside the unit square: the same instances in two other units get the same routes
    def moved(factor: float, shift: float) -> RoutingInstances:
        return RoutingInstances(
            small.locs * factor + shift, small.depot * factor + shift, small.demand, small.capacity
        )

    metres, kilometres = solve(model, moved(1000, 50)), solve(model, moved(1, -0.5))
    assert metres.routes == kilometres.routes
    np.testing.assert_allclose(metres.costs, kilometres.costs * 1000, rtol=1e-5)
    write_vrplib(small, tmp_path, stem="a")
    write_vrplib(generate("cvrp", "uniform", 1, 12, np.random.default_rng(5)), tmp_path, stem="b")
    from_files = solve(model, tmp_path)
    assert from_files.names == ["a-0000", "a-0001", "a-0002", "b-0000"]
    assert from_files.feasible.all()
    np.testing.assert_allclose(from_files.costs[:3], solved.costs)
    assert {"cost", "feasible", "routes", "gap_percent"} <= set(
        from_files.to_json([1.0] * 4)["instances"][0]
    )


@pytest.mark.parametrize("problem", ["tsp", "cvrp", "vrptw"])
def test_vrplib_round_trip(tmp_path, problem):
    instances = generate(problem, "uniform", 2, 9, np.random.default_rng(6))
    paths = write_vrplib(instances, tmp_path)
    for i, path in enumerate(paths):
        back = read_vrplib(path)
        assert back.problem == problem
        np.testing.assert_array_equal(back.locs, instances.locs[i : i + 1])
        if problem != "tsp":
            np.testing.assert_array_equal(back.depot, instances.depot[i : i + 1])
            np.testing.assert_array_equal(back.demand, instances.demand[i : i + 1])
            assert back.capacity[0] == instances.capacity[i]
        if problem == "vrptw":
            np.testing.assert_array_equal(back.windows, instances.windows[i : i + 1])
            np.testing.assert_array_equal(back.service, instances.service[i : i + 1])


def test_a_vrplib_file_without_a_depot_is_refused(tmp_path):
    path = tmp_path / "x.vrp"
    path.write_text("NAME: x\nTYPE: CVRP\nDIMENSION: 3\nCAPACITY: 10\nEDGE_WEIGHT_TYPE: EUC_2D\n"
                    "NODE_COORD_SECTION\n1 0 0\n2 1 1\n3 2 0\nDEMAND_SECTION\n1 0\n2 3\n3 4\nEOF\n")  # fmt: skip
    with pytest.raises(ValueError, match="needs exactly one depot in DEPOT_SECTION"):
        read_vrplib(path)


def test_saved_models_load_with_the_same_routes(tmp_path):
    torch.manual_seed(1)
    model = POMOModel("tsp", dim=16, layers=2, heads=4, hidden=24, norm="mixnorm").eval()
    instances = generate("tsp", "uniform", 2, 10, np.random.default_rng(7))
    save_model(model, tmp_path / "m", note="test")
    loaded = load_model(tmp_path / "m")
    assert loaded.norm == "mixnorm"
    assert loaded.problem == "tsp"
    assert solve(loaded, instances).routes == solve(model, instances).routes
    with pytest.raises(FileNotFoundError, match="has no config.json and model.safetensors"):
        load_model(tmp_path)
