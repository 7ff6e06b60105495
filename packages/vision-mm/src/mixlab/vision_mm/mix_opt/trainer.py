"""MixOptTrainer: personalize a diffusers UNet's LoRA adapter by mixing BP-low and ZO-high steps.

Each step draws one timestep t for the batch and, with the schedule's probability p_ZO(t, s),
takes either

- a **ZO-high** step: the ε-prediction loss on full-resolution images, evaluated twice under
  ``torch.inference_mode()`` at θ ± εz with the same images, noise and t (common random
  numbers), and the MeZO update (:mod:`mixlab.vision_mm.mix_opt.zo`); or
- a **BP step** on images box-downsampled to ``low_resolution`` (BP-low; full resolution for
  the :class:`~mixlab.vision_mm.mix_opt.schedule.BPHigh` schedule): the same loss,
  backpropagated with accelerate and applied by AdamW (the DreamBooth-LoRA recipe).

It works on any ``UNet2DConditionModel`` (``conditioning``: encoder hidden states, N × L × D) or
``UNet2DModel`` with class embeddings (``conditioning``: N class labels) whose trainable
parameters are the ones to tune (:func:`~mixlab.vision_mm.mix_opt.lora.add_lora`)::

    unet.requires_grad_(False); add_lora(unet, rank=4)
    trainer = MixOptTrainer(unet, DDPMScheduler(), images, text_states, MixOptConfig(steps=400))
    trainer.train(checkpoint_dir="runs/sks")     # resumes from there when killed
    save_lora(unet, "runs/sks/lora")
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator

from mixlab.shared import Checkpointer, is_count, progress, require
from mixlab.vision_mm.mix_opt.lora import lora_parameters
from mixlab.vision_mm.mix_opt.schedule import Schedule, TimestepAware
from mixlab.vision_mm.mix_opt.zo import zo_step_

MODES = ("bp_low", "bp_high", "zo_high")


@dataclass
class MixOptConfig:
    """Settings of one personalization run."""

    resolution: int = 32
    """full (ZO-high, BP-high) resolution; images are box-resized to it if needed"""
    low_resolution: int = 16
    """BP-low resolution"""
    steps: int = 400
    batch_size: int = 4
    schedule: Schedule = field(default_factory=TimestepAware)
    bp_lr: float = 1e-3
    """AdamW learning rate of BP steps"""
    bp_weight_decay: float = 1e-2
    zo_lr: float = 1e-3
    """learning rate η of ZO steps (θ ← θ − η·ĝ·z)"""
    zo_eps: float = 1e-2
    """perturbation scale ε"""
    zo_directions: int = 1
    """directions z averaged per ZO step (q)"""
    zo_weight_decay: float = 0.0
    seed: int = 0
    checkpoint_every: int = 100

    def __post_init__(self) -> None:
        for name in ("resolution", "low_resolution", "steps", "batch_size", "zo_directions"):
            value = getattr(self, name)
            require(is_count(value), name, "an integer >= 1", value)
        require(
            is_count(self.checkpoint_every),
            "checkpoint_every",
            "an integer >= 1",
            self.checkpoint_every,
        )
        require(
            self.low_resolution <= self.resolution,
            "low_resolution",
            f"<= resolution {self.resolution}",
            self.low_resolution,
        )
        require(isinstance(self.schedule, Schedule), "schedule", "a Schedule", self.schedule)
        for name in ("bp_lr", "zo_lr", "zo_eps"):
            require(getattr(self, name) >= 0, name, ">= 0", getattr(self, name))
        require(self.zo_eps > 0, "zo_eps", "> 0", self.zo_eps)


def downsampling_factor(unet: torch.nn.Module) -> int:
    """How much the UNet shrinks its input: 2 per down block that downsamples."""
    blocks = getattr(unet, "down_blocks", None)
    if blocks is None:
        raise ValueError(f"unet must be a diffusers UNet with down_blocks, got {type(unet)}")
    return 2 ** sum(1 for block in blocks if getattr(block, "downsamplers", None))


def denoise(
    unet: torch.nn.Module, noisy: torch.Tensor, t: torch.Tensor, conditioning: torch.Tensor
):
    """The UNet's prediction, conditioned by text states (3-D) or class labels (1-D)."""
    if conditioning.dim() == 1:
        return unet(noisy, t, class_labels=conditioning).sample
    return unet(noisy, t, encoder_hidden_states=conditioning).sample


