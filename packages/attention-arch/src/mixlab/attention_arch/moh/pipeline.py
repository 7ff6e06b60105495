"""``MoHPipeline``: sampling from a :class:`~.model.MoHDiffusion` the diffusers way.

``MoHPipeline(transformer=model, scheduler=any diffusers scheduler, vae=None)`` saves and loads
with ``save_pretrained``/``from_pretrained`` like any ``DiffusionPipeline``; ``__call__`` runs the
scheduler's loop with the routes of every step precomputed (they depend on t only), classifier-free
guidance on the model's prediction, and, with a ``vae`` (an ``AutoencoderKL`` of the user's, from
a local folder), decodes the latents the backbone was trained on.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from diffusers import DiffusionPipeline, ImagePipelineOutput

from mixlab.shared import is_count, require

__all__ = ["OUTPUT_TYPES", "MoHPipeline"]

OUTPUT_TYPES = ("np", "pt", "latent")
"""images in [0, 1] as an NHWC array or an NCHW tensor (decoded by the vae when there is one);
or the samples as drawn (pixels in about [-1, 1], or the latents)"""


class MoHPipeline(DiffusionPipeline):
    model_cpu_offload_seq = "transformer->vae"
    _optional_components: ClassVar[list[str]] = ["vae"]

    def __init__(self, transformer, scheduler, vae=None) -> None:
        super().__init__()
        self.register_modules(transformer=transformer, scheduler=scheduler, vae=vae)

    @torch.no_grad()
    def __call__(
        self,
        batch_size: int = 1,
        class_labels: torch.Tensor | list[int] | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        num_inference_steps: int = 50,
        guidance_scale: float = 1.0,
        generator: torch.Generator | None = None,
        output_type: str = "np",
        precompute_routes: bool = True,
        return_dict: bool = True,
        callback_on_step_end: Callable[..., dict[str, Any] | None] | None = None,
    ) -> ImagePipelineOutput | tuple:
        """``batch_size`` samples (one per label or caption when those are given). Classifier-free
        guidance: prediction = p_∅ + s·(p_y − p_∅) with the null class / a zero caption.
        ``callback_on_step_end(pipeline, i, t, {"latents": x})`` runs after each step, as in
        diffusers' pipelines; ``latents`` in the dict it returns replace the current ones."""
        model, config = self.transformer, self.transformer.config
        if class_labels is not None:
            class_labels = torch.as_tensor(class_labels, device=self.device).flatten()
            batch_size = len(class_labels)
        if encoder_hidden_states is not None:
            batch_size = len(encoder_hidden_states)
        require(is_count(batch_size), "batch_size", "an integer >= 1", batch_size)
        require(is_count(num_inference_steps), "num_inference_steps", "an integer >= 1",
                num_inference_steps)  # fmt: skip
        require(guidance_scale >= 1, "guidance_scale", "a number >= 1", guidance_scale)
        require(output_type in OUTPUT_TYPES, "output_type", f"one of {OUTPUT_TYPES}", output_type)
        shape = (batch_size, config.in_channels, config.sample_size, config.sample_size)
        x = torch.randn(shape, generator=generator).to(self.device, model.dtype)
        x = x * self.scheduler.init_noise_sigma
        self.scheduler.set_timesteps(num_inference_steps, device=self.device)
        # stochastic schedulers (DDPM, Euler with churn, ...) draw their noise from the generator
        # too, so a seed fixes the samples; schedulers without one (PNDM) take no generator
        step_options = {}
        if "generator" in inspect.signature(self.scheduler.step).parameters:
            step_options["generator"] = generator
        if precompute_routes:
            model.precompute_routes(self.scheduler.timesteps)
        try:
            for i, t in enumerate(self.progress_bar(self.scheduler.timesteps)):
                model_input = self.scheduler.scale_model_input(x, t)
                prediction = self._guided(model_input, t, class_labels, encoder_hidden_states,
                                          guidance_scale)  # fmt: skip
                x = self.scheduler.step(prediction, t, x, **step_options).prev_sample
                if callback_on_step_end is not None:
                    returned = callback_on_step_end(self, i, t, {"latents": x}) or {}
                    x = returned.get("latents", x)
        finally:
            model.clear_routes()
        if output_type == "latent":
            images = x
        else:
            if self.vae is not None:
                x = self.vae.decode(x / self.vae.config.scaling_factor).sample
            images = (x / 2 + 0.5).clamp(0, 1)
            if output_type == "np":
                images = images.permute(0, 2, 3, 1).float().cpu().numpy()
        if not return_dict:
            return (images,)
        return ImagePipelineOutput(images=images)

    def _guided(self, x, t, labels, captions, scale: float) -> torch.Tensor:
        model = self.transformer
        conditional = model(x, t, class_labels=labels, encoder_hidden_states=captions).sample
        if scale == 1.0 or (labels is None and captions is None):
            return conditional
        null_labels = None if labels is None else torch.full_like(labels, model.config.num_classes)
        null_captions = None if captions is None else torch.zeros_like(captions)
        unconditional = model(x, t, class_labels=null_labels,
                              encoder_hidden_states=null_captions).sample  # fmt: skip
        return unconditional + scale * (conditional - unconditional)
