"""``mixlab-attn mol``: route a LLaVA's projector over its vision encoder's layers by the question.

mixlab-attn mol toy --out runs/toy-llava                 (the toy MLLM as a transformers folder)
mixlab-attn mol data --out runs/vqa --n 600              (procedural VQA as images + data.jsonl)
mixlab-attn mol train --model runs/toy-llava --data runs/vqa --granularity hybrid --out runs/mol
mixlab-attn mol eval --model runs/mol --data runs/vqa-test
mixlab-attn mol routes --model runs/mol --image runs/vqa/00000.png --question "what colour is ..."

``--model`` is a LLaVA folder (``LlavaForConditionalGeneration`` and its processor, e.g. a local
LLaVA-1.5), ``toy`` (the cached toy), or a folder ``train`` wrote (the LLaVA plus ``mol/``, the
router). A killed ``train`` resumes from its checkpoints when run again with ``--resume``.
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
    check_output_folder,
    check_seed,
)

app = typer.Typer(
    help="MoL: Mixture of Layers, instruction-conditioned routing over a vision encoder's layers.",
    no_args_is_help=True,
)

MIXERS = ("image", "patch", "hybrid", "static", "uniform", "concat")
Model = Annotated[str, typer.Option(help="a LLaVA folder, 'toy', or a folder `mol train` wrote")]


def _load(model: str):
    """(MoLLlava, processor): the router of ``model/mol`` when there is one, else the plain
    LLaVA (its own ``vision_feature_layer``)."""
    import torch
    from transformers import AutoProcessor, LlavaForConditionalGeneration
    from transformers.utils import logging

    from mixlab.attention_arch.mol.layers import FixedLayer
    from mixlab.attention_arch.mol.llava import MoLLlava

    logging.disable_progress_bar()  # stderr keeps to our own lines (errors: one line, exit 2)
    logging.set_verbosity_error()
    torch.set_flush_denormal(True)
    if model == "toy":
        from mixlab.attention_arch.mol.toy import toy_llava

        llava, processor, _ = toy_llava(log=typer.echo)
    else:
        check_input_folder(Path(model), "--model", containing=("config.json",))
        kind = json.loads((Path(model) / "config.json").read_text()).get("model_type")
        if kind != "llava":
            raise ValueError(f"--model must be a LLaVA folder (model_type 'llava'), got {kind!r}")
        llava = LlavaForConditionalGeneration.from_pretrained(model).eval()
        processor = AutoProcessor.from_pretrained(model)
    if (Path(model) / "mol").is_dir():
        return MoLLlava.load_router(llava, Path(model) / "mol"), processor
    config = llava.config
    wrapped = MoLLlava(llava, FixedLayer(config.vision_config.hidden_size, config.vision_feature_layer,
                                         config.vision_config.num_hidden_layers,
                                         default_layer=config.vision_feature_layer))  # fmt: skip
    return wrapped, processor


def _pixels(processor, paths: list[Path]):
    from PIL import Image

    images = [Image.open(p).convert("RGB") for p in paths]
    return processor.image_processor(images, return_tensors="pt")["pixel_values"]


def _parse_layers(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--layers must be comma-separated integers, got {text!r}") from None


@app.command()
def toy(
    out: Annotated[Path, typer.Option(help="folder for the toy LLaVA")] = Path("runs/toy-llava"),
) -> None:
    """Train (once, into the cache) and write the toy LLaVA as a transformers folder."""
    from mixlab.attention_arch.mol.toy import save_toy, toy_llava

    check_output_folder(out, "--out")
    llava, processor, info = toy_llava(log=typer.echo)
    save_toy(llava, processor, info, out)
    typer.echo(f"wrote {out} (encoder accuracy {info['encoder_accuracy']:.3f})")


@app.command()
def data(
    out: Annotated[Path, typer.Option(help="folder for the images and data.jsonl")] = Path(
        "runs/vqa"
    ),
    n: Annotated[int, typer.Option(help="examples, the question types in turn")] = 600,
    size: Annotated[
        int, typer.Option(help="image side in pixels (the toy's, ToySpec.size, is 32)")
    ] = 32,
    seed: int = 0,
) -> None:
    """Write procedural VQA (V*-, HR-Bench-, CharXiv-like and the semantic control)."""
    from mixlab.attention_arch.mol.data import write_records
    from mixlab.attention_arch.mol.tasks import make_vqa

    check_count(n, "--n")
    check_count(size, "--size", 32)
    check_seed(seed)
    check_output_folder(out, "--out")
    vqa = make_vqa(n, size=size, seed=seed)
    write_records(out, vqa.images, vqa.questions, vqa.answers, vqa.tasks)
    typer.echo(f"wrote {n} examples to {out}")


@app.command()
def train(
    model: Model = "toy",
    data: Annotated[Path, typer.Option(help="folder with images and data.jsonl")] = Path(
        "runs/vqa"
    ),
    out: Annotated[Path, typer.Option(help="folder for the LLaVA, mol/ and checkpoints")] = Path(
        "runs/mol"
    ),
    granularity: Annotated[str, typer.Option(help=f"one of {MIXERS}")] = "hybrid",
    layers: Annotated[
        str | None,
        typer.Option(
            help="candidate layers, e.g. '1,2,3,4,5' (default: "
            "every other layer and the default one)"
        ),
    ] = None,
    tune: Annotated[
        str, typer.Option(help="'router', 'projector' (and router) or 'all' (and the LM)")
    ] = "projector",
    top_k: Annotated[int | None, typer.Option(help="keep the k largest weights per token")] = None,
    steps: int = 600,
    batch_size: int = 16,
    lr: float = 5e-4,
    seed: int = 0,
    resume: Annotated[bool, typer.Option(help="continue from the checkpoints in --out")] = False,
) -> None:
    """Wrap the LLaVA with MoL (or an instruction-blind mixer) and train on the data folder."""
    import torch

    from mixlab.attention_arch.mol.data import encode_prompts, image_token_count, load_records
    from mixlab.attention_arch.mol.layers import LayerConcat
    from mixlab.attention_arch.mol.llava import MoLLlava
    from mixlab.attention_arch.mol.training import TRAINABLE, TrainSpec
    from mixlab.attention_arch.mol.training import train as train_model

    check_choice(granularity, "--granularity", MIXERS)
    check_choice(tune, "--tune", TRAINABLE)
    check_count(steps, "--steps")
    check_count(batch_size, "--batch-size")
    check_number(lr, "--lr", 0 < lr < 1, "a number in (0, 1)")
    check_seed(seed)
    check_output_folder(out, "--out")
    check_fresh_output(out, "--out", resume=resume, made=("checkpoints", "train.json"))
    records = load_records(data)
    candidate = _parse_layers(layers)
    wrapped, processor = _load(model)
    llava = wrapped.llava
    torch.manual_seed(seed)
    if granularity == "concat":
        depth = llava.config.vision_config.num_hidden_layers
        default = llava.config.vision_feature_layer
        candidate = candidate or sorted({*range(2, depth + 1, 2), default % (depth + 1)})
        wrapped = MoLLlava(llava, LayerConcat(candidate, depth))
    else:
        wrapped = MoLLlava.from_llava(llava, candidate, granularity=granularity, top_k=top_k)
    prompts = encode_prompts(processor.tokenizer, records.questions, records.answers,
                             image_tokens=image_token_count(llava.config),
                             image_token=processor.image_token)  # fmt: skip
    pixels = _pixels(processor, records.images)

    def batch_of(index):
        return wrapped.vision_states(pixels[index]), prompts.select(index)

    spec = TrainSpec(steps=steps, batch_size=batch_size, lr=lr, trainable=tune, seed=seed,
                     checkpoint_every=max(1, steps // 10))  # fmt: skip
    if resume:
        typer.echo(f"resuming from the checkpoints in {out}")
    history = train_model(wrapped, batch_of, len(records), spec, out_dir=out, resume=resume)
    llava.save_pretrained(out)
    processor.save_pretrained(out)
    wrapped.save_router(out / "mol")
    settings = {"model": model, "data": str(data), "granularity": granularity, "tune": tune,
                "steps": steps, "seed": seed, "history": history}  # fmt: skip
    (out / "train.json").write_text(json.dumps(settings, indent=1))
    typer.echo(f"{granularity}: final loss {history[-1]['loss']:.4f}; saved {out}")


@app.command("eval")
def evaluate(
    model: Model = "runs/mol",
    data: Annotated[Path, typer.Option(help="folder with images and data.jsonl")] = Path(
        "runs/vqa"
    ),
    batch_size: int = 32,
) -> None:
    """Exact match of the greedy answer's first word, per task and overall (JSON)."""
    import torch

    from mixlab.attention_arch.mol.data import encode_prompts, image_token_count, load_records

    check_count(batch_size, "--batch-size")
    records = load_records(data)
    wrapped, processor = _load(model)
    tokenizer = processor.tokenizer
    hits = []
    for begin in range(0, len(records), batch_size):
        chunk = slice(begin, begin + batch_size)
        prompts = encode_prompts(tokenizer, records.questions[chunk], None, left_pad=True,
                                 image_tokens=image_token_count(wrapped.llava.config),
                                 image_token=processor.image_token)  # fmt: skip
        with torch.no_grad():
            generated = wrapped.generate(prompts.input_ids, prompts.attention_mask,
                                         pixel_values=_pixels(processor, records.images[chunk]),
                                         max_new_tokens=8, do_sample=False)  # fmt: skip
        texts = tokenizer.batch_decode(
            generated[:, prompts.input_ids.shape[1] :], skip_special_tokens=True
        )
        for text, answer in zip(texts, records.answers[chunk], strict=True):
            words = text.strip().lower().split()
            hits.append(bool(words) and words[0].strip(".,!?") == answer.strip().lower())
    result = {"all": sum(hits) / len(hits), "n": len(hits)}
    for task in sorted(set(records.tasks)):
        picked = [h for h, t in zip(hits, records.tasks, strict=True) if t == task]
        result[task] = sum(picked) / len(picked)
    typer.echo(json.dumps(result, indent=1))


@app.command()
def routes(
    model: Model = "runs/mol",
    image: Annotated[Path, typer.Option(help="an image file")] = Path("image.png"),
    question: Annotated[str, typer.Option(help="the instruction")] = "what is the large shape ?",
) -> None:
    """π over the candidate layers for one image and question (mean over patches; JSON)."""
    import torch

    from mixlab.attention_arch.mol.data import encode_prompts, image_token_count

    check_input_file(image, "--image")
    if not question.strip():
        raise ValueError("--question must be a non-empty instruction")
    wrapped, processor = _load(model)
    prompts = encode_prompts(processor.tokenizer, [question], None,
                             image_tokens=image_token_count(wrapped.llava.config),
                             image_token=processor.image_token)  # fmt: skip
    with torch.no_grad():
        _, mixed = wrapped.mix(prompts.input_ids, prompts.attention_mask,
                               pixel_values=_pixels(processor, [image]))  # fmt: skip
    weights = mixed.weights.mean(1) if mixed.weights.dim() == 3 else mixed.weights
    pi = {
        str(layer): round(float(w), 4)
        for layer, w in zip(wrapped.mol.layers, weights[0], strict=True)
    }
    typer.echo(json.dumps({"question": question, "pi": pi}, indent=1))
