"""Whole-model MoBiQuant: ``quantize_``, the run-time precision knobs, save and load.

    from mixlab.llm_efficiency.mobiquant import MoBiQuantConfig, quantize_, set_budget, set_precision

    quantize_(model, MoBiQuantConfig(bits=2, slices=4, group_size=128), calib=token_ids)
    set_budget(model, 3.0)        # the routers pick each token's depth, 3 code bits on average
    set_precision(model, 2)       # or: every token reads 2 slices (4 bits)
    save_quantized(model, "out/")  # safetensors + JSON; load_quantized("out/") gives equal logits
    model.save_pretrained("hf/")   # or the transformers way (see .hf):
    AutoModelForCausalLM.from_pretrained("hf/")  # the same model, equal logits

Every ``nn.Linear`` / ``Conv1D`` inside the decoder blocks becomes a :class:`MoBiLinear` (the
embeddings and the LM head stay as they are, as in GPTQ, AWQ and OmniQuant); ``target_modules``
(regular expressions on module names) narrows or widens that choice. With ``router=True`` each
block gets a :class:`MoBiRouter`, trained with the slices' ranges by block-wise calibration
(:mod:`.calibrate`), which needs calibration tokens.
"""

from __future__ import annotations

import inspect
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mixlab.llm_efficiency.lm import decoder_blocks
from mixlab.llm_efficiency.mobiquant.layer import (
    MoBiLinear,
    MoBiRouter,
    as_out_in,
    budget_grid,
    budget_index,
    check_budget,
    depth_plan,
    is_linear,
)
from mixlab.llm_efficiency.mobiquant.slices import SliceSpec
from mixlab.shared.files import CheckpointError, checkpoint_errors, read_sidecar, write_sidecar

__all__ = [
    "MoBiQuantConfig",
    "average_bits",
    "block_linears",
    "decoder_blocks",
    "finish_loading",
    "fit_thresholds",
    "load_quantized",
    "mobi_layers",
    "quantize_",
    "read_quantized_config",
    "rebuild",
    "reset_bit_counts",
    "run_settings",
    "save_quantized",
    "set_budget",
    "set_precision",
    "storage_bits",
    "stored_shapes",
]

