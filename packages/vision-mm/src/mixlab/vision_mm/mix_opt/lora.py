"""LoRA adapters on a diffusers UNet's attention projections, saved in the diffusers format.

:func:`add_lora` freezes the UNet and injects peft LoRA layers (the DreamBooth-LoRA recipe:
``to_q``, ``to_k``, ``to_v``, ``to_out.0``, Gaussian A and zero B, so the adapter starts as the
identity). :func:`save_lora` writes ``pytorch_lora_weights.safetensors`` exactly as diffusers'
``save_lora_adapter`` does (peft keys, the ``LoraConfig`` in the file's metadata), so
``UNet2DConditionModel.load_lora_adapter(folder, prefix=None,
weight_name="pytorch_lora_weights.safetensors")`` reads it too; :func:`load_lora`
reads it back into any UNet, ``UNet2DModel`` included (which has no diffusers LoRA loader).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model
from peft.utils import set_peft_model_state_dict
from safetensors import safe_open
from safetensors.torch import save_file

ATTENTION_PROJECTIONS = ("to_q", "to_k", "to_v", "to_out.0")
WEIGHT_NAME = "pytorch_lora_weights.safetensors"
METADATA_KEY = "lora_adapter_metadata"  # diffusers.loaders.lora_base.LORA_ADAPTER_METADATA_KEY


def add_lora(
    unet: torch.nn.Module,
    rank: int = 4,
    alpha: float | None = None,
    targets: Sequence[str] = ATTENTION_PROJECTIONS,
) -> LoraConfig:
    """Freeze ``unet`` and add a LoRA adapter of ``rank`` (scale ``alpha``/rank, default 1) to
    every module whose name ends with one of ``targets``; returns the adapter's config."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be an integer >= 1, got {rank!r}")
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else rank,
        init_lora_weights="gaussian",
        target_modules=list(targets),
    )
    _inject(unet, config)
    return config


def _inject(unet: torch.nn.Module, config: LoraConfig) -> None:
    unet.requires_grad_(False)
    try:
        if hasattr(unet, "add_adapter"):  # diffusers models with PeftAdapterMixin
            unet.add_adapter(config)
        else:
            inject_adapter_in_model(config, unet)
    except ValueError as error:  # peft: "Target modules ... not found in the base model"
        raise ValueError(
            f"targets {sorted(config.target_modules)} match no linear layer of "
            f"{type(unet).__name__}: {error}"
        ) from error


def lora_parameters(unet: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The trainable parameters (after :func:`add_lora`: the LoRA A and B matrices)."""
    return [p for p in unet.parameters() if p.requires_grad]


def save_lora(unet: torch.nn.Module, folder: str | os.PathLike[str]) -> Path:
    """Write the adapter to ``folder/pytorch_lora_weights.safetensors`` (diffusers format)."""
    config = getattr(unet, "peft_config", {}).get("default")
    if config is None:
        raise ValueError("unet has no LoRA adapter to save; call add_lora(unet) first")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(unet).items()}
    settings = {k: sorted(v) if isinstance(v, set) else v for k, v in config.to_dict().items()}
    metadata = {"format": "pt", METADATA_KEY: json.dumps(settings, sort_keys=True, default=str)}
    path = folder / WEIGHT_NAME
    save_file(state, str(path), metadata=metadata)
    return path


def load_lora(unet: torch.nn.Module, folder: str | os.PathLike[str]) -> None:
    """Load an adapter :func:`save_lora` (or diffusers' ``save_lora_adapter``) wrote into
    ``unet``, adding the adapter first when ``unet`` has none."""
    path = Path(folder) / WEIGHT_NAME if Path(folder).is_dir() else Path(folder)
    if not path.exists():
        raise ValueError(f"folder must hold {WEIGHT_NAME}, and {path} does not exist")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
        state = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    if "default" not in getattr(unet, "peft_config", {}):
        if METADATA_KEY not in metadata:
            raise ValueError(f"{path} has no LoRA config in its metadata; call add_lora first")
        settings = json.loads(metadata[METADATA_KEY])
        _inject(unet, LoraConfig(**{k: v for k, v in settings.items() if k in _LORA_FIELDS}))
    outcome = set_peft_model_state_dict(unet, state)
    missing = [k for k in outcome.missing_keys if "lora_" in k] if outcome else []
    if outcome and (outcome.unexpected_keys or missing):
        raise ValueError(
            f"{path} does not fit this unet: unexpected {outcome.unexpected_keys[:3]}, "
            f"missing {missing[:3]}"
        )


_LORA_FIELDS = ("r", "lora_alpha", "target_modules", "lora_dropout", "bias", "init_lora_weights")
