"""The GSS experiment's :class:`Config` and its registry entry :data:`METHOD`.

Light on purpose (standard library and ``mixlab.shared`` only): ``mixlab list`` reads it without
importing torch; :mod:`.experiment` loads on ``mixlab run gss``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from mixlab.shared.claims import ClaimSpec
from mixlab.shared.config import ExperimentConfig, is_count, require
from mixlab.shared.registry import Method

if TYPE_CHECKING:
    from mixlab.llm_efficiency.memorization import MemorizationLMConfig

TASKS = ("math-noise", "math-backdoor", "canaries")
OPTIMISED = ("gradient_ascent", "npo", "hard_concrete", "balanced_subnet")
STEERED = ("gss", "gss_ungated", "caa", "caa_gated")
SYSTEMS = ("base", "reference", *STEERED, *OPTIMISED)
MITIGATIONS = (*STEERED, *OPTIMISED)
HEAVY_TAIL = 0.25
"""claim: under 25 % of the memorized sequences' tokens lie above the mean ω (paper 18.7 %)"""
CUT, KEEP = 0.10, 0.02
"""claim: GSS memorization <= 10 % of the base's, clean accuracy within 2 points"""
UNGATED_COST = 0.02
"""claim: ungated GSS at equal memorization loses >= 2 points more accuracy"""
EQUAL_MEMORIZATION = 0.05
"""ungated GSS counts as at GSS's memorization when within 5 points of it on the test split"""
SPEEDUPS = (10.0, 100.0)
"""the compute claim as the NeurIPS abstract (10x) and arXiv v1 (100x) state its lower end"""
_CAA_CONTROL = (
    "mean-difference (CAA) steering at the same layers, picked on validation at matched clean "
    "accuracy (its lowest memorization among the settings at least as accurate as GSS's pick): "
    "a steer without GSS's gradient subspace, probes or gate (issue 71)"
)
CLAIMS = (
    ClaimSpec(
        key="heavy_tail",
        text=f"The token-level signal is heavy-tailed: under {HEAVY_TAIL:.0%} of the memorized "
        "sequences' tokens lie above the mean ω (paper: 18.7%)",
        system="gss",
        control="base",
        why_control="the base model's log-prob alone, without the clean reference subtracted "
        "(the simplest per-token signal; GSS's ω is the contrast with the reference)",
        threshold=HEAVY_TAIL,
        floor=0.0,
        ceiling=1.0,
    ),
    ClaimSpec(
        key="cuts_memorization",
        text=f"GSS cuts memorization to at most {CUT:.0%} of the base rate with clean accuracy "
        f"within {KEEP * 100:.0f} points",
        system="gss",
        control="caa",
        why_control=_CAA_CONTROL,
    ),
    ClaimSpec(
        key="lowest_ds",
        text="GSS's DS_0.05 is the lowest of all mitigations",
        system="gss",
        control="caa",
        why_control=_CAA_CONTROL + "; judged against every mitigation but itself and GSS, it "
        "passes when CAA beats all the others too: then the lowest DS is what a steer picked by "
        "the same rule reaches, not something of GSS's subspace",
    ),
    ClaimSpec(
        key="gating_costs_ungated",
        text=f"Ungated GSS at equal memorization loses at least {UNGATED_COST * 100:.0f} points "
        "more clean accuracy than gated GSS",
        system="gss",
        control="caa_gated",
        why_control="gated mean-difference (CAA) steering against CAA without its gate: the "
        "same gate on a steer without GSS's gradient subspace or probes; if gating costs less "
        "accuracy there too, the claim measures gating, not GSS (ungated GSS, which issue 71 "
        "names, is the claim's own reference: in GSS's place it would be compared with itself)",
    ),
    ClaimSpec(
        key="fits_faster",
        text=f"GSS fits at least {SPEEDUPS[0]:.0f}x faster than every optimisation baseline, "
        "each at its step count picked on validation by the same rule and fitted side by side "
        "(NeurIPS abstract: 10-100x; arXiv v1: 100-1000x)",
        system="gss",
        control="caa",
        why_control="mean-difference (CAA) steering, also fitted in closed form from activations "
        "(a mean difference, no gradients, no probes): the simplest fit without GSS's subspace",
    ),
)


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
    """Defaults are the quick profile: TinyMem Math-Noise on a 4-layer, 96-wide byte Llama and
    its clean-only reference (trained once and cached, about 6.5 minutes on 2 CPU cores), 3 seeds
    of calibration draws and baseline runs in two worker processes (about 6 minutes once
    cached). Full: all three tasks, a 6-layer, 256-wide model, layer, K and δ sweeps, 5 seeds
    (one large GPU)."""

    tasks: tuple[str, ...] = ("math-noise",)
    """memorization tasks: math-noise, math-backdoor (TinyMem Math) and canaries (stdlib text)"""
    hidden_size: int = 96
    """width of the base and reference models (one attention head per 32 channels); 128 wide
    and 3,000 steps took 14.5 minutes to train on 2 cores, the whole quick budget"""
    layers: int = 4
    """decoder blocks of the base and reference models"""
    lm_steps: int = 2000
    """training steps of the base model (16 x 128 tokens each; cached by config); at 1,500 the
    quick base model memorized only 24 % of the test sequences, at 2,000 95 %"""
    reference_steps: int = 600
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
    strengths: tuple[float, ...] = (64.0, 256.0, 1024.0)
    """multipliers of α on the validation grid (1 is the paper's α; both readings of it). In a
    pilot on the quick lab no setting moved memorization below strength 4: α is in units of
    1/‖u‖, not of ‖h‖ (validation never picked 16 in the committed runs)"""
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
    """step cap of the optimisation baselines: validation trains each this far once and picks
    its step count by the same rule as GSS's strength"""
    check_every: int = 10
    """the optimisation baselines' validation checks: every this many steps (not timed)"""
    workers: int = 2
    """processes that run the validation and test cells side by side (one torch thread each;
    a seed's systems are fitted one after another in one process, so its fit times compare
    under the same load)"""

    SYSTEMS: ClassVar[tuple[str, ...]] = SYSTEMS
    TIMINGS: ClassVar[tuple[str, ...]] = ("seconds", "seconds_std", "fit_time_vs_gss")
    CLAIMS: ClassVar[tuple[ClaimSpec, ...]] = CLAIMS
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
            "workers": 1,
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
            "check_every",
            "workers",
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
        require(
            self.check_every <= self.max_steps,
            "check_every",
            f"an integer from 1 to max_steps = {self.max_steps}",
            self.check_every,
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
