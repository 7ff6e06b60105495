"""A shared encoder with one patch tokenizer per modality (OneLLM's layout: per-modality
``conv1`` and positions in front of one frozen CLIP transformer).

The transformer trunk is a transformers ``CLIPVisionModel`` (its pre-norm and encoder layers; its
own patch embedding is not used) or the toy pre-norm ViT of :func:`toy_trunk`. :meth:`hidden_states`
returns HF's ``output_hidden_states`` layout: the embedding output first, then every layer.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

__all__ = ["ModalityTokenizer", "SharedEncoder", "toy_trunk"]


class ModalityTokenizer(nn.Module):
    """Patches of a [B, C, S, S] input embedded to D, a class token and learned positions."""

    def __init__(self, channels: int, size: int, patch: int, dim: int) -> None:
        super().__init__()
        if size % patch:
            raise ValueError(f"patch must divide the input size {size}, got {patch}")
        self.channels, self.size = channels, size
        self.proj = nn.Conv2d(channels, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.positions = nn.Parameter(torch.randn(1, 1 + (size // patch) ** 2, dim) * 0.02)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4 or images.shape[1:] != (self.channels, self.size, self.size):
            raise ValueError(
                f"input must be [batch, {self.channels}, {self.size}, {self.size}] for this tokenizer, "
                f"got {list(images.shape)}"
            )
        patches = self.proj(images).flatten(2).transpose(1, 2)
        return torch.cat([self.cls.expand(len(images), -1, -1), patches], 1) + self.positions


class _ToyLayer(nn.Module):
    """A pre-norm ViT block called as ``layer(hidden, attention_mask)`` like CLIP's."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                                batch_first=True, norm_first=True)  # fmt: skip

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.block(hidden)


def toy_trunk(dim: int = 64, depth: int = 6, heads: int = 4) -> nn.Module:
    """The toy trunk: ``pre_layrnorm`` and ``layers`` named as in CLIP's vision model."""
    trunk = nn.Module()
    trunk.pre_layrnorm = nn.LayerNorm(dim)
    trunk.layers = nn.ModuleList(_ToyLayer(dim, heads) for _ in range(depth))
    trunk.hidden_size = dim
    trunk.toy_config = {"dim": dim, "depth": depth, "heads": heads}
    return trunk


def _parts(trunk: nn.Module) -> tuple[nn.Module, nn.ModuleList, int]:
    """(pre-norm, layers, width) of a ``CLIPVisionModel`` or a :func:`toy_trunk`."""
    vision = getattr(trunk, "vision_model", trunk)  # transformers 4 nests it; 5 does not
    if hasattr(vision, "encoder") and hasattr(vision, "pre_layrnorm"):
        return vision.pre_layrnorm, vision.encoder.layers, trunk.config.hidden_size
    if hasattr(trunk, "layers") and hasattr(trunk, "pre_layrnorm"):
        return trunk.pre_layrnorm, trunk.layers, trunk.hidden_size
    raise ValueError(
        f"trunk must be a transformers CLIPVisionModel or toy_trunk(), got {type(trunk).__name__}"
    )


class SharedEncoder(nn.Module):
    """``tokenizers[modality]`` in front of one shared ``trunk``; ``modalities`` maps each name to
    its input (channels, size, patch)."""

    def __init__(self, trunk: nn.Module, modalities: Mapping[str, tuple[int, int, int]]) -> None:
        super().__init__()
        if not modalities:
            raise ValueError("modalities must name at least one modality")
        self.trunk = trunk
        self.dim = _parts(trunk)[2]  # the trunk's modules are read through it, never re-registered
        self.tokenizers = nn.ModuleDict(
            {name: ModalityTokenizer(c, s, p, self.dim) for name, (c, s, p) in modalities.items()}
        )

    @property
    def num_hidden_states(self) -> int:
        return len(_parts(self.trunk)[1]) + 1

    def hidden_states(self, modality: str, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every hidden state of ``images`` of ``modality`` (only its tokenizer runs)."""
        if modality not in self.tokenizers:
            raise ValueError(f"modality must be one of {list(self.tokenizers)}, got {modality!r}")
        pre_norm, layers, _ = _parts(self.trunk)
        h = pre_norm(self.tokenizers[modality](images))
        states = [h]
        for layer in layers:
            h = layer(h, None)
            states.append(h)
        return tuple(states)

    @torch.no_grad()
    def stacked_states(
        self, modality: str, images: torch.Tensor, batch_size: int = 256
    ) -> torch.Tensor:
        """Every hidden state of ``images`` as one tensor [B, L + 1, N, D], ``batch_size`` images
        at a time (the cached features of a frozen encoder)."""
        chunks = [torch.stack(self.hidden_states(modality, images[i : i + batch_size]), 1)
                  for i in range(0, len(images), batch_size)]  # fmt: skip
        return torch.cat(chunks)
