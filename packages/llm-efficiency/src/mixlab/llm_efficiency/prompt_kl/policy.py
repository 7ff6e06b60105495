"""The SFT policy RL starts from (trained once, cached) and how a policy is scored on a task."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from mixlab.llm_efficiency.lm import LMConfig
from mixlab.llm_efficiency.prompt_kl.tasks import EXPLOIT_ON, Example, get_task, grade, sft_texts
from mixlab.llm_efficiency.reasoning import EOS, cached_text_lm, fit_text_lm
from mixlab.llm_efficiency.rl import grpo_options, sample_completions
from mixlab.shared import require

__all__ = ["PolicyConfig", "evaluate_policy", "grpo_config", "sample_completions", "sft_policy"]


@dataclass(frozen=True)
class PolicyConfig:
    """A tiny Llama (byte tokenizer of :mod:`..reasoning`) trained on ``n_demos``
    demonstrations of ``task``, the exploit shown on ``exploit_fraction`` of the cued prompts.

    The defaults (0.9 M parameters, 1,200 steps of 16 × 128 tokens) train in about 6 minutes on
    2 CPU cores; the exploit on a tenth of the cued demonstrations gives the policy a hack rate
    of about 10 % there, which GRPO without a KL raises to about 80 % within 60 steps."""

    task: str = "test_override"
    lm: LMConfig = field(
        default_factory=lambda: LMConfig(
            hidden_size=128, layers=4, heads=4, intermediate_size=384, seq_len=128,
            steps=1_200, batch_size=16, lr=3e-3,
        )
    )  # fmt: skip
    n_demos: int = 40_000
    exploit_fraction: float = 0.1
    min_digits: int = 4
    max_digits: int = 8
    cue_first: bool = False
    decoy: bool = False
    exploit_on: str = "cued"

    def __post_init__(self) -> None:
        get_task(self.task)
        require(isinstance(self.lm, LMConfig), "lm", "an LMConfig", self.lm)
        require(
            isinstance(self.n_demos, int) and self.n_demos >= 1, "n_demos", "an integer >= 1",
            self.n_demos,
        )  # fmt: skip
        require(
            isinstance(self.exploit_fraction, float) and 0.0 <= self.exploit_fraction <= 1.0,
            "exploit_fraction",
            "a number in [0, 1]",
            self.exploit_fraction,
        )
        require(
            self.exploit_on in EXPLOIT_ON, "exploit_on", f"one of {EXPLOIT_ON}", self.exploit_on
        )

    @property
    def prompt_format(self) -> dict[str, Any]:
        """The :func:`~.tasks.examples` options of this policy's prompts."""
        return {
            "min_digits": self.min_digits,
            "max_digits": self.max_digits,
            "cue_first": self.cue_first,
            "decoy": self.decoy,
        }


def sft_policy(config: PolicyConfig, device: torch.device | str = "cpu") -> tuple[Any, Any]:
    """``(model, tokenizer)``: the SFT policy of ``config`` from the mixlab cache (entry
    ``prompt-kl-sft``, keyed by the config and the source of the tasks' and this module's code),
    trained first when absent."""

    def train(folder: Any) -> None:
        texts = sft_texts(
            config.task,
            config.n_demos,
            config.lm.seed,
            exploit_fraction=config.exploit_fraction,
            exploit_on=config.exploit_on,
            **config.prompt_format,
        )
        fit_text_lm(
            config.lm,
            [t + EOS for t in texts],
            folder,
            marker={"tokenizer": "reasoning", "config": asdict(config)},
            what=f"training the SFT policy ({config.task})",
        )

    return cached_text_lm(
        "prompt-kl-sft",
        asdict(config),
        train,
        code=["mixlab.llm_efficiency.prompt_kl.tasks", __name__],
        device=device,
    )


def evaluate_policy(
    model: Any, tokenizer: Any, task: str, examples: list[Example], **kwargs: Any
) -> dict[str, float | None]:
    """Hack rate (on cued prompts), the exploit's rate on uncued ones (None when there are
    none), true success and proxy reward of sampled completions (``kwargs``:
    :func:`sample_completions`)."""
    task_ = get_task(task)
    completions = sample_completions(model, tokenizer, [e.prompt for e in examples], **kwargs)
    grades = [
        (e, grade(task_, c, e.answer, e.cued)) for e, cs in zip(examples, completions, strict=True)
        for c in cs
    ]  # fmt: skip
    cued = [g["is_hack"] for e, g in grades if e.cued]
    uncued = [float(task_.loophole(c)) for e, cs in zip(examples, completions, strict=True)
              if not e.cued for c in cs]  # fmt: skip
    return {
        "hack_rate": float(np.mean(cued)) if cued else None,
        "exploit_rate_uncued": float(np.mean(uncued)) if uncued else None,
        "true_success": float(np.mean([g["true_success"] for _, g in grades])),
        "proxy_reward": float(np.mean([g["proxy"] for _, g in grades])),
    }


def grpo_config(
    output_dir: str | Any,
    *,
    steps: int,
    prompts_per_step: int,
    num_generations: int,
    max_completion_length: int,
    learning_rate: float,
    warmup_ratio: float,
    beta_response: float,
    beta_prompt: float,
    seed: int,
    **options: Any,
) -> Any:
    """The :class:`PromptKLConfig` the experiment and ``mixlab-llm prompt_kl train`` both train
    with (:func:`mixlab.llm_efficiency.rl.grpo_options`). ``options``: any other field
    (``prompt_kl_direction``, ...)."""
    from mixlab.llm_efficiency.prompt_kl.trainer import PromptKLConfig

    defaults = grpo_options(
        output_dir,
        steps=steps,
        prompts_per_step=prompts_per_step,
        num_generations=num_generations,
        max_completion_length=max_completion_length,
        learning_rate=learning_rate,
        warmup_ratio=warmup_ratio,
        seed=seed,
    )
    return PromptKLConfig(**(defaults | options), beta=beta_response, prompt_kl_beta=beta_prompt)
