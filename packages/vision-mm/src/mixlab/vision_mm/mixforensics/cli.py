"""``mixlab-vision mixforensics``: write procedural clips as videos, train a detector on a folder of
videos, score videos (probability and encoder passes), evaluate AUC/AP/ACC per family.

A data folder holds videos (mp4/avi/gif or frame folders) and ``labels.jsonl`` with one
``{"video": <relative path>, "label": 0|1, "family": <name>}`` per line (``family`` optional;
label 1 is fake). Every verb checks its options before it loads a model: bad input is one line
and exit code 2.

mixlab-vision mixforensics make-data --out clips                  (clips/train and clips/test)
mixlab-vision mixforensics train --data clips/train --out runs/sfb
mixlab-vision mixforensics train --data toy --out runs/toy         (the experiment's cached clips)
mixlab-vision mixforensics train --data videos/ --backbone torchvision/resnet18 --checkpoint r18.pth --size 224 --out runs/r18
mixlab-vision mixforensics score --model runs/sfb/model clip1.mp4 clip2.mp4
mixlab-vision mixforensics eval --model runs/sfb/model --data clips/test
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mixlab.shared.checks import (
    check_choice,
    check_count,
    check_fresh_output,
    check_input_folder,
    check_number,
    check_output_folder,
    check_seed,
    read_jsonl,
)

app = typer.Typer(
    help="MixForensics: blend-then-encode detection of AI-generated video.", no_args_is_help=True
)

TOY = "toy"
TRAINABLE = (
    "sfb-bir",
    "sfb",
    "voting",
    "voting-residual",
    "frame-difference",
    "mean-frame",
    "timesformer",
)


def _labelled(data: Path) -> list[dict]:
    check_input_folder(data, "--data", containing=("labels.jsonl",))
    rows = read_jsonl(data / "labels.jsonl", "--data", ("video", "label"))
    root = data.resolve()
    for row in rows:
        if row["label"] not in (0, 1):
            raise ValueError(
                f"--data: labels.jsonl labels must be 0 (real) or 1 (fake), got {row['label']!r}"
            )
        video = Path(str(row["video"]))
        if video.is_absolute() or not (root / video).resolve().is_relative_to(root):
            raise ValueError(  # issue 80: absolute and ../ paths read videos outside --data
                f"--data: labels.jsonl videos must be paths inside the folder, got {str(video)!r}"
            )
    return rows


def _read_all(data: Path, rows: list[dict], frames: int, size: int):
    import torch

    from mixlab.vision_mm.mixforensics.video import read_video

    return torch.stack([read_video(data / row["video"], frames=frames, size=size) for row in rows])


def _check_resumed_options(path: Path, options: dict) -> None:
    """Record a training's options; a resumed one must repeat them (else its checkpoints would
    continue another training)."""
    if path.is_file():
        saved = json.loads(path.read_text())
        changed = sorted(k for k in options.keys() | saved.keys() if saved.get(k) != options.get(k))
        if changed:
            raise ValueError(f"--resume: {path.parent} was trained with other {changed}; repeat its options "
                             "or use another --out")  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(options, indent=1))


@app.command("make-data")
def make_data(
    out: Annotated[
        Path, typer.Option(help="folder for train/ and test/ (mp4 videos + labels.jsonl)")
    ],
    train: Annotated[int, typer.Option(help="training clips (half real, half fakes A–C)")] = 400,
    test: Annotated[
        int,
        typer.Option(help="test clips per kind (real, A–E, splice, splice-control, continuation)"),
    ] = 40,
    frames: int = 8,
    size: int = 32,
    seed: int = 0,
) -> None:
    """Write the experiment's procedural clips as lossless mp4 files with labels."""
    from mixlab.vision_mm.mixforensics.clips import FAMILIES, PARTIAL, SEEN, make_set
    from mixlab.vision_mm.mixforensics.video import write_video

    check_output_folder(out, "--out")
    check_count(train, "--train", 2)
    check_count(test, "--test")
    check_count(frames, "--frames", 2)
    check_count(size, "--size", 16)
    check_seed(seed)
    splits = {"train": ["real"] * (train // 2) + [SEEN[i % 3] for i in range(train - train // 2)],
              "test": [k for k in ("real", *FAMILIES, *PARTIAL) for _ in range(test)]}  # fmt: skip
    for offset, (split, kinds) in enumerate(splits.items()):
        clips = make_set(kinds, seed * 7919 + offset, frames=frames, size=size, split=split)
        lines = []
        for i, (kind, clip) in enumerate(zip(kinds, clips, strict=True)):
            name = f"videos/{i:05d}-{kind}.mp4"
            write_video(out / split / name, clip)
            label = int(kind not in ("real", "splice-control"))
            lines.append(json.dumps({"video": name, "label": label, "family": kind}))
        (out / split / "labels.jsonl").write_text("\n".join(lines) + "\n")
    typer.echo(
        f"wrote {len(splits['train'])} training and {len(splits['test'])} test clips to {out}"
    )


@app.command()
def train(
    data: Annotated[
        str, typer.Option(help="a data folder (labels.jsonl) or 'toy' (the experiment's clips)")
    ],
    out: Annotated[Path, typer.Option(help="folder for model/, losses.json and the checkpoints")],
    system: Annotated[str, typer.Option(help=f"one of {', '.join(TRAINABLE)}")] = "sfb-bir",
    backbone: Annotated[
        str,
        typer.Option(
            help="'small-cnn', 'torchvision/NAME' or 'timm/NAME' (a bare NAME where "
            "only one library has it)"
        ),
    ] = "small-cnn",
    checkpoint: Annotated[
        Path | None, typer.Option(help="local backbone weights (no download)")
    ] = None,
    frames: Annotated[int, typer.Option(help="frames per clip, spread over each video")] = 8,
    size: Annotated[int, typer.Option(help="frames are resized to size × size")] = 32,
    steps: int = 300,
    batch_size: int = 32,
    lr: float = 3e-3,
    blends: Annotated[int, typer.Option(help="R, the fixed blends averaged at inference")] = 4,
    n_max: Annotated[int, typer.Option(help="most frames in one training blend")] = 4,
    alpha: Annotated[
        float, typer.Option(help="Dirichlet concentration of the blend weights")
    ] = 1.0,
    domain: Annotated[
        str, typer.Option(help="blend 'residual' (x − blur x) or 'pixel'")
    ] = "residual",
    consistency: Annotated[
        float, typer.Option(help="λ of BIR's Jensen–Shannon term (sfb-bir)")
    ] = 4.0,
    embedding: Annotated[float, typer.Option(help="μ of BIR's embedding MSE (sfb-bir)")] = 0.0,
    seed: int = 0,
    device: Annotated[
        str, typer.Option(help="'auto' (a GPU when there is one), 'cpu', 'cuda', 'cuda:1', ...")
    ] = "auto",
    resume: Annotated[bool, typer.Option(help="continue from the checkpoints in --out")] = False,
) -> None:
    """Train a detector; the model is saved to OUT/model."""
    import torch

    from mixlab.shared.checkpoint import checkpoint_spacing
    from mixlab.shared.device import check_device_name
    from mixlab.vision_mm.mixforensics.model import build_detector, build_loss, save_detector
    from mixlab.vision_mm.mixforensics.training import train_detector

    check_choice(system, "--system", TRAINABLE)
    check_output_folder(out, "--out")
    check_fresh_output(out, "--out", resume=resume, made=("training",))
    for value, option, low in ((frames, "--frames", 2), (size, "--size", 16), (steps, "--steps", 1),
                               (batch_size, "--batch-size", 1), (blends, "--blends", 1), (n_max, "--n-max", 2)):  # fmt: skip
        check_count(value, option, low)
    check_number(lr, "--lr", lr > 0, "a finite number > 0")
    check_number(alpha, "--alpha", alpha > 0, "a finite number > 0")
    check_choice(domain, "--domain", ("residual", "pixel"))
    check_number(consistency, "--consistency", consistency >= 0, "a finite number >= 0")
    check_number(embedding, "--embedding", embedding >= 0, "a finite number >= 0")
    check_seed(seed)
    check_device_name(device, "--device")
    if data == TOY:
        from mixlab.vision_mm.mixforensics.config import Config
        from mixlab.vision_mm.mixforensics.experiment import dataset

        toy = dataset(Config(seed=seed), "train")
        clips, labels = toy["clips"], toy["labels"]
        frames, size = clips.shape[1], clips.shape[-1]
    if system in ("sfb", "sfb-bir") and blends > frames // 2:  # refused now, not after training
        raise ValueError(f"--blends must be at most --frames // 2 = {frames // 2} (each blend mixes "
                         f">= 2 frames), got {blends}")  # fmt: skip
    if data != TOY:
        rows = _labelled(Path(data))
        clips = _read_all(Path(data), rows, frames, size)
        labels = torch.tensor([row["label"] for row in rows])
    spec = {"system": system, "backbone": backbone, "frames": frames, "size": size, "blends": blends,
            "n_max": n_max, "alpha": alpha, "domain": domain}  # fmt: skip
    options = {**spec, "data": str(data), "checkpoint": None if checkpoint is None else str(checkpoint),
               "steps": steps, "batch_size": batch_size, "lr": lr, "consistency": consistency,
               "embedding": embedding, "seed": seed}  # fmt: skip
    _check_resumed_options(out / "options.json", options)
    torch.manual_seed(seed)
    detector = build_detector(**spec, checkpoint=checkpoint)
    loss = build_loss(system, consistency, embedding)
    history = train_detector(detector, clips, labels, steps, batch_size=batch_size, lr=lr, seed=seed, loss=loss,
                             checkpoint=out / "training", checkpoint_every=checkpoint_spacing(steps), device=device)  # fmt: skip
    save_detector(detector, out / "model", spec)
    (out / "losses.json").write_text(json.dumps(history))
    typer.echo(
        f"trained {system} on {len(clips)} clips for {steps} steps; model in {out / 'model'}"
    )


@app.command()
def score(
    model: Annotated[Path, typer.Option(help="a folder saved by `train` (OUT/model)")],
    videos: Annotated[
        list[Path], typer.Argument(help="video files (mp4/avi/gif) or frame folders")
    ],
) -> None:
    """Print p(fake) and the encoder passes of each video, one JSON line each."""
    import torch

    from mixlab.vision_mm.mixforensics.model import load_detector
    from mixlab.vision_mm.mixforensics.video import read_video

    check_input_folder(model, "--model")
    detector, spec = load_detector(model)
    for path in videos:
        video = read_video(path, frames=spec["frames"], size=spec["size"])
        with torch.no_grad():
            p = float(detector(video[None])[0])
        typer.echo(
            json.dumps({"video": str(path), "p_fake": round(p, 6), "passes": detector.passes})
        )


@app.command("eval")
def evaluate(
    model: Annotated[Path, typer.Option(help="a folder saved by `train` (OUT/model)")],
    data: Annotated[
        Path, typer.Option(help="a data folder (labels.jsonl) with real and fake videos")
    ],
) -> None:
    """AUC, AP and ACC of every fake family against the real videos (JSON)."""
    import numpy as np

    from mixlab.vision_mm.mixforensics.experiment import scores_metrics
    from mixlab.vision_mm.mixforensics.model import load_detector
    from mixlab.vision_mm.mixforensics.training import predict

    check_input_folder(model, "--model")
    rows = _labelled(data)
    if not any(r["label"] == 0 for r in rows) or not any(r["label"] == 1 for r in rows):
        raise ValueError("--data: labels.jsonl needs both real (0) and fake (1) videos")
    detector, spec = load_detector(model)
    clips = _read_all(data, rows, spec["frames"], spec["size"])
    p = predict(detector, clips)
    labels = np.array([r["label"] for r in rows])
    families = np.array([r.get("family", "fake" if r["label"] else "real") for r in rows])
    real = p[labels == 0]
    report = {"all": scores_metrics(real, p[labels == 1]), "passes": detector.passes}
    for family in sorted(set(families[labels == 1])):
        report[family] = scores_metrics(real, p[(labels == 1) & (families == family)])
    typer.echo(json.dumps(report, indent=1))