CONFIG_FILE = "mobiquant_config.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass
class MoBiQuantConfig:
    """How a model is quantized and calibrated (defaults: the paper's four 2-bit slices)."""

    bits: int = 2  # bits per slice
    slices: int = 4  # depth 1..slices reads bits * depth bits per weight
    group_size: int = 128
    router: bool = True
    router_hidden: int = 32
    clip: str = "none"  # "none" (min-max ranges, the measured choice) or "search" (data-free)
    calib_steps: int = 200  # block-wise calibration steps of the ranges, per block
    router_steps: int = 200  # then of the router (ranges frozen), per block
    calib_batch: int = 4  # sequences per calibration step
    lwc_lr: float = 5e-3
    router_lr: float = 2e-3
    first_slice_fraction: float = 0.25  # stage 1: steps that calibrate the first slice alone
    target_modules: tuple[str, ...] | None = (
        None  # regexes on module names; None: all linears in blocks
    )
    seed: int = 0

    def __post_init__(self) -> None:
        self.spec()  # validates bits, slices and group_size
        if self.clip not in ("none", "search"):
            raise ValueError(f"clip must be 'none' or 'search', got {self.clip!r}")
        for name in ("calib_steps", "router_steps", "calib_batch", "router_hidden"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.router and self.slices < 2:
            raise ValueError("router=True needs slices >= 2 (one slice leaves nothing to route)")
        if not 0 <= self.first_slice_fraction < 1:
            raise ValueError(
                f"first_slice_fraction must be in [0, 1), got {self.first_slice_fraction!r}"
            )
        for name in ("lwc_lr", "router_lr"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if self.target_modules is not None:
            self.target_modules = tuple(self.target_modules)
            for pattern in self.target_modules:
                try:
                    re.compile(pattern)
                except re.error as error:
                    raise ValueError(
                        f"target_modules: {pattern!r} is not a regular expression ({error})"
                    ) from None

    def spec(self) -> SliceSpec:
        return SliceSpec(self.bits, self.slices, self.group_size)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MoBiQuantConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def block_linears(
    model: nn.Module, target_modules: tuple[str, ...] | None = None
) -> list[tuple[int, str, nn.Module]]:
    """``(block index, name within the block, module)`` of every layer to quantize: all linear
    layers inside the decoder blocks, or those whose name matches one of ``target_modules``."""
    found = []
    for index, block in enumerate(decoder_blocks(model)):
        for name, module in block.named_modules():
            if name.startswith("mobi_router"):
                continue
            if target_modules is None:
                if is_linear(module) or isinstance(module, MoBiLinear):
                    found.append((index, name, module))
            elif name and any(re.fullmatch(p, name) for p in target_modules):
                as_out_in(module, f"target_modules match {name!r}")  # unknown layer types raise
                found.append((index, name, module))
    if not found:
        raise ValueError("model: no linear layer to quantize inside the decoder blocks")
    return found


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, child, new)


def mobi_layers(block: nn.Module) -> list[MoBiLinear]:
    return [m for m in block.modules() if isinstance(m, MoBiLinear)]


def _route(block: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook of every quantized block: decide each token's depth and hand it to the
    block's layers, with the depths it can take. The router scores the tokens; the no-router
    ablation at a fractional budget draws depths at random, token-agnostic, in the same
    proportions (``block.mobi_random_depth = (low depth, P(low + 1), generator)``). A budget that
    sends no token deeper hands the layers one depth (their fixed-precision read)."""
    layers = mobi_layers(block)
    if any(layer.precision is not None for layer in layers):
        return
    hidden = args[0] if args else kwargs["hidden_states"]
    random_depth = getattr(block, "mobi_random_depth", None)
    router: MoBiRouter | None = getattr(block, "mobi_router", None)
    depth, depths = None, None
    if random_depth is not None:
        low, p_up, generator = random_depth
        if p_up == 0:
            depth = low
        else:
            up = torch.rand(hidden.shape[:-1].numel(), generator=generator) < p_up
            depth, depths = (low + up.long()).to(hidden.device), (low, low + 1)
    elif router is not None:
        if router.share == 0 and router.fit_to is None:
            depth = router.base
        else:
            depth = router.depth(hidden)
            depths = router.depths()
    for layer in layers:
        layer.token_depth, layer.token_depths = depth, depths


def _attach(model: nn.Module, config: MoBiQuantConfig) -> None:
    """Routers (when configured), the routing hooks and the transformers quantizer (so that
    ``save_pretrained`` writes a folder ``from_pretrained`` rebuilds); idempotent."""
    from mixlab.llm_efficiency.mobiquant.hf import attach_quantizer

    hidden_size = model.config.hidden_size
    for block in decoder_blocks(model):
        if config.router and not hasattr(block, "mobi_router"):
            block.mobi_router = MoBiRouter(
                hidden_size, config.slices, config.router_hidden, config.bits
            )
        if not getattr(block, "_mobi_hooked", False):
            block.register_forward_pre_hook(_route, with_kwargs=True)
            block._mobi_hooked = True
    model.mobiquant_config = config
    attach_quantizer(model)


def quantize_(
    model: nn.Module, config: MoBiQuantConfig | None = None, calib: torch.Tensor | None = None
) -> nn.Module:
    """Quantize ``model`` in place (and return it).

    ``calib``: token ids ``[sequences, seq_len]`` for block-wise calibration of the ranges (and of
    the routers, which need it); without it the slices are cut from min-max ranges (data-free).
    """
    config = config or MoBiQuantConfig()
    if config.router and calib is None:
        raise ValueError("calib: router=True needs calibration tokens (or set router=False)")
    spec = config.spec()
    targets = block_linears(model, config.target_modules)
    for _, name, module in targets:  # validate every layer before changing any
        if not isinstance(module, MoBiLinear):
            spec.check_width(as_out_in(module, name).shape[1], name)
    if calib is not None:
        from mixlab.llm_efficiency.mobiquant.calibrate import calibrate_

        calibrate_(model, config, calib)
    else:
        blocks = decoder_blocks(model)
        for index, name, module in targets:
            if not isinstance(module, MoBiLinear):
                layer = MoBiLinear.from_linear(
                    module, spec, clip="search" if config.clip == "search" else 1.0, name=name
                )
                _replace(blocks[index], name, layer)
        _attach(model, config)
    return model


def set_precision(model: nn.Module, depth: int | None) -> None:
    """Every token reads ``depth`` slices (``depth * bits`` bits); ``None`` hands the choice back to
    the routers (or, without routers, to all slices)."""
    model.mobiquant_budget = None
    for block in decoder_blocks(model):
        block.mobi_random_depth = None
        for layer in mobi_layers(block):
            if depth is not None and not 1 <= depth <= layer.spec.slices:
                raise ValueError(f"precision must be in 1..{layer.spec.slices}, got {depth!r}")
            layer.precision = depth
            layer.token_depth = layer.token_depths = None
            layer.reset_bit_counts()


def set_budget(model: nn.Module, avg_bits: float, *, seed: int = 0) -> None:
    """Average ``avg_bits`` code bits per weight from now on; runs no forward pass.

    Routed blocks switch to the threshold stored for ``avg_bits`` (a multiple of 1/8 slice, see
    :func:`.layer.budget_grid`; :func:`fit_thresholds` placed them). A model without routers
    mixes the two nearest depths at random per token in the same proportions (the token-agnostic
    ablation; ``seed`` seeds the draws).
    """
    config: MoBiQuantConfig = model.mobiquant_config
    blocks = decoder_blocks(model)
    routers = [r for b in blocks if (r := getattr(b, "mobi_router", None)) is not None]
    if routers:  # refused before anything changes
        budget_index(avg_bits, config.bits, config.slices)
    else:
        check_budget(avg_bits, config.bits, config.slices)
    set_precision(model, None)
    for router in routers:
        router.use_budget(avg_bits)
    if not routers:
        base, share = depth_plan(avg_bits, config.bits, config.slices)
        for block in blocks:
            block.mobi_random_depth = (base, share, torch.Generator().manual_seed(seed))
    model.mobiquant_budget = (avg_bits, seed)


@torch.no_grad()
def fit_thresholds(model: nn.Module, tokens: torch.Tensor) -> None:
    """Place every router's threshold for every budget of :func:`.layer.budget_grid` on the
    hidden states of ``tokens`` (``[sequences, seq_len]`` ids): one forward pass per budget, in
    which each block's threshold is the quantile of its tokens' scores that averages the budget,
    with the blocks before it already at that budget. Calibration calls it with its tokens; call
    it again to fit them to other text. The tokens are not kept."""
    config: MoBiQuantConfig = model.mobiquant_config
    routers = [r for b in decoder_blocks(model) if (r := getattr(b, "mobi_router", None))]
    if not routers:
        raise ValueError("model: it has no routers to fit (quantized with router=False)")
    budget, precision = getattr(model, "mobiquant_budget", None), run_settings(model)["precision"]
    set_precision(model, None)
    device = next(model.parameters()).device
    # only the last position's logits: the thresholds read the blocks, not the LM head
    head = (
        {"logits_to_keep": 1}
        if "logits_to_keep" in inspect.signature(model.forward).parameters
        else {}
    )
    try:
        for index, grid_budget in enumerate(budget_grid(config.bits, config.slices)):
            for router in routers:
                router.fit_to = grid_budget
            model(input_ids=tokens.long().to(device), use_cache=False, **head)
            for router in routers:
                router.thresholds[index] = router.threshold
    finally:
        for router in routers:
            router.fit_to = None
            router.excess.zero_()
    if budget is not None:  # back where the model was, with the new thresholds
        set_budget(model, budget[0], seed=budget[1])
    else:
        set_precision(model, precision)


def average_bits(model: nn.Module, *, last_call: bool = False) -> float:
    """Code bits per weight the model read since the last :func:`set_budget` /
    :func:`set_precision` / :func:`reset_bit_counts` (or in the last forward, ``last_call``),
    averaged over tokens and over layers weighted by their size."""
    total = weighted = 0.0
    for block in decoder_blocks(model):
        for layer in mobi_layers(block):
            size = layer.in_features * layer.out_features
            total += size
            weighted += size * (layer.last_avg_bits if last_call else layer.avg_bits)
    return weighted / total


def reset_bit_counts(model: nn.Module) -> None:
    for block in decoder_blocks(model):
        for layer in mobi_layers(block):
            layer.reset_bit_counts()


def storage_bits(model: nn.Module) -> dict[str, float]:
    """Bits of the quantized layers: codes (all slices), scales + zeros, routers, and the count of
    quantized weights (so ``(codes + scales) / weights`` is the nested model's bits per weight)."""
    codes = scales = routers = weights = 0
    for block in decoder_blocks(model):
        for layer in mobi_layers(block):
            codes += layer.planes.numel() * 8
            scales += (layer.scale.numel() + layer.zero.numel()) * 16
            weights += layer.in_features * layer.out_features
        if (router := getattr(block, "mobi_router", None)) is not None:
            routers += router.parameter_bits()
    return {"codes": codes, "scales": scales, "routers": routers, "weights": weights}


QUANTIZED_FORMAT = "mixlab.mobiquant/2"
"""2: thresholds per budget in the routers, no calibration tokens (1: MoBiQuant v1)"""
_SIDECAR_TYPES: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "bits": int,
    "slices": int,
    "group_size": int,
    "router": bool,
    "router_hidden": int,
    "clip": str,
    "calib_steps": int,
    "router_steps": int,
    "calib_batch": int,
    "lwc_lr": (int, float),
    "router_lr": (int, float),
    "first_slice_fraction": (int, float),
    "target_modules": (list, type(None)),
    "seed": int,
}
"""the keys of ``mobiquant_config.json`` and their JSON types"""


def run_settings(model: nn.Module) -> dict[str, Any]:
    """The run-time setting to save with ``model``: ``precision``, the depth :func:`set_precision`
    set (or None), or ``budget`` and ``budget_seed``, what :func:`set_budget` set (else None)."""
    precisions = {layer.precision for b in decoder_blocks(model) for layer in mobi_layers(b)}
    if len(precisions) > 1:
        raise ValueError(
            f"model: its layers read different precisions {sorted(precisions, key=str)}; call "
            "set_precision(model, depth) (or None) before saving"
        )
    budget, seed = getattr(model, "mobiquant_budget", None) or (None, None)
    return {"precision": precisions.pop(), "budget": budget, "budget_seed": seed}


def rebuild(model: nn.Module, config: MoBiQuantConfig) -> None:
    """Turn a freshly built Hugging Face model into an empty MoBiQuant model of ``config``, ready
    for the saved tensors."""
    spec, blocks = config.spec(), decoder_blocks(model)
    for index, name, module in block_linears(model, config.target_modules):
        _replace(blocks[index], name, MoBiLinear.shaped_like(module, spec, name=name))
    _attach(model, config)


def finish_loading(
    model: nn.Module,
    precision: int | None = None,
    budget: float | None = None,
    budget_seed: int | None = None,
) -> None:
    """After the tensors are in: freeze the quantized layers and routers (as calibration leaves
    them) and restore the saved :func:`run_settings` (a router-free model's random depths restart
    from their seed)."""
    for module in model.modules():
        if isinstance(module, MoBiLinear | MoBiRouter):
            module.requires_grad_(False)
        if isinstance(module, MoBiRouter):  # a non-persistent buffer transformers may leave empty
            module.excess.zero_()
    if precision is not None:
        set_precision(model, precision)
    elif budget is not None:
        set_budget(model, budget, seed=budget_seed or 0)


def save_quantized(model: nn.Module, out_dir: str | Path) -> Path:
    """Write the model's HF config, ``model.safetensors`` and, last, ``mobiquant_config.json``: the
    MoBiQuant config with the SHA-256 of the other two files (checked by :func:`load_quantized`).

    The HF config records the model's dtype and, in its ``quantization_config``, the MoBiQuant
    config and :func:`run_settings`, so that ``from_pretrained`` loads this folder too."""
    from safetensors.torch import save_model

    from mixlab.llm_efficiency.mobiquant.hf import MoBiQuantHfConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sidecar = out_dir / CONFIG_FILE
    sidecar.unlink(missing_ok=True)  # a folder with a sidecar is a complete one
    model.config.quantization_config = MoBiQuantHfConfig.of(model)
    model.config.dtype = model.dtype  # as save_pretrained does: from_config builds in it
    model.config.save_pretrained(out_dir)
    weights = out_dir / WEIGHTS_FILE
    partial = out_dir / f"{WEIGHTS_FILE}.partial"
    save_model(model, str(partial))  # handles tied embeddings
    os.replace(partial, weights)
    data = {"format": QUANTIZED_FORMAT, **model.mobiquant_config.to_dict()}
    write_sidecar(sidecar, data, covers=[weights, out_dir / "config.json"])
    return out_dir


def read_quantized_config(path: str | Path) -> MoBiQuantConfig:
    """The :class:`MoBiQuantConfig` of a folder :func:`save_quantized` wrote, after checking the
    folder's integrity (a damaged, edited or foreign folder raises :class:`CheckpointError`)."""
    path = Path(path)
    sidecar = path / CONFIG_FILE
    if not sidecar.is_file():
        raise ValueError(
            f"--model: {path} holds no MoBiQuant model (no {CONFIG_FILE}; a folder written by "
            "save_pretrained loads with AutoModelForCausalLM.from_pretrained)"
        )
    data = read_sidecar(sidecar, expect=_SIDECAR_TYPES)
    if data["format"] == "mixlab.mobiquant/1":
        raise CheckpointError(
            f"{sidecar}: saved by MoBiQuant v1, whose routers stored calibration tokens instead "
            "of thresholds; quantize the model again"
        )
    if data["format"] != QUANTIZED_FORMAT:
        raise CheckpointError(f"{sidecar}: not a MoBiQuant model (format {data['format']!r})")
    with checkpoint_errors(sidecar, "MoBiQuant config"):
        return MoBiQuantConfig.from_dict(data)


def load_quantized(
    path: str | Path,
    device: torch.device | str = "cpu",
    *,
    config: MoBiQuantConfig | None = None,
) -> nn.Module:
    """A model :func:`save_quantized` wrote, in its saved dtype, with its routers, thresholds and
    run-time setting (eval mode).

    ``config``: what :func:`read_quantized_config` returned for ``path`` (saves checking the
    folder twice); by default it is read and checked here.
    """
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from mixlab.llm_efficiency.mobiquant.hf import MoBiQuantHfConfig

    path = Path(path)
    if config is None:
        config = read_quantized_config(path)
    with checkpoint_errors(path / "config.json", "Hugging Face model config"):
        hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
        saved = getattr(hf_config, "quantization_config", None)  # absent in older folders
        settings = MoBiQuantHfConfig.from_dict(saved).run_settings() if saved else {}
        model = AutoModelForCausalLM.from_config(hf_config, dtype=hf_config.dtype)
    weights = path / WEIGHTS_FILE
    with checkpoint_errors(path / CONFIG_FILE, "MoBiQuant config for this model"):
        rebuild(model, config)
    with checkpoint_errors(weights, "MoBiQuant weights file"):
        try:
            load_model(model, str(weights))
        except RuntimeError as error:  # missing, unexpected or mis-shaped tensors
            raise ValueError(" ".join(str(error).split())[:300]) from error
    finish_loading(model, **settings)
    return model.to(device).eval()


def stored_shapes(files: list[str] | list[Path]) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor in the safetensors ``files``, read from their headers."""
    from safetensors import safe_open

    shapes = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (a safe_open handle has no __iter__)
                shapes[key] = tuple(handle.get_slice(key).get_shape())
    return shapes
