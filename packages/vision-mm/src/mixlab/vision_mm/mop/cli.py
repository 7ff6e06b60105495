"""``mixlab-vision mop``: train an MLLM with a privileged modality, evaluate one modality alone,
read the probes' diagnostics, write the demo scenes.

Every verb checks its options and folders before it loads a model: bad input is one line and
exit code 2.

mixlab-vision mop scenes --out demo/train --count 2000
mixlab-vision mop train --data demo/train --encoder toy --lm toy --modalities rgb,depth --out runs/mopx
mixlab-vision mop train --data my_data --encoder clip-folder/ --lm llama-folder/ --out runs/mine
mixlab-vision mop eval --model runs/mopx/model --data demo/test --modality rgb
mixlab-vision mop probes --model runs/mopx/model --data demo/test --modality rgb
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mixlab.shared.checks import check_fresh_output
from mixlab.shared.config import is_count, require
from mixlab.shared.files import atomic_folder

app = typer.Typer(
    help="MoP: Mixture of Probes and cross-modal probe training (MoP-X) for MLLMs with a privileged modality.",
    no_args_is_help=True,
)

SYSTEMS = ("unimodal", "dropout", "resampler", "mop-nodis", "mop-x", "onellm")
"""the systems ``train`` offers (distillation needs a teacher: use the library)"""
TOY = "toy"


def _split_names(text: str, option: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    require(
        len(names) > 0 and len(set(names)) == len(names),
        option,
        "distinct comma-separated names",
        text,
    )
    return names


def _layers(text: str, num_probes: int) -> list[int]:
    try:
        layers = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--layers must be comma-separated integers, got {text!r}") from None
    require(len(layers) == num_probes, "--layers", f"{num_probes} (--probes) layer indices", text)
    return layers


def _quiet() -> None:
    """No progress bars from transformers: an error stays one line on stderr."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def _folder(path: Path, option: str) -> Path:
    if not path.is_dir():
        raise ValueError(f"{option} {path} is not a folder")
    return path


def _encoder(source: str, modalities: dict[str, int], patch: int | None):
    """The shared encoder: ``toy`` (the experiment's cached toy ViT, pre-trained into the cache
    on first use) or a transformers CLIPVisionModel folder; one tokenizer per modality."""
    from mixlab.vision_mm.mop.encoder import SharedEncoder

    if source == TOY:
        from mixlab.vision_mm.mop import experiment
        from mixlab.vision_mm.mop.config import Config

        config = Config()
        unknown = [m for m in modalities if m not in config.modalities]
        require(not unknown, "--modalities", f"names from {list(config.modalities)} with --encoder toy",
                ",".join(modalities))  # fmt: skip
        encoder, _, _, _ = experiment.bases(config)
        for name, channels in modalities.items():
            tokenizer = encoder.tokenizers[name]
            require(channels == tokenizer.channels, "--data", f"{tokenizer.channels}-channel {name} images",
                    f"{channels} channels")  # fmt: skip
        return encoder
    from transformers import CLIPVisionModel

    folder = _folder(Path(source), "--encoder")
    trunk = CLIPVisionModel.from_pretrained(folder)
    size = trunk.config.image_size
    patch = patch or trunk.config.patch_size
    return SharedEncoder(trunk, {m: (c, size, patch) for m, c in modalities.items()})


def _lm(source: str):
    if source == TOY:
        from mixlab.vision_mm.mop import experiment
        from mixlab.vision_mm.mop.config import Config

        _, lm, tokenizer, _ = experiment.bases(Config())
        return lm, tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _folder(Path(source), "--lm")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return AutoModelForCausalLM.from_pretrained(folder), tokenizer


def _stacked(samples, modalities: tuple[str, ...]):
    """Per modality, images [N, C, S, S] (zeros where a sample lacks it) and the present mask."""
    import numpy as np
    import torch

    images, present = {}, {}
    for modality in modalities:
        rows = samples.modality_rows(modality)
        if not rows:
            raise ValueError(f"--data: no sample has the modality {modality!r}")
        shapes = {samples.images[i][modality].shape for i in rows}
        if len(shapes) > 1:
            raise ValueError(
                f"--data: {modality} images must all have one shape, got {sorted(shapes)}"
            )
        (shape,) = shapes
        stacked = np.zeros((len(samples), *shape), dtype=np.float32)
        for i in rows:
            stacked[i] = samples.images[i][modality]
        images[modality] = torch.from_numpy(stacked)
        present[modality] = torch.zeros(len(samples), dtype=torch.bool)
        present[modality][rows] = True
    return images, present


