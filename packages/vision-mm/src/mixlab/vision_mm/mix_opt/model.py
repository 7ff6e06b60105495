"""The small pixel-space text-to-image model the experiment personalizes, pre-trained here.

- :func:`build_unet`: a diffusers ``UNet2DConditionModel`` of about 1.7 M parameters at 32×32
  with cross-attention at the 16² and 8² feature maps only.
- :class:`CaptionEncoder`: the "text encoder", learned token + position embeddings of the
  three-token captions; frozen while personalizing, like CLIP's in DreamBooth-LoRA.
- :func:`pretrained_model`: both, trained on :func:`captioned_shapes` (centred layout) with
  v-prediction, 10 % caption dropout (for classifier-free guidance) and an EMA of the UNet, cached under the mixlab cache
  (``mix_opt/``) keyed by every setting and the code that trains it (:data:`MODEL_CODE`); a
  killed pre-training resumes from its last checkpoint.
- :func:`sample`: DDIM sampling with classifier-free guidance, for any ``UNet2DConditionModel``;
  :func:`save_grid` writes samples as one PNG.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from diffusers import DDIMScheduler, DDPMScheduler, UNet2DConditionModel
from PIL import Image
from torch import nn

from mixlab.shared import (
    Checkpointer,
    capture_rng_state,
    progress,
    restore_rng_state,
    save_state,
    warmup_cosine,
)
from mixlab.shared.cache import cached
from mixlab.shared.files import CheckpointError, checkpoint_errors
from mixlab.shared.plotting import image_grid
from mixlab.vision_mm.mix_opt.cache import load_cached
from mixlab.vision_mm.mix_opt.config import Config
from mixlab.vision_mm.mix_opt.data import NULL_TOKEN, TOKEN_ID, VOCABULARY, captioned_shapes
from mixlab.vision_mm.mix_opt.trainer import diffusion_loss, resize


@dataclass(frozen=True)
class ModelSpec:
    """The pre-trained model: architecture, pre-training budget and data."""

    size: int = 32
    channels: tuple[int, ...] = (32, 64, 64)
    text_dim: int = 64
    train_timesteps: int = 1000
    steps: int = 1500
    batch_size: int = 16
    lr: float = 1e-3
    ema_decay: float = 0.995
    caption_dropout: float = 0.1
    train_size: int = 20000
    layout: str = "centred"
    """placement of the pre-training shapes (:data:`~mixlab.vision_mm.mix_opt.data.LAYOUTS`)"""
    prediction: str = "v_prediction"
    """the UNet's target: "v_prediction" (Salimans & Ho 2022) or "epsilon". With ε-prediction a
    1,500-step model (placements jittered around the centre) drew the asked colours on tinted
    grey backgrounds, with v-prediction on backgrounds of their own colour: at high noise
    x₀ = (x_t − √(1−ᾱ)·ε̂)/√ᾱ magnifies ε̂'s error, and the global colour is decided there"""
    seed: int = 0
    low_share: float = 0.0
    """share of pre-training steps taken on the images area-downsampled to ``low_size``, as
    Stable Diffusion saw 256² before 512²: a model that has never drawn at the low resolution
    learns nothing there that carries to the full one (BP-low lowered subject fidelity below the
    un-personalized model's at 16² and at 24², issue 63). 0: the first versions' model"""
    low_size: int = 16
    """the low resolution of those steps (BP-low's)"""


def model_spec(config: Config) -> ModelSpec:
    """The pre-trained (cached) shapes UNet the experiment's ``config`` personalizes (the CLI's
    ``--pretrain-steps`` changes only its steps)."""
    return ModelSpec(
        size=config.resolution,
        channels=tuple(config.base_channels),
        text_dim=config.base_text_dim,
        steps=config.pretrain_steps,
        train_size=config.pretrain_images,
        low_share=config.pretrain_low_share,
        low_size=config.low_resolution,
    )


class CaptionEncoder(nn.Module):
    """Token + position embeddings of a caption (B, L) → (B, L, dim) encoder hidden states."""

    def __init__(self, dim: int = 64, length: int = 3, vocabulary: int = len(VOCABULARY)):
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, dim)
        self.positions = nn.Parameter(torch.randn(length, dim) * 0.02)
        self.norm = nn.LayerNorm(dim)

    def forward(self, captions: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tokens(captions) + self.positions[: captions.shape[1]])