def diffusion_loss(unet, scheduler, images, noise, t, conditioning) -> torch.Tensor:
    """ε- (or v-) prediction MSE at timesteps ``t`` (the scheduler's ``prediction_type``)."""
    noisy = scheduler.add_noise(images, noise, t)
    kind = scheduler.config.prediction_type
    if kind == "v_prediction":
        target = scheduler.get_velocity(images, noise, t)
    elif kind == "sample":
        target = images
    elif kind == "epsilon":
        target = noise
    else:
        raise ValueError(f"prediction_type must be epsilon, v_prediction or sample, got {kind!r}")
    return F.mse_loss(denoise(unet, noisy, t, conditioning).float(), target.float())


class MixOptTrainer:
    """Mix-Opt personalization of ``unet``'s trainable parameters on ``images`` (N, C, H, W
    in [-1, 1]) with ``conditioning`` (one entry per image)."""

    def __init__(
        self,
        unet: torch.nn.Module,
        noise_scheduler,
        images: torch.Tensor,
        conditioning: torch.Tensor,
        config: MixOptConfig | None = None,
        accelerator: Accelerator | None = None,
    ) -> None:
        self.config = config = config or MixOptConfig()
        self.params = lora_parameters(unet)
        if not self.params:
            raise ValueError(
                "unet has no trainable parameters: add a LoRA adapter (add_lora(unet)) or "
                "mark the parameters to tune with requires_grad"
            )
        factor = downsampling_factor(unet)
        for name in ("resolution", "low_resolution"):
            value = getattr(config, name)
            require(
                value % factor == 0,
                name,
                f"a multiple of the UNet's downsampling factor {factor}",
                value,
            )
        if images.dim() != 4 or len(images) != len(conditioning):
            raise ValueError(
                f"images must be (N, C, H, W) with one conditioning entry each, got images "
                f"{tuple(images.shape)} and conditioning {tuple(conditioning.shape)}"
            )
        self.accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.unet = unet
        self.scheduler = noise_scheduler
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.bp_lr, weight_decay=config.bp_weight_decay
        )
        self.unet, self.optimizer = self.accelerator.prepare(unet, self.optimizer)
        device = self.accelerator.device
        self.images = {
            "full": _resize(images, config.resolution).to(device),
            "low": _resize(images, config.low_resolution).to(device),
        }
        self.conditioning = conditioning.to(device)
        self.step_count = 0
        self.history: list[dict[str, Any]] = []

    def mode_at(self, timestep: int, step: int, draw: float) -> tuple[str, float]:
        """The mode at ``timestep`` and ``step`` for a uniform ``draw`` in [0, 1), and p_ZO."""
        schedule, total = self.config.schedule, self.scheduler.config.num_train_timesteps
        p = schedule.p_zo(timestep / total, step / self.config.steps)
        if draw < p:
            return "zo_high", p
        return ("bp_high" if schedule.bp_resolution == "full" else "bp_low"), p

    def step(self) -> dict[str, Any]:
        """One training step; returns ``{"step", "mode", "timestep", "p_zo", "loss"}``."""
        config, device = self.config, self.accelerator.device
        # Each step draws from its own seed, in a fixed order (timestep, mode draw, batch, then
        # noise), so every schedule sees the same timesteps, draws and batches at each step:
        # runs that differ only in the schedule are paired step by step.
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + self.step_count)
        timestep = int(
            torch.randint(self.scheduler.config.num_train_timesteps, (), generator=generator)
        )
        draw = torch.rand((), generator=generator).item()
        mode, p = self.mode_at(timestep, self.step_count, draw)
        index = torch.randint(len(self.conditioning), (config.batch_size,), generator=generator)
        index = index.to(device)
        images = self.images["low" if mode == "bp_low" else "full"][index]
        noise = torch.randn(images.shape, generator=generator).to(device, images.dtype)
        t = torch.full((config.batch_size,), timestep, device=device, dtype=torch.long)
        conditioning = self.conditioning[index]
        if mode == "zo_high":
            self.unet.eval()  # no dropout: both forwards must see the same function (CRN)

            def loss() -> float:
                # Common random numbers: both perturbed forwards see these images, noise and t.
                with torch.inference_mode():
                    value = diffusion_loss(
                        self.unet, self.scheduler, images, noise, t, conditioning
                    )
                return value.item()

            seed = (config.seed * 1_000_003 + self.step_count) * 101
            gradients, value = zo_step_(
                self.params,
                loss,
                [seed + d for d in range(config.zo_directions)],
                eps=config.zo_eps,
                lr=config.zo_lr,
                weight_decay=config.zo_weight_decay,
            )
            record = {"projected_gradient": sum(gradients) / len(gradients)}
        else:
            self.unet.train()
            value_t = diffusion_loss(self.unet, self.scheduler, images, noise, t, conditioning)
            self.optimizer.zero_grad(set_to_none=True)
            self.accelerator.backward(value_t)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            value, record = value_t.item(), {}
        self.step_count += 1
        entry = {"step": self.step_count, "mode": mode, "timestep": timestep, "p_zo": p}
        entry |= {"loss": value, **record}
        self.history.append(entry)
        return entry

    def settings(self) -> dict[str, Any]:
        """The config as a checkpoint records it (the schedule by its repr)."""
        settings = {**asdict(self.config), "schedule": repr(self.config.schedule)}
        settings.pop("checkpoint_every")
        return settings

    def state(self) -> dict[str, Any]:
        return {
            "settings": json.dumps(self.settings(), sort_keys=True),
            "params": [p.detach().clone() for p in self.params],
            "optimizer": self.optimizer.state_dict(),
            "step": self.step_count,
            "history": self.history,
        }

    def load(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; one written under other settings is refused."""
        saved, mine = json.loads(state["settings"]), self.settings()
        changed = sorted(k for k in mine if saved.get(k) != mine[k])
        if changed:
            raise ValueError(f"the checkpoint was written with other values of {changed}")
        with torch.no_grad():
            for p, saved in zip(self.params, state["params"], strict=True):
                p.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
        self.step_count, self.history = state["step"], list(state["history"])

    def train(
        self, checkpoint_dir: str | os.PathLike[str] | None = None, *, resume: bool = True
    ) -> list[dict[str, Any]]:
        """Run the remaining steps; with ``checkpoint_dir``, save every ``checkpoint_every``
        steps and (``resume``) continue from the last save there. Returns the step history."""
        checkpoints = None
        if checkpoint_dir is not None:
            checkpoints = Checkpointer(Path(checkpoint_dir), resume=resume, keep_last=1)
            if (last := checkpoints.load_latest()) is not None:
                self.load(last[1])
        with progress(self.config.steps, "mix-opt steps", completed=self.step_count) as bar:
            while self.step_count < self.config.steps:
                entry = self.step()
                bar.advance(loss=entry["loss"])
                if checkpoints and self.step_count % self.config.checkpoint_every == 0:
                    checkpoints.save(self.step_count, self.state())
        return self.history


def _resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """Box-filter (area) resize to size × size, as a dataloader's downsampling would."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    if size > min(images.shape[-2:]):
        resized = F.interpolate(images.float(), size=(size, size), mode="bilinear")
    else:
        resized = F.interpolate(images.float(), size=(size, size), mode="area")
    return resized.to(images.dtype)
