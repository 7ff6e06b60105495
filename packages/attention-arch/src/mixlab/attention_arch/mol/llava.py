"""MoL inside a transformers LLaVA: :class:`MoLLlava` wraps any ``LlavaForConditionalGeneration``
(a LLaVA-1.5 from a local folder, or the toy of :mod:`.toy`) and hands the mixed, projected
features to it through ``mm_encoder_outputs``, so its own ``forward``, ``generate`` and
``save_pretrained`` run unchanged. The router saves and loads alone (:meth:`MoLLlava.save_router`).

:func:`vision_hidden_states` reads every layer of a vision tower: transformers models through
``output_hidden_states``, timm ViTs and open_clip towers through forward hooks on their blocks.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mixlab.attention_arch.mol.layers import FixedLayer, LayerConcat, MixtureOfLayers, MoLOutput
from mixlab.shared import require

__all__ = ["MoLLlava", "hooked_hidden_states", "vision_hidden_states", "widen_projector"]

Mixer = MixtureOfLayers | FixedLayer | LayerConcat
ROUTER_WEIGHTS, ROUTER_CONFIG = "mol.safetensors", "mol.json"
PROJECTOR_WEIGHTS = "projector.safetensors"
"""the fine-tuned projector, saved beside the router when it was trained (:meth:`save_router`)"""


def hooked_hidden_states(
    blocks: Sequence[nn.Module], run: Callable[[], Any]
) -> tuple[torch.Tensor, ...]:
    """Every residual-stream state of a stack of ``blocks`` while ``run()`` runs the model: the
    first block's input (the embeddings) then each block's output, ``[batch, tokens, d]``."""
    states: list[torch.Tensor] = []

    def first(tensor):
        return tensor[0] if isinstance(tensor, tuple | list) else tensor

    handles = [blocks[0].register_forward_pre_hook(lambda m, args: states.append(first(args)))]
    handles += [
        b.register_forward_hook(lambda m, args, out: states.append(first(out))) for b in blocks
    ]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return tuple(states)


def vision_hidden_states(
    encoder: nn.Module, pixel_values: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """The embeddings and every block's output of a vision tower, batch first: a transformers
    vision model (CLIP, SigLIP, ...), a timm ViT (``blocks``) or an open_clip CLIP or its
    ``visual`` tower (``transformer.resblocks``)."""
    if hasattr(encoder, "config") and hasattr(encoder, "get_input_embeddings"):  # transformers
        return tuple(encoder(pixel_values, output_hidden_states=True).hidden_states)
    if hasattr(encoder, "blocks") and hasattr(encoder, "forward_features"):  # timm ViT
        return hooked_hidden_states(encoder.blocks, lambda: encoder.forward_features(pixel_values))
    visual = getattr(encoder, "visual", encoder)
    transformer = getattr(visual, "transformer", None)
    if transformer is not None and hasattr(transformer, "resblocks"):  # open_clip
        states = hooked_hidden_states(transformer.resblocks, lambda: visual(pixel_values))
        if not getattr(transformer, "batch_first", True):
            states = tuple(s.transpose(0, 1) for s in states)
        return states
    raise ValueError(
        "encoder must be a transformers vision model, a timm ViT (with `blocks`) or an open_clip "
        f"visual tower (with `transformer.resblocks`), got {type(encoder).__name__}"
    )


def widen_projector(llava: nn.Module, layers: Sequence[int]) -> None:
    """Make ``llava`` read the channel concat of ``layers`` the way transformers does for a list
    ``vision_feature_layer``: the projector's first linear grows to |S|·d inputs, the trained
    weights on the default layer's block and zeros elsewhere (so it starts where it was)."""
    config = llava.config
    default = config.vision_feature_layer
    require(isinstance(default, int), "model", "a LLaVA reading one vision_feature_layer", default)
    total = config.vision_config.num_hidden_layers + 1
    resolved = [i % total for i in layers]
    require(
        default % total in resolved, "layers", f"a set holding the default layer {default}", layers
    )
    old = llava.model.multi_modal_projector.linear_1
    width = old.in_features
    new = nn.Linear(width * len(resolved), old.out_features, bias=old.bias is not None)
    with torch.no_grad():
        new.weight.zero_()
        block = resolved.index(default % total)
        new.weight[:, block * width : (block + 1) * width] = old.weight
        if old.bias is not None:
            new.bias.copy_(old.bias)
    llava.model.multi_modal_projector.linear_1 = new.to(old.weight.device, old.weight.dtype)
    config.vision_feature_layer = list(layers)


def _is_llava(model: Any) -> bool:
    config = getattr(model, "config", None)
    return (
        hasattr(model, "model")
        and hasattr(getattr(model, "model", None), "multi_modal_projector")
        and getattr(config, "vision_config", None) is not None
        and getattr(config, "image_token_id", None) is not None
    )


