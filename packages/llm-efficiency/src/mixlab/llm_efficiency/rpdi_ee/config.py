"""The RPDI-EE experiment's :class:`Config` and its registry entry :data:`METHOD`.

Light on purpose (standard library and ``mixlab.shared`` only): ``mixlab list`` reads it without
importing torch or transformers; :mod:`.experiment` loads on ``mixlab run rpdi_ee``.
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
    from mixlab.llm_efficiency.reasoning import ReasoningLMConfig

TUNED = ("budget", "rpdi", "deer", "dynasor", "eat")
"""methods whose parameters the validation split picks"""
RIVALS = ("budget", "deer", "dynasor", "eat")
"""the other early-exit methods RPDI's gain is compared with"""
SYSTEMS = ("first_answer", "vanilla", *TUNED)
GAIN, FEWER = 0.03, 0.20
"""claim: RPDI >= 3 points over vanilla with >= 20 % fewer think tokens"""
PREMATURE_MAX = 0.10
"""claim: RPDI exits before the first answer on <= 10 % of traces with a productive wait"""
_BUDGET_CONTROL = (
    "a fixed think budget tuned on the same validation split: the simplest early exit, with no "
    "signal read from the model (no entropy deviation, no probe)"
)
CLAIMS = (
    ClaimSpec(
        key="gain_with_fewer_tokens",
        text=f"RPDI gains at least {GAIN * 100:.0f} points of accuracy over vanilla thinking with "
        f"at least {FEWER:.0%} fewer think tokens",
        system="rpdi",
        control="budget",
        why_control=_BUDGET_CONTROL,
    ),
    ClaimSpec(
        key="largest_gain",
        text="RPDI's accuracy gain over vanilla is the largest of the early-exit methods "
        "(fixed budget, DEER-, Dynasor- and EAT-style, each tuned on validation)",
        system="rpdi",
        control="vanilla",
        why_control="vanilla thinking, no early exit at all (issue 78's control): if it also "
        "beats every early-exit rival, exiting early is what loses accuracy, not RPDI that gains",
    ),
    ClaimSpec(
        key="no_probe_cost",
        text="RPDI spends no probe tokens, and its wall time per problem is below DEER-style's",
        system="rpdi",
        control="budget",
        why_control=_BUDGET_CONTROL + "; it too runs no extra forward pass",
    ),
    ClaimSpec(
        key="few_premature_exits",
        text=f"RPDI exits before the first answer on at most {PREMATURE_MAX:.0%} of the traces "
        'with a productive "wait" before it, and less often than DEER-style',
        system="rpdi",
        control="budget",
        why_control=_BUDGET_CONTROL + " (vanilla never exits, so it would pass trivially)",
        threshold=PREMATURE_MAX,
        floor=0.0,
        ceiling=1.0,
    ),
)


def _positive_numbers(values: object) -> bool:
    return (
        isinstance(values, tuple | list)
        and len(values) > 0
        and all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v > 0
            for v in values
        )
    )


def _counts(values: object) -> bool:
    return isinstance(values, tuple | list) and len(values) > 0 and all(is_count(v) for v in values)