@app.command()
def scenes(
    out: Annotated[Path, typer.Option(help="folder for data.jsonl and the .npy images")],
    count: Annotated[int, typer.Option(help="scenes (one question each)")] = 1000,
    modalities: Annotated[
        str, typer.Option(help="comma-separated: rgb, depth, edge")
    ] = "rgb,depth",
    seed: int = 0,
    size: int = 32,
) -> None:
    """Write the demo's paired RGB/depth scenes and questions as a data folder."""
    from mixlab.vision_mm.mop.data import write_samples
    from mixlab.vision_mm.mop.scenes import make_scenes

    require(is_count(count), "--count", "an integer >= 1", count)
    require(is_count(size, 8), "--size", "an integer >= 8", size)
    require(is_count(seed, 0) and seed < 2**32, "--seed", "an integer in [0, 2**32)", seed)
    names = _split_names(modalities, "--modalities")
    write_samples(out, make_scenes(count, seed, size=size), names)
    typer.echo(f"wrote {count} samples to {out}")


@app.command()
def train(
    data: Annotated[
        Path, typer.Option(help="folder with data.jsonl (see mixlab.vision_mm.mop.data)")
    ],
    out: Annotated[Path, typer.Option(help="folder for model/, history.json and the checkpoint")],
    encoder: Annotated[str, typer.Option(help="a CLIPVisionModel folder, or 'toy'")] = TOY,
    lm: Annotated[str, typer.Option(help="a causal LM folder with its tokenizer, or 'toy'")] = TOY,
    modalities: Annotated[
        str, typer.Option(help="comma-separated modality names of the data")
    ] = "rgb,depth",
    system: Annotated[str, typer.Option(help=f"one of {', '.join(SYSTEMS)}")] = "mop-x",
    deploy: Annotated[str | None, typer.Option(help="unimodal: the modality trained")] = None,
    probes: int = 4,
    queries: int = 8,
    layers: Annotated[
        str | None, typer.Option(help="one encoder hidden state per probe, e.g. 0,2,4,6")
    ] = None,
    aligned: Annotated[
        str | None, typer.Option(help="probes MoP-X aligns, e.g. 2,3 (default: all)")
    ] = None,
    patch: Annotated[
        int | None, typer.Option(help="tokenizer patch size (default: CLIP's)")
    ] = None,
    combine: Annotated[
        str, typer.Option(help="the LM prefix: sum (--queries tokens) or concat")
    ] = "sum",
    steps: int = 600,
    batch_size: int = 64,
    lr: float = 3e-3,
    lm_lr: float = 1e-3,
    lambda_x: float = 1.0,
    lambda_d: float = 0.1,
    seed: int = 0,
    resume: Annotated[bool, typer.Option(help="continue from out/checkpoint")] = False,
) -> None:
    """Train one system on a data folder; each modality can then be served alone."""
    import torch

    from mixlab.vision_mm.mop.data import read_samples
    from mixlab.vision_mm.mop.model import PrivilegedMLLM
    from mixlab.vision_mm.mop.text import encode_qa
    from mixlab.vision_mm.mop.training import fit, system_connector, system_spec

    names = _split_names(modalities, "--modalities")
    require(system in SYSTEMS, "--system", f"one of {list(SYSTEMS)}", system)
    for option, value in (("--probes", probes), ("--queries", queries), ("--steps", steps),
                          ("--batch-size", batch_size)):  # fmt: skip
        require(is_count(value), option, "an integer >= 1", value)
    require(patch is None or is_count(patch), "--patch", "an integer >= 1", patch)
    require(combine in ("sum", "concat"), "--combine", "'sum' or 'concat'", combine)
    require(is_count(seed, 0) and seed < 2**32, "--seed", "an integer in [0, 2**32)", seed)
    if system == "unimodal":
        require(
            deploy in names, "--deploy", f"one of --modalities {list(names)} for unimodal", deploy
        )
    else:
        require(len(names) >= 2, "--modalities", f"two or more names for {system}", modalities)
    probe_layers = None if layers is None else _layers(layers, probes)
    aligned_probes = None if aligned is None else tuple(_layers(aligned, len(aligned.split(","))))
    require(aligned_probes is None or all(0 <= k < probes for k in aligned_probes), "--aligned",
            f"probe indices in [0, {probes - 1}]", aligned)  # fmt: skip
    _folder(data, "--data")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; it must be a folder")
    samples = read_samples(data, names)
    images, present = _stacked(samples, names)
    _quiet()
    shared = _encoder(encoder, {m: x.shape[1] for m, x in images.items()}, patch)
    for modality, x in images.items():  # the tokenizer names what does not fit
        shared.tokenizers[modality](x[:1])
    language_model, tokenizer = _lm(lm)
    encoded = encode_qa(tokenizer, samples.questions, samples.answers)
    torch.manual_seed(seed)
    heads = next(h for h in (8, 4, 2, 1) if shared.dim % h == 0)
    connector = system_connector(system, shared.dim, shared.num_hidden_states, num_probes=probes,
                                 queries=queries, heads=heads, layers=probe_layers, combine=combine)  # fmt: skip
    model = PrivilegedMLLM(shared, connector, language_model)
    deployed = deploy or names[0]
    privileged = next((m for m in names if m != deployed), deployed)
    spec = system_spec(system, names, deploy=deployed, privileged=privileged, lambda_x=lambda_x,
                       lambda_d=lambda_d, aligned=aligned_probes, symmetric=True)  # fmt: skip
    checkpoint = out / "checkpoint"
    check_fresh_output(out, "--out", resume=resume, made=("checkpoint/step.txt",))

    def batch(step: int) -> dict:
        rows = torch.randint(
            len(samples),
            (batch_size,),
            generator=torch.Generator().manual_seed(seed * 1_000_003 + step),
        )
        return {"images": {m: x[rows] for m, x in images.items()}, "present": {m: p[rows] for m, p in present.items()},
                "input_ids": encoded.input_ids[rows], "attention_mask": encoded.attention_mask[rows],
                "labels": encoded.labels[rows]}  # fmt: skip

    history = fit(
        model, batch, spec, steps, lr=lr, lm_lr=lm_lr, seed=seed, checkpoint=str(checkpoint)
    )
    with atomic_folder(out / "model") as folder:  # a kill while saving leaves no half model
        model.save_pretrained(folder, tokenizer)
    (out / "history.json").write_text(json.dumps(history) + "\n")
    typer.echo(f"trained {system} for {steps} steps; model in {out / 'model'}")


