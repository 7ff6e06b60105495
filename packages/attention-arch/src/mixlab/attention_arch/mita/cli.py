"""``mixlab-attn mita``: swap MiTA into a timm ViT, time attention kinds, train on cluttered digits.

mixlab-attn mita swap --model vit_small_patch16_224 --checkpoint deit_s.safetensors --out mita_s.safetensors
mixlab-attn mita bench --tokens 1024 4096 --heads 6 --head-dim 64
mixlab-attn mita train --attention mita --steps 300 --out runs/mita-digits
"""

from __future__ import annotations

import json
import math
import os
import pickle
from pathlib import Path
from typing import Annotated

import typer

from mixlab.attention_arch.mita.config import check_budget, check_kind, matched_config
from mixlab.shared.checks import (
    check_count,
    check_input_file,
    check_output_file,
    check_output_folder,
    check_seed,
)
from mixlab.shared.config import is_count
from mixlab.shared.files import (
    SIDECAR_KEY,
    CheckpointError,
    checkpoint_errors,
    read_sidecar,
    write_json_atomic,
    write_sidecar,
)

app = typer.Typer(
    help="MiTA: Mixture-of-Top-k Attention as a drop-in for timm vision transformers.",
    no_args_is_help=True,
)

PoolSize = Annotated[int, typer.Option(help="landmark grid p (M = p² landmarks)")]
TopK = Annotated[int, typer.Option(help="routed keys per query (k)")]
SWAPPED_FORMAT = "mixlab.mita.swapped/1"
TRAINED_FORMAT = "mixlab.mita.digits_vit/1"


# --- checks that run before anything is built ------------------------------------------------


def _kind_config(attention: str, pool_size: int, top_k: int) -> tuple[int, dict]:
    """(key budget, ``attention``'s settings) at MiTA's budget of pool_size² + top_k keys per
    query, the options checked first."""
    check_kind(attention, "--attention")
    check_count(pool_size, "--pool-size")
    check_count(top_k, "--top-k")
    budget = pool_size * pool_size + top_k
    try:
        return budget, matched_config(attention, budget, pool_size)
    except ValueError as error:  # its message speaks of key_budget = pool_size² + top_k
        raise ValueError(f"--pool-size {pool_size} / --top-k {top_k}: {error}") from error


def _check_fits(attention: str, budget: int, pool_size: int, grid: tuple[int, int]) -> None:
    problem = check_budget(attention, budget, pool_size, grid)
    if problem:
        raise ValueError(f"--pool-size / --top-k do not fit: {problem}")


