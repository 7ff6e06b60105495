"""``mixlab-rl mixroute``: train a POMO solver, solve instances, generate shifted families, and
solve them with PyVRP for reference.

mixlab-rl mixroute train --problem cvrp --n 50 --norm mix --steps 20000 --out runs/cvrp50-mix
mixlab-rl mixroute generate --family cluster:n_c=5+demand-large --n 50 --num 100 --out data/c5
mixlab-rl mixroute reference --instances data/c5 --seconds 2 --out data/c5/reference.json
mixlab-rl mixroute solve --model runs/cvrp50-mix --instances data/c5 --reference data/c5/reference.json --out routes.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mixlab.shared.checks import (
    check_choice,
    check_count,
    check_fresh_output,
    check_input_file,
    check_input_folder,
    check_number,
    check_output_file,
    check_output_folder,
    check_seed,
)

app = typer.Typer(
    help="MixRoute: POMO with Mix Normalization for routing across distributions.",
    no_args_is_help=True,
)

PROBLEMS = ("tsp", "cvrp", "vrptw")
NORM_NAMES = ("instance", "batch", "layer", "mixnorm", "mixnorm-adaptive", "mixnorm-fixed", "mix",
              "mix-adaptive", "mix-fixed")  # fmt: skip
"""``mix``, ``mix-adaptive`` and ``mix-fixed`` are short for the ``mixnorm`` names"""
EUC_2D_HELP = (
    "cost on VRPLIB's EUC_2D convention (each leg rounded to the nearest integer), as CVRPLIB's "
    "best-known costs are stated"
)


@app.command()
def train(
    problem: Annotated[str, typer.Option(help="tsp, cvrp or vrptw")] = "cvrp",
    n: Annotated[int, typer.Option(help="customers (cities) per training instance")] = 20,
    norm: Annotated[str, typer.Option(help=f"one of {', '.join(NORM_NAMES)}")] = "mixnorm",
    steps: int = 1000,
    batch_size: int = 64,
    lr: float = 3e-4,
    mix_lr: Annotated[
        float | None, typer.Option(help="MixNorm's mixing logits' step size (default: --lr)")
    ] = None,
    dim: int = 128,
    layers: int = 6,
    heads: int = 8,
    hidden: int = 512,
    families: Annotated[
        str, typer.Option(help="training families, comma-separated (several: a mixture)")
    ] = "uniform",
    seed: int = 0,
    out: Annotated[Path, typer.Option(help="folder for model.safetensors and config.json")] = Path(
        "runs/mixroute"
    ),
    resume: Annotated[
        bool, typer.Option(help="continue from the training checkpoint in --out")
    ] = False,
) -> None:
    """Train POMO with the chosen normalisation (safetensors + JSON in --out)."""
    check_choice(problem, "--problem", PROBLEMS)
    check_choice(norm, "--norm", NORM_NAMES)
    check_count(n, "--n", minimum=2)
    for value, option in ((steps, "--steps"), (batch_size, "--batch-size"), (dim, "--dim"),
                          (layers, "--layers"), (heads, "--heads"), (hidden, "--hidden")):  # fmt: skip
        check_count(value, option)
    check_number(lr, "--lr", lr > 0, "a number > 0")
    if mix_lr is not None:
        check_number(mix_lr, "--mix-lr", mix_lr > 0, "a number > 0")
    check_seed(seed)
    check_output_folder(out, "--out")
    if dim % heads:
        raise ValueError(f"--dim must be a multiple of --heads ({heads}), got {dim}")
    check_fresh_output(out, "--out", resume=resume, made=("train.json",))
    names = [f.strip() for f in families.split(",") if f.strip()]
    import numpy as np
    import torch

    from mixlab.rl.mixroute.instances import generate
    from mixlab.rl.mixroute.pomo import POMOModel
    from mixlab.rl.mixroute.solver import save_model
    from mixlab.rl.mixroute.training import train_pomo

    for family in names:  # refuse an unknown family before training
        generate(problem, family, 1, n, np.random.default_rng(0))
    norm = {"mix": "mixnorm", "mix-adaptive": "mixnorm-adaptive", "mix-fixed": "mixnorm-fixed"}.get(
        norm, norm
    )
    torch.manual_seed(seed)
    model = POMOModel(problem, dim, layers, heads, hidden, norm)
    out.mkdir(parents=True, exist_ok=True)
    history = train_pomo(model, steps, n=n, batch_size=batch_size, lr=lr, mix_lr=mix_lr,
                         families=names, seed=seed, checkpoint=out / "train")  # fmt: skip
    save_model(model, out, n=n, steps=steps, families=names, seed=seed,
               final_length=history[-1]["length"] if history else None)  # fmt: skip
    typer.echo(f"wrote {out / 'model.safetensors'} ({problem}{n}, {norm}, {steps} steps)")


def _read_reference(path: Path, euc_2d: bool) -> dict[str, float]:
    """The reference costs by instance name from a reference.json of `reference`, checked before
    any solving (a file of another kind was a KeyError after the solve; issue 80)."""
    check_input_file(path, "--reference", suffixes=(".json",))
    try:
        saved = json.loads(path.read_text())
    except ValueError:
        raise ValueError(f"--reference: {str(path)!r} is not JSON") from None
    rows = saved.get("instances") if isinstance(saved, dict) else None
    if not isinstance(rows, list) or not all(
        isinstance(row, dict) and isinstance(row.get("name"), str)
        and isinstance(row.get("cost"), int | float) and not isinstance(row.get("cost"), bool)
        for row in rows
    ):  # fmt: skip
        raise ValueError(
            "--reference must be a reference.json from `mixlab-rl mixroute reference`: an object "
            "whose 'instances' list holds {name, cost} rows"
        )
    if saved.get("euc_2d", False) != euc_2d:
        made = "with" if saved.get("euc_2d", False) else "without"
        raise ValueError(
            f"--reference was made {made} --euc-2d: solve the same way, or the gaps mix rounded "
            "and unrounded costs"
        )
    return {row["name"]: float(row["cost"]) for row in rows}


def _read_instances(path: Path):
    """A folder or file of VRPLIB instances, or an .npz of RoutingInstances' arrays."""
    if path.suffix == ".npz":
        import numpy as np

        from mixlab.rl.mixroute.instances import RoutingInstances

        with np.load(path) as arrays:
            return RoutingInstances(**{k: arrays[k] for k in arrays.files})
    if not path.exists():
        raise ValueError(f"--instances: {str(path)!r} does not exist")
    return path


