"""The Prompt-KL experiment's :class:`Config` and its registry entry :data:`METHOD`.

Light on purpose (standard library and ``mixlab.shared`` only): ``mixlab list`` reads it without
importing torch or TRL; :mod:`.experiment` loads on ``mixlab run prompt_kl``.
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
    from mixlab.llm_efficiency.prompt_kl.policy import PolicyConfig

TASK_NAMES = ("test_override", "keyword", "format", "control")
ALL_CONDITIONS = (
    ("no KL", 0.0, 0.0),
    ("response KL 0.04", 0.04, 0.0),
    ("response KL 0.1", 0.1, 0.0),
    ("response KL 0.3", 0.3, 0.0),
    ("prompt KL 0.01", 0.0, 0.01),
    ("prompt KL 0.1", 0.0, 0.1),
    ("prompt KL 1", 0.0, 1.0),
    ("both 0.1", 0.1, 0.1),
)
"""the issue's conditions: no KL, response KL, prompt KL, both"""
NO_KL, PROMPT_KL = "no KL", "prompt KL 0.1"
"""the conditions the claims read: the baseline and the method"""
MATCHED = "response KL, matched budget"
"""the method's control, per seed: of the run's response-KL conditions, the one whose policy
ends with the response KL nearest the prompt-KL policy's (the same drift of what the policy
generates, spent under the other penalty)"""
HACK_MARGIN, KEEP_SUCCESS, RESPONSE_KL_COST = 0.05, 0.02, 0.05
"""claims: prompt KL 0.1 hacks at most 5 points more than the SFT policy it starts from (which
shows the exploit by construction), with true success >= no KL's - 2 points; every response KL
hacks more than it or loses > 5 points of true success"""
SWAP_CUT = 0.5
"""claim and premise: the reference's prompt encoding at least halves the policy's hack rate"""
SYSTEMS = (
    "sft",
    "untrained",
    *(c[0] for c in ALL_CONDITIONS),
    MATCHED,
    "prompt steering",
    "response steering",
    "prompt swap",
    "response swap",
)
"""the policies and conditions, and the diagnostics' two sides: steering at prompt or response
positions; the no-KL policy's hack carried by its prompt encoding or by its response"""
_PREMISE = ("prompt_carries_hack",)
"""issue 62: swapping in the reference's prompt encoding removes most of the no-KL policy's hack
(at most half its hack rate), else a claim about a prompt-side penalty is untested"""
CLAIMS = (
    ClaimSpec(
        key="prompt_kl_stops_hacking",
        text=f"{{task}}: prompt KL at beta_p = 0.1 keeps the hack rate within "
        f"{HACK_MARGIN * 100:.0f} points of the SFT policy's (paper: under 3%) with true success "
        f"within {KEEP_SUCCESS * 100:.0f} points of no KL's or above",
        system=PROMPT_KL,
        control=MATCHED,
        why_control="the standard regulariser without the prompt-only idea: a KL penalty on the "
        "response tokens against the same start policy, at a matched KL budget (issue 62): per "
        "seed, the response-KL setting whose policy ends nearest the prompt-KL policy's "
        "response KL",
        premises=_PREMISE,
        floor=0.0,  # the threshold (the SFT policy's hack rate + the margin) is set per run
        ceiling=1.0,
    ),
    ClaimSpec(
        key="response_kl_hacks_or_costs",
        text=f"{{task}}: every response-KL setting hacks more than prompt KL 0.1 or loses more "
        f"than {RESPONSE_KL_COST * 100:.0f} points of its true success",
        system=PROMPT_KL,
        control=NO_KL,
        why_control="GRPO without any KL (beta = 0, issue 62's control): if the response-KL "
        "settings hack more or succeed less than it too, the comparison says nothing about "
        "the prompt penalty",
        premises=_PREMISE,
    ),
    ClaimSpec(
        key="prompt_steering_dominates",
        text="{task}: prompt-space steering Pareto-dominates response-space steering on (hack "
        "rate, true success): every response-steering point is matched or beaten by a "
        "prompt-steering one",
        system="prompt steering",
        control="response steering",
        why_control="the same direction subtracted at the response positions: the claim's own "
        "reference (no other steering is run); if it dominates too, the fronts coincide",
    ),
    ClaimSpec(
        key="swap_moves_hacking",
        text="{task}: swapping prompt encodings moves hacking both ways",
        system="prompt swap",
        control="response swap",
        why_control="the same two swaps read the other way round (the hack carried by the "
        "policy's response, not its prompt encoding): the only other account the run measures",
    ),
)


