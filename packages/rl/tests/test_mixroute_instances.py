"""Routing instance families: seeded, inside [0, 1]², shifted where they should be; VRPTW windows
reachable; bad instances refused with the parameter named."""

import numpy as np
import pytest

from mixlab.rl.mixroute.instances import (
    COORDINATE_FAMILIES,
    DEMAND_FAMILIES,
    RoutingInstances,
    coordinates,
    cvrp,
    generate,
    vrptw,
)


@pytest.mark.parametrize("family", COORDINATE_FAMILIES)
def test_every_family_is_seeded_and_stays_in_the_unit_square(family):
    a = coordinates(family, 100, np.random.default_rng(3))
    b = coordinates(family, 100, np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (100, 2)
    assert a.min() >= 0
    assert a.max() <= 1


def test_clustered_points_are_closer_together_than_uniform_ones():
    def mean_nearest(points):
        d = np.linalg.norm(points[:, None] - points[None], axis=-1) + np.eye(len(points)) * 9
        return d.min(1).mean()

    rng = np.random.default_rng(0)
    assert mean_nearest(coordinates("cluster:n_c=3", 200, rng)) < 0.7 * mean_nearest(
        coordinates("uniform", 200, rng)
    )


@pytest.mark.parametrize("demand", DEMAND_FAMILIES)
def test_cvrp_demands_fit_the_capacity(demand):
    instances = cvrp(
        8, 20, np.random.default_rng(0), demand=demand, capacity=30 if demand != "large" else 40
    )
    assert instances.locs.shape == (8, 20, 2)
    assert instances.demand.min() >= 1
    assert (instances.demand <= instances.capacity[:, None]).all()


def test_bad_families_and_capacities_are_named():
    with pytest.raises(ValueError, match="coordinate family must be one of"):
        coordinates("spiral", 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="family options must be key=number"):
        coordinates("cluster:n_c=many", 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="capacity 5 is below"):
        cvrp(2, 20, np.random.default_rng(0), demand="large", capacity=5)


@pytest.mark.parametrize("problem", ["tsp", "cvrp", "vrptw"])
def test_generate_is_seeded_and_in_the_unit_square(problem):
    family = {
        "tsp": "rotation",
        "cvrp": "grid+demand-bimodal",
        "vrptw": "cluster:n_c=3+windows:wide=0.5",
    }[problem]
    a = generate(problem, family, 5, 12, np.random.default_rng(4))
    b = generate(problem, family, 5, 12, np.random.default_rng(4))
    assert a.problem == problem
    np.testing.assert_array_equal(a.locs, b.locs)
    assert a.locs.min() >= 0
    assert a.locs.max() <= 1
    if problem != "tsp":
        np.testing.assert_array_equal(a.demand, b.demand)
        assert a.depot.min() >= 0
        assert a.depot.max() <= 1


@pytest.mark.parametrize(
    "options", [{}, {"length": 5.0}, {"service": 2.0}, {"horizon": 6.0}, {"wide": 1.0}]
)
def test_vrptw_windows_are_reachable_from_the_depot_and_leave_time_to_return(options):
    instances = vrptw(20, 20, np.random.default_rng(5), **options)
    distance = np.linalg.norm(instances.locs - instances.depot[:, None], axis=-1)
    start, end = instances.windows[:, 1:, 0], instances.windows[:, 1:, 1]
    horizon = instances.windows[:, :1, 1]
    assert (end >= distance - 1e-9).all()
    assert (
        np.maximum(start, distance) + instances.service[:, 1:] + distance <= horizon + 1e-9
    ).all()
    assert (instances.windows[:, 0] == [0.0, options.get("horizon", 4.6)]).all()


def test_family_specs_combine_coordinates_demand_capacity_and_windows():
    rng = np.random.default_rng(0)
    loose = generate("cvrp", "cluster:n_c=5+demand-large+capacity:c=60", 2, 10, rng)
    assert (loose.capacity == 60).all()
    assert loose.demand.max() <= 20
    wide = generate("vrptw", "uniform+windows:length=5", 3, 10, rng)
    narrow = generate("vrptw", "uniform+windows:length=0.5", 3, 10, rng)
    width = lambda x: (x.windows[:, 1:, 1] - x.windows[:, 1:, 0]).mean()  # noqa: E731
    assert width(wide) > 5 * width(narrow)
    for problem, family, match in [
        ("cvrp", "spiral", "family part 'spiral' is unknown for cvrp"),
        ("tsp", "uniform+demand-large", "unknown for tsp"),
        ("cvrp", "uniform+windows:length=2", "unknown for cvrp"),
        ("vrptw", "uniform+windows:speed=2", "unknown for vrptw"),
        ("pdp", "uniform", "problem must be one of"),
    ]:
        with pytest.raises(ValueError, match=match):
            generate(problem, family, 1, 5, rng)


def test_bad_instances_are_refused_with_the_parameter_named():
    locs, depot = np.random.default_rng(0).random((1, 4, 2)), np.zeros((1, 2))
    demand = np.array([[1, 2, 3, 4]])
    with pytest.raises(ValueError, match="locs: coordinates must be finite"):
        RoutingInstances(np.where(locs > 0.5, np.nan, locs))
    with pytest.raises(ValueError, match="locs: an instance needs n >= 2"):
        RoutingInstances(locs[:, :1])
    with pytest.raises(
        ValueError, match="demand: customer 4 of instance 0 asks 4, above the capacity 3"
    ):
        RoutingInstances(locs, depot, demand, 3)
    with pytest.raises(ValueError, match="capacity: must be > 0"):
        RoutingInstances(locs, depot, demand * 0, 0)
    with pytest.raises(ValueError, match="depot: CVRP and VRPTW instances need a depot"):
        RoutingInstances(locs, None, demand, 10)
    windows = np.tile([0.0, 4.6], (1, 5, 1))
    windows[0, 2] = [0.0, 1e-6]  # closes before anyone can arrive
    with pytest.raises(ValueError, match="windows: customer 2 of instance 0 cannot be reached"):
        RoutingInstances(locs + 0.1, depot, demand, 10, windows, np.zeros((1, 5)))
    with pytest.raises(ValueError, match="n must be an integer >= 2"):
        cvrp(1, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="capacity must be an integer >= 1"):
        cvrp(1, 5, np.random.default_rng(0), capacity=0)


def test_nodes_put_the_depot_first_and_are_the_cities_for_tsp():
    cvrp = generate("cvrp", "uniform", 2, 5, np.random.default_rng(0))
    assert cvrp.nodes.shape == (2, 6, 2)
    np.testing.assert_array_equal(cvrp.nodes[:, 0], cvrp.depot)
    np.testing.assert_array_equal(cvrp.nodes[:, 1:], cvrp.locs)
    tsp = generate("tsp", "uniform", 2, 5, np.random.default_rng(0))
    np.testing.assert_array_equal(tsp.nodes, tsp.locs)
