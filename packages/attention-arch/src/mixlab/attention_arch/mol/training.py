"""Training and scoring a :class:`~.llava.MoLLlava` on VQA: next-token loss on the answer tokens
only (LLaVA's instruction tuning), plus ``balance_weight`` x MoL's balance loss; exact match of the
greedy answer. Used by the toy's stage 1, every system of the experiment and the CLI.

Batches come from ``batch_of(indices) -> (vision_states, prompts)``, so the same loop trains on a
cache of frozen vision states (the experiment) or on images (a user's model).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mixlab.attention_arch.mol.data import EncodedPrompts
from mixlab.attention_arch.mol.llava import MoLLlava
from mixlab.shared import (
    Checkpointer,
    capture_rng_state,
    is_count,
    progress,
    require,
    restore_rng_state,
)
from mixlab.shared.optim import warmup_cosine

__all__ = ["TRAINABLE", "BatchFn", "TrainSpec", "answer_hits", "cached_batches", "train"]

BatchFn = Callable[[torch.Tensor], tuple[Sequence[torch.Tensor | None], EncodedPrompts]]
TRAINABLE = ("router", "projector", "all")
"""what trains besides the vision tower (always frozen): the mixer alone; the mixer and the
projector (LLaVA stage 1); the mixer, the projector and the language model (stage 2)"""


@dataclass(frozen=True)
class TrainSpec:
    steps: int = 600
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    balance_weight: float = 0.0
    trainable: str = "all"
    seed: int = 0
    release_steps: int = 0
    """steps over which MoL's bias on the default layer falls linearly to 0 (0: kept)"""
    checkpoint_every: int = 0
    """0: no checkpoints; else every this many steps (what ``resume`` picks up)"""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(self.lr > 0, "lr", "a number > 0", self.lr)
        require(self.trainable in TRAINABLE, "trainable", f"one of {TRAINABLE}", self.trainable)
        require(self.balance_weight >= 0, "balance_weight", "a number >= 0", self.balance_weight)


def trainable_parameters(model: MoLLlava, trainable: str) -> list[torch.nn.Parameter]:
    model.llava.requires_grad_(False)
    parts = [model.mol]
    if trainable in ("projector", "all"):
        parts.append(model.llava.model.multi_modal_projector)
    if trainable == "all":
        parts.append(model.llava.model.language_model)
        parts.append(model.llava.lm_head)
    for part in parts:
        part.requires_grad_(True)
    return [p for part in parts for p in part.parameters() if p.requires_grad]


def cached_batches(states: Sequence[torch.Tensor | None], prompts: EncodedPrompts,
                   dtype: torch.dtype = torch.float32) -> BatchFn:  # fmt: skip
    """Batches from cached vision states (``[n, tokens, d]`` per layer, None for a layer no
    mixer reads) and the encoded prompts of the same n examples."""

    def batch_of(index: torch.Tensor):
        picked = [None if s is None else s[index].to(dtype) for s in states]
        return picked, prompts.select(index)

    return batch_of


def train(
    model: MoLLlava,
    batch_of: BatchFn,
    n_examples: int,
    spec: TrainSpec,
    *,
    out_dir: str | Path | None = None,
    resume: bool = False,
    description: str = "train",
) -> list[dict[str, Any]]:
    """``spec.steps`` AdamW steps on batches drawn with ``spec.seed``; returns the loss history.
    With ``out_dir`` and ``spec.checkpoint_every`` it checkpoints the trained weights, the
    optimiser and the generators, and ``resume`` continues a killed run exactly. The steps show
    as :func:`mixlab.shared.progress` named ``description``."""
    params = trainable_parameters(model, spec.trainable)
    optimizer = torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)
    schedule = warmup_cosine(optimizer, spec.steps)
    generator = torch.Generator().manual_seed(spec.seed)
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    checkpoints = None
    start, history = 0, []
    if out_dir is not None and spec.checkpoint_every:
        checkpoints = Checkpointer(out_dir, resume=resume, keep_last=1)
        if (last := checkpoints.load_latest()) is not None:
            start, state = last
            with torch.no_grad():
                for name, value in state["weights"].items():
                    named[name].copy_(value)
            optimizer.load_state_dict(state["optimizer"])
            schedule.load_state_dict(state["schedule"])
            generator.set_state(state["generator"])
            restore_rng_state(state["rng"])
            history = state["history"]
    model.train()
    release = getattr(model.mol, "release", None)
    with progress(spec.steps, description, completed=start) as bar:
        for step in range(start, spec.steps):
            if release is not None and spec.release_steps:
                release(step / spec.release_steps)
            index = torch.randint(n_examples, (spec.batch_size,), generator=generator)
            states, prompts = batch_of(index)
            out = model(prompts.input_ids, prompts.attention_mask, vision_states=states,
                        labels=prompts.labels)  # fmt: skip
            loss = out.loss + spec.balance_weight * out.routing.balance_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            bar.advance(loss=float(out.loss.detach()))
            if step % 50 == 0 or step == spec.steps - 1:
                history.append({"step": step, "loss": float(out.loss.detach())})
            if (
                checkpoints is not None
                and (step + 1) % spec.checkpoint_every == 0
                and step + 1 < spec.steps
            ):
                checkpoints.save(step + 1, {
                    "weights": {n: p.detach().clone() for n, p in named.items()},
                    "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                    "generator": generator.get_state(), "rng": capture_rng_state(), "history": history,
                })  # fmt: skip
    if release is not None and spec.release_steps:
        release(spec.steps / spec.release_steps)
    model.eval()
    return history


@torch.no_grad()
def answer_hits(model: MoLLlava, batch_of: BatchFn, n_examples: int, *, batch_size: int = 256,
                zero_image: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Per example: whether the greedy first answer token is the answer's first token (exact
    match for one-token answers), and π (MoL's weights averaged over tokens) ``[n, |S|]``.
    ``zero_image``: the blind model (the vision states zeroed)."""
    model.eval()
    hits, weights = [], []
    for begin in range(0, n_examples, batch_size):
        states, prompts = batch_of(torch.arange(begin, min(begin + batch_size, n_examples)))
        if zero_image:
            states = [None if s is None else torch.zeros_like(s) for s in states]
        out = model(prompts.input_ids, prompts.attention_mask, vision_states=states,
                    labels=prompts.labels)  # fmt: skip
        rows = torch.arange(len(prompts.answer_start))
        predicted = out.logits[rows, prompts.answer_start - 1].argmax(-1)
        hits.append(predicted == prompts.input_ids[rows, prompts.answer_start])
        pi = out.routing.weights
        weights.append(pi.mean(1) if pi.dim() == 3 else pi)
    return torch.cat(hits), torch.cat(weights).float()