@dataclass
class Config(ExperimentConfig):
    """Defaults are the quick profile: the cached reasoning toy (trained once, about 4 minutes
    on 2 quiet CPU cores), 300 test problems and 3 sampling seeds (about 2.5 minutes once
    cached). Full is a larger toy with longer chains, 2,000 problems and 5 seeds (one large
    GPU)."""

    hidden_size: int = 128
    """width of the reasoning toy (a Llama, one attention head per 32 channels)"""
    layers: int = 4
    """decoder blocks of the reasoning toy"""
    lm_steps: int = 3000
    """training steps of the reasoning toy (8 x 256 tokens each; cached by its config)"""
    n_traces: int = 20000
    """generated traces it is trained on"""
    max_chain: int = 8
    """longest chain (steps) of the training traces and the problems (shortest: 3)"""
    n_val: int = 200
    """validation problems (their own seed): they pick every method's hyper-parameters"""
    n_test: int = 300
    """test problems (their own seed): the claims"""
    n_seeds: int = 3
    """sampling seeds on the test problems (all methods share them)"""
    temperature: float = 0.7
    """sampling temperature. At 1 the 0.9 M-parameter toy is too unsure of each step (18 % of
    sampled main-line steps wrong, first answer 0.62 in a pilot): 0.7 keeps its one systematic
    slip (corrections, harmful overthinking) and drops the scattered noise"""
    batch_size: int = 300
    """prompts per generate call"""
    max_new_tokens: int = 256
    """generation cap per problem (think and answer)"""
    windows: tuple[int, ...] = (4, 8, 16)
    """RPDI windows W on the validation grid (a toy step is 4 tokens: W of one to four steps)"""
    thresholds: tuple[float, ...] = (1.5, 2.0, 2.5)
    """RPDI thresholds lambda on the validation grid"""
    deer_thresholds: tuple[float, ...] = (0.9, 0.95, 0.99)
    """DEER-style confidence thresholds theta on the validation grid"""
    dynasor_intervals: tuple[int, ...] = (8, 16, 32)
    """Dynasor-style probe intervals N on the validation grid (k = 2 agreeing probes)"""
    eat_thresholds: tuple[float, ...] = (0.001, 0.01, 0.05)
    """EAT-style EMA-variance thresholds delta on the validation grid (a probe every 8 tokens)"""
    budgets: tuple[int, ...] = (32, 48, 64)
    """fixed think budgets (tokens) on the validation grid"""

    SYSTEMS: ClassVar[tuple[str, ...]] = SYSTEMS
    TIMINGS: ClassVar[tuple[str, ...]] = ("seconds_per_problem", "seconds_per_problem_std")
    CLAIMS: ClassVar[tuple[ClaimSpec, ...]] = CLAIMS
    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {},
        "full": {
            "hidden_size": 512,
            "layers": 8,
            "lm_steps": 6000,
            "n_traces": 100000,
            "max_chain": 20,
            "n_val": 500,
            "n_test": 2000,
            "n_seeds": 5,
            "max_new_tokens": 768,
            "windows": (4, 8, 16),
        },
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in (
            "hidden_size",
            "layers",
            "lm_steps",
            "n_traces",
            "n_val",
            "n_test",
            "n_seeds",
            "batch_size",
            "max_new_tokens",
        ):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(
            self.hidden_size % 32 == 0,
            "hidden_size",
            "a multiple of 32 (one head per 32 channels)",
            self.hidden_size,
        )
        require(
            is_count(self.max_chain, 3) and self.max_chain <= 26,
            "max_chain",
            "an integer from 3 to 26",
            self.max_chain,
        )
        require(
            isinstance(self.temperature, numbers.Real) and 0 < self.temperature <= 10,
            "temperature",
            "a number in (0, 10]",
            self.temperature,
        )
        for name in ("windows", "dynasor_intervals", "budgets"):
            require(
                _counts(getattr(self, name)),
                name,
                "a non-empty tuple of integers >= 1",
                getattr(self, name),
            )
        for name in ("thresholds", "eat_thresholds"):
            require(
                _positive_numbers(getattr(self, name)),
                name,
                "a non-empty tuple of numbers > 0",
                getattr(self, name),
            )
        require(
            _positive_numbers(self.deer_thresholds) and max(self.deer_thresholds) <= 1,
            "deer_thresholds",
            "a non-empty tuple of numbers in (0, 1]",
            self.deer_thresholds,
        )

    def lm_config(self) -> ReasoningLMConfig:
        from mixlab.llm_efficiency.reasoning import ReasoningLMConfig, TraceConfig

        base = ReasoningLMConfig()
        lm = base.lm.resized(self.hidden_size, self.layers, self.lm_steps)
        return ReasoningLMConfig(
            lm=lm, traces=TraceConfig(max_steps=self.max_chain), n_traces=self.n_traces
        )


METHOD = Method(
    name="rpdi_ee",
    domain="llm-efficiency",
    paper=(
        "Mitigating Overthinking in Large Reasoning Language Models via Reasoning Path "
        "Deviation Monitoring (arXiv 2603.14251)"
    ),
    claim=(
        "Ending thinking when the local mean token entropy deviates from its global mean "
        "(the RPDI) improves accuracy over vanilla chain of thought with fewer think tokens, "
        "more than the probing early-exit methods, with no extra forward pass."
    ),
    config=Config,
    run="mixlab.llm_efficiency.rpdi_ee.experiment:run",
    headline_plot="accuracy_vs_forward_tokens.png",
)
