"""A tiny method the registry tests install through a real entry point (see conftest.py).

The "method" fits a linear regression by minibatch SGD, checkpointing as it goes; the "baseline" is
the closed-form least-squares fit. ``crash_at_step`` simulates a run killed part-way.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from mixlab.shared import (
    Checkpointer,
    Claim,
    ClaimSpec,
    ExperimentConfig,
    Method,
    Result,
    capture_rng_state,
    line_plot,
    require,
    restore_rng_state,
)


@dataclass
class Config(ExperimentConfig):
    steps: int = 100
    """SGD steps"""
    lr: float = 0.05
    """learning rate"""
    save_every: int = 10
    """steps between checkpoints"""
    crash_at_step: int | None = None
    """raise at this step, as if the run were killed"""

    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {"quick": {}, "full": {"steps": 200}}
    SYSTEMS: ClassVar[tuple[str, ...]] = ("sgd", "least_squares", "zero")
    CLAIMS: ClassVar[tuple[ClaimSpec, ...]] = (
        ClaimSpec(
            key="matches_least_squares",
            text="SGD gets within 0.01 of the least-squares error",
            system="sgd",
            control="zero",
            why_control="the all-zero weights: no fitting at all",
            not_per_seed="one run of one seed (a toy)",
        ),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.steps >= 1, "steps", "an integer >= 1", self.steps)


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    generator = torch.Generator().manual_seed(config.seed)
    features = torch.randn(256, 3, generator=generator)
    targets = features @ torch.tensor([1.0, -2.0, 0.5]) + 0.1 * torch.randn(
        256, generator=generator
    )

    weights = torch.zeros(3, requires_grad=True)
    optimizer = torch.optim.SGD([weights], lr=config.lr, momentum=0.9)
    checkpoints = Checkpointer(out_dir, resume=resume)
    start = 0
    if (last := checkpoints.load_latest()) is not None:
        start, state = last
        (out_dir / "resumed_from.txt").write_text(str(start))
        with torch.no_grad():
            weights.copy_(state["weights"])
        optimizer.load_state_dict(state["optimizer"])
        restore_rng_state(state["rng"])
    losses = []
    for step in range(start, config.steps):
        if step == config.crash_at_step:
            raise RuntimeError(f"simulated kill at step {step}")
        batch = torch.randint(0, 256, (32,))
        loss = ((features[batch] @ weights - targets[batch]) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % config.save_every == 0:
            checkpoints.save(
                step + 1,
                {
                    "weights": weights,
                    "optimizer": optimizer.state_dict(),
                    "rng": capture_rng_state(),
                },
            )
    line_plot(
        out_dir / "loss.png",
        {"sgd": (list(range(len(losses))), losses)},
        xlabel="step",
        ylabel="loss",
    )

    exact = torch.linalg.lstsq(features, targets.unsqueeze(1)).solution.squeeze(1)
    mse = {"sgd": ((features @ weights.detach() - targets) ** 2).mean().item()}
    mse["least_squares"] = ((features @ exact - targets) ** 2).mean().item()
    mse["zero"] = (targets**2).mean().item()
    metrics = {name: {"train_mse": value} for name, value in mse.items()}
    claims = [
        config.judge(
            "matches_least_squares",
            lambda system: Claim.compare(system, mse[system], "<=", mse["least_squares"] + 0.01),
        )
    ]
    return Result(metrics=metrics, claims=claims)


METHOD = Method(
    name="toy",
    domain="online",
    paper="A toy for the registry tests",
    claim="SGD matches closed-form least squares",
    config=Config,
    run=run,
    headline_plot="loss.png",
)
