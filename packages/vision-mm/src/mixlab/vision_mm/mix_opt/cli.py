"""``mixlab-vision mix-opt``: personalize the bundled shapes UNet, render sample grids, profile modes.

Every verb checks all its options and paths before it loads or pre-trains a model (which takes
minutes on a fresh machine) or starts a child process: bad input is one line and exit code 2.

mixlab-vision mix-opt personalize --schedule mix_opt --steps 300 --out runs/sks
mixlab-vision mix-opt personalize --images my_subject/ --noun circle --out runs/mine
mixlab-vision mix-opt sample --lora runs/sks/lora --out grid.png
mixlab-vision mix-opt profile --modes bp_high bp_low zo_high --batch-size 4
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from mixlab.shared.checks import check_fresh_output
from mixlab.shared.config import is_count, is_number, require
from mixlab.vision_mm.mix_opt.config import (
    BACKGROUND_NAMES,
    BASE_CHANNELS,
    CAPTION_WORDS,
    downsampling_factor,
)
from mixlab.vision_mm.mix_opt.formats import check_checkpoint, lora_file

app = typer.Typer(
    help="Mix-Opt: personalization mixing low-resolution backprop and full-resolution ZO steps.",
    no_args_is_help=True,
)

PretrainSteps = Annotated[int, typer.Option(help="steps of the cached pre-trained shapes UNet")]
Backgrounds = Annotated[list[str] | None, typer.Option(help="backgrounds to render (default: all)")]


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
BASE_RESOLUTION = 32
"""the bundled shapes UNet's resolution (ModelSpec.size)"""


def _count(value: int, option: str, minimum: int = 1) -> None:
    require(is_count(value, minimum), option, f"an integer >= {minimum}", value)


def _seed(value: int) -> None:
    require(is_count(value, 0) and value < 2**32, "--seed", "an integer in [0, 2**32)", value)


def _positive(value: float, option: str) -> None:
    require(is_number(value) and value > 0, option, "a finite number > 0", value)


def _writable_parent(path: Path, option: str) -> None:
    """The nearest existing folder above ``path`` is a folder we may write into."""
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{option} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: cannot write into {parent}")


def check_out_folder(path: Path, option: str = "--out") -> None:
    """``path`` is a writable folder or can be created as one."""
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{option} {path} is a file; it must be a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{option} {path}: cannot write into this folder")
        return
    _writable_parent(path, option)


def check_out_image(path: Path, option: str = "--out") -> None:
    """``path`` is an image file name (.png, .jpg, .jpeg) that can be written."""
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise ValueError(f"{option} {path} must end in one of {list(IMAGE_SUFFIXES)}")
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; it must be an image file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{option} {path}: cannot overwrite this file")
    _writable_parent(path, option)


def _image_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise ValueError(f"--images {folder} is not a folder")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"--images {folder} holds no .png/.jpg/.jpeg files")
    return files


def _load_images(folder: Path, size: int):
    """The PNG/JPEG images of ``folder`` as (N, 3, size, size) in [-1, 1]."""
    import numpy as np
    import torch
    from PIL import Image, UnidentifiedImageError

    arrays = []
    for path in _image_files(folder):
        try:
            with Image.open(path) as opened:
                picture = opened.convert("RGB").resize((size, size), Image.Resampling.BOX)
        except (UnidentifiedImageError, OSError, SyntaxError) as error:
            raise ValueError(f"--images: {path} is not a readable image ({error})") from error
        arrays.append(np.asarray(picture, dtype=np.float32) / 127.5 - 1)
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


def _caption_word(word: str, option: str) -> None:
    require(word in CAPTION_WORDS, option, f"one of {list(CAPTION_WORDS)}", word)


