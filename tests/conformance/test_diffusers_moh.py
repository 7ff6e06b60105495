"""MoH in diffusers' idiom: the backbone as a ``ModelMixin`` under diffusers' own schedulers, the
``DiffusionPipeline`` save/load round trip and a seeded call, and a local ``AutoencoderKL``'s
latents."""

from __future__ import annotations

import pytest
import torch
from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
)

from mixlab.attention_arch.moh import MoHDiffusion, MoHPipeline

torch.set_num_threads(1)

TINY = {"width": 16, "depth": 2, "d_state": 4, "expand": 1.0, "levels": (1, 2),
        "experts": ("raster", "zigzag", "conv", "mlp"), "depth_gate": True}  # fmt: skip


def trained_looking(model: MoHDiffusion) -> MoHDiffusion:
    """Random values in the zero-initialised layers, so outputs depend on every path."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    return model.eval()


@pytest.mark.parametrize(
    "scheduler",
    [DDPMScheduler, DDIMScheduler, EulerDiscreteScheduler, DPMSolverMultistepScheduler],
)
def test_the_backbone_runs_under_diffusers_schedulers(scheduler):
    pipeline = MoHPipeline(trained_looking(MoHDiffusion(**TINY, num_classes=3)), scheduler())
    pipeline.set_progress_bar_config(disable=True)
    images = pipeline(class_labels=[0, 2], num_inference_steps=3, guidance_scale=2.0,
                      generator=torch.Generator().manual_seed(0)).images  # fmt: skip
    assert images.shape == (2, 8, 8, 1)
    assert images.min() >= 0
    assert images.max() <= 1


@pytest.mark.parametrize(
    "scheduler",
    [DDPMScheduler, DDIMScheduler, EulerDiscreteScheduler, EulerAncestralDiscreteScheduler],
)
def test_the_same_seed_gives_the_same_samples_under_every_scheduler(scheduler):
    """DDPM and ancestral Euler draw fresh noise at every step: from the caller's generator
    (issue 67: the pipeline did not pass it on, and the same seed gave images 1.0 apart)."""
    pipeline = MoHPipeline(trained_looking(MoHDiffusion(**TINY)), scheduler())
    pipeline.set_progress_bar_config(disable=True)

    calls = iter(range(100))

    def call(seed: int) -> torch.Tensor:
        torch.manual_seed(next(calls))  # the global generator moves on: it must not matter
        return pipeline(batch_size=2, num_inference_steps=4, output_type="pt",
                        generator=torch.Generator().manual_seed(seed)).images  # fmt: skip

    torch.testing.assert_close(call(0), call(0), rtol=0, atol=0)
    assert not torch.equal(call(0), call(1))


def test_pipeline_save_load_round_trip_and_seeded_calls(tmp_path):
    pipeline = MoHPipeline(trained_looking(MoHDiffusion(**TINY)), DDIMScheduler())
    pipeline.set_progress_bar_config(disable=True)

    def call(p, seed):
        return p(batch_size=3, num_inference_steps=4, output_type="pt",
                 generator=torch.Generator().manual_seed(seed)).images  # fmt: skip

    first = call(pipeline, 0)
    torch.testing.assert_close(call(pipeline, 0), first)
    assert not torch.equal(call(pipeline, 1), first)
    pipeline.save_pretrained(tmp_path)
    loaded = MoHPipeline.from_pretrained(tmp_path)
    loaded.set_progress_bar_config(disable=True)
    assert isinstance(loaded.transformer, MoHDiffusion)
    assert isinstance(loaded.scheduler, DDIMScheduler)
    torch.testing.assert_close(call(loaded, 0), first)
    # precomputed routes change nothing but the router calls
    routes_on_the_fly = pipeline(batch_size=3, num_inference_steps=4, output_type="pt",
                                 precompute_routes=False,
                                 generator=torch.Generator().manual_seed(0)).images  # fmt: skip
    torch.testing.assert_close(routes_on_the_fly, first)


def test_a_local_autoencoder_decodes_the_latents(tmp_path):
    torch.manual_seed(0)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16),
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=4, sample_size=16,
    )  # fmt: skip
    vae.save_pretrained(tmp_path / "vae")  # a user's VAE, loaded from a local folder
    vae = AutoencoderKL.from_pretrained(tmp_path / "vae").eval()
    model = trained_looking(MoHDiffusion(**TINY, in_channels=4))
    pipeline = MoHPipeline(model, DDIMScheduler(), vae=vae)
    pipeline.set_progress_bar_config(disable=True)
    images = pipeline(batch_size=2, num_inference_steps=2, output_type="pt").images
    assert images.shape == (2, 3, 16, 16)  # 8x8 latents, decoded x2
    latents = pipeline(batch_size=2, num_inference_steps=2, output_type="latent").images
    assert latents.shape == (2, 4, 8, 8)
