"""``mixlab-vision moa3cir``: train a composed-retrieval model, index a gallery once, search it,
evaluate R@1/10/50; write the toy catalogue in FashionIQ's layout.

Every verb checks its options and folders before it loads a model: bad input is one line and
exit code 2.

mixlab-vision moa3cir make-data --out demo
mixlab-vision moa3cir train --data toy --out runs/toy            (the experiment's cached towers)
mixlab-vision moa3cir train --data demo --out runs/demo --tower-steps 600 --steps 600
mixlab-vision moa3cir train --data fashioniq/ --clip ViT-B-32 --pretrained vit-b-32.bin --out runs/fiq
mixlab-vision moa3cir index --model runs/demo/model --gallery demo/images --out gallery.safetensors
mixlab-vision moa3cir search --model runs/demo/model --index gallery.safetensors --image shirt.png --text "in blue with dots"
mixlab-vision moa3cir eval --model runs/demo/model --data demo
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
    check_input_file,
    check_input_folder,
    check_number,
    check_output_file,
    check_output_folder,
    check_seed,
)
from mixlab.shared.files import atomic_folder

app = typer.Typer(
    help="MoA3CIR: composed image retrieval with item descriptions and attribute-routed attention.",
    no_args_is_help=True,
)

TOY = "toy"
HEADS = ("moa3cir", "moa3-dense", "combiner")


def _dataset(data: Path, split: str, descriptions: Path | None):
    """FashionIQ's layout (``captions/``) or Shoes' (``relative_captions_shoes.json``);
    descriptions from ``--descriptions`` or the folder's ``descriptions.jsonl``."""
    from mixlab.vision_mm.moa3cir.data import load_fashioniq, load_shoes

    check_input_folder(data, "--data")
    if descriptions is None and (data / "descriptions.jsonl").is_file():
        descriptions = data / "descriptions.jsonl"
    if (data / "captions").is_dir():
        return load_fashioniq(data, split, descriptions=descriptions)
    if (data / "relative_captions_shoes.json").is_file():
        return load_shoes(data, "eval" if split == "val" else split, descriptions=descriptions)
    raise ValueError(f"--data: {str(data)!r} is neither FashionIQ's layout (captions/) nor Shoes' "
                     "(relative_captions_shoes.json)")  # fmt: skip


def _towers(clip: str, pretrained: Path | None, image_size: int, share: str):
    from mixlab.vision_mm.moa3cir.towers import ClipTowers, tiny_clip

    if clip == "tiny":
        config = {"image_size": image_size, "patch_size": 4 if image_size <= 64 else 16}
        return ClipTowers(tiny_clip(**config), share=share), config
    import open_clip

    if clip not in open_clip.list_models():
        raise ValueError(f"--clip must be 'tiny' or an open_clip model name, got {clip!r}")
    from mixlab.shared.files import checkpoint_errors

    with checkpoint_errors(pretrained or clip, f"{clip} weights file"):  # garbage (issue 80)
        model = open_clip.create_model(
            clip, pretrained=None if pretrained is None else str(pretrained)
        )
    return ClipTowers(model, share=share), {"name": clip}


def _head_options(
    head: str, groups: int, heads: int, shared_heads: int, top_k: int, descriptions: bool
) -> dict:
    dense = head == "moa3-dense"
    return {"heads": heads, "groups": 1 if dense else groups, "shared_heads": 0 if dense else shared_heads,
            "routed": not dense, "top_k": top_k or None, "descriptions": descriptions}  # fmt: skip


@app.command("make-data")
def make_data(
    out: Annotated[
        Path, typer.Option(help="folder for captions/, image_splits/, images/, descriptions.jsonl")
    ],
    train: Annotated[int, typer.Option(help="training triplets")] = 2000,
    val: Annotated[int, typer.Option(help="validation triplets")] = 500,
    size: int = 32,
    seed: int = 0,
) -> None:
    """Write the procedural catalogue as a FashionIQ-layout folder (category ``toy``)."""
    from mixlab.vision_mm.moa3cir.data import write_toy

    check_output_folder(out, "--out")
    check_count(train, "--train")
    check_count(val, "--val")
    check_count(size, "--size", 16)
    check_seed(seed)
    write_toy(out, train=train, val=val, size=size, seed=seed)
    typer.echo(f"wrote {train} + {val} triplets to {out}")


