"""MixOptTrainer: personalize a diffusers UNet's LoRA adapter by mixing BP-low and ZO-high steps.

Each step takes, with probability E_t[p_ZO(t, s)] (t uniform; s = step / steps), either

- a **ZO-high** step: the diffusion loss on full-resolution images, evaluated twice under
  ``torch.inference_mode()`` at θ ± εz with the same images, noise and timesteps (common random
  numbers), and the MeZO update (:mod:`mixlab.vision_mm.mix_opt.zo`); or
- a **BP step** on low-resolution images (BP-low; full resolution for the
  :class:`~mixlab.vision_mm.mix_opt.schedule.BPHigh` schedule): the same loss, backpropagated
  with accelerate and applied by AdamW (the DreamBooth-LoRA recipe). The low-resolution images
  are ``low_res_images`` when given (for a latent model: the VAE latents of the downscaled
  photos, which box-resizing full-resolution latents is not), else ``images`` box-downsampled.

Every example of the batch has its own timestep, as DreamBooth samples them, drawn from the
timesteps given the step's mode: p(t | ZO) ∝ p_ZO(t, s) and p(t | BP) ∝ 1 − p_ZO(t, s). Each
example's (t, mode) then has exactly the joint law of the one-timestep rule "draw t, take ZO with
probability p_ZO(t, s)" that the schedule describes, while the step stays one mode, one update.

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
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator

from mixlab.shared import Checkpointer, is_count, progress, require
from mixlab.shared.files import checkpoint_errors
from mixlab.vision_mm.mix_opt.formats import CHECKPOINT_WHAT, check_settings
from mixlab.vision_mm.mix_opt.settings import MixOptConfig, recorded_settings
from mixlab.vision_mm.mix_opt.zo import zo_step_

MODES = ("bp_low", "bp_high", "zo_high")
__all__ = [
    "MODES",
    "MixOptConfig",
    "MixOptTrainer",
    "diffusion_loss",
    "downsampling_factor",
    "planned_modes",
]


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
    in [-1, 1], or latents) with ``conditioning`` (one entry per image); ``low_res_images``
    (N, C, low_resolution, low_resolution) are what BP-low trains on, when given."""

    def __init__(
        self,
        unet: torch.nn.Module,
        noise_scheduler,
        images: torch.Tensor,
        conditioning: torch.Tensor,
        config: MixOptConfig | None = None,
        accelerator: Accelerator | None = None,
        *,
        low_res_images: torch.Tensor | None = None,
    ) -> None:
        self.config = config = config or MixOptConfig()
        self.params = [p for p in unet.parameters() if p.requires_grad]  # the LoRA A and B
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
        low = config.low_resolution
        if low_res_images is not None and (
            low_res_images.dim() != 4
            or low_res_images.shape[0] != len(images)
            or low_res_images.shape[1] != images.shape[1]
            or tuple(low_res_images.shape[-2:]) != (low, low)
        ):
            raise ValueError(
                f"low_res_images must be ({len(images)}, {images.shape[1]}, {low}, {low}): one "
                f"per image at low_resolution, got {tuple(low_res_images.shape)}"
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
            "full": resize(images, config.resolution).to(device),
            "low": (resize(images, low) if low_res_images is None else low_res_images).to(device),
        }
        self.conditioning = conditioning.to(device)
        self.step_count = 0
        self.history: list[dict[str, Any]] = []

    def p_zo(self, step: int) -> torch.Tensor:
        """p_ZO(t / T, step / steps) at every timestep t = 0 … T − 1 (float64)."""
        return p_zo_table(self.config, step, self.scheduler.config.num_train_timesteps)

    def mode_at(
        self, step: int, draw: float, uniforms: torch.Tensor
    ) -> tuple[str, float, torch.Tensor]:
        """(mode, P(ZO-high), timesteps) at ``step``: ZO-high when the uniform ``draw`` is below
        E_t[p_ZO(t, s)], then one timestep per entry of ``uniforms`` (uniform in [0, 1)) by the
        inverse CDF of p(t | mode)."""
        p_zo = self.p_zo(step)
        p = float(p_zo.mean())
        mode = _mode(draw, p, self.config)
        weights = p_zo if mode == "zo_high" else 1 - p_zo
        cdf = weights.cumsum(0) / weights.sum()
        timesteps = torch.searchsorted(cdf, uniforms.double(), right=True)
        return mode, p, timesteps.clamp(max=len(cdf) - 1)

    def step(self) -> dict[str, Any]:
        """One training step; returns ``{"step", "mode", "timesteps", "p_zo", "loss"}``."""
        config, device = self.config, self.accelerator.device
        # Each step draws from its own seed, in a fixed order (mode draw, timestep uniforms,
        # batch, then noise), so every schedule sees the same draws and batches at each step:
        # runs that differ only in the schedule are paired step by step (and schedules whose
        # p(t | mode) is uniform, the constant ones, see the same timesteps too).
        generator = step_generator(config, self.step_count)
        draw = torch.rand((), generator=generator).item()
        uniforms = torch.rand(config.batch_size, generator=generator)
        mode, p, timesteps = self.mode_at(self.step_count, draw, uniforms)
        index = torch.randint(len(self.conditioning), (config.batch_size,), generator=generator)
        index = index.to(device)
        images = self.images["low" if mode == "bp_low" else "full"][index]
        noise = torch.randn(images.shape, generator=generator).to(device, images.dtype)
        t = timesteps.to(device)
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
        entry = {"step": self.step_count, "mode": mode, "timesteps": timesteps.tolist(), "p_zo": p}
        entry |= {"loss": value, **record}
        self.history.append(entry)
        return entry

    def settings(self) -> dict[str, Any]:
        """The config as a checkpoint records it (the schedule by its repr)."""
        return recorded_settings(self.config)

    def state(self) -> dict[str, Any]:
        return {
            "settings": json.dumps(self.settings(), sort_keys=True),
            "params": [p.detach().clone() for p in self.params],
            "optimizer": self.optimizer.state_dict(),
            "step": self.step_count,
            "history": self.history,
        }

    def load(self, state: dict[str, Any], where: str | os.PathLike[str] = "checkpoint") -> None:
        """Continue from ``state`` (read from ``where``); one written under other settings is
        refused with a ValueError, a damaged or foreign one with a :class:`CheckpointError`."""
        what = CHECKPOINT_WHAT
        with checkpoint_errors(where, what):
            saved = json.loads(state["settings"])
            params, history, step = state["params"], list(state["history"]), state["step"]
            if not (is_count(step, 0) and step <= self.config.steps and len(history) == step):
                raise ValueError(f"step {step!r} does not match its history of {len(history)}")
            if len(params) != len(self.params) or any(
                not isinstance(s, torch.Tensor) or s.shape != p.shape
                for s, p in zip(params, self.params, strict=False)
            ):
                raise ValueError("its adapter tensors do not fit this model's (another rank?)")
        check_settings(saved, recorded_settings(self.config), where)
        with checkpoint_errors(where, what):
            with torch.no_grad():
                for p, value in zip(self.params, params, strict=True):
                    p.copy_(value)
            self.optimizer.load_state_dict(state["optimizer"])
        self.step_count, self.history = step, history

    def train(
        self, checkpoint_dir: str | os.PathLike[str] | None = None, *, resume: bool = True
    ) -> list[dict[str, Any]]:
        """Run the remaining steps; with ``checkpoint_dir``, save every ``checkpoint_every``
        steps and (``resume``) continue from the last save there. Returns the step history."""
        checkpoints = None
        if checkpoint_dir is not None:
            checkpoints = Checkpointer(Path(checkpoint_dir), resume=resume, keep_last=1)
            if (last := checkpoints.load_latest()) is not None:
                self.load(last[1], checkpoints.path(last[0]).with_suffix(".json"))
        with progress(self.config.steps, "mix-opt steps", completed=self.step_count) as bar:
            while self.step_count < self.config.steps:
                entry = self.step()
                bar.advance(loss=entry["loss"])
                if checkpoints and self.step_count % self.config.checkpoint_every == 0:
                    checkpoints.save(self.step_count, self.state())
        return self.history


