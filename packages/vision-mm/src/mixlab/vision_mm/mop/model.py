"""An MLLM with a privileged modality: shared encoder → probes → projector → any transformers
causal LM through ``inputs_embeds`` (the LLaVA recipe with MoP or a baseline as the connector).

Each modality runs alone: :meth:`PrivilegedMLLM.forward` takes one modality's images, so a model
trained on RGB and depth is served on RGB only (or depth only) with no change. The visual prefix
comes first and is never a label.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from mixlab.vision_mm.mop.encoder import SharedEncoder
from mixlab.vision_mm.mop.probes import ProbeOutput

__all__ = ["MLLMOutput", "PrivilegedMLLM"]

IGNORE = -100


@dataclass
class MLLMOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor
    probes: ProbeOutput


class PrivilegedMLLM(nn.Module):
    """``encoder`` (frozen unless ``train_encoder``: OneLLM freezes it and trains the tokenizers
    unless ``train_tokenizers=False``), ``connector`` (:class:`~.probes.MixtureOfProbes` or a baseline) and ``lm`` (a
    transformers causal LM), joined by LLaVA's two-layer MLP projector."""

    def __init__(
        self,
        encoder: SharedEncoder,
        connector: nn.Module,
        lm: nn.Module,
        *,
        train_encoder: bool = False,
        train_tokenizers: bool = True,
    ):
        super().__init__()
        self.encoder, self.connector, self.lm = encoder, connector, lm
        width = lm.get_input_embeddings().embedding_dim
        self.projector = nn.Sequential(
            nn.Linear(encoder.dim, width), nn.GELU(), nn.Linear(width, width)
        )
        for parameter in encoder.trunk.parameters():
            parameter.requires_grad_(train_encoder)
        for parameter in encoder.tokenizers.parameters():
            parameter.requires_grad_(train_encoder or train_tokenizers)

    @property
    def modalities(self) -> list[str]:
        return list(self.encoder.tokenizers)

    def save_pretrained(self, folder: str | Path, tokenizer=None) -> Path:
        """``folder/mop.json`` (the layout), ``parts.safetensors`` (tokenizers, connector,
        projector and a toy trunk), ``encoder/`` (a CLIP trunk, ``save_pretrained``) and ``lm/``
        (the LM and ``tokenizer``, ``save_pretrained``): :meth:`from_pretrained` reads it back."""
        from safetensors.torch import save_model

        from mixlab.vision_mm.mop.probes import connector_kind

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        trunk = self.encoder.trunk
        toy = getattr(trunk, "toy_config", None)
        parts = nn.ModuleDict({"tokenizers": self.encoder.tokenizers, "connector": self.connector,
                               "projector": self.projector})  # fmt: skip
        if toy is None:
            trunk.save_pretrained(folder / "encoder")
        else:
            parts["trunk"] = trunk
        save_model(parts, str(folder / "parts.safetensors"))
        self.lm.save_pretrained(folder / "lm")
        if tokenizer is not None:
            tokenizer.save_pretrained(folder / "lm")
        modalities = {
            m: [t.channels, t.size, t.proj.kernel_size[0]]
            for m, t in self.encoder.tokenizers.items()
        }
        layout = {"format": "mixlab-mop/1", "toy_trunk": toy, "modalities": modalities,
                  "connector": {"kind": connector_kind(self.connector), "config": self.connector.config}}  # fmt: skip
        (folder / "mop.json").write_text(json.dumps(layout, indent=1) + "\n")
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> PrivilegedMLLM:
        """A model saved by :meth:`save_pretrained` (its LM loaded with ``AutoModelForCausalLM``)."""
        from safetensors.torch import load_model
        from transformers import AutoModelForCausalLM, CLIPVisionModel

        from mixlab.vision_mm.mop.encoder import toy_trunk
        from mixlab.vision_mm.mop.probes import build_connector

        folder = Path(folder)
        if not (folder / "mop.json").is_file():
            raise FileNotFoundError(
                f"{folder} has no mop.json: not a model saved by save_pretrained"
            )
        layout = json.loads((folder / "mop.json").read_text())
        toy = layout["toy_trunk"]
        trunk = toy_trunk(**toy) if toy else CLIPVisionModel.from_pretrained(folder / "encoder")
        encoder = SharedEncoder(trunk, {m: tuple(v) for m, v in layout["modalities"].items()})
        connector = build_connector(layout["connector"]["kind"], layout["connector"]["config"])
        model = cls(encoder, connector, AutoModelForCausalLM.from_pretrained(folder / "lm"))
        parts = nn.ModuleDict({"tokenizers": encoder.tokenizers, "connector": connector,
                               "projector": model.projector})  # fmt: skip
        if toy:
            parts["trunk"] = trunk
        load_model(parts, str(folder / "parts.safetensors"))
        return model.eval()

    def visual_prefix(
        self, modality: str, images: torch.Tensor | None, *, features: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ProbeOutput]:
        """The projected prefix [B, T, H] of ``images`` of one ``modality`` and the probes' output;
        ``features``: the frozen encoder's stacked hidden states [B, L + 1, N, D] (see
        :meth:`encode`) in place of the images."""
        if features is None:
            states = self.encoder.hidden_states(modality, images)
        else:
            if modality not in self.encoder.tokenizers:
                raise ValueError(f"modality must be one of {self.modalities}, got {modality!r}")
            states = features.transpose(0, 1)
        probes = self.connector(states)
        return self.projector(probes.prefix), probes

    @torch.no_grad()
    def encode(self, modality: str, images: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
        """The encoder's hidden states [B, L + 1, N, D] of ``images``, for training the connector
        and LM on cached features when the encoder and tokenizers are frozen."""
        return self.encoder.stacked_states(modality, images, batch_size)

    @torch.no_grad()
    def generate(
        self, modality: str, images: torch.Tensor | None, input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None, *, features: torch.Tensor | None = None, **kwargs,
    ) -> torch.Tensor:  # fmt: skip
        """The LM's ``generate`` on [visual prefix; tokens] of one modality (``kwargs`` pass
        through); returns the new tokens only, as transformers does for ``inputs_embeds``. A
        left-padded batch keeps its padding between the prefix and each row's tokens, masked."""
        prefix, _ = self.visual_prefix(modality, images, features=features)
        tokens = self.lm.get_input_embeddings()(input_ids)
        ones = torch.ones(prefix.shape[:2], dtype=torch.long, device=tokens.device)
        mask = torch.cat(
            [ones, torch.ones_like(input_ids) if attention_mask is None else attention_mask], 1
        )
        embeds = torch.cat([prefix.to(tokens.dtype), tokens], 1)
        return self.lm.generate(inputs_embeds=embeds, attention_mask=mask, **kwargs)

    def forward(
        self, modality: str, images: torch.Tensor | None, input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None, *,
        features: torch.Tensor | None = None,
    ) -> MLLMOutput:  # fmt: skip
        """The LM on [visual prefix; tokens] of one modality; ``labels`` as in transformers
        (``-100`` ignored; the prefix is never a label); ``features`` as in :meth:`visual_prefix`."""
        rows = len(images if features is None else features)
        if rows != len(input_ids):
            raise ValueError(
                f"images ({rows}) and input_ids ({len(input_ids)}) must have one row per sample"
            )
        prefix, probes = self.visual_prefix(modality, images, features=features)
        tokens = self.lm.get_input_embeddings()(input_ids)
        embeds = torch.cat([prefix.to(tokens.dtype), tokens], 1)
        ones = torch.ones(prefix.shape[:2], dtype=torch.long, device=tokens.device)
        mask = torch.cat(
            [ones, torch.ones_like(input_ids) if attention_mask is None else attention_mask], 1
        )
        full_labels = None
        if labels is not None:
            full_labels = torch.cat([torch.full_like(ones, IGNORE), labels], 1)
        out = self.lm(inputs_embeds=embeds, attention_mask=mask, labels=full_labels)
        return MLLMOutput(out.loss, out.logits[:, prefix.shape[1] :], probes)
