"""PyVRP's and VRPLIB's side of MixRoute (issue 27), and MixNorm as a torch module.

Instances written by ``write_vrplib`` are read by PyVRP's own reader (``pyvrp.read``) with the
same clients, demands, capacity, windows and service times; routes from ``solve`` are judged by
PyVRP's own ``Solution`` (feasible, the same distance up to its integer rounding); a CVRPLIB
file as users have them (integer coordinates, depot 1, ``EOF``) is solved as is. MixNorm passes
``gradcheck`` (static and adaptive, train and eval) and loads strictly from a ``state_dict``.
"""

import numpy as np
import pytest
import torch
from pyvrp import Solution
from pyvrp import read as pyvrp_read

from mixlab.rl.mixroute import (
    MixNorm,
    POMOModel,
    RoutingInstances,
    generate,
    read_vrplib,
    solve,
    write_vrplib,
)


def _integral(instances: RoutingInstances, scale: float = 10_000.0) -> RoutingInstances:
    """The instances in integer units (PyVRP's), so both sides see the same numbers."""
    as_int = lambda x: None if x is None else np.round(x * scale)  # noqa: E731
    return RoutingInstances(as_int(instances.locs), as_int(instances.depot), instances.demand,
                            instances.capacity, as_int(instances.windows), as_int(instances.service))  # fmt: skip


def _pyvrp_clients(routes: list[list[int]]) -> list[list[int]]:
    """Our customers are 1..N (0 the depot); PyVRP 0.14 numbers its clients 0..N−1."""
    return [[customer - 1 for customer in route] for route in routes]


@pytest.mark.parametrize("problem", ["cvrp", "vrptw"])
def test_pyvrp_reads_our_files_and_accepts_our_routes(tmp_path, problem):
    family = "uniform" if problem == "cvrp" else "uniform+windows:length=2"
    instances = _integral(generate(problem, family, 2, 12, np.random.default_rng(0)))
    torch.manual_seed(0)
    model = POMOModel(problem, dim=16, layers=1, heads=2, hidden=32)
    solved = solve(model, instances)
    assert solved.feasible.all()
    for i, path in enumerate(write_vrplib(instances, tmp_path)):
        data = pyvrp_read(path, round_func="round")
        assert data.num_clients == 12
        assert data.num_depots == 1
        assert [c.delivery[0] for c in data.clients()] == instances.demand[i].tolist()
        assert data.vehicle_type(0).capacity[0] == instances.capacity[i]
        if problem == "vrptw":
            assert [c.tw_late for c in data.clients()] == instances.windows[i, 1:, 1].astype(
                int
            ).tolist()
            assert [c.service_duration for c in data.clients()] == instances.service[i, 1:].astype(
                int
            ).tolist()
        solution = Solution(data, _pyvrp_clients(solved.routes[i]))
        assert solution.is_feasible()
        legs = sum(len(route) + 1 for route in solved.routes[i])
        assert abs(solution.distance() - solved.costs[i]) <= 0.5 * legs  # PyVRP rounds each edge


def test_a_cvrplib_file_as_users_have_it_is_solved(tmp_path):
    rng = np.random.default_rng(1)
    coords = rng.integers(0, 1000, (16, 2))
    demand = [0, *rng.integers(1, 10, 15)]
    lines = ["NAME : X-n16-k4", "COMMENT : integer coordinates, depot 1", "TYPE : CVRP", "DIMENSION : 16",
             "EDGE_WEIGHT_TYPE : EUC_2D", "CAPACITY : 20", "NODE_COORD_SECTION"]  # fmt: skip
    lines += [f"{k + 1}\t{x}\t{y}" for k, (x, y) in enumerate(coords)]
    lines += [
        "DEMAND_SECTION",
        *(f"{k + 1}\t{d}" for k, d in enumerate(demand)),
        "DEPOT_SECTION",
        "1",
        "-1",
        "EOF",
    ]
    path = tmp_path / "X-n16-k4.vrp"
    path.write_text("\n".join(lines) + "\n")
    instance = read_vrplib(path)
    assert instance.n == 15
    assert instance.capacity[0] == 20
    torch.manual_seed(0)
    solved = solve(POMOModel("cvrp", dim=16, layers=1, heads=2, hidden=32), path)
    assert solved.names == ["X-n16-k4"]
    assert solved.feasible.all()
    assert Solution(
        pyvrp_read(path, round_func="none"), _pyvrp_clients(solved.routes[0])
    ).is_feasible()


@pytest.mark.parametrize("adaptive", [False, True])
def test_mixnorm_passes_gradcheck_and_loads_strictly(adaptive):
    torch.manual_seed(0)
    norm = MixNorm(4, adaptive=adaptive).double()
    with torch.no_grad():
        norm.mean_logits.copy_(torch.tensor([0.3, -0.2, 0.1]))
        norm.var_logits.copy_(torch.tensor([-0.1, 0.4, 0.0]))
    h = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(norm, (h,))
    norm.eval()
    assert torch.autograd.gradcheck(norm, (h,))
    fresh = MixNorm(4, adaptive=adaptive).double()
    fresh.load_state_dict(norm.state_dict(), strict=True)
    fresh.eval()
    torch.testing.assert_close(fresh(h), norm(h))
