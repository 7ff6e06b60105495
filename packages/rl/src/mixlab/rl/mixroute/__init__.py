"""MixRoute: Mix Normalization in POMO's encoder, for neural routing that generalises across
instance distributions (reconstructed; paper not found).

POMO normalises each attention layer over the nodes of an instance (instance norm); the
Attention Model over the batch. MixNorm mixes instance, per-node and batch statistics with
softmax weights learned per layer (means and variances apart), optionally conditioned on the
instance. A solver trained on uniform instances then meets clustered customers, skewed demands
and tight capacities at test time.

    from mixlab.rl.mixroute import POMOModel, train_pomo, generate, solve
    model = POMOModel("cvrp", norm="mixnorm")                    # or "instance", "batch", "layer"
    train_pomo(model, steps=20_000, n=50, lr=1e-4)
    instances = generate("cvrp", "cluster:n_c=5+demand-large", 100, 50, np.random.default_rng(0))
    solutions = solve(model, instances)                          # or VRPLIB files: solve(model, "data/")
    solutions.costs, solutions.routes, solutions.feasible

    MixNorm(128)(h)                                              # alone, on any [B, N, d] embeddings

See ``seeds/mixroute.md`` for what is reconstructed and the measured results.
"""

from typing import TYPE_CHECKING

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "BatchNorm": "norms",
    "InstanceNorm": "norms",
    "LayerNormRL4CO": "norms",
    "MixNorm": "norms",
    "NORMS": "norms",
    "POMOModel": "pomo",
    "RoutingBatch": "pomo",
    "RoutingInstances": "instances",
    "Solutions": "solver",
    "augment_8": "pomo",
    "check_routes": "solver",
    "coordinates": "instances",
    "cvrp": "instances",
    "evaluate": "training",
    "generate": "instances",
    "load_model": "solver",
    "make_norm": "norms",
    "pyvrp_routes": "reference",
    "pyvrp_solve": "reference",
    "read_vrplib": "solver",
    "rollout": "pomo",
    "save_model": "solver",
    "savings": "reference",
    "solve": "solver",
    "train_policy": "training",
    "train_pomo": "training",
    "tsp": "instances",
    "vrptw": "instances",
    "write_vrplib": "solver",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = [
    "NORMS",
    "BatchNorm",
    "InstanceNorm",
    "LayerNormRL4CO",
    "MixNorm",
    "POMOModel",
    "RoutingBatch",
    "RoutingInstances",
    "Solutions",
    "augment_8",
    "check_routes",
    "coordinates",
    "cvrp",
    "evaluate",
    "generate",
    "load_model",
    "make_norm",
    "pyvrp_routes",
    "pyvrp_solve",
    "read_vrplib",
    "rollout",
    "save_model",
    "savings",
    "solve",
    "train_policy",
    "train_pomo",
    "tsp",
    "vrptw",
    "write_vrplib",
]

if TYPE_CHECKING:
    from mixlab.rl.mixroute.instances import (
        RoutingInstances,
        coordinates,
        cvrp,
        generate,
        tsp,
        vrptw,
    )
    from mixlab.rl.mixroute.norms import (
        NORMS,
        BatchNorm,
        InstanceNorm,
        LayerNormRL4CO,
        MixNorm,
        make_norm,
    )
    from mixlab.rl.mixroute.pomo import POMOModel, RoutingBatch, augment_8, rollout
    from mixlab.rl.mixroute.reference import pyvrp_routes, pyvrp_solve, savings
    from mixlab.rl.mixroute.solver import (
        Solutions,
        check_routes,
        load_model,
        read_vrplib,
        save_model,
        solve,
        write_vrplib,
    )
    from mixlab.rl.mixroute.training import evaluate, train_policy, train_pomo