@app.command()
def train(
    data: Annotated[
        str,
        typer.Option(
            help="a FashionIQ- or Shoes-layout folder, or 'toy' (the experiment's catalogue)"
        ),
    ],
    out: Annotated[Path, typer.Option(help="folder for model/, losses.json and the checkpoints")],
    clip: Annotated[
        str, typer.Option(help="'tiny' (trained here) or an open_clip model name")
    ] = "tiny",
    pretrained: Annotated[
        Path | None, typer.Option(help="local weights for --clip (no download)")
    ] = None,
    descriptions: Annotated[Path | None, typer.Option(help="JSONL of {id, description}")] = None,
    head: Annotated[str, typer.Option(help=f"one of {', '.join(HEADS)}")] = "moa3cir",
    share: Annotated[
        str, typer.Option(help="'clip' (CLIP's two encoders) or 'none' (five towers)")
    ] = "clip",
    image_size: Annotated[int, typer.Option(help="image side for --clip tiny")] = 32,
    tower_steps: Annotated[int, typer.Option(help="phase 1 (0: keep the towers as loaded)")] = 600,
    steps: Annotated[int, typer.Option(help="phase 2")] = 600,
    batch_size: int = 64,
    tower_lr: float = 5e-4,
    lr: float = 1e-3,
    heads: int = 16,
    groups: int = 4,
    shared_heads: int = 4,
    top_k: Annotated[int, typer.Option(help="groups kept per query (0: soft)")] = 0,
    no_descriptions: Annotated[
        bool, typer.Option(help="three towers: ignore descriptions")
    ] = False,
    route_supervision: Annotated[
        float | None,
        typer.Option(
            help="weight of the router's NLL of each triplet's edited attribute (toy "
            "data only: it knows the attribute; default 1 there, one group per attribute)"
        ),
    ] = None,
    seed: int = 0,
    resume: Annotated[bool, typer.Option(help="continue from the checkpoints in --out")] = False,
) -> None:
    """Train the towers (phase 1) and the fusion head on frozen towers (phase 2)."""
    import torch

    from mixlab.vision_mm.moa3cir.model import CIRModel, Combiner, MoA3Head

    check_output_folder(out, "--out")
    check_choice(head, "--head", HEADS)
    check_choice(share, "--share", ("clip", "none"))
    for option, value in (("--steps", steps), ("--batch-size", batch_size), ("--heads", heads),
                          ("--groups", groups), ("--image-size", image_size)):  # fmt: skip
        check_count(value, option)
    for option, value in (
        ("--tower-steps", tower_steps),
        ("--shared-heads", shared_heads),
        ("--top-k", top_k),
    ):
        check_count(value, option, 0)
    for option, value in (("--lr", lr), ("--tower-lr", tower_lr)):
        check_number(value, option, value > 0, "a number > 0")
    if route_supervision is not None:
        check_number(
            route_supervision, "--route-supervision", route_supervision >= 0, "a number >= 0"
        )
        if data != TOY and route_supervision > 0:
            raise ValueError("--route-supervision: only --data toy knows each triplet's edited "
                             "attribute; leave it out for a dataset folder")  # fmt: skip
    check_seed(seed)
    if pretrained is not None:
        check_input_file(pretrained, "--pretrained")
    check_fresh_output(out, "--out", resume=resume, made=("training",))
    options = _head_options(head, groups, heads, shared_heads, top_k, not no_descriptions)
    if data == TOY:
        supervision = 1.0 if route_supervision is None else route_supervision
        model, clip_config, losses = _train_toy(head, options, steps, batch_size, lr, supervision,
                                                seed, out)  # fmt: skip
    else:
        dataset = _dataset(Path(data), "train", descriptions)
        towers, clip_config = _towers(clip, pretrained, image_size, share)
        torch.manual_seed(seed)
        if head == "combiner":
            fusion = Combiner(towers.embed_dim, 4 * towers.embed_dim, 8 * towers.embed_dim)
        else:
            fusion = MoA3Head(towers.image_width, towers.text_width, towers.embed_dim, **options)
        model = CIRModel(towers, fusion)
        losses = _train_folder(
            model, dataset, tower_steps, steps, batch_size, tower_lr, lr, seed, out
        )
    with atomic_folder(out / "model") as folder:  # a kill while saving leaves no half model
        model.save_pretrained(folder, clip_config)
    (out / "losses.json").write_text(json.dumps(losses) + "\n")
    typer.echo(f"trained {head}; model in {out / 'model'}")


def _train_toy(
    head: str, options: dict, steps: int, batch_size: int, lr: float, route_supervision: float,
    seed: int, out: Path,
):  # fmt: skip
    """The experiment's cached towers (trained on first use) and a head on their features, a
    routed head's router supervised with each triplet's edited attribute."""
    import torch

    from mixlab.vision_mm.moa3cir import experiment
    from mixlab.vision_mm.moa3cir.config import Config
    from mixlab.vision_mm.moa3cir.model import CIRModel, MoA3Head
    from mixlab.vision_mm.moa3cir.training import train_head

    config = Config(seed=0)
    towers, _, _ = experiment.towers(config)
    torch.manual_seed(seed)
    if head == "combiner":
        fusion = experiment.make_head(config, "combiner")
    else:
        fusion = MoA3Head(
            towers.image_width, towers.text_width, towers.embed_dim, dim=config.dim, **options
        )
    system = "moa3cir" if options["descriptions"] else "moa3cir-3tower"
    features = experiment._training_features(config, system)
    losses = train_head(fusion, features, steps, batch_size=batch_size, lr=lr, seed=seed,
                        route_supervision=route_supervision, checkpoint=out / "training" / "head")  # fmt: skip
    return CIRModel(towers, fusion), experiment._clip_config(config), {"head": losses}


