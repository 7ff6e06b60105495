"""POMO rollouts on CVRP are feasible tours whose lengths match a recomputation, for every
normalisation (issue 27, work in progress)."""

import numpy as np
import pytest
import torch

from mixlab.rl.mixroute.instances import cvrp
from mixlab.rl.mixroute.norms import NORMS
from mixlab.rl.mixroute.pomo import CVRPBatch, POMOModel, augment_8, rollout

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("norm", [n for n in NORMS if n != "none"])
def test_rollouts_visit_every_customer_once_within_capacity(norm):
    instances = cvrp(3, 8, np.random.default_rng(0))
    torch.manual_seed(0)
    model = POMOModel(dim=16, layers=1, heads=2, hidden=32, norm=norm)
    lengths, log_prob, tours = rollout(model, CVRPBatch.from_instances(instances), greedy=False)
    assert lengths.shape == log_prob.shape == (3, 8)
    for b in range(3):
        points = np.concatenate([instances.depot[b][None], instances.locs[b]])
        for start in range(8):
            tour = tours[b, start].tolist()
            assert tour[1] == start + 1  # POMO's start i visits customer i first
            assert sorted(x for x in tour if x) == list(range(1, 9))
            load = 0
            for node in tour:
                load = 0 if node == 0 else load + instances.demand[b, node - 1]
                assert load <= instances.capacity
            path = [*tour, 0]
            expected = sum(
                np.linalg.norm(points[path[i + 1]] - points[path[i]]) for i in range(len(path) - 1)
            )
            assert lengths[b, start].item() == pytest.approx(expected, abs=1e-4)
    (lengths - lengths.mean(1, keepdim=True)).mul(log_prob).mean().backward()
    assert model.embed_customer.weight.grad.abs().sum() > 0


def test_augmentation_keeps_tour_lengths_of_the_same_tour():
    instances = cvrp(2, 6, np.random.default_rng(1))
    batch = augment_8(CVRPBatch.from_instances(instances))
    assert batch.locs.shape == (16, 6, 2)
    distances = torch.cdist(batch.locs, batch.locs)
    torch.testing.assert_close(
        distances[:2].repeat(8, 1, 1), distances
    )  # the 8 views are isometries
