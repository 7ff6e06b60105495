"""LoRA adapters on a diffusers UNet's attention projections, saved in the diffusers format.

:func:`add_lora` freezes the UNet and injects peft LoRA layers (the DreamBooth-LoRA recipe:
``to_q``, ``to_k``, ``to_v``, ``to_out.0``, Gaussian A and zero B, so the adapter starts as the
identity). :func:`save_lora` writes ``pytorch_lora_weights.safetensors`` as a diffusers
pipeline's ``save_lora_weights`` does (peft keys and the ``LoraConfig`` fields in the file's
metadata, each prefixed ``unet.``), so ``pipe.load_lora_weights(folder)`` and ``UNet2DConditionModel.load_lora_adapter(folder, prefix="unet", weight_name=WEIGHT_NAME)`` read it;
:func:`load_lora` reads it (or an unprefixed file from ``save_lora_adapter``) back into any UNet,
``UNet2DModel`` included (which has no diffusers LoRA loader).

Beside the weights, :func:`save_lora` writes (last) the sidecar ``mixlab_lora.json``: the adapter's
rank, alpha and targets and the SHA-256 of the weights file and of itself. :func:`load_lora` checks
it when present, so a truncated, replaced or hand-edited adapter is refused with one line naming the
file; a folder without it (a LoRA from diffusers or another trainer) loads when the file is intact
safetensors.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model
from peft.utils import set_peft_model_state_dict
from safetensors import safe_open
from safetensors.torch import save_file

from mixlab.shared.files import checkpoint_errors, write_sidecar
from mixlab.vision_mm.mix_opt.formats import (
    LORA_FORMAT,
    SIDECAR_NAME,
    WEIGHT_NAME,
    lora_file,
)

ATTENTION_PROJECTIONS = ("to_q", "to_k", "to_v", "to_out.0", "add_k_proj", "add_v_proj")
"""diffusers' DreamBooth-LoRA targets (``add_*`` exist only in SD 1.x's added-KV blocks)"""
PREFIX = "unet."  # what pipelines' save_lora_weights / load_lora_weights put before each key
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
    """Write the adapter to ``folder/pytorch_lora_weights.safetensors`` (diffusers format) and,
    last, the sidecar ``folder/mixlab_lora.json`` with its SHA-256, which :func:`load_lora` checks."""
    config = getattr(unet, "peft_config", {}).get("default")
    if config is None:
        raise ValueError("unet has no LoRA adapter to save; call add_lora(unet) first")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        PREFIX + k: v.detach().cpu().contiguous()
        for k, v in get_peft_model_state_dict(unet).items()
    }
    settings = {
        PREFIX + k: sorted(v) if isinstance(v, set) else v for k, v in config.to_dict().items()
    }
    metadata = {"format": "pt", METADATA_KEY: json.dumps(settings, sort_keys=True, default=str)}
    path = folder / WEIGHT_NAME
    (folder / SIDECAR_NAME).unlink(missing_ok=True)  # no sidecar of an older adapter meanwhile
    partial = folder / (WEIGHT_NAME + ".partial")
    save_file(state, str(partial), metadata=metadata)
    os.replace(partial, path)
    write_sidecar(
        folder / SIDECAR_NAME,
        {
            "format": LORA_FORMAT,
            "weight_name": WEIGHT_NAME,
            "rank": int(config.r),
            "alpha": float(config.lora_alpha),
            "targets": sorted(config.target_modules),
            "tensors": len(state),
        },
        covers=[path],
    )
    return path


def load_lora(unet: torch.nn.Module, folder: str | os.PathLike[str]) -> None:
    """Load an adapter :func:`save_lora` (or diffusers' ``save_lora_adapter``) wrote into
    ``unet``, adding the adapter first when ``unet`` has none. The file is checked first
    (:func:`lora_file`); a damaged one raises :class:`CheckpointError` naming it."""
    path = lora_file(folder)
    with checkpoint_errors(path, "LoRA safetensors file"):
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            state = {key.removeprefix(PREFIX): handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
        if "default" not in getattr(unet, "peft_config", {}):
            if METADATA_KEY not in metadata:
                raise ValueError(f"{path} has no LoRA config in its metadata; call add_lora first")
            settings = json.loads(metadata[METADATA_KEY])
            settings = {k.removeprefix(PREFIX): v for k, v in settings.items()}
            known = {f.name for f in fields(LoraConfig) if f.init}
            _inject(unet, LoraConfig(**{k: v for k, v in settings.items() if k in known}))
    own = get_peft_model_state_dict(unet)
    wrong = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
    if wrong:
        raise ValueError(
            f"{path} does not fit this unet's adapter: {wrong[0]} is {tuple(state[wrong[0]].shape)}"
            f", the adapter's {tuple(own[wrong[0]].shape)} (another rank?)"
        )
    outcome = set_peft_model_state_dict(unet, state)
    missing = [k for k in outcome.missing_keys if "lora_" in k] if outcome else []
    if outcome and (outcome.unexpected_keys or missing):
        raise ValueError(
            f"{path} does not fit this unet: unexpected {outcome.unexpected_keys[:3]}, "
            f"missing {missing[:3]}"
        )
