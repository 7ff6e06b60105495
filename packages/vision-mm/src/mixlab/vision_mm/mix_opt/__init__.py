"""Mix-Opt: memory-efficient diffusion personalization mixing low-resolution backprop (BP-low)
and full-resolution zeroth-order steps (ZO-high), chosen per step by a timestep- and
progress-aware probability.

- :class:`MixOptTrainer` / :class:`MixOptConfig`: personalize any diffusers
  ``UNet2DConditionModel`` (or ``UNet2DModel`` with class labels) on accelerate.
- Schedules p_ZO(t, s): :class:`TimestepAware` (Mix-Opt), :class:`Threshold`, :class:`Constant`
  (random mixing; 0 = BP-low, 1 = ZO-high), :class:`BPHigh`; :func:`make_schedule` by name.
- MeZO pieces: :func:`perturb_`, :func:`projected_gradient`, :func:`zo_step_`.
- LoRA in the diffusers format: :func:`add_lora`, :func:`save_lora`, :func:`load_lora` (with a
  SHA-256 sidecar; :func:`lora_file` checks an adapter folder without torch, and
  :func:`check_checkpoint` a training checkpoint before resuming).
- The experiment's model, data and metrics: :func:`pretrained_model`, :func:`build_unet`,
  :func:`sample`, :func:`subject_images`, :func:`captioned_shapes`, :func:`evaluation_nets`,
  :func:`edge_iou`, :func:`profile_modes`.

    from diffusers import DDPMScheduler
    from mixlab.vision_mm.mix_opt import MixOptConfig, MixOptTrainer, add_lora, save_lora

    add_lora(unet, rank=4)                       # freezes the UNet, LoRA on to_q/k/v/out
    # latents: the VAE's encoding of the photos at 512² (64² latents); low_latents: of the same
    # photos downscaled to 256² (32² latents), what BP-low trains on
    trainer = MixOptTrainer(unet, DDPMScheduler.from_pretrained("sd15", subfolder="scheduler"),
                            latents, text_states, MixOptConfig(resolution=64, low_resolution=32),
                            low_res_images=low_latents)
    trainer.train(checkpoint_dir="runs/sks")
    save_lora(unet, "runs/sks/lora")
"""

from typing import TYPE_CHECKING

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "BPHigh": "schedule",
    "CaptionEncoder": "model",
    "Constant": "schedule",
    "MixOptConfig": "settings",
    "MixOptTrainer": "trainer",
    "ModelSpec": "model",
    "Schedule": "schedule",
    "Threshold": "schedule",
    "TimestepAware": "schedule",
    "add_lora": "lora",
    "build_unet": "model",
    "captioned_shapes": "data",
    "check_checkpoint": "formats",
    "diffusion_loss": "trainer",
    "edge_iou": "metrics",
    "evaluation_nets": "metrics",
    "feature_center": "metrics",
    "feature_cosine": "metrics",
    "load_lora": "lora",
    "lora_file": "formats",
    "make_schedule": "schedule",
    "nearest_ssim": "metrics",
    "perturb_": "zo",
    "planned_modes": "trainer",
    "pretrained_model": "model",
    "profile_modes": "profile",
    "projected_gradient": "zo",
    "prompt_accuracy": "metrics",
    "sample": "model",
    "save_grid": "model",
    "save_lora": "lora",
    "subject_images": "data",
    "zo_step_": "zo",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = [
    "BPHigh",
    "CaptionEncoder",
    "Constant",
    "MixOptConfig",
    "MixOptTrainer",
    "ModelSpec",
    "Schedule",
    "Threshold",
    "TimestepAware",
    "add_lora",
    "build_unet",
    "captioned_shapes",
    "check_checkpoint",
    "diffusion_loss",
    "edge_iou",
    "evaluation_nets",
    "feature_center",
    "feature_cosine",
    "load_lora",
    "lora_file",
    "make_schedule",
    "nearest_ssim",
    "perturb_",
    "planned_modes",
    "pretrained_model",
    "profile_modes",
    "projected_gradient",
    "prompt_accuracy",
    "sample",
    "save_grid",
    "save_lora",
    "subject_images",
    "zo_step_",
]

if TYPE_CHECKING:
    from mixlab.vision_mm.mix_opt.data import captioned_shapes, subject_images
    from mixlab.vision_mm.mix_opt.formats import check_checkpoint, lora_file
    from mixlab.vision_mm.mix_opt.lora import add_lora, load_lora, save_lora
    from mixlab.vision_mm.mix_opt.metrics import (
        edge_iou,
        evaluation_nets,
        feature_center,
        feature_cosine,
        nearest_ssim,
        prompt_accuracy,
    )
    from mixlab.vision_mm.mix_opt.model import (
        CaptionEncoder,
        ModelSpec,
        build_unet,
        pretrained_model,
        sample,
        save_grid,
    )
    from mixlab.vision_mm.mix_opt.profile import profile_modes
    from mixlab.vision_mm.mix_opt.schedule import (
        BPHigh,
        Constant,
        Schedule,
        Threshold,
        TimestepAware,
        make_schedule,
    )
    from mixlab.vision_mm.mix_opt.settings import MixOptConfig
    from mixlab.vision_mm.mix_opt.trainer import MixOptTrainer, diffusion_loss, planned_modes
    from mixlab.vision_mm.mix_opt.zo import perturb_, projected_gradient, zo_step_