def build_unet(size: int = 32, channels: tuple[int, ...] = (32, 64, 64), text_dim: int = 64):
    """A ``UNet2DConditionModel`` for ``size``² RGB images; every block but the first
    cross-attends to the caption (downsampling factor 2^(len(channels) − 1))."""
    depth = len(channels)
    return UNet2DConditionModel(
        sample_size=size,
        in_channels=3,
        out_channels=3,
        block_out_channels=channels,
        down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (depth - 1),
        up_block_types=("CrossAttnUpBlock2D",) * (depth - 1) + ("UpBlock2D",),
        layers_per_block=1,
        cross_attention_dim=text_dim,
        attention_head_dim=8,
        norm_num_groups=8,
    )


def noise_scheduler(spec: ModelSpec = ModelSpec()) -> DDPMScheduler:
    """The training noise schedule of ``spec`` (its timesteps and prediction target)."""
    return DDPMScheduler(num_train_timesteps=spec.train_timesteps, prediction_type=spec.prediction)


def null_captions(n: int, length: int = 3) -> torch.Tensor:
    return torch.full((n, length), TOKEN_ID[NULL_TOKEN], dtype=torch.long)


MODEL_CODE = ("mixlab.vision_mm.mix_opt.model", "mixlab.vision_mm.mix_opt.data",
              "mixlab.vision_mm.mix_opt.trainer", "mixlab.shared.shapes")  # fmt: skip
"""the code that pre-trains the shapes UNet (model, captioned shapes, diffusion loss): part of
its cache key"""


def _cache_key(spec: ModelSpec) -> dict:
    """``spec`` as the cache keys it: the multi-resolution fields only when used, so a
    single-resolution model keeps the key it was cached under."""
    key = asdict(spec)
    if not spec.low_share:
        del key["low_share"], key["low_size"]
    return key


def _pretrained_folder(spec: ModelSpec) -> Path:
    """The cache entry of ``spec``'s pre-trained UNet and caption encoder (``model.safetensors``
    and ``model.json``), trained on first use. A killed pre-training resumes from its
    checkpoints, kept beside the entries under the same key until it ends."""
    key = _cache_key(spec)

    def build(folder: Path) -> None:
        checkpoints = folder / "training"  # kept by a kill: the next run resumes there
        torch.manual_seed(spec.seed)
        unet = build_unet(spec.size, spec.channels, spec.text_dim)
        encoder = CaptionEncoder(spec.text_dim)
        _pretrain(unet, encoder, spec, Checkpointer(checkpoints, resume=True))
        state = {"unet": unet.state_dict(), "encoder": encoder.state_dict(),
                 "key": json.dumps(key)}  # fmt: skip
        save_state(state, folder / "model")
        shutil.rmtree(checkpoints, ignore_errors=True)

    return cached("mix_opt", "shapes-unet", key, build, code=MODEL_CODE, resumable=True)


def pretrained_model(
    spec: ModelSpec = ModelSpec(), device: torch.device | str = "cpu"
) -> tuple[UNet2DConditionModel, CaptionEncoder]:
    """The (EMA) UNet and caption encoder pre-trained on captioned shapes, from the cache when
    there (seconds) or trained now (about 10 minutes on 2 idle CPU cores for the default spec)."""
    with torch.random.fork_rng():  # the caller's random stream stays as it was
        folder = _pretrained_folder(spec)
        torch.manual_seed(spec.seed)
        unet = build_unet(spec.size, spec.channels, spec.text_dim)
        encoder = CaptionEncoder(spec.text_dim)
    load_cached(folder / "model", "cached shapes UNet", {"unet": unet, "encoder": encoder},
                key=json.dumps(_cache_key(spec)))  # fmt: skip
    for module in (unet, encoder):
        module.requires_grad_(False).eval()
    return unet.to(device), encoder.to(device)