def _evaluation_inputs(model_dir: Path, data: Path, modality: str):
    from transformers import AutoTokenizer

    from mixlab.vision_mm.mop.data import read_samples
    from mixlab.vision_mm.mop.model import PrivilegedMLLM
    from mixlab.vision_mm.mop.text import encode_qa

    _folder(model_dir, "--model")
    _folder(data, "--data")
    _quiet()
    model = PrivilegedMLLM.from_pretrained(model_dir)
    require(
        modality in model.modalities,
        "--modality",
        f"one of the model's {model.modalities}",
        modality,
    )
    samples = read_samples(data)
    images, _ = _stacked(samples, (modality,))
    rows = samples.modality_rows(modality)
    model.encoder.tokenizers[modality](images[modality][:1])  # names an input that does not fit
    tokenizer = AutoTokenizer.from_pretrained(model_dir / "lm")
    encoded = encode_qa(
        tokenizer, [samples.questions[i] for i in rows], [samples.answers[i] for i in rows]
    )
    return model, images[modality][rows], encoded, [samples.types[i] for i in rows]


@app.command("eval")
def evaluate(
    model: Annotated[Path, typer.Option(help="a model folder written by train")],
    data: Annotated[Path, typer.Option(help="folder with data.jsonl")],
    modality: Annotated[str, typer.Option(help="the one modality served")],
) -> None:
    """Exact-match accuracy per question type (JSON) of the samples that have ``--modality``."""
    from mixlab.vision_mm.mop.training import accuracy_by_type

    loaded, images, encoded, types = _evaluation_inputs(model, data, modality)
    typer.echo(json.dumps(accuracy_by_type(loaded, modality, images, encoded, types), indent=1))


@app.command()
def probes(
    model: Annotated[Path, typer.Option(help="a model folder written by train")],
    data: Annotated[Path, typer.Option(help="folder with data.jsonl")],
    modality: Annotated[str, typer.Option(help="the one modality served")],
) -> None:
    """Probe diagnostics (JSON): mean pairwise cosine, effective rank, router entropy."""
    import torch

    from mixlab.vision_mm.mop.losses import probe_diagnostics

    loaded, images, _, _ = _evaluation_inputs(model, data, modality)
    with torch.no_grad():
        _, output = loaded.visual_prefix(modality, images)
    typer.echo(json.dumps(probe_diagnostics(output.probes, output.weights), indent=1))
