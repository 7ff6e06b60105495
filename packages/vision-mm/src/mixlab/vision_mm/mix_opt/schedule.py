"""When to take a zeroth-order high-resolution step instead of a backprop low-resolution one.

A schedule gives p_ZO(t, s), the probability of a ZO-high step at normalised timestep
t = timestep / T ∈ [0, 1) and training progress s = step / steps ∈ [0, 1); the trainer draws
the mode from it once per step. BP steps run at the schedule's ``bp_resolution`` ("low", or
"full" for the BP-high upper bound).

The paper's exact function is not public (only its abstract): :class:`TimestepAware` is our
reconstruction of what it describes: ZO-high at high timesteps, where structure forms and
BP-low's resolution mismatch distorts it, and more ZO-high as training progresses, once BP-low
has adapted the model (spec §7(a)):

    p_ZO(t, s) = clip(σ(κ·(t − t₀)) · s^γ + p_min, 0, 1)
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from mixlab.shared.config import is_number, require


class Schedule(ABC):
    """p_ZO(t, s); subclasses are frozen dataclasses that check their fields."""

    bp_resolution: ClassVar[str] = "low"

    @abstractmethod
    def p_zo(self, t: float, progress: float) -> float:
        """Probability of a ZO-high step at normalised timestep ``t`` and progress ``progress``."""

    def mean_p_zo(self, timesteps: int = 1000, steps: int = 100) -> float:
        """E[p_ZO] over uniform timesteps and steps: the ZO share of a run, to give
        timestep-agnostic random mixing the same BP/ZO ratio."""
        total = sum(
            self.p_zo(i / timesteps, j / steps) for i in range(timesteps) for j in range(steps)
        )
        return total / (timesteps * steps)


def _probability(name: str, value: float) -> None:
    require(is_number(value) and 0.0 <= value <= 1.0, name, "a probability in [0, 1]", value)


@dataclass(frozen=True)
class TimestepAware(Schedule):
    """Mix-Opt's schedule (our reconstruction): σ(κ·(t − t₀))·s^γ + p_min, clipped to [0, 1]."""

    kappa: float = 10.0
    """steepness of the switch around t₀ (0: timestep-agnostic)"""
    t0: float = 0.5
    """normalised timestep where the sigmoid is ½"""
    gamma: float = 1.0
    """how fast ZO-high takes over with progress (0: from the start)"""
    p_min: float = 0.0
    """floor added to the probability"""

    def __post_init__(self) -> None:
        require(
            is_number(self.kappa) and self.kappa >= 0, "kappa", "a finite number >= 0", self.kappa
        )
        _probability("t0", self.t0)
        require(
            is_number(self.gamma) and self.gamma >= 0, "gamma", "a finite number >= 0", self.gamma
        )
        _probability("p_min", self.p_min)

    def p_zo(self, t: float, progress: float) -> float:
        sigmoid = 1 / (1 + math.exp(-self.kappa * (t - self.t0)))
        return min(1.0, max(0.0, sigmoid * progress**self.gamma + self.p_min))


@dataclass(frozen=True)
class Threshold(Schedule):
    """Hard switch: ZO-high exactly when t ≥ ``t_threshold`` and progress ≥ ``after``."""

    t_threshold: float = 0.5
    after: float = 0.0

    def __post_init__(self) -> None:
        _probability("t_threshold", self.t_threshold)
        _probability("after", self.after)

    def p_zo(self, t: float, progress: float) -> float:
        return float(t >= self.t_threshold and progress >= self.after)


@dataclass(frozen=True)
class Constant(Schedule):
    """Timestep-agnostic random mixing with p_ZO = ``p``; p = 0 is pure BP-low, 1 pure ZO-high."""

    p: float = 0.5

    def __post_init__(self) -> None:
        _probability("p", self.p)

    def p_zo(self, t: float, progress: float) -> float:
        return self.p


@dataclass(frozen=True)
class BPHigh(Constant):
    """Backprop at full resolution every step: the memory-hungry upper bound."""

    bp_resolution: ClassVar[str] = "full"
    p: float = 0.0

    def __post_init__(self) -> None:
        require(self.p == 0.0, "p", "0 (BP-high takes no ZO steps)", self.p)


SCHEDULES: dict[str, type[Schedule]] = {
    "mix_opt": TimestepAware,
    "threshold": Threshold,
    "random": Constant,
    "bp_high": BPHigh,
}


def make_schedule(name: str, **fields: float) -> Schedule:
    """A schedule by name: ``mix_opt``, ``threshold``, ``random`` (``p``), ``bp_low`` (pure
    BP-low), ``zo_high`` (pure ZO-high) or ``bp_high``, with its fields as keywords."""
    names = [*SCHEDULES, "bp_low", "zo_high"]
    require(name in names, "schedule", f"one of {names}", name)
    try:
        if name in ("bp_low", "zo_high"):
            require(not fields, "fields", f"none for {name}", fields)
            return Constant(p=0.0 if name == "bp_low" else 1.0)
        return SCHEDULES[name](**fields)
    except TypeError as error:
        raise ValueError(f"schedule {name!r}: {error}") from error