def _pretrain(
    unet: UNet2DConditionModel, encoder: CaptionEncoder, spec: ModelSpec, checkpoints: Checkpointer
) -> None:
    """Training on ``spec.prediction``'s target (AdamW, warm-up then cosine decay); leaves the
    EMA weights in ``unet``. Saves every 100 steps to ``checkpoints`` and resumes from there."""
    data = captioned_shapes(spec.train_size, size=spec.size, seed=spec.seed, layout=spec.layout)
    scheduler = noise_scheduler(spec)
    ema = copy.deepcopy(unet).requires_grad_(False)
    parameters = [*unet.parameters(), *encoder.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=spec.lr, weight_decay=0.01)
    lr_schedule = warmup_cosine(optimizer, spec.steps)
    generator = torch.Generator().manual_seed(spec.seed)
    start = 0
    if (last := checkpoints.load_latest()) is not None:
        start, state = last
        where = checkpoints.path(start).with_suffix(".json")
        try:
            with checkpoint_errors(where, "pre-training checkpoint of the shapes UNet"):
                unet.load_state_dict(state["unet"])
                encoder.load_state_dict(state["encoder"])
                ema.load_state_dict(state["ema"])
                optimizer.load_state_dict(state["optimizer"])
                lr_schedule.load_state_dict(state["lr_schedule"])
                restore_rng_state(state["rng"])
                generator.set_state(state["batches"])
        except RuntimeError as error:  # other shapes
            raise CheckpointError(
                f"{where}: damaged or not a pre-training checkpoint of the shapes UNet "
                f"({' '.join(str(error).split())[:200]}); delete {where.parent} to start over"
            ) from error
    unet.train()
    with progress(spec.steps, "pre-training the shapes UNet", completed=start) as bar:
        for step in range(start, spec.steps):
            index = torch.randint(len(data), (spec.batch_size,), generator=generator)
            images, captions = data.images[index], data.captions[index].clone()
            dropped = torch.rand(spec.batch_size, generator=generator) < spec.caption_dropout
            captions[dropped] = TOKEN_ID[NULL_TOKEN]
            if spec.low_share and _is_low_step(step, spec.low_share):
                images = resize(images, spec.low_size)
            noise = torch.randn(images.shape, generator=generator)
            t = torch.randint(spec.train_timesteps, (spec.batch_size,), generator=generator)
            loss = diffusion_loss(unet, scheduler, images, noise, t, encoder(captions))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
            lr_schedule.step()
            with torch.no_grad():
                for averaged, current in zip(ema.parameters(), unet.parameters(), strict=True):
                    averaged.lerp_(current, 1 - spec.ema_decay)
            bar.advance(loss=loss.item())
            if (step + 1) % 100 == 0 and step + 1 < spec.steps:
                checkpoints.save(
                    step + 1,
                    {
                        "unet": unet.state_dict(),
                        "encoder": encoder.state_dict(),
                        "ema": ema.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "lr_schedule": lr_schedule.state_dict(),
                        "rng": capture_rng_state(),
                        "batches": generator.get_state(),
                    },
                )
    unet.load_state_dict(ema.state_dict())


def _is_low_step(step: int, share: float) -> bool:
    """Whether pre-training step ``step`` is at the low resolution: spread evenly, so that
    ⌊(step + 1)·share⌋ − ⌊step·share⌋ of each step is (the share of the first n steps is within
    1/n of ``share``)."""
    return int((step + 1) * share) > int(step * share)


@torch.inference_mode()
def sample(
    unet: UNet2DConditionModel,
    conditioning: torch.Tensor,
    unconditional: torch.Tensor | None = None,
    *,
    steps: int = 25,
    guidance: float = 2.0,
    seed: int = 0,
    train_timesteps: int = 1000,
    size: int | None = None,
    prediction_type: str,
) -> torch.Tensor:
    """DDIM samples (B, 3, size, size) in [-1, 1] for encoder hidden states ``conditioning``
    (B, L, D), with classifier-free guidance against ``unconditional`` when given;
    ``prediction_type`` is what the UNet predicts ("epsilon" or "v_prediction")."""
    size = size or unet.config.sample_size
    device = next(unet.parameters()).device
    ddim = DDIMScheduler(
        num_train_timesteps=train_timesteps, clip_sample=True, prediction_type=prediction_type
    )
    ddim.set_timesteps(steps)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(conditioning), unet.config.in_channels, size, size, generator=generator)
    x = x.to(device)
    guided = unconditional is not None and guidance != 1.0
    context = torch.cat([unconditional, conditioning]) if guided else conditioning
    with progress(len(ddim.timesteps), f"sampling {len(x)} images") as bar:
        for t in ddim.timesteps:
            batch = torch.cat([x, x]) if guided else x
            out = unet(batch, t.to(device), encoder_hidden_states=context).sample
            if guided:
                out_uncond, out_cond = out.chunk(2)
                out = out_uncond + guidance * (out_cond - out_uncond)
            x = ddim.step(out, t, x).prev_sample
            bar.advance()
    return x.clamp(-1, 1)


def save_grid(
    path: str | os.PathLike[str], images: torch.Tensor, columns: int, scale: int = 4
) -> Path:
    """Write images (B, 3, H, W) in [-1, 1] as one PNG, ``columns`` per row, upscaled ×scale
    (nearest neighbour, so pixels stay visible)."""
    canvas = image_grid(images, columns)
    picture = Image.fromarray(canvas)
    picture = picture.resize((canvas.shape[1] * scale, canvas.shape[0] * scale), Image.NEAREST)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    picture.save(path)
    return path
