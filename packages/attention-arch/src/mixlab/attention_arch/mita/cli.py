"""``mixlab-attn mita``: swap MiTA into a timm ViT, time attention kinds, train on cluttered digits.

mixlab-attn mita swap --model vit_small_patch16_224 --checkpoint deit_s.safetensors --out mita_s.safetensors
mixlab-attn mita bench --tokens 1024 4096 --heads 6 --head-dim 64
mixlab-attn mita train --attention mita --steps 300 --out runs/mita-digits
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="MiTA: Mixture-of-Top-k Attention as a drop-in for timm vision transformers.",
    no_args_is_help=True,
)

PoolSize = Annotated[int, typer.Option(help="landmark grid p (M = p² landmarks)")]
TopK = Annotated[int, typer.Option(help="routed keys per query (k)")]


def _kind_config(attention: str, pool_size: int, top_k: int) -> dict:
    """``attention``'s settings at MiTA's budget of pool_size² + top_k keys per query."""
    from mixlab.attention_arch.mita.swap import matched_config

    for name, value in (("--pool-size", pool_size), ("--top-k", top_k)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    try:
        return matched_config(attention, pool_size * pool_size + top_k, pool_size)
    except ValueError as error:  # its message speaks of key_budget = pool_size² + top_k
        raise ValueError(f"--pool-size {pool_size} / --top-k {top_k}: {error}") from error


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
    out: Annotated[Path | None, typer.Option(help="write the swapped state dict here")] = None,
) -> None:
    """Swap every attention block of a timm ViT, check a forward pass, report attention FLOPs."""
    import timm
    import torch
    from safetensors.torch import save_file

    from mixlab.attention_arch.mita.attention import FullAttention
    from mixlab.attention_arch.mita.swap import attention_modules, replace_attention

    if checkpoint is not None and not checkpoint.exists():
        raise ValueError(f"--checkpoint {checkpoint} does not exist")
    kwargs = {"img_size": img_size} if img_size else {}
    try:
        vit = timm.create_model(
            model, pretrained=False, checkpoint_path=str(checkpoint or ""), **kwargs
        )
    except RuntimeError as error:
        raise ValueError(f"--model {model} / --checkpoint: {error}") from error
    keys = set(vit.state_dict())
    replace_attention(vit, attention, **_kind_config(attention, pool_size, top_k))
    same = set(vit.state_dict()) == keys
    channels, size = vit.patch_embed.proj.in_channels, vit.patch_embed.img_size
    with torch.inference_mode():
        output = vit.eval()(torch.zeros(1, channels, *size))
    layers = attention_modules(vit)
    tokens = layers[0].num_prefix_tokens + vit.patch_embed.num_patches
    flops = sum(layer.attention_flops(tokens) for layer in layers)
    full = sum(FullAttention.attention_flops(layer, tokens) for layer in layers)
    typer.echo(
        f"{model}: {len(layers)} blocks -> {attention}, {tokens} tokens, output {tuple(output.shape)}, "
        f"state dict keys {'unchanged' if same else 'CHANGED (new parameters)'}, "
        f"attention GFLOPs/image {flops / 1e9:.3f} ({flops / full:.1%} of full attention)"
    )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in vit.state_dict().items()}, str(out))
        typer.echo(f"wrote {out}")


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
    import math

    import torch

    from mixlab.attention_arch.mita.profile import build_layer, layer_input, time_layers

    kinds = {k: _kind_config(k, pool_size, top_k) for k in ("full", "mita", "moba", "topk")}
    torch.set_flush_denormal(True)
    for n in tokens:
        side = math.isqrt(n)
        if side * side != n:
            raise ValueError(f"--tokens must be perfect squares (a square patch grid), got {n}")
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
    out: Annotated[Path | None, typer.Option(help="folder for the weights and metrics")] = None,
) -> None:
    """Train a small ViT with one attention kind on cluttered digits; report accuracy and,
    for MiTA, the coverage of its routed experts."""
    import torch
    from safetensors.torch import save_file

    from mixlab.attention_arch.mita.data import cluttered_digits
    from mixlab.attention_arch.mita.introspection import coverage
    from mixlab.attention_arch.mita.training import TrainSpec, ViTShape, accuracy, build_vit
    from mixlab.attention_arch.mita.training import train as train_model

    config = _kind_config(attention, pool_size, top_k)
    if canvas < 16 or canvas % 4:
        raise ValueError(f"--canvas must be a multiple of 4 and >= 16, got {canvas}")
    torch.manual_seed(seed)
    model = build_vit(ViTShape(canvas=canvas), attention, **config)
    train_data = cluttered_digits(5000, canvas=canvas, split="train", seed=seed)
    test_data = cluttered_digits(1000, canvas=canvas, split="test", seed=seed)
    checkpoint = None if out is None else out / f"partial-{attention}"
    train_model(model, train_data, TrainSpec(steps=steps, seed=seed), checkpoint=checkpoint)
    metrics = {
        "attention": attention,
        **config,
        "steps": steps,
        "accuracy": accuracy(model, test_data),
    }
    if attention.startswith("mita") and attention != "mita_shared_only":
        metrics["coverage"] = coverage(model, test_data.images[:256]).mean().item()
    typer.echo(json.dumps(metrics))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        save_file(model.state_dict(), str(out / "model.safetensors"))
        (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        typer.echo(f"wrote {out / 'model.safetensors'} and {out / 'metrics.json'}")
