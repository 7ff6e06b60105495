"""Mix-Opt in diffusers' idiom: a Stable-Diffusion-shaped latent UNet, a VAE and SD's noise
schedule, each loaded from a local folder, personalized with the VAE latents of downscaled photos
for BP-low (ε- and v-prediction); the adapter read back by the pipelines' own LoRA loader."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKL, DDPMScheduler, StableDiffusionPipeline, UNet2DConditionModel

from mixlab.vision_mm.mix_opt import Constant, MixOptConfig, MixOptTrainer, add_lora, save_lora
from mixlab.vision_mm.mix_opt.lora import lora_parameters

SD_LIKE_UNET = {
    "sample_size": 8, "in_channels": 4, "out_channels": 4, "block_out_channels": (16, 32),
    "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"), "layers_per_block": 1,
    "cross_attention_dim": 16, "attention_head_dim": 4, "norm_num_groups": 8,
}  # fmt: skip
"""SD 1.x's block layout (cross-attention down and up, 4 latent channels), tiny"""
SD_SCHEDULE = {"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A user's model as local folders: unet/, vae/ and scheduler/ (never a hub download)."""
    root = tmp_path_factory.mktemp("sd-like")
    torch.manual_seed(0)
    UNet2DConditionModel(**SD_LIKE_UNET).save_pretrained(root / "unet")
    AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16),
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=4, sample_size=16,
    ).save_pretrained(root / "vae")  # fmt: skip
    DDPMScheduler(**SD_SCHEDULE).save_pretrained(root / "scheduler")
    return root


def encode(vae: AutoencoderKL, photos: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return vae.encode(photos).latent_dist.mean * vae.config.scaling_factor


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_latent_personalization_with_low_resolution_latents(folders, prediction_type):
    unet = UNet2DConditionModel.from_pretrained(folders / "unet")
    vae = AutoencoderKL.from_pretrained(folders / "vae").eval()
    scheduler = DDPMScheduler.from_pretrained(
        folders / "scheduler", prediction_type=prediction_type
    )
    photos = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1
    latents = encode(vae, photos)  # 16² photos → 8² latents
    low_latents = encode(vae, torch.nn.functional.interpolate(photos, size=8, mode="area"))
    text = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(2))
    add_lora(unet, rank=2)
    before = [p.detach().clone() for p in lora_parameters(unet)]
    noised = []
    add_noise = scheduler.add_noise
    scheduler.add_noise = lambda clean, noise, t: (
        noised.append(clean),
        add_noise(clean, noise, t),
    )[1]
    config = MixOptConfig(resolution=8, low_resolution=4, steps=8, batch_size=2,
                          schedule=Constant(0.5), zo_lr=1e-2)  # fmt: skip
    trainer = MixOptTrainer(unet, scheduler, latents, text, config, low_res_images=low_latents)
    history = trainer.train()
    assert {h["mode"] for h in history} == {"bp_low", "zo_high"}
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in history)
    low_seen = [x for x in noised if x.shape[-1] == 4]
    assert low_seen
    for batch in low_seen:  # the encoding of the downscaled photos, not resized latents
        for row in batch:
            assert any(torch.equal(row, candidate) for candidate in low_latents)
    assert any(not torch.equal(a, b) for a, b in zip(before, lora_parameters(unet), strict=True))


def test_the_pipelines_lora_loader_reads_the_adapter(folders, tmp_path):
    unet = UNet2DConditionModel.from_pretrained(folders / "unet")
    add_lora(unet, rank=2)
    with torch.no_grad():  # a trained-looking adapter: B starts at zero
        for p in lora_parameters(unet):
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    save_lora(unet, tmp_path / "lora")
    # what StableDiffusionPipeline.load_lora_weights does, without the text encoder it also needs
    state_dict, alphas = StableDiffusionPipeline.lora_state_dict(tmp_path / "lora")
    assert all(key.startswith("unet.") for key in state_dict)
    fresh = UNet2DConditionModel.from_pretrained(folders / "unet")
    StableDiffusionPipeline.load_lora_into_unet(state_dict, alphas, unet=fresh)
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(4))
    t, text = torch.tensor([10, 900]), torch.randn(2, 3, 16)
    with torch.no_grad():
        expected = unet(x, t, encoder_hidden_states=text).sample
        torch.testing.assert_close(fresh(x, t, encoder_hidden_states=text).sample, expected)
        plain = UNet2DConditionModel.from_pretrained(folders / "unet")
        assert not torch.allclose(plain(x, t, encoder_hidden_states=text).sample, expected)