def _train_folder(model, dataset, tower_steps, steps, batch_size, tower_lr, lr, seed, out: Path):
    from mixlab.vision_mm.moa3cir.data import ImageFiles
    from mixlab.vision_mm.moa3cir.training import TripletData, fit_two_phase

    size = model.towers.image_size
    references = [r for r, _, _ in dataset.triplets]
    targets = [t for _, _, t in dataset.triplets]
    # images are read batch by batch: a real training set does not fit in memory as one tensor
    data = TripletData(ImageFiles([dataset.paths[i] for i in references], size),
                       ImageFiles([dataset.paths[i] for i in targets], size), [t for _, t, _ in dataset.triplets],
                       dataset.description_list(references), dataset.description_list(targets))  # fmt: skip
    return fit_two_phase(model, data, tower_steps, steps, batch_size=batch_size, tower_lr=tower_lr, lr=lr,
                         seed=seed, checkpoint=out / "training")  # fmt: skip


def _model(folder: Path):
    from mixlab.vision_mm.moa3cir.model import CIRModel

    check_input_folder(folder, "--model", ("moa3cir.json", "model.safetensors"))
    return CIRModel.from_pretrained(folder)


@app.command()
def index(
    model: Annotated[Path, typer.Option(help="a model folder written by train")],
    gallery: Annotated[
        Path, typer.Option(help="a folder of images (ids: file names without suffix)")
    ],
    out: Annotated[Path, typer.Option(help="the index file (.safetensors)")],
    descriptions: Annotated[
        Path | None, typer.Option(help="JSONL of {id, description} for every image")
    ] = None,
    batch_size: int = 256,
) -> None:
    """Embed a gallery once."""
    from mixlab.vision_mm.moa3cir.data import image_folder, index_files, read_descriptions

    check_output_file(out, "--out", (".safetensors",))
    check_count(batch_size, "--batch-size")
    paths = image_folder(gallery)
    ids = sorted(paths)
    texts = None
    if descriptions is not None:
        known = read_descriptions(descriptions)
        missing = [i for i in ids if i not in known]
        if missing:
            raise ValueError(
                f"--descriptions has no description of {len(missing)} gallery images, e.g. {missing[0]!r}"
            )
        texts = [known[i] for i in ids]
    loaded = _model(model)
    index_files(loaded, [paths[i] for i in ids], ids, texts, batch_size).save(out)
    typer.echo(f"indexed {len(ids)} images into {out}")


@app.command()
def search(
    model: Annotated[Path, typer.Option(help="a model folder written by train")],
    index: Annotated[Path, typer.Option(help="an index file written by index")],
    image: Annotated[Path, typer.Option(help="the reference image")],
    text: Annotated[str, typer.Option(help="the modification, e.g. 'the same in blue with dots'")],
    description: Annotated[
        str | None, typer.Option(help="the reference item's description")
    ] = None,
    k: int = 10,
) -> None:
    """The top-k gallery ids (JSON) for one composed query."""
    from mixlab.vision_mm.moa3cir.data import load_images
    from mixlab.vision_mm.moa3cir.model import RetrievalIndex

    check_input_file(index, "--index", (".safetensors",))
    check_input_file(image, "--image")
    if not text.strip():
        raise ValueError("--text must be a non-empty modification text")
    if description is not None and not description.strip():
        raise ValueError("--description must be non-empty when given")
    check_count(k, "--k")
    gallery = RetrievalIndex.load(index)
    check_count(k, "--k", 1, len(gallery))
    loaded = _model(model)
    images = load_images([image], loaded.towers.image_size)
    scores, ids = loaded.search(
        gallery, images, [text], None if description is None else [description], k
    )
    typer.echo(
        json.dumps(
            [{"id": i, "score": round(float(s), 4)} for i, s in zip(ids[0], scores[0], strict=True)]
        )
    )


@app.command("eval")
def evaluate(
    model: Annotated[Path, typer.Option(help="a model folder written by train")],
    data: Annotated[Path, typer.Option(help="a FashionIQ- or Shoes-layout folder")],
    split: Annotated[str, typer.Option(help="FashionIQ: val or test; Shoes: eval")] = "val",
    descriptions: Annotated[Path | None, typer.Option(help="JSONL of {id, description}")] = None,
    batch_size: int = 256,
) -> None:
    """R@1/10/50 (JSON) of the split's triplets against its gallery (per category for FashionIQ)."""
    from mixlab.vision_mm.moa3cir.data import evaluate_dataset

    check_count(batch_size, "--batch-size")
    dataset = _dataset(data, split, descriptions)
    typer.echo(
        json.dumps(evaluate_dataset(_model(model), dataset, batch_size=batch_size), indent=1)
    )
