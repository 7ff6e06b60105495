"""Train a diffusion backbone with a diffusers scheduler (ε or v, EMA, label dropout for
classifier-free guidance, the routing losses), resumably; sample with DDIM.

Every step draws its batch, timesteps, noise, label dropout and Gumbel noise from a generator
seeded by (seed, step), so a run killed and resumed from its last checkpoint takes exactly the
steps an uninterrupted run takes.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers import DDIMScheduler, DDPMScheduler

from mixlab.attention_arch.moh.model import MoHDiffusion
from mixlab.attention_arch.moh.pipeline import MoHPipeline
from mixlab.shared import Checkpointer, is_count, progress, require, warmup_cosine
from mixlab.shared.diffusion import ema_update

__all__ = ["TrainSpec", "sample", "train", "training_loss"]

PREDICTIONS = ("epsilon", "v_prediction", "sample")
"""what the network predicts: the noise, v (Salimans & Ho), or the clean image x0"""


@dataclass(frozen=True)
class TrainSpec:
    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    """AdamW peak learning rate (linear warm-up over 5 % of the steps, then cosine to 0)"""
    weight_decay: float = 0.0
    ema_decay: float = 0.999
    """EMA of the weights (warmed up as min(decay, (1 + step) / (10 + step))); sampled from"""
    prediction_type: str = "epsilon"
    beta_schedule: str = "squaredcos_cap_v2"
    num_train_timesteps: int = 1000
    class_dropout: float = 0.1
    """share of labels (or captions) replaced by the null one: classifier-free guidance"""
    balance_weight: float = 0.01
    """weight of Switch's load-balancing loss"""
    depth_weight: float = 0.05
    """λ_d: weight of the depth gate's compute penalty (mean open probability)"""
    grad_clip: float = 1.0
    checkpoint_every: int = 250
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "num_train_timesteps", "checkpoint_every"):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(self.prediction_type in PREDICTIONS, "prediction_type", f"one of {PREDICTIONS}",
                self.prediction_type)  # fmt: skip
        for name in ("lr", "grad_clip"):
            value = getattr(self, name)
            require(math.isfinite(value) and value > 0, name, "a number > 0", value)
        for name in ("weight_decay", "balance_weight", "depth_weight"):
            value = getattr(self, name)
            require(math.isfinite(value) and value >= 0, name, "a number >= 0", value)
        for name in ("ema_decay", "class_dropout"):
            value = getattr(self, name)
            require(0 <= value < 1, name, "a number in [0, 1)", value)

    def scheduler(self) -> DDPMScheduler:
        return DDPMScheduler(
            num_train_timesteps=self.num_train_timesteps,
            beta_schedule=self.beta_schedule,
            prediction_type=self.prediction_type,
            clip_sample=False,
        )