def tiny_text_side(root) -> tuple:
    """A CLIP text encoder and tokenizer of a 16-wide, one-layer config, saved to and loaded
    from local folders: the tokenizer's vocabulary is every lower-case letter (with and without
    the end-of-word mark), so any lower-case prompt encodes without merges."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for letter in letters:
        vocab[letter], vocab[letter + "</w>"] = len(vocab), len(vocab) + 1
    CLIPTokenizer(vocab, [], model_max_length=16).save_pretrained(root / "tokenizer")
    torch.manual_seed(5)
    CLIPTextModel(
        CLIPTextConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32,
                       num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=16,
                       bos_token_id=0, eos_token_id=1, pad_token_id=1)
    ).save_pretrained(root / "text_encoder")  # fmt: skip
    return (CLIPTextModel.from_pretrained(root / "text_encoder"),
            CLIPTokenizer.from_pretrained(root / "tokenizer"))  # fmt: skip


def test_a_stable_diffusion_pipeline_loads_the_trained_adapter(folders, tmp_path):
    """The whole pipeline from local parts (UNet, VAE, CLIP text encoder and tokenizer, DDIM):
    an adapter trained by MixOptTrainer, saved by save_lora and loaded by
    ``pipe.load_lora_weights`` draws the trained UNet's images; at scale 0 and after unloading,
    the base model's."""
    from diffusers import DDIMScheduler

    text_encoder, tokenizer = tiny_text_side(tmp_path)
    vae = AutoencoderKL.from_pretrained(folders / "vae").eval()
    scheduler = DDPMScheduler.from_pretrained(folders / "scheduler")

    prompt = "a photo of sks dog"
    trained = UNet2DConditionModel.from_pretrained(folders / "unet")
    pipe = StableDiffusionPipeline(
        vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=trained,
        scheduler=DDIMScheduler.from_config(scheduler.config), safety_checker=None,
        feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    photos = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(6)) * 2 - 1
    with torch.no_grad():
        text = pipe.encode_prompt(prompt, "cpu", 1, False)[0].repeat(2, 1, 1)
    add_lora(trained, rank=2)
    config = MixOptConfig(resolution=8, low_resolution=4, steps=6, batch_size=2,
                          schedule=Constant(0.5), bp_lr=3e-2, zo_lr=1e-2)  # fmt: skip
    MixOptTrainer(trained, scheduler, encode(vae, photos), text, config).train()
    trained.eval()
    save_lora(trained, tmp_path / "lora")

    def draw(pipe: StableDiffusionPipeline, **kwargs) -> torch.Tensor:
        return pipe(prompt, height=16, width=16, num_inference_steps=3, output_type="pt",
                    generator=torch.Generator().manual_seed(7), **kwargs).images  # fmt: skip

    expected = draw(pipe)
    base = StableDiffusionPipeline(**{**pipe.components,
                                      "unet": UNet2DConditionModel.from_pretrained(folders / "unet")})  # fmt: skip
    base.set_progress_bar_config(disable=True)
    plain = draw(base)
    assert (expected - plain).abs().max() > 1e-3  # the adapter changes what is drawn
    base.load_lora_weights(tmp_path / "lora")
    torch.testing.assert_close(draw(base), expected)
    torch.testing.assert_close(draw(base, cross_attention_kwargs={"scale": 0.0}), plain)
    base.unload_lora_weights()
    torch.testing.assert_close(draw(base), plain)