def _schedule_fields(fields: str) -> dict[str, Any]:
    try:
        parsed = json.loads(fields)
    except json.JSONDecodeError as error:
        raise ValueError(f"--fields must be a JSON object, got {fields!r}: {error}") from error
    require(isinstance(parsed, dict), "--fields", "a JSON object", fields)
    return parsed


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
    # Everything is checked before the (cached, else minutes-long) base model loads.
    check_out_folder(out)
    for value, option in ((steps, "--steps"), (batch_size, "--batch-size"), (rank, "--rank")):
        _count(value, option)
    _count(pretrain_steps, "--pretrain-steps")
    _count(low_resolution, "--low-resolution")
    factor = downsampling_factor(BASE_CHANNELS)
    require(
        low_resolution % factor == 0 and low_resolution <= BASE_RESOLUTION,
        "--low-resolution",
        f"a multiple of the UNet's downsampling factor {factor}, at most {BASE_RESOLUTION}",
        low_resolution,
    )
    for value, option in ((bp_lr, "--bp-lr"), (zo_lr, "--zo-lr"), (zo_eps, "--zo-eps")):
        _positive(value, option)
    _seed(seed)
    _caption_word(noun, "--noun")
    if images is None:
        require(
            background in BACKGROUND_NAMES,
            "--background",
            f"one of {list(BACKGROUND_NAMES)} (the bundled subject's backgrounds)",
            background,
        )
    else:
        _caption_word(background, "--background")
        _image_files(images)

    from mixlab.vision_mm.mix_opt.schedule import make_schedule
    from mixlab.vision_mm.mix_opt.settings import MixOptConfig, recorded_settings

    config = MixOptConfig(
        resolution=BASE_RESOLUTION,
        low_resolution=low_resolution,
        steps=steps,
        batch_size=batch_size,
        schedule=make_schedule(schedule, **_schedule_fields(fields)),
        bp_lr=bp_lr,
        zo_lr=zo_lr,
        zo_eps=zo_eps,
        seed=seed,
    )
    check_fresh_output(out, "--out", resume=resume, made=("checkpoints", "lora"))
    if resume:  # a damaged checkpoint or one of other settings is refused now, not after loading
        check_checkpoint(out / "checkpoints", recorded_settings(config))

    import torch

    from mixlab.shared.files import write_text_atomic
    from mixlab.vision_mm.mix_opt.config import Config
    from mixlab.vision_mm.mix_opt.data import SUBJECT_TOKEN, encode_caption, subject_images
    from mixlab.vision_mm.mix_opt.lora import add_lora, save_lora
    from mixlab.vision_mm.mix_opt.model import model_spec, noise_scheduler, pretrained_model
    from mixlab.vision_mm.mix_opt.trainer import MixOptTrainer

    spec = model_spec(Config(pretrain_steps=pretrain_steps))
    caption = encode_caption(SUBJECT_TOKEN, noun, background)
    if images is None:
        pictures = subject_images(background=background, seed=seed).images
    else:
        pictures = _load_images(images, spec.size)
    unet, encoder = pretrained_model(spec)
    add_lora(unet, rank=rank)
    with torch.inference_mode():
        text = encoder(torch.tensor([caption] * len(pictures)))
    trainer = MixOptTrainer(unet, noise_scheduler(spec), pictures, text.clone(), config)
    history = trainer.train(out / "checkpoints", resume=resume)
    path = save_lora(unet, out / "lora")
    write_text_atomic(out / "history.json", json.dumps(history) + "\n")
    zo = sum(h["mode"] == "zo_high" for h in history) / len(history)
    typer.echo(
        f"{schedule}: {len(history)} steps ({zo:.0%} ZO-high), mean loss of the last 50 "
        f"{sum(h['loss'] for h in history[-50:]) / len(history[-50:]):.4f}; wrote {path}"
    )


