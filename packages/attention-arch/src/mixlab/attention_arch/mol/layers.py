"""Mixture of Layers: instruction-conditioned routing over a frozen vision encoder's layers.

The paper was not found; this is the reconstruction of ``shared/specs/attention-vision.md`` §3a
(TGIF, IGVA, DenseConnector). For hidden states H_l ``[batch, tokens, d]`` of a candidate layer set
S and an instruction embedding e ``[batch, e_dim]``:

- image level: π = softmax(MLP_r(e)/T) ∈ Δ^|S|, V = Σ_l π_l · LN_l(H_l);
- patch level: π_i = softmax(MLP_p([e ; h̄_i])/T) per token i, h̄_i the token's mean over S;
- hybrid: log π_i = log π^img + log π^patch_i − logsumexp (the patch router refines the image one);
- optional top-k over layers (renormalised) and Switch's balance loss n·Σ f_l·P_l.

Two instruction-blind granularities serve as baselines in the same module: ``static`` learns one
π for every input (a learned static mixture), ``uniform`` keeps π = 1/|S| (layer averaging).

LN_l is a LayerNorm per candidate layer except the default one (the layer the projector was
trained on: LLaVA's ``vision_feature_layer = -2``), which passes unchanged. The routers' output
weights start at zero and the image router's bias puts ``default_bias`` on the default layer, so an
untrained MoL returns the default layer's states (to within e^(−default_bias) of them) and an MLLM
wrapped with it starts exactly where it was.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from mixlab.shared import is_count, require
from mixlab.shared.routing import keep_top_k, switch_balance_loss

__all__ = [
    "GRANULARITIES",
    "FixedLayer",
    "LayerConcat",
    "MixtureOfLayers",
    "MoLOutput",
    "instruction_embedding",
]

GRANULARITIES = ("image", "patch", "hybrid", "static", "uniform")
ROUTED = ("image", "patch", "hybrid")
"""the granularities whose π reads the instruction"""


@dataclass
class MoLOutput:
    features: torch.Tensor
    """``[batch, tokens, d]``: the mixed states, in place of the default layer's"""
    weights: torch.Tensor
    """π: ``[batch, |S|]`` (image level) or ``[batch, tokens, |S|]``"""
    balance_loss: torch.Tensor
    """Switch's load-balancing loss over the batch (1 when balanced)"""


def instruction_embedding(embeddings: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """e: the mean of the LM's input embeddings ``[batch, length, d]`` over the instruction's
    text tokens (``mask`` ``[batch, length]``, True or 1 on them) -> ``[batch, d]``."""
    mask = mask.to(embeddings.dtype)
    counts = mask.sum(1)
    require(bool((counts > 0).all()), "mask", "at least one text token per instruction",
            f"{int((counts == 0).sum())} instruction(s) without text tokens")  # fmt: skip
    return (embeddings * mask[..., None]).sum(1) / counts[:, None]


def _router(in_dim: int, hidden: int, outputs: int) -> nn.Sequential:
    router = nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Linear(hidden, outputs))
    nn.init.zeros_(router[2].weight)
    nn.init.zeros_(router[2].bias)
    return router