@app.command()
def solve(
    model: Annotated[Path, typer.Option(help="a folder written by train")],
    instances: Annotated[Path, typer.Option(help="a VRPLIB file or folder, or an .npz of arrays")],
    out: Annotated[Path, typer.Option(help="routes.json")] = Path("routes.json"),
    reference: Annotated[
        Path | None, typer.Option(help="reference.json from `reference`: adds the gaps")
    ] = None,
    no_augment: Annotated[bool, typer.Option(help="skip the ×8 augmentation")] = False,
    euc_2d: Annotated[bool, typer.Option("--euc-2d", help=EUC_2D_HELP)] = False,
) -> None:
    """Routes, costs and feasibility per instance (and gaps against a reference)."""
    check_input_folder(model, "--model", containing=("config.json", "model.safetensors"))
    check_output_file(out, "--out", suffixes=(".json",))
    source = _read_instances(instances)
    from mixlab.rl.mixroute.solver import load_model
    from mixlab.rl.mixroute.solver import solve as solve_instances
    from mixlab.shared.files import write_json_atomic

    known = None if reference is None else _read_reference(reference, euc_2d)
    solutions = solve_instances(load_model(model), source, augment=not no_augment, euc_2d=euc_2d)
    costs = None
    if known is not None:
        names = solutions.names or [str(i) for i in range(len(solutions.costs))]
        missing = [name for name in names if name not in known]
        if missing:
            raise ValueError(f"--reference has no cost for {missing[:3]}")
        costs = [known[name] for name in names]
    report = solutions.to_json(costs)
    write_json_atomic(out, report)
    gaps = [row["gap_percent"] for row in report["instances"] if "gap_percent" in row]
    gap = f", mean gap {sum(gaps) / len(gaps):.2f} %" if gaps else ""
    typer.echo(f"wrote {out}: {len(solutions.costs)} instances, {int(solutions.feasible.sum())} "
               f"feasible, mean cost {report['mean_cost']:.4f}{gap}")  # fmt: skip