def _step_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def training_loss(
    model: MoHDiffusion,
    scheduler: DDPMScheduler,
    images: torch.Tensor,
    spec: TrainSpec,
    generator: torch.Generator,
    class_labels: torch.Tensor | None = None,
    captions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Diffusion loss (MSE on ε or v) + balance and depth terms on one batch."""
    batch = images.shape[0]
    t = torch.randint(0, scheduler.config.num_train_timesteps, (batch,), generator=generator)
    noise = torch.randn(images.shape, generator=generator)
    drop = torch.rand(batch, generator=generator) < spec.class_dropout
    device = next(model.parameters()).device
    images, noise, t = images.to(device), noise.to(device), t.to(device)
    if class_labels is not None:
        null = torch.full_like(class_labels, model.config.num_classes)
        class_labels = torch.where(drop, null, class_labels).to(device)
    if captions is not None:
        captions = torch.where(drop[:, None, None], torch.zeros_like(captions), captions)
        captions = captions.to(device)
    noisy = scheduler.add_noise(images, noise, t)
    if spec.prediction_type == "epsilon":
        target = noise
    elif spec.prediction_type == "v_prediction":
        target = scheduler.get_velocity(images, noise, t)
    else:
        target = images
    out = model(noisy, t, class_labels=class_labels, encoder_hidden_states=captions)
    mse = (out.sample - target).pow(2).mean()
    loss = mse
    logs = {"mse": float(mse.detach())}
    if out.balance_loss is not None:
        loss = loss + spec.balance_weight * out.balance_loss
        logs["balance"] = float(out.balance_loss.detach())
    if out.depth_cost is not None:
        loss = loss + spec.depth_weight * out.depth_cost
        logs["depth"] = float(out.depth_cost.detach())
    return loss, logs


def train(
    model: MoHDiffusion,
    images: torch.Tensor,
    spec: TrainSpec,
    *,
    class_labels: torch.Tensor | None = None,
    captions: torch.Tensor | None = None,
    out_dir: str | Path | None = None,
    resume: bool = False,
    on_checkpoint: Callable[[int, MoHDiffusion], dict[str, Any]] | None = None,
    eval_steps: tuple[int, ...] = (),
) -> tuple[MoHDiffusion, list[dict[str, Any]]]:
    """Train ``model`` on ``images`` ``[N, C, H, W]`` in [-1, 1]; return the EMA model (eval
    mode) and the history. ``out_dir``: checkpoints every ``checkpoint_every`` steps (and at
    ``eval_steps``), resumed from with ``resume``. ``on_checkpoint(step, ema)`` runs at each of
    ``eval_steps`` (e.g. FID_local over training); its dicts join the history."""
    require(images.dim() == 4 and images.shape[0] >= 1, "images", "a tensor [N, C, H, W]",
            tuple(images.shape))  # fmt: skip
    require(class_labels is None or model.config.num_classes is not None, "class_labels",
            "None for a model without num_classes", "labels")  # fmt: skip
    scheduler = spec.scheduler()
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    lr_schedule = warmup_cosine(optimizer, spec.steps)
    history: list[dict[str, Any]] = []
    start = 0
    checkpoints = None if out_dir is None else Checkpointer(out_dir, resume=resume, keep_last=1)
    if checkpoints is not None and (last := checkpoints.load_latest()) is not None:
        start, state = last
        require(state["spec"] == asdict(spec), "resume", "a checkpoint of the same TrainSpec",
                state["spec"])  # fmt: skip
        model.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        optimizer.load_state_dict(state["optimizer"])
        lr_schedule.load_state_dict(state["lr_schedule"])
        history = state["history"]
    model.train()
    with progress(spec.steps, "train", completed=start) as bar:
        for step in range(start, spec.steps):
            generator = _step_generator(spec.seed, step)
            torch.manual_seed(spec.seed * 1_000_003 + step)  # the router's Gumbel noise
            index = torch.randint(0, images.shape[0], (spec.batch_size,), generator=generator)
            loss, logs = training_loss(
                model,
                scheduler,
                images[index],
                spec,
                generator,
                None if class_labels is None else class_labels[index],
                None if captions is None else captions[index],
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
            optimizer.step()
            lr_schedule.step()
            ema_update(ema, model, spec.ema_decay, step)
            done = step + 1
            bar.advance(loss=logs["mse"])
            if done % 50 == 0 or done == spec.steps:
                history.append({"step": done, **logs})
            if done in eval_steps and on_checkpoint is not None:
                history.append({"step": done, **on_checkpoint(done, ema)})
            if checkpoints is not None and (
                done % spec.checkpoint_every == 0 or done in eval_steps
            ):
                checkpoints.save(done, {
                    "spec": asdict(spec), "model": model.state_dict(), "ema": ema.state_dict(),
                    "optimizer": optimizer.state_dict(), "lr_schedule": lr_schedule.state_dict(),
                    "history": history,
                })  # fmt: skip
    return ema.eval(), history


@torch.no_grad()
def sample(
    model: MoHDiffusion,
    n: int,
    *,
    steps: int = 50,
    seed: int = 0,
    prediction_type: str = "epsilon",
    beta_schedule: str = "squaredcos_cap_v2",
    class_labels: torch.Tensor | None = None,
    captions: torch.Tensor | None = None,
    guidance_scale: float = 1.0,
    batch_size: int = 250,
    precompute_routes: bool = True,
) -> torch.Tensor:
    """``n`` DDIM samples (η = 0) ``[n, C, H, W]`` in [-1, 1] through :class:`~.pipeline.MoHPipeline`
    in batches, deterministic given ``seed``; with ``class_labels`` (or ``captions``) ``[n]`` and
    ``guidance_scale`` > 1, classifier-free guidance."""
    for name, value in (("n", n), ("steps", steps), ("batch_size", batch_size)):
        require(is_count(value), name, "an integer >= 1", value)
    require(prediction_type in PREDICTIONS, "prediction_type", f"one of {PREDICTIONS}",
            prediction_type)  # fmt: skip
    scheduler = DDIMScheduler(
        num_train_timesteps=model.config.num_train_timesteps,
        beta_schedule=beta_schedule,
        prediction_type=prediction_type,
        clip_sample=True,
        set_alpha_to_one=True,
    )
    pipeline = MoHPipeline(transformer=model.eval(), scheduler=scheduler)
    pipeline.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(seed)
    out = []
    with progress(math.ceil(n / batch_size) * steps, "sample (DDIM steps)") as bar:

        def advance(*_: Any) -> None:
            bar.advance()

        for first in range(0, n, batch_size):
            part = slice(first, min(n, first + batch_size))
            images = pipeline(
                batch_size=part.stop - part.start,
                class_labels=None if class_labels is None else class_labels[part],
                encoder_hidden_states=None if captions is None else captions[part],
                num_inference_steps=steps,
                guidance_scale=guidance_scale,
                generator=generator,
                output_type="latent",
                precompute_routes=precompute_routes,
                callback_on_step_end=advance,
            ).images
            out.append(images.clamp(-1, 1).cpu())
    return torch.cat(out)
