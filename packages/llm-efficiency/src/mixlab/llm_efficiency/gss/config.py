"""The GSS experiment's :class:`Config` and its registry entry :data:`METHOD`.

Light on purpose (standard library and ``mixlab.shared`` only): ``mixlab list`` reads it without
importing torch; :mod:`.experiment` loads on ``mixlab run gss``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from mixlab.shared.config import ExperimentConfig, is_count, require
from mixlab.shared.registry import Method

if TYPE_CHECKING:
    from mixlab.llm_efficiency.memorization import MemorizationLMConfig

TASKS = ("math-noise", "math-backdoor", "canaries")


def _numbers(values: object, low: float, high: float) -> bool:
    return (
        isinstance(values, tuple | list)
        and len(values) > 0
        and all(
            isinstance(v, numbers.Real)
            and not isinstance(v, bool)
            and math.isfinite(v)
            and low < v < high
            for v in values
        )
    )


def _counts(values: object, minimum: int = 1) -> bool:
    return (
        isinstance(values, tuple | list)
        and len(values) > 0
        and all(is_count(v, minimum) for v in values)
    )


@dataclass
class Config(ExperimentConfig):
    """Defaults are the quick profile: TinyMem Math-Noise on a 4-layer, 128-wide byte Llama and
    its clean-only reference (trained once and cached, about 12 minutes on 2 CPU cores), 3 seeds
    of calibration draws and baseline runs (a few minutes once cached). Full: all three tasks,
    a 6-layer, 256-wide model, layer, K and δ sweeps, 5 seeds (one large GPU)."""

    tasks: tuple[str, ...] = ("math-noise",)
    """memorization tasks: math-noise, math-backdoor (TinyMem Math) and canaries (stdlib text)"""
    hidden_size: int = 128
    """width of the base and reference models (one attention head per 32 channels)"""
    layers: int = 4
    """decoder blocks of the base and reference models"""
    lm_steps: int = 3000
    """training steps of the base model (16 x 128 tokens each; cached by config)"""
    reference_steps: int = 1000
    """training steps of the reference (it learns the clean rule early)"""
    n_memorized: int = 200
    """memorized (noised or backdoored) sequences, each duplicated ``duplicates`` times; a
    third is the test split, the rest is drawn into fit and validation halves per seed"""
    duplicates: int = 30
    """copies of each memorized sequence in the base model's training data"""
    n_seeds: int = 3
    """seeds of the calibration draws and of the baseline runs"""
    steer_layers: tuple[int, ...] = (2, 3)
    """decoder blocks the validation split may hook (GSS and mean-difference steering)"""
    ranks: tuple[int, ...] = (1, 5)
    """GSS ranks K on the validation grid"""
    deltas: tuple[float, ...] = (0.05,)
    """GSS δ (the probe's Chebyshev budget) on the validation grid"""
    strengths: tuple[float, ...] = (16.0, 64.0, 256.0, 1024.0)
    """multipliers of α on the validation grid (1 is the paper's α; both readings of it). In a
    pilot on the quick lab no setting moved memorization below strength 4: α is in units of
    1/‖u‖, not of ‖h‖"""
    caa_strengths: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0)
    """multipliers of the mean difference v on the validation grid (mean-difference steering)"""
    top_fraction: float = 0.05
    """share of the memorized sequences' tokens, by ω, that forms D_mem"""
    quantile: float = 0.95
    """the gate's ε: this quantile of |uᵀh| on held-out general tokens"""
    max_accuracy_drop: float = 0.01
    """validation rule: the lowest memorization among settings whose clean validation accuracy
    is at most this far below the base model's"""
    max_steps: int = 100
    """step cap of the optimisation baselines (each stops earlier at GSS's memorization)"""

    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {},
        "full": {
            "tasks": TASKS,
            "hidden_size": 256,
            "layers": 6,
            "lm_steps": 8000,
            "reference_steps": 1500,
            "n_memorized": 600,
            "n_seeds": 5,
            "steer_layers": (2, 3, 4, 5),
            "ranks": (1, 2, 5, 10),
            "deltas": (0.01, 0.05, 0.2),
            "max_steps": 1000,
        },
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            isinstance(self.tasks, tuple | list)
            and len(self.tasks) > 0
            and all(t in TASKS for t in self.tasks),
            "tasks",
            f"a non-empty tuple of {TASKS}",
            self.tasks,
        )
        for name in (
            "hidden_size",
            "layers",
            "lm_steps",
            "reference_steps",
            "duplicates",
            "n_seeds",
            "max_steps",
        ):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(is_count(self.n_memorized, 6), "n_memorized", "an integer >= 6", self.n_memorized)
        require(
            self.hidden_size % 32 == 0,
            "hidden_size",
            "a multiple of 32 (one head per 32 channels)",
            self.hidden_size,
        )
        require(
            _counts(self.steer_layers, 0) and max(self.steer_layers) < self.layers,
            "steer_layers",
            f"a non-empty tuple of block indices from 0 to layers - 1 = {self.layers - 1}",
            self.steer_layers,
        )
        require(
            _counts(self.ranks) and max(self.ranks) <= self.hidden_size,
            "ranks",
            f"a non-empty tuple of integers from 1 to hidden_size = {self.hidden_size}",
            self.ranks,
        )
        require(
            _numbers(self.deltas, 0, 1),
            "deltas",
            "a non-empty tuple of numbers in (0, 1)",
            self.deltas,
        )
        for name in ("strengths", "caa_strengths"):
            values = getattr(self, name)
            require(_numbers(values, 0, math.inf), name, "a non-empty tuple of numbers > 0", values)
        for name in ("top_fraction", "quantile", "max_accuracy_drop"):
            value = getattr(self, name)
            require(_numbers((value,), 0, 1), name, "a number in (0, 1)", value)

    def lm_config(self, task: str) -> MemorizationLMConfig:
        from mixlab.llm_efficiency.memorization import (
            CanaryTaskConfig,
            MathTaskConfig,
            MemorizationLMConfig,
        )

        base = MemorizationLMConfig()
        lm = base.lm.resized(self.hidden_size, self.layers, self.lm_steps)
        if task == "canaries":
            return MemorizationLMConfig(
                lm=lm,
                task=CanaryTaskConfig(repeats=self.duplicates),
                reference_steps=self.reference_steps,
            )
        variant = task.removeprefix("math-")
        return MemorizationLMConfig(
            lm=lm,
            task=MathTaskConfig(
                variant=variant, n_memorized=self.n_memorized, duplicates=self.duplicates
            ),
            reference_steps=self.reference_steps,
        )


METHOD = Method(
    name="gss",
    domain="llm-efficiency",
    paper=(
        "Gated Subspace Steering for selective memorization mitigation in language models "
        "(arXiv 2602.08901)"
    ),
    claim=(
        "A closed-form, gated low-rank steer at one layer, fitted in seconds from activations "
        "and gradients, suppresses verbatim memorization while keeping clean accuracy, better "
        "than ungated steering and 10-100x faster to fit than optimisation-based mitigations."
    ),
    config=Config,
    run="mixlab.llm_efficiency.gss.experiment:run",
    headline_plot="memorization_vs_accuracy.png",
)
