"""The hybrid-mode SFT model RL starts from (trained once on the world, cached) and how a model
is scored in both modes."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from mixlab.llm_efficiency.lm import LMConfig
from mixlab.llm_efficiency.margo.world import (
    DIRECT_PREFIX,
    THINKING_PREFIX,
    Question,
    World,
    WorldConfig,
    final_answer,
    sft_texts,
    think_length,
    world_tokenizer,
)
from mixlab.llm_efficiency.reasoning import cached_text_lm, fit_text_lm
from mixlab.llm_efficiency.rl import sample_completions
from mixlab.shared import require

__all__ = ["PolicyConfig", "evaluate_modes", "sft_policy"]


@dataclass(frozen=True)
class PolicyConfig:
    """A tiny Llama (word tokenizer of the world) trained on the world's SFT corpus.

    The defaults (0.8 M parameters, 1,000 steps of 16 x 128 tokens) train in about 4 minutes on
    2 CPU cores."""

    world: WorldConfig = field(default_factory=WorldConfig)
    lm: LMConfig = field(
        default_factory=lambda: LMConfig(
            hidden_size=128, layers=4, heads=4, intermediate_size=384, seq_len=128,
            steps=1_500, batch_size=16, lr=3e-3,
        )
    )  # fmt: skip

    def __post_init__(self) -> None:
        require(isinstance(self.world, WorldConfig), "world", "a WorldConfig", self.world)
        require(isinstance(self.lm, LMConfig), "lm", "an LMConfig", self.lm)


def sft_policy(config: PolicyConfig, device: torch.device | str = "cpu") -> tuple[Any, Any, World]:
    """``(model, tokenizer, world)``: the SFT model of ``config`` from the mixlab cache (entry
    ``margo-sft``, keyed by the config and the source of the world's and this module's code),
    trained first when absent."""
    world = World.build(config.world)
    tokenizer = world_tokenizer(world)

    def train(folder: Any) -> None:
        fit_text_lm(
            config.lm,
            sft_texts(world),
            folder,
            marker={"tokenizer": "margo-world", "config": json.loads(json.dumps(asdict(config)))},
            what="training the hybrid-mode SFT model",
            tokenizer=tokenizer,
        )

    model, tokenizer = cached_text_lm(
        "margo-sft",
        asdict(config),
        train,
        code=["mixlab.llm_efficiency.margo.world", __name__],
        device=device,
        tokenizer=tokenizer,
    )
    return model, tokenizer, world


def evaluate_modes(
    model: Any,
    tokenizer: Any,
    questions: list[Question],
    *,
    samples: int = 4,
    seed: int = 0,
    max_new_tokens: int = 16,
    thinking_prefix: str = THINKING_PREFIX,
    direct_prefix: str = DIRECT_PREFIX,
) -> dict[str, float | None]:
    """Both modes sampled ``samples`` times per question (temperature 1, the same seed): accuracy
    of each, the overturn rate (the i-th direct sample right and the i-th thinking sample wrong,
    over the direct samples that are right), the share of wrong thinking answers that are the
    colleague's city (1-hop only, else None) and the mean think length in tokens."""
    require(len(questions) > 0, "questions", "a non-empty list", questions)
    answers = {}
    for mode, prefix in (("thinking", thinking_prefix), ("direct", direct_prefix)):
        texts = sample_completions(
            model,
            tokenizer,
            [q.prompt + prefix for q in questions],
            samples=samples,
            seed=seed,
            max_new_tokens=max_new_tokens,
        )
        answers[mode] = [[final_answer(c, mode == "thinking") for c in cs] for cs in texts]
        if mode == "thinking":
            lengths = [think_length(c) for cs in texts for c in cs]
    right = {
        mode: np.array(
            [[a == q.answer for a in row] for q, row in zip(questions, rows, strict=True)]
        )
        for mode, rows in answers.items()
    }
    direct_right = right["direct"]
    overturned = direct_right & ~right["thinking"]
    wrong = [(q, a) for q, row in zip(questions, answers["thinking"], strict=True) for a in row
             if a != q.answer]  # fmt: skip
    associates = [a == q.associate for q, a in wrong if q.associate]
    return {
        "thinking_accuracy": float(right["thinking"].mean()),
        "direct_accuracy": float(direct_right.mean()),
        "overturn_rate": float(overturned.sum() / direct_right.sum())
        if direct_right.any()
        else None,
        "associate_share": float(np.mean(associates)) if associates else None,
        "wrong_thinking": len(wrong),
        "think_length": float(np.mean(lengths)),
    }
