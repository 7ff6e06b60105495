"""The MARGO experiment's :class:`Config` and its registry entry :data:`METHOD`.

Light on purpose (standard library and ``mixlab.shared`` only): ``mixlab list`` reads it without
importing torch or TRL; :mod:`.experiment` loads on ``mixlab run margo``.
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
    from mixlab.llm_efficiency.margo.policy import PolicyConfig

THINK_ONLY, MIXED = "GRPO think-only", "mixed lambda=0"
QUICK_CONDITIONS = (
    (THINK_ONLY, 0, 0.0, False),
    (MIXED, 4, 0.0, False),
    ("MARGO lambda=1", 4, 1.0, False),
    ("MARGO lambda=1 one-sided", 4, 1.0, True),
)
"""``(name, direct rollouts of 8, lambda, one-sided)``: the issue's quick systems"""
FULL_CONDITIONS = (
    *QUICK_CONDITIONS,
    ("MARGO lambda=0.5", 4, 0.5, False),
    ("MARGO lambda=2", 4, 2.0, False),
    ("MARGO lambda=0.5 one-sided", 4, 0.5, True),
    ("MARGO lambda=2 one-sided", 4, 2.0, True),
    ("MARGO lambda=1 6:2", 2, 1.0, False),
    ("MARGO lambda=1 2:6", 6, 1.0, False),
)
"""the full profile adds lambda in {0.5, 2} and other thinking:direct ratios"""
MARGO = "MARGO lambda=1"
"""the MARGO condition the claims name; every other condition with lambda > 0 is judged alike"""
OVERTURN_CUT, QA_GAIN, MATH_SLACK, LENGTH_KEEP = 0.5, 0.02, 0.02, 0.7
"""claims (issue 21): MARGO at most halves SFT's overturn rate; beats think-only's thinking
accuracy by 2 points; arithmetic within 2 points of SFT's; think length >= 70 % of SFT's"""
SYSTEMS = ("SFT", *(c[0] for c in FULL_CONDITIONS))
_MIXED_CONTROL = (
    "mixed-mode GRPO with lambda = 0: the same groups of thinking and direct rollouts, without "
    "MARGO's cross-mode score (issue 78's control of every MARGO claim)"
)


def _claim(
    key: str, text: str, *, control: str = MIXED, why_control: str = _MIXED_CONTROL
) -> ClaimSpec:
    """A claim about a MARGO condition (``{system}``), with mixed lambda = 0 as its control unless
    it says otherwise."""
    return ClaimSpec(
        key=key,
        text="{system}: " + text,
        system=MARGO,
        control=control,
        why_control=why_control,
    )


CLAIMS = (
    _claim(
        "overturn_suppressed",
        "the 1-hop overturn rate is at most half SFT's and below GRPO think-only's",
    ),
    _claim(
        "qa_beats_think_only",
        f"thinking accuracy on factual QA (1- and 2-hop) beats GRPO think-only's by >= "
        f"{QA_GAIN * 100:.0f} points",
    ),
    _claim(
        "qa_beats_mixed",
        "thinking accuracy on factual QA (1- and 2-hop) beats mixed lambda=0's",
        control=THINK_ONLY,
        why_control="GRPO on thinking rollouts alone, with neither direct rollouts nor MARGO's "
        "cross-mode score: mixed lambda=0 is the claim's own reference, so think-only is the "
        "strongest simple system left without MARGO's idea (its test compares think-only's "
        "thinking accuracy with mixed lambda=0's)",
    ),
    _claim("two_hop_kept", "2-hop thinking accuracy is at least SFT's"),
    _claim(
        "math_kept",
        f"arithmetic thinking accuracy is within {MATH_SLACK * 100:.0f} points of SFT's or above",
    ),
    _claim(
        "think_length_kept",
        f"think length on 2-hop and arithmetic stays >= {LENGTH_KEEP:.0%} of SFT's (no win by "
        "not thinking)",
    ),
)


