"""The settings of one personalization run (:class:`MixOptConfig`), importable without torch, so
the CLI checks them, and a checkpoint's, before any model loads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mixlab.shared.config import is_count, is_number, require
from mixlab.vision_mm.mix_opt.schedule import Schedule, TimestepAware


@dataclass
class MixOptConfig:
    """Settings of one personalization run."""

    resolution: int = 32
    """full (ZO-high, BP-high) resolution; images are box-resized to it if needed"""
    low_resolution: int = 16
    """BP-low resolution"""
    steps: int = 400
    batch_size: int = 4
    schedule: Schedule = field(default_factory=TimestepAware)
    bp_lr: float = 1e-3
    """AdamW learning rate of BP steps"""
    bp_weight_decay: float = 1e-2
    zo_lr: float = 1e-3
    """learning rate η of ZO steps (θ ← θ − η·ĝ·z)"""
    zo_eps: float = 1e-2
    """perturbation scale ε"""
    zo_directions: int = 1
    """directions z averaged per ZO step (q)"""
    zo_weight_decay: float = 0.0
    seed: int = 0
    checkpoint_every: int = 100

    def __post_init__(self) -> None:
        for name in ("resolution", "low_resolution", "steps", "batch_size", "zo_directions"):
            value = getattr(self, name)
            require(is_count(value), name, "an integer >= 1", value)
        require(
            is_count(self.checkpoint_every),
            "checkpoint_every",
            "an integer >= 1",
            self.checkpoint_every,
        )
        require(
            self.low_resolution <= self.resolution,
            "low_resolution",
            f"<= resolution {self.resolution}",
            self.low_resolution,
        )
        require(isinstance(self.schedule, Schedule), "schedule", "a Schedule", self.schedule)
        for name in ("bp_lr", "zo_lr", "bp_weight_decay", "zo_weight_decay"):
            value = getattr(self, name)
            require(is_number(value) and value >= 0, name, "a finite number >= 0", value)
        require(
            is_number(self.zo_eps) and self.zo_eps > 0, "zo_eps", "a finite number > 0", self.zo_eps
        )
        require(is_count(self.seed, 0), "seed", "an integer >= 0", self.seed)


TIMESTEP_RULE = "per example, given the mode"
"""how the trainer draws timesteps, recorded in checkpoints: one of the first version (one timestep
per batch, then the mode) is refused rather than continued under another rule"""


def recorded_settings(config: MixOptConfig) -> dict[str, Any]:
    """``config`` as a checkpoint records it (the schedule by its repr; not checkpoint_every),
    with the trainer's :data:`TIMESTEP_RULE`."""
    settings = {**asdict(config), "schedule": repr(config.schedule), "timesteps": TIMESTEP_RULE}
    settings.pop("checkpoint_every")
    return settings


__all__ = ["MixOptConfig", "recorded_settings"]