class MixtureOfLayers(nn.Module):
    """Mixes the hidden states of ``layers`` (indices into an encoder's ``hidden_states`` tuple,
    which has ``num_hidden_layers + 1`` entries, the embeddings first; negative from the end)
    by an instruction-conditioned router (module docstring)."""

    def __init__(
        self,
        hidden_size: int,
        instruction_dim: int,
        layers: Sequence[int],
        num_hidden_layers: int,
        *,
        default_layer: int = -2,
        granularity: str = "hybrid",
        top_k: int | None = None,
        temperature: float = 1.0,
        router_hidden: int = 128,
        default_bias: float = 16.0,
    ) -> None:
        super().__init__()
        require(is_count(num_hidden_layers), "num_hidden_layers", "an integer >= 1",
                num_hidden_layers)  # fmt: skip
        total = num_hidden_layers + 1
        layers = list(layers)
        require(len(layers) > 0, "layers", "a non-empty set of layer indices", layers)
        for index in (*layers, default_layer):
            require(isinstance(index, int) and -total <= index < total, "layers",
                    f"indices into the {total} hidden states, in [{-total}, {total - 1}]", index)  # fmt: skip
        resolved = [i % total for i in layers]
        require(len(set(resolved)) == len(resolved), "layers", "distinct layers", layers)
        require(default_layer % total in resolved, "default_layer",
                f"one of the candidate layers {layers}", default_layer)  # fmt: skip
        require(granularity in GRANULARITIES, "granularity", f"one of {GRANULARITIES}", granularity)
        require(top_k is None or (is_count(top_k) and top_k <= len(layers)), "top_k",
                f"None or an integer in [1, |S| = {len(layers)}]", top_k)  # fmt: skip
        require(math.isfinite(temperature) and temperature > 0, "temperature", "a number > 0",
                temperature)  # fmt: skip
        self.layers, self.granularity, self.top_k = resolved, granularity, top_k
        self.temperature, self.router_hidden = temperature, router_hidden
        self.default = resolved.index(default_layer % total)
        self.norms = nn.ModuleList(
            nn.Identity() if i == self.default else nn.LayerNorm(hidden_size)
            for i in range(len(resolved))
        )
        size = len(resolved)
        self.image_router = self.patch_router = self.static_logits = None
        if granularity in ("image", "hybrid"):
            self.image_router = _router(instruction_dim, router_hidden, size)
        if granularity in ("patch", "hybrid"):
            self.patch_router = _router(instruction_dim + hidden_size, router_hidden, size)
        if granularity == "static":
            self.static_logits = nn.Parameter(torch.zeros(size))
        # the bias on the default layer: a buffer, so that training can release it (release())
        self.default_bias = 0.0 if granularity == "uniform" else float(default_bias)
        self.register_buffer("default_offset", torch.tensor(self.default_bias))

    def release(self, fraction: float) -> None:
        """Lower the default layer's bias to ``(1 - fraction)`` of its initial value.

        At e^16 the softmax is saturated and its gradient ~e^-16: the routers then barely move
        (π stayed exactly on the default layer through 300 steps of the toy). Training releases
        the bias over its first steps (:class:`~.training.TrainSpec` ``release_steps``), so the
        model starts exactly at the original MLLM and the routers still learn."""
        self.default_offset.fill_(self.default_bias * (1 - min(max(fraction, 0.0), 1.0)))

    def _offset(self, logits: torch.Tensor) -> torch.Tensor:
        bump = torch.zeros(logits.shape[-1], device=logits.device, dtype=logits.dtype)
        bump[self.default] = self.default_offset
        return logits + bump

    def forward(
        self, hidden_states: Sequence[torch.Tensor], instruction: torch.Tensor
    ) -> MoLOutput:
        """``hidden_states``: the encoder's tuple (all layers); ``instruction``: e ``[batch, e_dim]``."""
        total = len(hidden_states)
        require(max(self.layers) < total, "hidden_states",
                f"a tuple with at least {max(self.layers) + 1} entries", total)  # fmt: skip
        states = torch.stack([norm(hidden_states[i]) for norm, i in zip(self.norms, self.layers,
                                                                        strict=True)], dim=-2)  # fmt: skip
        # states: [batch, tokens, |S|, d]
        if self.granularity not in ("patch", "hybrid"):
            logits = self._offset(self._image_logits(instruction)) / self.temperature  # [b, |S|]
            weights = self._sparse(logits.softmax(-1))
            features = torch.einsum("bl,btld->btd", weights, states)
            return MoLOutput(features, weights, switch_balance_loss(weights))
        tokens = states.shape[1]
        context = torch.cat([instruction[:, None].expand(-1, tokens, -1), states.mean(-2)], -1)
        patch = self.patch_router(context)  # [batch, tokens, |S|]
        if self.granularity == "hybrid":  # log π^img + log π^patch, renormalised by the softmax
            patch = patch + self.image_router(instruction)[:, None]
        patch = self._offset(patch) / self.temperature
        weights = self._sparse(patch.softmax(-1))
        features = torch.einsum("btl,btld->btd", weights, states)
        return MoLOutput(features, weights, switch_balance_loss(weights.flatten(0, 1)))

    def _image_logits(self, instruction: torch.Tensor) -> torch.Tensor:
        if self.granularity == "image":
            return self.image_router(instruction)
        batch = instruction.shape[0]
        if self.granularity == "static":
            return self.static_logits.expand(batch, -1)
        return instruction.new_zeros(batch, len(self.layers))  # uniform

    def _sparse(self, weights: torch.Tensor) -> torch.Tensor:
        return weights if self.top_k is None else keep_top_k(weights, self.top_k)


def _resolve(layer: int, num_hidden_layers: int, name: str) -> int:
    total = num_hidden_layers + 1
    require(isinstance(layer, int) and -total <= layer < total, name,
            f"an index into the {total} hidden states, in [{-total}, {total - 1}]", layer)  # fmt: skip
    return layer % total


class FixedLayer(nn.Module):
    """The single-layer baseline: one layer's states (LLaVA's ``vision_feature_layer``), through
    a LayerNorm unless it is the default layer the projector was trained on (as in MoL)."""

    def __init__(self, hidden_size: int, layer: int, num_hidden_layers: int, *,
                 default_layer: int = -2) -> None:  # fmt: skip
        super().__init__()
        self.layers = [_resolve(layer, num_hidden_layers, "layer")]
        default = _resolve(default_layer, num_hidden_layers, "default_layer")
        self.norm = nn.Identity() if self.layers[0] == default else nn.LayerNorm(hidden_size)

    def forward(
        self, hidden_states: Sequence[torch.Tensor], instruction: torch.Tensor
    ) -> MoLOutput:
        features = self.norm(hidden_states[self.layers[0]])
        weights = features.new_ones(features.shape[0], 1)
        return MoLOutput(features, weights, features.new_ones(()))


class LayerConcat(nn.Module):
    """DenseConnector's sparse token integration: the layers' states side by side on the
    channels (``[batch, tokens, |S|·d]``), as transformers' LLaVA does for a list
    ``vision_feature_layer``; the projector's first linear is widened to read them
    (:func:`~mixlab.attention_arch.mol.llava.widen_projector`)."""

    def __init__(self, layers: Sequence[int], num_hidden_layers: int) -> None:
        super().__init__()
        require(len(layers) > 0, "layers", "a non-empty set of layer indices", layers)
        self.layers = [_resolve(i, num_hidden_layers, "layers") for i in layers]
        require(len(set(self.layers)) == len(self.layers), "layers", "distinct layers", layers)

    def forward(
        self, hidden_states: Sequence[torch.Tensor], instruction: torch.Tensor
    ) -> MoLOutput:
        features = torch.cat([hidden_states[i] for i in self.layers], dim=-1)
        weights = features.new_full((features.shape[0], len(self.layers)), 1 / len(self.layers))
        return MoLOutput(features, weights, features.new_ones(()))