def p_zo_table(config: MixOptConfig, step: int, train_timesteps: int) -> torch.Tensor:
    """p_ZO(t / T, step / steps) of ``config.schedule`` at every timestep t = 0 … T − 1
    (float64)."""
    progress = step / config.steps
    values = [config.schedule.p_zo(t / train_timesteps, progress) for t in range(train_timesteps)]
    # Clamped: a user's Schedule may stray outside [0, 1], and 1 − p_ZO weights BP's timesteps.
    return torch.tensor(values, dtype=torch.float64).clamp(0, 1)


def step_generator(config: MixOptConfig, step: int) -> torch.Generator:
    """The generator of step ``step``'s draws (mode, timesteps, batch, noise, in that order):
    seeded by the run's seed and the step alone."""
    return torch.Generator().manual_seed(config.seed * 1_000_003 + step)


def planned_modes(config: MixOptConfig, train_timesteps: int = 1000) -> list[str]:
    """The mode of every step of a run of ``config``, without training: a step's mode depends
    only on its seeded draw and the schedule (:meth:`MixOptTrainer.mode_at`). The experiment's
    BP-low control takes as many BP steps as Mix-Opt's run does."""
    modes = []
    for step in range(config.steps):
        draw = torch.rand((), generator=step_generator(config, step)).item()
        modes.append(_mode(draw, float(p_zo_table(config, step, train_timesteps).mean()), config))
    return modes


def _mode(draw: float, p: float, config: MixOptConfig) -> str:
    """ZO-high when the step's uniform ``draw`` is below its P(ZO-high) ``p``, else the
    schedule's BP mode."""
    if draw < p:
        return "zo_high"
    return "bp_high" if config.schedule.bp_resolution == "full" else "bp_low"


def resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """Box-filter (area) resize to size × size, as a dataloader's downsampling would."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    if size > min(images.shape[-2:]):
        resized = F.interpolate(images.float(), size=(size, size), mode="bilinear")
    else:
        resized = F.interpolate(images.float(), size=(size, size), mode="area")
    return resized.to(images.dtype)
