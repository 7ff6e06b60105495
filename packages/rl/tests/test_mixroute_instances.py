"""Routing instance families: seeded, inside [0, 1]², shifted where they should be (issue 27,
work in progress)."""

import numpy as np
import pytest

from mixlab.rl.mixroute.instances import COORDINATE_FAMILIES, DEMAND_FAMILIES, coordinates, cvrp


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
    assert instances.demand.max() <= instances.capacity


def test_bad_families_and_capacities_are_named():
    with pytest.raises(ValueError, match="coordinate family must be one of"):
        coordinates("spiral", 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="family options must be key=number"):
        coordinates("cluster:n_c=many", 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="capacity 5 is below"):
        cvrp(2, 20, np.random.default_rng(0), demand="large", capacity=5)