@app.command()
def generate(
    family: Annotated[
        str, typer.Option(help="e.g. uniform, cluster:n_c=5, explosion+demand-large")
    ],
    n: int = 20,
    num: Annotated[int, typer.Option(help="instances to write")] = 100,
    problem: str = "cvrp",
    seed: int = 0,
    out: Annotated[Path, typer.Option(help="folder for the VRPLIB files")] = Path("instances"),
) -> None:
    """Write ``num`` instances of a family as VRPLIB files, with family.json (the config)."""
    check_choice(problem, "--problem", PROBLEMS)
    check_count(n, "--n", minimum=2)
    check_count(num, "--num")
    check_seed(seed)
    check_output_folder(out, "--out")
    import numpy as np

    from mixlab.rl.mixroute.instances import generate as generate_instances
    from mixlab.rl.mixroute.solver import write_vrplib
    from mixlab.shared.files import write_json_atomic

    instances = generate_instances(problem, family, num, n, np.random.default_rng(seed))
    paths = write_vrplib(instances, out, stem=f"{problem}{n}")
    write_json_atomic(out / "family.json", {"problem": problem, "family": family, "n": n,
                                            "num": num, "seed": seed})  # fmt: skip
    typer.echo(f"wrote {len(paths)} {problem.upper()} instances to {out}")


@app.command()
def reference(
    instances: Annotated[Path, typer.Option(help="a VRPLIB file or folder")],
    seconds: Annotated[float, typer.Option(help="PyVRP's time limit per instance")] = 1.0,
    seed: int = 0,
    out: Annotated[
        Path | None, typer.Option(help="reference.json (default: in the folder)")
    ] = None,
    euc_2d: Annotated[bool, typer.Option("--euc-2d", help=EUC_2D_HELP)] = False,
) -> None:
    """PyVRP (HGS) routes and costs per instance at a fixed time limit, each route checked."""
    check_number(seconds, "--seconds", seconds > 0, "a number > 0")
    check_seed(seed)
    if not instances.exists():
        raise ValueError(f"--instances: {str(instances)!r} does not exist")
    out = out or (instances if instances.is_dir() else instances.parent) / "reference.json"
    check_output_file(out, "--out", suffixes=(".json",))
    from mixlab.rl.mixroute.reference import pyvrp_routes
    from mixlab.rl.mixroute.solver import Solutions, check_routes, read_vrplib, vrplib_paths
    from mixlab.shared.files import write_json_atomic

    paths = vrplib_paths(instances)
    solutions = Solutions(names=[p.stem for p in paths])
    costs, feasible = [], []
    for path in paths:
        one = read_vrplib(path)
        routes = pyvrp_routes(one, 0, seconds=seconds, seed=seed, euc_2d=euc_2d)
        cost, ok = check_routes(one, 0, routes, euc_2d=euc_2d)
        costs.append(cost)
        feasible.append(ok)
        solutions.routes.append(routes)
    import numpy as np

    solutions.costs, solutions.feasible = np.asarray(costs), np.asarray(feasible)
    write_json_atomic(out, {**solutions.to_json(), "euc_2d": euc_2d, "seconds": seconds})
    infeasible = len(costs) - int(solutions.feasible.sum())
    warning = f", {infeasible} INFEASIBLE (see 'feasible')" if infeasible else ""
    typer.echo(f"wrote {out}: {len(costs)} instances, mean cost {np.mean(costs):.4f}{warning}")
