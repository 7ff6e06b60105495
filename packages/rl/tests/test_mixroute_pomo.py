"""POMO on TSP, CVRP and VRPTW: every rollout is a feasible tour whose length an independent
recomputation confirms, the encoder is permutation equivariant, ×8 augmentation keeps costs,
training reaches MixNorm's weights and lowers the tour length, and a killed training resumes."""

import numpy as np
import pytest
import torch

from mixlab.rl.mixroute.instances import generate
from mixlab.rl.mixroute.norms import NORMS, MixNorm
from mixlab.rl.mixroute.pomo import POMOModel, RoutingBatch, augment_8, rollout
from mixlab.rl.mixroute.solver import check_routes, split_routes
from mixlab.rl.mixroute.training import evaluate, train_pomo

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAMILY = {
    "tsp": "cluster:n_c=2",
    "cvrp": "explosion+demand-large",
    "vrptw": "uniform+windows:length=0.5",
}


def _tiny(problem: str, norm: str = "instance") -> POMOModel:
    torch.manual_seed(0)
    return POMOModel(problem, dim=16, layers=1, heads=2, hidden=32, norm=norm)


@pytest.mark.parametrize("problem", ["tsp", "cvrp", "vrptw"])
def test_sampled_rollouts_are_feasible_and_costed_right(problem):
    instances = generate(problem, FAMILY[problem], 3, 8, np.random.default_rng(0))
    model = _tiny(problem)
    lengths, log_prob, tours = rollout(model, RoutingBatch.from_instances(instances), greedy=False,
                                       generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert lengths.shape == log_prob.shape == (3, 8)
    for b in range(3):
        for start in range(8):
            tour = tours[b, start].tolist()
            # POMO's start i visits node i first (customer i + 1 after the depot for VRPs)
            assert tour[0] == start if problem == "tsp" else tour[1] == start + 1
            cost, feasible = check_routes(instances, b, split_routes(tour, problem))
            assert feasible, (problem, b, start, tour)
            assert lengths[b, start].item() == pytest.approx(cost, abs=1e-4)
    assert torch.isfinite(log_prob).all()


@pytest.mark.parametrize("norm", [n for n in NORMS if n != "none"])
def test_every_norm_trains_and_gradients_reach_the_mixing_weights(norm):
    model = _tiny("cvrp", norm)
    instances = generate("cvrp", "uniform", 4, 6, np.random.default_rng(1))
    lengths, log_prob, _ = rollout(model, RoutingBatch.from_instances(instances), greedy=False)
    (lengths - lengths.mean(1, keepdim=True)).mul(log_prob).mean().backward()
    assert model.embed_node.weight.grad.abs().sum() > 0
    for module in model.modules():
        if isinstance(module, MixNorm) and norm != "mixnorm-fixed":
            assert module.mean_logits.grad.abs().sum() > 0
            assert module.var_logits.grad.abs().sum() > 0
        elif isinstance(module, MixNorm):  # the equal-weight blend's logits are buffers
            assert module.mean_logits.grad is None


def test_the_mixing_logits_take_their_own_step_size():
    """Adam moves a parameter by about its step size each step: at POMO's lr the mixing weights
    cannot leave 1/3 in a short run, at ``mix_lr`` they can; no weight decay pulls them back."""
    from mixlab.rl.mixroute.training import optimizer_groups, train_pomo

    moved = {}
    for mix_lr in (None, 0.1):
        model = _tiny("cvrp", "mixnorm")
        groups = optimizer_groups(model, 1e-3, 1e-6, mix_lr)
        assert [(len(g["params"]), g["lr"], g["weight_decay"]) for g in groups][1] == (
            2 * 2 * len(model.encoder),
            mix_lr or 1e-3,
            0.0,
        )
        train_pomo(model, 3, n=6, batch_size=4, lr=1e-3, mix_lr=mix_lr)
        moved[mix_lr] = max(
            m.mean_logits.abs().max().item() for m in model.modules() if isinstance(m, MixNorm)
        )
    assert moved[None] < 0.005 < 0.05 < moved[0.1]


@pytest.mark.parametrize("norm", ["instance", "layer", "mixnorm", "mixnorm-adaptive"])
def test_encoder_is_permutation_equivariant(norm):
    model = _tiny("cvrp", norm).eval()
    batch = RoutingBatch.from_instances(generate("cvrp", "uniform", 2, 7, np.random.default_rng(2)))
    order = torch.randperm(7, generator=torch.Generator().manual_seed(0))
    permuted = RoutingBatch(batch.locs[:, order], batch.depot, batch.demand[:, order])
    with torch.no_grad():
        h, h_permuted = model.encode(batch), model.encode(permuted)
    torch.testing.assert_close(h_permuted[:, 0], h[:, 0], atol=1e-5, rtol=1e-4)  # the depot
    torch.testing.assert_close(h_permuted[:, 1:], h[:, 1:][:, order], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("problem", ["tsp", "cvrp", "vrptw"])
def test_augmentation_keeps_the_cost_of_every_tour(problem):
    instances = generate(problem, FAMILY[problem], 2, 6, np.random.default_rng(3))
    batch = RoutingBatch.from_instances(instances)
    model = _tiny(problem).eval()
    with torch.no_grad():
        _, _, tours = rollout(model, batch, greedy=True)
        augmented = augment_8(batch)
        coords = (
            augmented.locs
            if problem == "tsp"
            else torch.cat([augmented.depot[:, None], augmented.locs], 1)
        )
    for view in range(8):
        for b in range(2):
            tour = tours[b, 0]
            closed = (
                torch.cat([tour, tour[:1]])
                if problem == "tsp"
                else torch.cat([tour, tour.new_zeros(1)])
            )
            points = coords[view * 2 + b][closed]
            original = check_routes(instances, b, split_routes(tour.tolist(), problem))[0]
            assert (points[1:] - points[:-1]).norm(dim=-1).sum().item() == pytest.approx(
                original, abs=1e-4
            )


def test_training_lowers_the_tour_length_and_resumes_after_a_kill(tmp_path):
    test = generate("cvrp", "uniform", 16, 8, np.random.default_rng(9))
    model = _tiny("cvrp", "mixnorm")
    before = evaluate(model, test)[0].mean()
    history = train_pomo(model, 30, n=8, batch_size=16, lr=1e-3, seed=0)
    assert evaluate(model, test)[0].mean() < before
    assert np.mean([h["length"] for h in history[-5:]]) < np.mean(
        [h["length"] for h in history[:5]]
    )

    whole = _tiny("cvrp", "mixnorm")
    train_pomo(
        whole, 6, n=6, batch_size=4, seed=1, checkpoint=tmp_path / "a.ckpt", checkpoint_every=2
    )
    killed = _tiny("cvrp", "mixnorm")
    train_pomo(
        killed, 4, n=6, batch_size=4, seed=1, checkpoint=tmp_path / "b.ckpt", checkpoint_every=2
    )
    resumed = _tiny("cvrp", "mixnorm")
    assert len(train_pomo(resumed, 6, n=6, batch_size=4, seed=1, checkpoint=tmp_path / "b.ckpt",
                          checkpoint_every=2)) == 2  # fmt: skip
    for key, value in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[key], value)


def test_model_refuses_another_problem_and_bad_sizes():
    model = _tiny("cvrp")
    tsp = RoutingBatch.from_instances(generate("tsp", "uniform", 1, 5, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="this model solves cvrp, got a tsp batch"):
        model.encode(tsp)
    with pytest.raises(ValueError, match="problem must be one of"):
        POMOModel("pdp")
    with pytest.raises(ValueError, match="dim must be a multiple of heads"):
        POMOModel(dim=10, heads=4)
    with pytest.raises(ValueError, match="norm must be one of"):
        POMOModel(norm="group")