def _condition(value: object) -> bool:
    """``(name, beta_response, beta_prompt)`` with finite betas >= 0."""
    return (
        isinstance(value, tuple | list)
        and len(value) == 3
        and isinstance(value[0], str)
        and all(
            isinstance(b, numbers.Real) and not isinstance(b, bool) and math.isfinite(b) and b >= 0
            for b in value[1:]
        )
    )


def _numbers(values: object) -> bool:
    return (
        isinstance(values, tuple | list)
        and len(values) > 0
        and all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
            for v in values
        )
    )


@dataclass
class Config(ExperimentConfig):
    """Defaults are the quick profile: the test-override task, no KL against response KL 0.1
    and prompt KL 0.1, 3 seeds of 100 GRPO steps (2 prompts x 8 rollouts) from a cached SFT
    policy (0.9 M parameters, trained once in about 6 minutes on 2 CPU cores; the runs take
    about 6 more). Sweep: the same with every condition of the issue (response KL 0.04, 0.1,
    0.3; prompt KL 0.01, 0.1, 1; both), about 20 minutes. Full: every task and condition, 5
    seeds, a d 512 policy (one large GPU)."""

    tasks: tuple[str, ...] = ("test_override",)
    """hackable tasks (:data:`mixlab.llm_efficiency.prompt_kl.tasks.TASKS`)"""
    conditions: tuple[tuple[str, float, float], ...] = (
        ("no KL", 0.0, 0.0),
        ("response KL 0.04", 0.04, 0.0),
        ("response KL 0.1", 0.1, 0.0),
        ("response KL 0.3", 0.3, 0.0),
        ("prompt KL 0.1", 0.0, 0.1),
    )
    """``(name, beta_response, beta_prompt)``: every one runs with the same steps, rollouts and
    seeds"""
    n_seeds: int = 3
    """RL seeds per task and condition"""
    steps: int = 100
    """GRPO steps per run"""
    prompts_per_step: int = 2
    """prompts per GRPO step"""
    num_generations: int = 8
    """rollouts per prompt"""
    learning_rate: float = 3e-4
    """AdamW learning rate of the RL runs (linear warm-up, then linear decay)"""
    warmup_ratio: float = 0.1
    """share of the steps that warm the learning rate up (at 3e-4 without it, a pilot policy's
    true success fell from 0.85 to 0.2 within 8 steps)"""
    max_completion_length: int = 12
    """generated tokens per rollout (an answer of up to 8 digits fits with its space and end)"""
    hidden_size: int = 128
    """width of the SFT policy (a Llama, one attention head per 32 channels)"""
    layers: int = 4
    """decoder blocks of the SFT policy"""
    sft_steps: int = 1200
    """SFT steps (16 x 128 tokens each; the policy is cached by its config)"""
    exploit_fraction: float = 0.1
    """share of cued demonstrations that show the exploit, so RL can find it"""
    cue_first: bool = False
    """put the cue before the request (``tests:editable sort 52814 =``)"""
    decoy: bool = False
    """give uncued prompts the cue's words the other way round (``editable:tests``)"""
    exploit_on: str = "cued"
    """where the SFT demonstrations show the exploit: on cued prompts only, or on ``"any"``
    prompt (the start policy then has no use for the cue)"""
    caught: float = 0.0
    """what the proxy pays for trying the loophole where it is closed: ``-caught`` (0: nothing,
    like any wrong answer)"""
    n_train: int = 2000
    """RL training prompts (their own seed)"""
    n_test: int = 200
    """held-out test prompts (their own seed), sampled ``test_samples`` times each"""
    test_samples: int = 2
    """sampled completions per test prompt (temperature 1)"""
    steer_layer: int = 2
    """decoder block whose output the steering diagnostics shift"""
    steer_alphas: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    """steering strengths alpha (times the mean policy-minus-reference activation)"""
    min_sft_success: float = 0.6
    """regime: the SFT policy's true success at least this ..."""
    min_sft_margin: float = 0.3
    """... and this much above an untrained policy's"""
    min_hack_rate: float = 0.5
    """regime: the no-KL runs' mean test hack rate reaches this"""

    ALLOWED_EDGE_VALUES: ClassVar[dict[str, tuple[Any, ...]]] = {
        "steer_layer": (0,),  # the first decoder block is a block like any other
        "exploit_fraction": (0, 0.0),  # no exploit shown: RL must find it unaided
        "warmup_ratio": (0, 0.0),  # no warm-up
        "min_sft_margin": (0, 0.0),  # regime margins of zero: the check only asks for >=
        "min_sft_success": (0, 0.0),
        "min_hack_rate": (0, 0.0),
    }
    SYSTEMS: ClassVar[tuple[str, ...]] = SYSTEMS
    CLAIMS: ClassVar[tuple[ClaimSpec, ...]] = CLAIMS
    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {},
        "sweep": {"conditions": ALL_CONDITIONS},
        "full": {
            "tasks": TASK_NAMES,
            "conditions": ALL_CONDITIONS,
            "n_seeds": 5,
            "steps": 300,
            "prompts_per_step": 4,
            "hidden_size": 512,
            "layers": 8,
            "sft_steps": 4000,
            "n_test": 500,
            "steer_layer": 4,
        },
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            isinstance(self.tasks, tuple | list) and len(self.tasks) > 0
            and all(t in TASK_NAMES for t in self.tasks),
            "tasks",
            f"a non-empty tuple of {TASK_NAMES}",
            self.tasks,
        )  # fmt: skip
        require(
            isinstance(self.conditions, tuple | list) and len(self.conditions) > 0
            and all(_condition(c) for c in self.conditions),
            "conditions",
            "a non-empty tuple of (name, beta_response >= 0, beta_prompt >= 0)",
            self.conditions,
        )  # fmt: skip
        names = [c[0] for c in self.conditions]
        require(NO_KL in names, "conditions", f"a tuple including {NO_KL!r}", names)
        require(
            PROMPT_KL not in names or self.response_kl_conditions(),
            "conditions",
            f"a tuple with a response-KL condition (beta_response > 0, beta_prompt = 0) beside "
            f"{PROMPT_KL!r} (its claim's control)",
            names,
        )
        for name in (
            "n_seeds",
            "steps",
            "prompts_per_step",
            "max_completion_length",
            "hidden_size",
            "layers",
            "sft_steps",
            "n_train",
            "n_test",
            "test_samples",
        ):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(
            is_count(self.num_generations, 2),
            "num_generations",
            "an integer >= 2 (GRPO compares the rollouts of a prompt)",
            self.num_generations,
        )
        require(
            self.hidden_size % 32 == 0,
            "hidden_size",
            "a multiple of 32 (one head per 32 channels)",
            self.hidden_size,
        )
        require(
            is_count(self.steer_layer, 0) and self.steer_layer < self.layers,
            "steer_layer",
            f"a block index in [0, {self.layers})",
            self.steer_layer,
        )
        require(
            isinstance(self.learning_rate, numbers.Real) and 0 < self.learning_rate < 1,
            "learning_rate",
            "a number in (0, 1)",
            self.learning_rate,
        )
        require(isinstance(self.cue_first, bool), "cue_first", "True or False", self.cue_first)
        require(isinstance(self.decoy, bool), "decoy", "True or False", self.decoy)
        require(
            self.exploit_on in ("cued", "any"), "exploit_on", "'cued' or 'any'", self.exploit_on
        )
        require(_numbers(self.steer_alphas), "steer_alphas", "numbers >= 0", self.steer_alphas)
        require(
            isinstance(self.caught, numbers.Real) and 0 <= self.caught <= 10,
            "caught",
            "a number in [0, 10]",
            self.caught,
        )
        for name in (
            "exploit_fraction",
            "warmup_ratio",
            "min_sft_success",
            "min_sft_margin",
            "min_hack_rate",
        ):
            value = getattr(self, name)
            require(
                isinstance(value, numbers.Real) and 0 <= value <= 1, name, "a number in [0, 1]",
                value,
            )  # fmt: skip

    def response_kl_conditions(self) -> list[tuple[str, float]]:
        """``(name, beta_response)`` of the conditions with a response KL and no prompt KL: the
        settings the matched control is picked from and claim 2 compares against."""
        return [(c[0], float(c[1])) for c in self.conditions if c[1] > 0 and c[2] == 0]

    def policy_config(self, task: str) -> PolicyConfig:
        from mixlab.llm_efficiency.prompt_kl.policy import PolicyConfig

        base = PolicyConfig()
        return PolicyConfig(
            task=task,
            lm=base.lm.resized(self.hidden_size, self.layers, self.sft_steps),
            exploit_fraction=float(self.exploit_fraction),
            cue_first=self.cue_first,
            decoy=self.decoy,
            exploit_on=self.exploit_on,
        )


METHOD = Method(
    name="prompt_kl",
    domain="llm-efficiency",
    paper=(
        "Prompt-token KL regularization against reward hacking in RL fine-tuning "
        "(paper not found; reconstructed from its abstract)"
    ),
    claim=(
        "A KL penalty on the prompt tokens only, against the start policy, keeps the hack rate "
        "of GRPO on tasks with a cued loophole low without losing true task success, where a "
        "response KL either still hacks or costs task success."
    ),
    config=Config,
    run="mixlab.llm_efficiency.prompt_kl.experiment:run",
    headline_plot="hack_rate_over_steps.png",
)