def _check_llava(model: Any) -> None:
    """A LLaVA-1.5-style model: one image, one grid of patch tokens. LLaVA-NeXT and OneVision
    (``image_grid_pinpoints``) tile an image into crops and pack them with newline tokens
    ("anyres"); MoL mixes one grid's states, so it would silently skip that packing."""
    require(_is_llava(model), "model", "a transformers LlavaForConditionalGeneration",
            type(model).__name__)  # fmt: skip
    pinpoints = getattr(model.config, "image_grid_pinpoints", None)
    require(
        pinpoints is None, "model",
        "a LlavaForConditionalGeneration (LLaVA-NeXT's anyres packing of image crops is not "
        "supported: mix the layers of a LLaVA-1.5-style model)", type(model).__name__,
    )  # fmt: skip


class MoLLlava(nn.Module):
    """A LLaVA whose projector reads a :class:`MixtureOfLayers` (or a baseline mixer) of its
    frozen vision tower's layers in place of ``vision_feature_layer``. The token count, the
    projector and the language model are LLaVA's own; the vision tower is frozen here.

    ``forward``/``generate`` take LLaVA's ``input_ids``, ``attention_mask`` and ``pixel_values``
    (or ``vision_states``, the tower's hidden states computed once, for training on a cache).
    The instruction embedding e is the mean input embedding of the prompt's text tokens: not the
    image placeholders, padding or special tokens, nor the supervised answer (``labels`` ≠ -100)."""

    def __init__(self, llava: nn.Module, mixer: Mixer) -> None:
        super().__init__()
        _check_llava(llava)
        self.llava, self.mol = llava, mixer
        if isinstance(mixer, LayerConcat) and not isinstance(
            llava.config.vision_feature_layer, list
        ):
            widen_projector(llava, mixer.layers)
        self.vision_tower.requires_grad_(False)

    @classmethod
    def from_llava(
        cls, llava: nn.Module, layers: Sequence[int] | None = None, *, granularity: str = "hybrid",
        **kwargs: Any,
    ) -> MoLLlava:  # fmt: skip
        """Wrap ``llava`` with a fresh MoL over ``layers`` (default: every other layer of the
        tower and the default one) routed at ``granularity``; ``kwargs`` go to
        :class:`MixtureOfLayers` (top_k, temperature, router_hidden, default_bias)."""
        _check_llava(llava)
        config = llava.config
        depth = config.vision_config.num_hidden_layers
        default = config.vision_feature_layer
        require(
            isinstance(default, int), "model", "a LLaVA reading one vision_feature_layer", default
        )
        if layers is None:
            layers = sorted({*range(2, depth + 1, 2), default % (depth + 1)})
        mixer = MixtureOfLayers(
            config.vision_config.hidden_size, config.text_config.hidden_size, layers, depth,
            default_layer=default, granularity=granularity, **kwargs,
        )  # fmt: skip
        return cls(llava, mixer)

    @property
    def vision_tower(self) -> nn.Module:
        return self.llava.model.vision_tower

    @property
    def drops_cls(self) -> bool:
        return self.llava.config.vision_feature_select_strategy == "default"

    @torch.no_grad()
    def vision_states(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The frozen tower's hidden states (the CLS token dropped when LLaVA drops it)."""
        tower = self.vision_tower
        pixel_values = pixel_values.to(next(tower.parameters()).dtype)
        states = vision_hidden_states(tower, pixel_values)
        return tuple(s[:, 1:] for s in states) if self.drops_cls else states

    def instruction_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                         labels: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        config = self.llava.config
        mask = input_ids != config.image_token_id
        if attention_mask is not None:
            mask &= attention_mask.bool()
        if labels is not None:
            mask &= labels == -100
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            token = getattr(config.text_config, name, None)
            if isinstance(token, int):
                mask &= input_ids != token
        return mask

    def mix(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        pixel_values: torch.Tensor | None = None,
        vision_states: Sequence[torch.Tensor] | None = None,
        labels: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, MoLOutput]:
        """The projected visual tokens ``[batch, tokens, lm_d]`` and MoL's output."""
        require((pixel_values is None) != (vision_states is None), "pixel_values",
                "exactly one of pixel_values and vision_states", "both or neither")  # fmt: skip
        if vision_states is None:
            vision_states = self.vision_states(pixel_values)
        from mixlab.attention_arch.mol.layers import instruction_embedding

        embeddings = self.llava.get_input_embeddings()(input_ids)
        mask = self.instruction_mask(input_ids, attention_mask, labels)
        instruction = instruction_embedding(embeddings, mask)
        mixed = self.mol(vision_states, instruction.to(vision_states[0].dtype))
        projector = self.llava.model.multi_modal_projector
        features = projector(mixed.features.to(projector.linear_1.weight.dtype))
        return features, mixed

    def _encoder_outputs(self, features: torch.Tensor) -> dict[str, Any]:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        return {"image": BaseModelOutputWithPooling(pooler_output=list(features))}

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
        *,
        vision_states: Sequence[torch.Tensor] | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Any,
    ):
        """LLaVA's forward on MoL's features; the output also carries ``routing`` (MoL's
        :class:`~.layers.MoLOutput`: π and the balance loss)."""
        features, mixed = self.mix(input_ids, attention_mask, pixel_values=pixel_values,
                                   vision_states=vision_states, labels=labels)  # fmt: skip
        out = self.llava(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                         mm_encoder_outputs=self._encoder_outputs(features), **kwargs)  # fmt: skip
        out.routing = mixed
        return out

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
        *,
        vision_states: Sequence[torch.Tensor] | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """LLaVA's ``generate`` with MoL's features for the prompt's image tokens."""
        features, _ = self.mix(input_ids, attention_mask, pixel_values=pixel_values,
                               vision_states=vision_states)  # fmt: skip
        return self.llava.generate(input_ids=input_ids, attention_mask=attention_mask,
                                   mm_encoder_outputs=self._encoder_outputs(features), **kwargs)  # fmt: skip

    # the router alone ------------------------------------------------------------------------

    def router_config(self) -> dict[str, Any]:
        mol = self.mol
        if isinstance(mol, MixtureOfLayers):
            return {"kind": "mixture", "layers": mol.layers, "granularity": mol.granularity,
                    "top_k": mol.top_k, "temperature": mol.temperature,
                    "router_hidden": mol.router_hidden}  # fmt: skip
        if isinstance(mol, FixedLayer):
            return {"kind": "fixed", "layers": mol.layers}
        return {"kind": "concat", "layers": mol.layers}

    def save_router(self, directory: str | Path, *, projector: bool = True) -> Path:
        """The adapter without the LLaVA: the mixer's weights (``mol.safetensors``), how to
        rebuild it (``mol.json``) and, unless ``projector=False``, the projector's weights
        (``projector.safetensors``; ``"projector": true`` in the JSON), which LLaVA's stages 1
        and 2 fine-tune with the mixer (``False`` suits a mixer trained with
        ``trainable="router"``). A fine-tuned language model is not part of it: save the LLaVA
        with ``save_pretrained``."""
        from safetensors.torch import save_file

        module = self.llava.model.multi_modal_projector
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in self.mol.state_dict().items()}
        save_file(state, directory / ROUTER_WEIGHTS)
        if projector:
            weights = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
            save_file(weights, directory / PROJECTOR_WEIGHTS)
        else:
            (directory / PROJECTOR_WEIGHTS).unlink(missing_ok=True)
        config = {**self.router_config(), "projector": bool(projector)}
        (directory / ROUTER_CONFIG).write_text(json.dumps(config, indent=1))
        return directory

    @classmethod
    def load_router(cls, llava: nn.Module, directory: str | Path) -> MoLLlava:
        """Wrap ``llava`` with the mixer saved in ``directory`` by :meth:`save_router`, and load
        its projector into ``llava`` when the adapter holds one."""
        from safetensors.torch import load_file

        directory = Path(directory)
        require((directory / ROUTER_CONFIG).is_file(), "directory",
                f"a folder with {ROUTER_CONFIG} and {ROUTER_WEIGHTS}", str(directory))  # fmt: skip
        spec = json.loads((directory / ROUTER_CONFIG).read_text())
        kind, layers = spec.pop("kind"), spec.pop("layers")
        has_projector = spec.pop("projector", False)
        config = llava.config
        depth, width = config.vision_config.num_hidden_layers, config.vision_config.hidden_size
        default = config.vision_feature_layer
        if kind == "concat":
            mixer: Mixer = LayerConcat(layers, depth)
        elif kind == "fixed":
            mixer = FixedLayer(width, layers[0], depth, default_layer=default)
        else:
            mixer = MixtureOfLayers(width, config.text_config.hidden_size, layers, depth,
                                    default_layer=default, **spec)  # fmt: skip
        mixer.load_state_dict(load_file(directory / ROUTER_WEIGHTS))
        device = next(llava.parameters()).device
        wrapped = cls(llava, mixer.to(device))  # widens the projector for a concat first
        if has_projector:
            projector = wrapped.llava.model.multi_modal_projector
            projector.load_state_dict(load_file(directory / PROJECTOR_WEIGHTS, device=str(device)))
        return wrapped