def _condition(value: object, generations: int) -> bool:
    return (
        isinstance(value, tuple | list)
        and len(value) == 4
        and isinstance(value[0], str)
        and is_count(value[1], 0)
        and value[1] < generations
        and isinstance(value[2], numbers.Real)
        and not isinstance(value[2], bool)
        and math.isfinite(value[2])
        and value[2] >= 0
        and not (value[1] == 0 and value[2] != 0)
        and isinstance(value[3], bool)
    )


@dataclass
class Config(ExperimentConfig):
    """Defaults are the quick profile: a hybrid-mode SFT model of a closed-book world (0.8 M
    parameters, trained once and cached in about 6 minutes on 2 CPU cores), then GRPO
    think-only, mixed lambda=0 and MARGO lambda=1 two- and one-sided, 3 seeds of 100 steps
    (2 prompts x 8 rollouts) each, about 10 more minutes. Full (one large GPU): lambda in {0.5,
    1, 2}, other thinking:direct ratios, a d 512 model, a larger world, 5 seeds."""

    conditions: tuple[tuple[str, int, float, bool], ...] = QUICK_CONDITIONS
    """``(name, direct rollouts per group, lambda, one-sided)``; every one trains with the same
    steps, rollouts, prompts and seeds"""
    n_seeds: int = 3
    """RL seeds per condition"""
    steps: int = 100
    """GRPO steps per run"""
    prompts_per_step: int = 2
    """prompts per GRPO step"""
    num_generations: int = 8
    """rollouts per prompt (thinking + direct)"""
    learning_rate: float = 2e-4
    """AdamW learning rate of the RL runs (linear warm-up, then linear decay)"""
    warmup_ratio: float = 0.1
    """share of the steps that warm the learning rate up"""
    max_completion_length: int = 16
    """generated tokens per rollout (the longest trace with its answer and end is 12)"""
    n_people: int = 240
    """people in the world (a third held out: the test questions)"""
    n_cities: int = 24
    """cities in the world (each person lives in one, drawn at random)"""
    n_countries: int = 6
    """countries in the world (each has at least one city; the 2-hop answer is a country)"""
    p_drift: float = 0.3
    """share of the 1-hop thinking demonstrations that drift to the colleague's city"""
    hidden_size: int = 128
    """width of the SFT model (a Llama, one attention head per 32 channels)"""
    layers: int = 4
    """transformer layers of the SFT model"""
    sft_steps: int = 1500
    """SFT steps (16 x 128 tokens each; the model is cached by its config)"""
    rl_mix: tuple[float, float, float] = (0.5, 0.25, 0.25)
    """shares of 1-hop, 2-hop and math questions among the RL training prompts"""
    n_math_test: int = 200
    """held-out arithmetic chains (their own seed)"""
    test_samples: int = 4
    """samples per test question and mode (temperature 1)"""
    probe_every: int = 5
    """steps between the held-out probes of the over-steps plot (every run drops most of its
    drift within 20 steps)"""
    min_direct_one_hop: float = 0.85
    """regime: the SFT model's direct 1-hop accuracy reaches this ..."""
    min_two_hop_gain: float = 0.15
    """... its thinking beats its direct mode on 2-hop by this ..."""
    min_overturn: float = 0.10
    """... and thinking overturns at least this share of its correct direct 1-hop answers"""

    SYSTEMS: ClassVar[tuple[str, ...]] = SYSTEMS
    CLAIMS: ClassVar[tuple[ClaimSpec, ...]] = CLAIMS
    ALLOWED_EDGE_VALUES: ClassVar[dict[str, tuple[Any, ...]]] = {
        "p_drift": (0, 0.0),  # no drift shown: nothing to overturn (the regime check says so)
        "warmup_ratio": (0, 0.0),
        "min_direct_one_hop": (0, 0.0),
        "min_two_hop_gain": (0, 0.0),
        "min_overturn": (0, 0.0),
    }
    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {},
        "full": {
            "conditions": FULL_CONDITIONS,
            "n_seeds": 5,
            "steps": 300,
            "prompts_per_step": 4,
            "n_people": 600,
            "n_cities": 40,
            "n_countries": 8,
            "hidden_size": 512,
            "layers": 8,
            "sft_steps": 4000,
            "n_math_test": 500,
            "test_samples": 8,
        },
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            is_count(self.num_generations, 2),
            "num_generations",
            "an integer >= 2 (GRPO compares the rollouts of a prompt)",
            self.num_generations,
        )
        require(
            isinstance(self.conditions, tuple | list) and len(self.conditions) > 0
            and all(_condition(c, self.num_generations) for c in self.conditions),
            "conditions",
            "a non-empty tuple of (name, direct rollouts in [0, num_generations), lambda >= 0 "
            "(0 without direct rollouts), one-sided bool)",
            self.conditions,
        )  # fmt: skip
        names = [c[0] for c in self.conditions]
        require(len(set(names)) == len(names), "conditions", "distinct names", names)
        require(
            MIXED in names,
            "conditions",
            f"a tuple including {MIXED!r} (the control of every claim but qa_beats_mixed)",
            names,
        )
        require(
            THINK_ONLY in names,
            "conditions",
            f"a tuple including {THINK_ONLY!r} (the control of qa_beats_mixed and the reference "
            "of overturn_suppressed and qa_beats_think_only)",
            names,
        )
        for name in ("n_seeds", "steps", "prompts_per_step", "max_completion_length",
                     "hidden_size", "layers", "sft_steps", "n_math_test", "test_samples",
                     "probe_every"):  # fmt: skip
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(is_count(self.n_people, 12), "n_people", "an integer >= 12", self.n_people)
        require(is_count(self.n_cities, 2), "n_cities", "an integer >= 2", self.n_cities)
        require(
            is_count(self.n_countries, 2) and self.n_countries <= self.n_cities,
            "n_countries",
            f"an integer in [2, n_cities = {self.n_cities}]",
            self.n_countries,
        )
        require(
            self.hidden_size % 32 == 0,
            "hidden_size",
            "a multiple of 32 (one head per 32 channels)",
            self.hidden_size,
        )
        require(
            isinstance(self.learning_rate, numbers.Real) and 0 < self.learning_rate < 1,
            "learning_rate",
            "a number in (0, 1)",
            self.learning_rate,
        )
        require(
            isinstance(self.rl_mix, tuple | list) and len(self.rl_mix) == 3
            and all(isinstance(v, numbers.Real) and v >= 0 for v in self.rl_mix)
            and sum(self.rl_mix) > 0,
            "rl_mix",
            "three shares >= 0 (1-hop, 2-hop, math), not all 0",
            self.rl_mix,
        )  # fmt: skip
        for name in ("p_drift", "warmup_ratio", "min_direct_one_hop", "min_two_hop_gain",
                     "min_overturn"):  # fmt: skip
            value = getattr(self, name)
            require(
                isinstance(value, numbers.Real) and 0 <= value < 1 if name == "p_drift"
                else isinstance(value, numbers.Real) and 0 <= value <= 1,
                name,
                "a number in [0, 1)" if name == "p_drift" else "a number in [0, 1]",
                value,
            )  # fmt: skip

    def policy_config(self) -> PolicyConfig:
        from mixlab.llm_efficiency.margo.policy import PolicyConfig
        from mixlab.llm_efficiency.margo.world import WorldConfig

        base = PolicyConfig()
        world = WorldConfig(
            n_people=self.n_people,
            n_cities=self.n_cities,
            n_countries=self.n_countries,
            p_drift=float(self.p_drift),
        )
        return PolicyConfig(
            world=world, lm=base.lm.resized(self.hidden_size, self.layers, self.sft_steps)
        )


METHOD = Method(
    name="margo",
    domain="llm-efficiency",
    paper=(
        "MARGO: Mixed-Mode Advantage Regularization for Grounded Optimization "
        "(paper not found; reconstructed from its abstract)"
    ),
    claim=(
        "Scoring thinking rollouts against the same model's direct answers in mixed-mode GRPO "
        "groups suppresses thinking that overturns correct direct answers (factual QA) while "
        "keeping thinking where it helps (multi-hop recall, arithmetic)."
    ),
    config=Config,
    run="mixlab.llm_efficiency.margo.experiment:run",
    headline_plot="overturn_over_steps.png",
)