@app.command("sample")
def sample_grid(
    out: Annotated[Path, typer.Option(help="image file to write (.png, .jpg)")],
    lora: Annotated[
        Path | None, typer.Option(help="adapter folder from personalize (default: none)")
    ] = None,
    noun: str = "star",
    backgrounds: Backgrounds = None,
    per_prompt: Annotated[int, typer.Option(help="samples per background")] = 4,
    steps: Annotated[int, typer.Option(help="DDIM steps")] = 25,
    guidance: Annotated[float, typer.Option(help="classifier-free guidance (>= 1; 1: none)")] = 1.0,
    seed: int = 0,
    pretrain_steps: PretrainSteps = 1500,
) -> None:
    """Render "<sks> <noun> <background>" for each background, one row each, as a PNG grid."""
    check_out_image(out)
    _count(per_prompt, "--per-prompt")
    _count(steps, "--steps")
    _count(pretrain_steps, "--pretrain-steps")
    require(
        is_number(guidance) and guidance >= 1,
        "--guidance",
        "a finite number >= 1 (1: no guidance)",
        guidance,
    )
    _seed(seed)
    _caption_word(noun, "--noun")
    chosen = backgrounds or list(BACKGROUND_NAMES)
    for background in chosen:
        _caption_word(background, "--backgrounds")

    if lora is not None:  # intact (and, with our sidecar, unchanged) before the model loads
        lora_file(lora)

    import torch

    from mixlab.vision_mm.mix_opt.config import Config
    from mixlab.vision_mm.mix_opt.data import SUBJECT_TOKEN, encode_caption
    from mixlab.vision_mm.mix_opt.lora import load_lora
    from mixlab.vision_mm.mix_opt.model import model_spec, null_captions, pretrained_model, sample
    from mixlab.vision_mm.mix_opt.model import save_grid as write_grid

    captions = [encode_caption(SUBJECT_TOKEN, noun, b) for b in chosen for _ in range(per_prompt)]
    spec = model_spec(Config(pretrain_steps=pretrain_steps))
    unet, encoder = pretrained_model(spec)
    if lora is not None:
        load_lora(unet, lora)
    with torch.inference_mode():
        context = encoder(torch.tensor(captions))
        empty = encoder(null_captions(len(captions)))
    images = sample(
        unet, context, empty, steps=steps, guidance=guidance, seed=seed,
        train_timesteps=spec.train_timesteps, prediction_type=spec.prediction,
    )  # fmt: skip
    typer.echo(f"wrote {write_grid(out, images, columns=per_prompt)}")


OPTION_OF = {
    "mode": "--modes",
    "resolution": "--resolution",
    "low_resolution": "--low-resolution",
    "batch_size": "--batch-size",
    "rank": "--rank",
    "unet": "--unet",
}


@app.command()
def profile(
    modes: Annotated[
        list[str] | None, typer.Option(help="bp_high, bp_low, zo_high (default: all)")
    ] = None,
    resolution: int = 32,
    low_resolution: int = 16,
    batch_size: int = 4,
    rank: int = 4,
    device: Annotated[str, typer.Option(help="auto (CUDA when available), cpu or cuda")] = "auto",
    unet: Annotated[
        str,
        typer.Option(
            help="shapes (the experiment's UNet) or sd15 (Stable Diffusion 1.5's layout, no "
            "weights; resolutions are latent sizes: 64 for 512² images)"
        ),
    ] = "shapes",
) -> None:
    """Peak training memory (total, and what one step adds) and seconds per step, per mode,
    each in a fresh process; on CUDA the allocator's peak, on a CPU the resident set."""
    from mixlab.vision_mm.mix_opt.profile import MODE_SCHEDULES, check_spec, profile_modes

    require(device in ("auto", "cpu", "cuda"), "--device", "auto, cpu or cuda", device)
    chosen = modes or list(MODE_SCHEDULES)
    common = {
        "resolution": resolution,
        "low_resolution": low_resolution,
        "batch_size": batch_size,
        "rank": rank,
        "unet": unet,
    }
    specs = [{**common, "mode": mode} for mode in chosen]
    for spec in specs:  # here, in this process: the probe's child never sees bad input
        check_spec(spec, lambda key: OPTION_OF.get(key, key))

    from mixlab.shared.device import resolve_device

    resolved = resolve_device(device).type  # cuda asked for on a machine without: one line
    measured = profile_modes([{**spec, "device": resolved} for spec in specs])
    for mode, row in zip(chosen, measured, strict=True):
        typer.echo(
            f"{mode} ({resolved}): peak {row['total_peak_bytes'] / 2**20:.1f} MiB in all, "
            f"+{row['added_peak_bytes'] / 2**20:.1f} MiB per step, "
            f"{row['seconds_per_step'] * 1e3:.0f} ms/step"
        )
