"""``mixlab-vision mix-opt``: personalize the bundled shapes UNet, render sample grids, profile modes.

mixlab-vision mix-opt personalize --schedule mix_opt --steps 300 --out runs/sks
mixlab-vision mix-opt personalize --images my_subject/ --noun circle --out runs/mine
mixlab-vision mix-opt sample --lora runs/sks/lora --out grid.png
mixlab-vision mix-opt profile --modes bp_high bp_low zo_high --batch-size 4
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="Mix-Opt: personalization mixing low-resolution backprop and full-resolution ZO steps.",
    no_args_is_help=True,
)

PretrainSteps = Annotated[int, typer.Option(help="steps of the cached pre-trained shapes UNet")]
Backgrounds = Annotated[list[str] | None, typer.Option(help="backgrounds to render (default: all)")]


def _load_images(folder: Path, size: int):
    """The PNG/JPEG images of ``folder`` as (N, 3, size, size) in [-1, 1]."""
    import numpy as np
    import torch
    from PIL import Image

    if not folder.is_dir():
        raise ValueError(f"--images {folder} is not a folder")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
    if not files:
        raise ValueError(f"--images {folder} holds no .png/.jpg/.jpeg files")
    arrays = []
    for path in files:
        picture = Image.open(path).convert("RGB").resize((size, size), Image.Resampling.BOX)
        arrays.append(np.asarray(picture, dtype=np.float32) / 127.5 - 1)
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


@app.command()
def personalize(
    out: Annotated[Path, typer.Option(help="folder for lora/, history.json and samples.png")],
    schedule: Annotated[
        str, typer.Option(help="mix_opt, threshold, random, bp_low, zo_high or bp_high")
    ] = "mix_opt",
    fields: Annotated[
        str, typer.Option(help='schedule fields as JSON, e.g. \'{"kappa": 20, "t0": 0.3}\'')
    ] = "{}",
    images: Annotated[
        Path | None, typer.Option(help="folder of your subject's images (default: the star)")
    ] = None,
    noun: Annotated[str, typer.Option(help="class word of the subject's caption")] = "star",
    background: Annotated[str, typer.Option(help="background word of the caption")] = "on_white",
    steps: int = 300,
    batch_size: int = 4,
    low_resolution: int = 16,
    rank: int = 4,
    bp_lr: float = 1e-3,
    zo_lr: float = 0.05,
    zo_eps: float = 1e-2,
    seed: int = 0,
    pretrain_steps: PretrainSteps = 1500,
    resume: Annotated[bool, typer.Option(help="continue from out/checkpoints")] = False,
) -> None:
    """Personalize the pre-trained shapes UNet to a subject with a LoRA adapter; the caption is
    "<sks> <noun> <background>"."""
    import torch

    from mixlab.vision_mm.mix_opt.data import SUBJECT_TOKEN, encode_caption, subject_images
    from mixlab.vision_mm.mix_opt.lora import add_lora, save_lora
    from mixlab.vision_mm.mix_opt.model import ModelSpec, noise_scheduler, pretrained_model
    from mixlab.vision_mm.mix_opt.schedule import make_schedule
    from mixlab.vision_mm.mix_opt.trainer import MixOptConfig, MixOptTrainer

    try:
        schedule_fields = json.loads(fields)
    except json.JSONDecodeError as error:
        raise ValueError(f"--fields must be a JSON object, got {fields!r}: {error}") from error
    mixing = make_schedule(schedule, **schedule_fields)
    spec = ModelSpec(steps=pretrain_steps)
    caption = encode_caption(SUBJECT_TOKEN, noun, background)
    if images is None:
        pictures = subject_images(background=background, seed=seed).images
    else:
        pictures = _load_images(images, spec.size)
    config = MixOptConfig(
        resolution=spec.size,
        low_resolution=low_resolution,
        steps=steps,
        batch_size=batch_size,
        schedule=mixing,
        bp_lr=bp_lr,
        zo_lr=zo_lr,
        zo_eps=zo_eps,
        seed=seed,
    )
    unet, encoder = pretrained_model(spec)
    add_lora(unet, rank=rank)
    with torch.inference_mode():
        text = encoder(torch.tensor([caption] * len(pictures)))
    trainer = MixOptTrainer(unet, noise_scheduler(spec), pictures, text.clone(), config)
    history = trainer.train(out / "checkpoints", resume=resume)
    path = save_lora(unet, out / "lora")
    (out / "history.json").write_text(json.dumps(history) + "\n")
    zo = sum(h["mode"] == "zo_high" for h in history) / len(history)
    typer.echo(
        f"{schedule}: {len(history)} steps ({zo:.0%} ZO-high), mean loss of the last 50 "
        f"{sum(h['loss'] for h in history[-50:]) / len(history[-50:]):.4f}; wrote {path}"
    )


@app.command("sample")
def sample_grid(
    out: Annotated[Path, typer.Option(help="PNG file to write")],
    lora: Annotated[Path | None, typer.Option(help="adapter folder (default: none)")] = None,
    noun: str = "star",
    backgrounds: Backgrounds = None,
    per_prompt: Annotated[int, typer.Option(help="samples per background")] = 4,
    steps: Annotated[int, typer.Option(help="DDIM steps")] = 25,
    guidance: float = 2.0,
    seed: int = 0,
    pretrain_steps: PretrainSteps = 1500,
) -> None:
    """Render "<sks> <noun> <background>" for each background, one row each, as a PNG grid."""
    import torch

    from mixlab.vision_mm.mix_opt.data import BACKGROUNDS, SUBJECT_TOKEN, encode_caption
    from mixlab.vision_mm.mix_opt.lora import load_lora
    from mixlab.vision_mm.mix_opt.model import ModelSpec, null_captions, pretrained_model, sample
    from mixlab.vision_mm.mix_opt.model import save_grid as write_grid

    if per_prompt < 1 or steps < 1:
        raise ValueError(f"--per-prompt and --steps must be >= 1, got {per_prompt} and {steps}")
    chosen = backgrounds or list(BACKGROUNDS)
    captions = [encode_caption(SUBJECT_TOKEN, noun, b) for b in chosen for _ in range(per_prompt)]
    unet, encoder = pretrained_model(ModelSpec(steps=pretrain_steps))
    if lora is not None:
        load_lora(unet, lora)
    with torch.inference_mode():
        context = encoder(torch.tensor(captions))
        empty = encoder(null_captions(len(captions)))
    images = sample(unet, context, empty, steps=steps, guidance=guidance, seed=seed)
    typer.echo(f"wrote {write_grid(out, images, columns=per_prompt)}")


@app.command()
def profile(
    modes: Annotated[
        list[str] | None, typer.Option(help="bp_high, bp_low, zo_high (default: all)")
    ] = None,
    resolution: int = 32,
    low_resolution: int = 16,
    batch_size: int = 4,
    rank: int = 4,
) -> None:
    """Peak memory one training step adds and seconds per step, per mode (fresh process)."""
    from mixlab.vision_mm.mix_opt.profile import MODE_SCHEDULES, profile_modes

    chosen = modes or list(MODE_SCHEDULES)
    common = {
        "resolution": resolution,
        "low_resolution": low_resolution,
        "batch_size": batch_size,
        "rank": rank,
    }
    measured = profile_modes([{**common, "mode": mode} for mode in chosen])
    for mode, row in zip(chosen, measured, strict=True):
        typer.echo(
            f"{mode}: peak +{row['peak_bytes'] / 2**20:.1f} MiB, "
            f"{row['seconds_per_step'] * 1e3:.0f} ms/step"
        )
