"""``mixlab-attn moh``: train a timestep-routed Mamba diffusion backbone, sample from it, plot
its routes, score it.

mixlab-attn moh train --data digits --out runs/moh-digits        (killed: run it again to resume)
mixlab-attn moh sample --model runs/moh-digits --n 64 --out digits.png
mixlab-attn moh routes --model runs/moh-digits --out routes.png
mixlab-attn moh score --model runs/moh-digits --data digits
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mixlab.shared.checks import (
    check_choice,
    check_count,
    check_input_folder,
    check_number,
    check_output_file,
    check_output_folder,
    check_seed,
)
from mixlab.shared.files import atomic_folder

app = typer.Typer(
    help="MoH: Mixture-of-Hierarchical Experts, a timestep-routed Mamba diffusion backbone.",
    no_args_is_help=True,
)

SYSTEM_CHOICES = ("MoH", "plain Mamba", "ZigMa multi-scan", "static MoE", "MoH levels only",
                  "MoH transformations only", "MoH depth only", "DiT")  # fmt: skip
Data = Annotated[str, typer.Option(help="'digits', 'faces', 'shapes' or a folder of images")]
Model = Annotated[Path, typer.Option(help="a folder written by `moh train --out`")]


def _check_data(data: str) -> None:
    if data not in ("digits", "faces", "shapes"):
        check_input_folder(Path(data), "--data")


def _load_model(folder: Path):
    from mixlab.attention_arch.moh.model import MoHDiffusion

    check_input_folder(folder, "--model", containing=("model/config.json",))
    return MoHDiffusion.from_pretrained(folder / "model").eval()


def _settings(folder: Path) -> dict:
    return json.loads((folder / "train.json").read_text())


@app.command()
def train(
    data: Data = "digits",
    out: Annotated[
        Path, typer.Option(help="folder for the model, checkpoints and train.json")
    ] = Path("runs/moh"),
    system: Annotated[str, typer.Option(help=f"one of {SYSTEM_CHOICES}")] = "MoH",
    size: Annotated[int | None, typer.Option(help="image size (default: the source's)")] = None,
    width: int = 64,
    depth: int = 4,
    patch_size: int = 2,
    d_state: int = 4,
    expand: float = 1.0,
    top_k: Annotated[
        int, typer.Option(help="routed systems: 1 or 2 levels and experts per block (0: soft)")
    ] = 1,
    steps: int = 2000,
    batch_size: int = 64,
    lr: float = 2e-3,
    prediction: Annotated[
        str, typer.Option(help="'epsilon', 'v_prediction' or 'sample' (x0)")
    ] = "sample",
    conditional: Annotated[
        bool, typer.Option(help="class-conditional on labelled images (label dropout 0.1)")
    ] = True,
    seed: int = 0,
) -> None:
    """Train from scratch (EMA, checkpoints every 10 % of the steps; run again to resume)."""
    check_choice(system, "--system", SYSTEM_CHOICES)
    _check_data(data)
    for value, option in ((width, "--width"), (depth, "--depth"), (patch_size, "--patch-size"),
                          (d_state, "--d-state"), (steps, "--steps"), (batch_size, "--batch-size")):  # fmt: skip
        check_count(value, option)
    if size is not None:
        check_count(size, "--size", 8)
    check_number(expand, "--expand", expand > 0, "a number > 0")
    check_choice(top_k, "--top-k", (0, 1, 2))
    check_number(lr, "--lr", 0 < lr < 1, "a number in (0, 1)")
    check_choice(prediction, "--prediction", ("epsilon", "v_prediction", "sample"))
    check_seed(seed)
    check_output_folder(out, "--out")

    import torch

    from mixlab.attention_arch.moh.config import system_architecture
    from mixlab.attention_arch.moh.data import load_images
    from mixlab.attention_arch.moh.experiment import CAPTION_DIM, caption_embeddings
    from mixlab.attention_arch.moh.model import MoHDiffusion
    from mixlab.attention_arch.moh.training import TrainSpec
    from mixlab.attention_arch.moh.training import train as train_model

    torch.set_flush_denormal(True)
    images = load_images(data, size=size, seed=seed)
    sample_size = images.images.shape[-1]
    if sample_size % patch_size:
        raise ValueError(f"--patch-size must divide the image size {sample_size}, got {patch_size}")
    captions = None
    if images.captions is not None:
        captions = caption_embeddings(images.captions, images.vocab_size, seed)
    arguments = {
        "sample_size": sample_size, "in_channels": images.images.shape[1], "patch_size": patch_size,
        "width": width, "depth": depth, "d_state": d_state, "expand": expand,
        "caption_dim": CAPTION_DIM if captions is not None else None,
        "num_classes": images.num_classes if conditional and captions is None else None,
        **system_architecture(system, expand, top_k or None),
    }  # fmt: skip
    torch.manual_seed(seed)
    model = MoHDiffusion(**arguments)
    spec = TrainSpec(steps=steps, batch_size=batch_size, lr=lr, prediction_type=prediction,
                     seed=seed, checkpoint_every=max(1, steps // 10))  # fmt: skip
    resuming = (out / "checkpoints").is_dir()
    if resuming:
        typer.echo(f"resuming from the checkpoints in {out}")
    labels = images.labels if arguments["num_classes"] is not None else None
    ema, history = train_model(model, images.images, spec, class_labels=labels, captions=captions,
                               out_dir=out, resume=resuming)  # fmt: skip
    with atomic_folder(out / "model") as folder:  # a kill while saving leaves no half model
        ema.save_pretrained(folder)
    settings = {"data": data, "size": sample_size, "system": system, "prediction": prediction,
                "seed": seed, "history": history}  # fmt: skip
    (out / "train.json").write_text(json.dumps(settings, indent=1))
    params = sum(p.numel() for p in ema.parameters())
    typer.echo(f"{system}: {params:,} parameters, final loss {history[-1]['mse']:.4f}; saved {out}")


@app.command()
def sample(
    model: Model,
    out: Annotated[Path, typer.Option(help="a .png grid of the samples")] = Path("samples.png"),
    n: int = 64,
    steps: Annotated[int, typer.Option(help="DDIM steps")] = 50,
    guidance: Annotated[float, typer.Option(help="classifier-free guidance scale")] = 1.0,
    seed: int = 0,
) -> None:
    """Draw ``n`` DDIM samples (routes precomputed per step) into a PNG grid."""
    check_count(n, "--n")
    check_count(steps, "--steps")
    check_number(guidance, "--guidance", guidance >= 1, "a number >= 1")
    check_seed(seed)
    check_output_file(out, "--out", (".png",))
    unet = _load_model(model)
    images = _samples(unet, model, n, steps, guidance, seed)

    import matplotlib.pyplot as plt

    from mixlab.shared.plotting import image_grid

    grid = image_grid(images, 8)
    plt.imsave(out, grid.squeeze(-1) if grid.shape[-1] == 1 else grid, cmap="gray")
    typer.echo(f"wrote {n} samples to {out}")


def _samples(unet, folder: Path, n: int, steps: int, guidance: float, seed: int):
    from mixlab.attention_arch.moh.training import sample as draw

    settings = _settings(folder)
    conditioning = {}
    if unet.config.caption_dim is not None:  # sample with captions of random training scenes
        from mixlab.attention_arch.moh.data import load_images
        from mixlab.attention_arch.moh.experiment import caption_embeddings, sampling_conditions

        data = load_images(settings["data"], size=settings["size"], seed=settings["seed"])
        captions = caption_embeddings(data.captions, data.vocab_size, settings["seed"])
        conditioning = sampling_conditions(data, captions, None, n, seed)
    elif unet.config.num_classes is not None:  # every class in turn
        import torch

        conditioning = {"class_labels": torch.arange(n) % unet.config.num_classes}
    return draw(unet, n, steps=steps, seed=seed, prediction_type=settings["prediction"],
                guidance_scale=guidance, **conditioning)  # fmt: skip


@app.command()
def routes(
    model: Model,
    out: Annotated[Path, typer.Option(help="a .png plot of g(t)")] = Path("routes.png"),
) -> None:
    """Plot the routes g(t) per axis (mean over blocks) against the timestep."""
    check_output_file(out, "--out", (".png",))
    unet = _load_model(model)
    from mixlab.attention_arch.moh.experiment import route_summary
    from mixlab.shared import line_plot

    summary = route_summary(unet)
    if not summary["routes"]:
        raise ValueError(f"--model {model}: this backbone routes nothing (a plain block)")
    t = summary["routes"]["t"]
    series = {}
    for axis, values in summary["routes"].items():
        if axis == "t":
            continue
        columns = [values] if not isinstance(values[0], list) else list(zip(*values, strict=True))
        for j, column in enumerate(columns):
            series[f"{axis} {j}"] = (t, list(column))
    line_plot(out, series, xlabel="timestep t", ylabel="route weight",
              title=f"g(t), total variation {summary['route_tv']:.3f}")  # fmt: skip
    typer.echo(f"wrote {out} (route total variation, lowest vs highest t decile: "
               f"{summary['route_tv']:.3f})")  # fmt: skip


@app.command()
def score(
    model: Model,
    data: Annotated[
        str | None, typer.Option(help="real images (default: the training data)")
    ] = None,
    n: int = 1000,
    steps: Annotated[int, typer.Option(help="DDIM steps")] = 50,
    feature_steps: Annotated[int, typer.Option(help="training steps of the feature CNN")] = 600,
    seed: int = 0,
) -> None:
    """FID_local, KID_local, precision/recall and the recognisable rate of ``n`` samples, in the
    feature space of a CNN trained (once, cached) on the real images; never Inception FID."""
    check_count(n, "--n", 2)
    check_count(steps, "--steps")
    check_count(feature_steps, "--feature-steps")
    check_seed(seed)
    if data is not None:
        _check_data(data)
    unet = _load_model(model)
    settings = _settings(model)
    from mixlab.attention_arch.moh.data import load_images
    from mixlab.attention_arch.moh.metrics import feature_net
    from mixlab.attention_arch.moh.metrics import score as measure

    real = load_images(
        data or settings["data"], size=unet.config.sample_size, seed=settings["seed"]
    )
    net = feature_net(real.images, real.labels, steps=feature_steps)
    fake = _samples(unet, model, n, steps, 1.0, seed)
    result = measure(net, real.images, fake, seed=seed)
    typer.echo(json.dumps({k: v for k, v in result.items()}, indent=1))