def _save_tensors(tensors: dict, path: Path) -> None:
    """safetensors through a temporary name, so a killed write leaves no half file."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(partial))
    os.replace(partial, path)


def _check_own_sidecar(checkpoint: Path) -> None:
    """A checkpoint that ``swap --out`` wrote has a sidecar beside it: check it (and the SHA-256
    of the tensors) before loading. A ``.json`` of the same name that is not JSON counts as one."""
    sidecar = checkpoint.with_suffix(".json")
    if checkpoint.suffix != ".safetensors" or not sidecar.is_file():
        return
    try:
        data = json.loads(sidecar.read_text(encoding="utf-8"))
        ours = isinstance(data, dict) and (
            SIDECAR_KEY in data or data.get("format") == SWAPPED_FORMAT
        )
    except (ValueError, UnicodeDecodeError):
        ours = True
    if ours:
        read_sidecar(sidecar, expect={"format": str, "model": str, "attention": str})


def _load_timm_checkpoint(vit, checkpoint: Path) -> None:
    """A user's timm checkpoint into ``vit``; anything damaged, foreign or of another
    architecture is one :class:`CheckpointError` naming the file."""
    from timm.models import load_checkpoint

    with checkpoint_errors(checkpoint, "timm checkpoint"):
        try:
            load_checkpoint(vit, str(checkpoint))
        except (RuntimeError, pickle.UnpicklingError, NotImplementedError, AssertionError) as error:
            detail = " ".join(str(error).split())[:300] or type(error).__name__
            raise CheckpointError(
                f"{checkpoint}: damaged or not a timm checkpoint of this model "
                f"({type(error).__name__}: {detail})"
            ) from error


# --- verbs -------------------------------------------------------------------------------------


@app.command()
def swap(
    model: Annotated[str, typer.Option(help="timm model name, e.g. vit_small_patch16_224")],
    checkpoint: Annotated[
        Path | None, typer.Option(help="local weights (.safetensors / .pth) to load; none: random")
    ] = None,
    attention: Annotated[str, typer.Option(help="attention kind to swap in")] = "mita",
    pool_size: PoolSize = 5,
    top_k: TopK = 25,
    img_size: Annotated[int | None, typer.Option(help="image size (default: the model's)")] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="write the swapped state dict here (.safetensors, with a .json sidecar)"),
    ] = None,
) -> None:
    """Swap every attention block of a timm ViT or EVA, check a forward pass, report attention
    FLOPs."""
    budget, config = _kind_config(attention, pool_size, top_k)
    if img_size is not None:
        check_count(img_size, "--img-size")
    if checkpoint is not None:
        check_input_file(checkpoint, "--checkpoint")
        _check_own_sidecar(checkpoint)
    if out is not None:
        check_output_file(out, "--out", suffixes=(".safetensors",))

    import timm
    import torch

    from mixlab.attention_arch.mita.attention import FullAttention
    from mixlab.attention_arch.mita.swap import attention_modules, replace_attention

    if not timm.is_model(model):
        raise ValueError(
            f"--model must be a timm model name (see timm.list_models()), got {model!r}"
        )
    kwargs = {"img_size": img_size} if img_size else {}
    try:
        vit = timm.create_model(model, pretrained=False, **kwargs)
    except (RuntimeError, TypeError, ValueError, AssertionError) as error:
        raise ValueError(f"--model {model} {kwargs or ''}: {error}") from error
    grid = getattr(getattr(vit, "patch_embed", None), "grid_size", None)
    if grid is None:
        raise ValueError(f"--model {model} is not a vision transformer with a patch grid")
    _check_fits(attention, budget, pool_size, tuple(grid))
    if checkpoint is not None:
        _load_timm_checkpoint(vit, checkpoint)
    keys = set(vit.state_dict())
    replace_attention(vit, attention, **config)
    same = set(vit.state_dict()) == keys
    channels, size = vit.patch_embed.proj.in_channels, vit.patch_embed.img_size
    with torch.inference_mode():
        output = vit.eval()(torch.zeros(1, channels, *size))
    layers = attention_modules(vit)
    tokens = layers[0].num_prefix_tokens + vit.patch_embed.num_patches
    flops = sum(layer.attention_flops(tokens) for layer in layers)
    executed = sum(layer.executed_flops(tokens) for layer in layers)
    full = sum(FullAttention.attention_flops(layer, tokens) for layer in layers)
    path = getattr(layers[0], "path", lambda n: None)(tokens)
    typer.echo(
        f"{model}: {len(layers)} blocks -> {attention}, {tokens} tokens, output {tuple(output.shape)}, "
        f"state dict keys {'unchanged' if same else 'CHANGED (new parameters)'}, "
        f"attention GFLOPs/image {flops / 1e9:.3f} ({flops / full:.1%} of full attention), "
        f"executed {executed / 1e9:.3f} ({executed / full:.1%}"
        + (f", {path} path)" if path else ")")
    )
    if out is not None:
        _save_tensors(vit.state_dict(), out)
        sidecar = {
            "format": SWAPPED_FORMAT,
            "model": model,
            "img_size": [int(s) for s in size],
            "attention": attention,
            "attention_config": json.loads(json.dumps(config)),
            "source_checkpoint": None if checkpoint is None else str(checkpoint),
        }
        write_sidecar(out.with_suffix(".json"), sidecar, covers=[out])
        typer.echo(f"wrote {out} and {out.with_suffix('.json')}")


@app.command()
def bench(
    tokens: Annotated[list[int], typer.Option(help="token counts N (square grids)")] = [1024, 4096],  # noqa: B006
    heads: int = 6,
    head_dim: int = 64,
    pool_size: PoolSize = 4,
    top_k: TopK = 48,
    backward: Annotated[bool, typer.Option(help="time forward + backward")] = False,
    repeats: int = 3,
) -> None:
    """Time one attention layer of each kind at a matched key budget (M + k keys per query)."""
    kinds = {}
    for kind in ("full", "mita", "moba", "topk"):
        budget, kinds[kind] = _kind_config(kind, pool_size, top_k)
    check_count(heads, "--heads")
    check_count(head_dim, "--head-dim")
    check_count(repeats, "--repeats")
    for n in tokens:
        check_count(n, "--tokens")
        side = math.isqrt(n)
        if side * side != n:
            raise ValueError(f"--tokens must be perfect squares (a square patch grid), got {n}")
        for kind in kinds:
            _check_fits(kind, budget, pool_size, (side, side))

    import torch

    from mixlab.attention_arch.mita.profile import build_layer, layer_input, time_layers

    torch.set_flush_denormal(True)
    for n in tokens:
        side = math.isqrt(n)
        spec = {"heads": heads, "head_dim": head_dim, "grid": [side, side]}
        layers = {k: build_layer({**spec, "kind": k, "config": c}) for k, c in kinds.items()}
        times = time_layers(
            layers, layer_input(spec, requires_grad=backward), backward=backward, repeats=repeats
        )
        ratios = ", ".join(f"{k} {times[k] / times['mita']:.2f}x" for k in kinds if k != "mita")
        typer.echo(f"N={n}: mita {times['mita'] * 1e3:.1f} ms; time relative to mita: {ratios}")


@app.command()
def train(
    attention: Annotated[str, typer.Option(help="attention kind")] = "mita",
    pool_size: PoolSize = 2,
    top_k: TopK = 12,
    steps: int = 300,
    canvas: int = 32,
    seed: int = 0,
    out: Annotated[
        Path | None,
        typer.Option(
            help="folder for the weights (model.safetensors + model.json) and metrics.json; "
            "a run killed there resumes from its last checkpoint (every 200 steps)"
        ),
    ] = None,
) -> None:
    """Train a small ViT with one attention kind on cluttered digits; report accuracy and,
    for MiTA, the coverage of its routed experts."""
    budget, config = _kind_config(attention, pool_size, top_k)
    check_count(steps, "--steps")
    if not is_count(canvas, 16) or canvas % 4:
        raise ValueError(f"--canvas must be a multiple of 4 and >= 16, got {canvas}")
    check_seed(seed)
    _check_fits(attention, budget, pool_size, (canvas // 4, canvas // 4))
    checkpoint = None if out is None else out / f"partial-{attention}"
    if out is not None:
        check_output_folder(out, "--out")
        if checkpoint.with_suffix(".json").exists():  # left by a killed run: resumed from below
            read_sidecar(checkpoint.with_suffix(".json"))  # intact? (before anything is built)

    from dataclasses import asdict

    import torch

    from mixlab.attention_arch.mita.data import cluttered_digits
    from mixlab.attention_arch.mita.introspection import coverage
    from mixlab.attention_arch.mita.training import (
        TrainSpec,
        ViTShape,
        accuracy,
        build_vit,
        load_training_checkpoint,
    )
    from mixlab.attention_arch.mita.training import train as train_model

    torch.manual_seed(seed)
    shape = ViTShape(canvas=canvas)
    spec = TrainSpec(steps=steps, seed=seed)
    model = build_vit(shape, attention, **config)
    if checkpoint is not None and checkpoint.with_suffix(".json").exists():
        # check a checkpoint left by a killed run before the data is drawn
        load_training_checkpoint(checkpoint, build_vit(shape, attention, **config), spec)
    train_data = cluttered_digits(5000, canvas=canvas, split="train", seed=seed)
    test_data = cluttered_digits(1000, canvas=canvas, split="test", seed=seed)
    train_model(model, train_data, spec, checkpoint=checkpoint)
    metrics = {
        "attention": attention,
        **config,
        "steps": steps,
        "accuracy": accuracy(model, test_data),
    }
    if attention.startswith("mita") and attention != "mita_shared_only":
        metrics["coverage"] = coverage(model, test_data.images[:256]).mean().item()
    metrics = json.loads(json.dumps(metrics))  # tuples as lists
    typer.echo(json.dumps(metrics))
    if out is not None:
        weights = out / "model.safetensors"
        _save_tensors(model.state_dict(), weights)
        sidecar = {
            "format": TRAINED_FORMAT,
            "shape": asdict(shape),
            "attention": attention,
            "attention_config": json.loads(json.dumps(config)),
            "train": asdict(spec),
        }
        write_sidecar(out / "model.json", sidecar, covers=[weights])
        write_json_atomic(out / "metrics.json", metrics, indent=1)
        typer.echo(f"wrote {weights}, {out / 'model.json'} and {out / 'metrics.json'}")
