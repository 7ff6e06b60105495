"""The five towers of MoA3CIR on any open_clip model: pooled embeddings and token sequences.

Query side: T1 reference image, T2 reference description, T3 modification text; target side: T4
target image, T5 target description. ``share="clip"`` keeps CLIP's two encoders (T1 = T4 the
image encoder, T2 = T3 = T5 the text encoder); ``share="none"`` gives each tower its own copy of
the model (five copies: memory grows five-fold).

Tokens are what the encoders hold before pooling: the image encoder's patch tokens after
``ln_post`` (``output_tokens``), the text encoder's positions after ``ln_final`` with a padding
mask. Pooled embeddings are the model's own ``encode_image`` / ``encode_text`` outputs.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

TOWERS = (
    "reference_image",
    "reference_description",
    "modification",
    "target_image",
    "target_description",
)
SHARING = ("clip", "none")
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)

__all__ = ["SHARING", "TOWERS", "ClipTowers", "Encoded", "tiny_clip"]


def tiny_clip(
    *,
    embed_dim: int = 128,
    width: int = 128,
    layers: int = 3,
    heads: int = 4,
    image_size: int = 32,
    patch_size: int = 4,
    context_length: int = 24,
):
    """A small ``open_clip.CLIP`` from config, trained from scratch here (no weights to fetch);
    its config is :func:`tiny_clip`'s keyword arguments."""
    import open_clip

    vision = {"image_size": image_size, "patch_size": patch_size, "width": width,
              "layers": layers, "head_width": width // heads}  # fmt: skip
    text = {"context_length": context_length, "vocab_size": 49408, "width": width,
            "heads": heads, "layers": layers}  # fmt: skip
    return open_clip.CLIP(embed_dim=embed_dim, vision_cfg=vision, text_cfg=text)


@contextlib.contextmanager
def _with_tokens(module: nn.Module):
    """open_clip's towers return (pooled, tokens) while ``output_tokens`` is set."""
    before = module.output_tokens
    module.output_tokens = True
    try:
        yield
    finally:
        module.output_tokens = before


@dataclass
class Encoded:
    """One tower's output: the pooled embedding ``[B, E]``, the tokens ``[B, L, W]`` and, for
    text, the padding mask ``[B, L]`` (True at padding)."""

    pooled: torch.Tensor
    tokens: torch.Tensor
    padding: torch.Tensor | None = None

    def rows(self, index: Any) -> Encoded:
        padding = None if self.padding is None else self.padding[index]
        return Encoded(self.pooled[index], self.tokens[index], padding)


class ClipTowers(nn.Module):
    """The towers over ``clip`` (an ``open_clip.CLIP`` or ``CustomTextCLIP``); images are
    ``[B, 3, S, S]`` in [0, 1] at the model's ``image_size`` (normalised here with the model's
    mean and std), texts are strings (tokenized with ``tokenizer``, default open_clip's BPE at
    the model's context length)."""

    def __init__(self, clip: nn.Module, *, share: str = "clip", tokenizer=None) -> None:
        super().__init__()
        from open_clip.transformer import VisionTransformer

        if not isinstance(getattr(clip, "visual", None), VisionTransformer):
            raise ValueError("clip must be an open_clip model with a VisionTransformer image encoder (its patch "
                             f"tokens feed MoA³), got {type(getattr(clip, 'visual', clip)).__name__}")  # fmt: skip
        if share not in SHARING:
            raise ValueError(f"share must be one of {list(SHARING)}, got {share!r}")
        self.share = share
        if share == "clip":
            self.models = nn.ModuleDict({"shared": clip})
        else:
            self.models = nn.ModuleDict({name: copy.deepcopy(clip) for name in TOWERS})
        visual = clip.visual
        config = getattr(visual, "preprocess_cfg", {}) or {}
        size = visual.image_size
        self.image_size = int(size[0] if isinstance(size, tuple | list) else size)
        self.register_buffer("mean", torch.tensor(config.get("mean", OPENAI_MEAN)).view(1, 3, 1, 1), persistent=False)  # fmt: skip
        self.register_buffer("std", torch.tensor(config.get("std", OPENAI_STD)).view(1, 3, 1, 1), persistent=False)  # fmt: skip
        self.embed_dim = int(visual.output_dim)
        self.image_width = int(visual.transformer.width)
        text = clip.text if hasattr(clip, "text") else clip
        self.text_width = int(text.transformer.width)
        self.context_length = int(text.context_length if hasattr(text, "context_length")
                                  else text.positional_embedding.shape[0])  # fmt: skip
        if tokenizer is None:
            import open_clip

            tokenizer = open_clip.get_tokenizer("ViT-B-32", context_length=self.context_length)
        self.tokenizer = tokenizer

    def model(self, tower: str) -> nn.Module:
        return self.models["shared" if self.share == "clip" else tower]

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        if any(not isinstance(t, str) or not t.strip() for t in texts):
            raise ValueError("texts must be non-empty strings")
        return self.tokenizer(list(texts)).to(self.mean.device)

    def image(self, images: torch.Tensor, tower: str = "reference_image") -> Encoded:
        if images.ndim != 4 or images.shape[1] != 3 or images.shape[-1] != self.image_size:
            raise ValueError(f"images must be [B, 3, {self.image_size}, {self.image_size}] in [0, 1], "
                             f"got {tuple(images.shape)}")  # fmt: skip
        visual = self.model(tower).visual
        with _with_tokens(visual):
            pooled, tokens = visual((images - self.mean) / self.std)
        return Encoded(pooled, tokens)

    def text(self, ids: torch.Tensor, tower: str = "modification") -> Encoded:
        """``ids`` from :meth:`tokenize` (padding id 0)."""
        clip = self.model(tower)
        if hasattr(clip, "text"):  # CustomTextCLIP: a TextTransformer with output_tokens
            with _with_tokens(clip.text):
                pooled, tokens = clip.text(ids)
            return Encoded(pooled, tokens, ids[:, : tokens.shape[1]] == 0)
        from open_clip.transformer import text_global_pool

        # open_clip's CLIP.encode_text, stopping to keep the tokens after ln_final
        cast = clip.transformer.get_cast_dtype()
        x = clip.token_embedding(ids).to(cast) + clip.positional_embedding.to(cast)
        x = clip.ln_final(clip.transformer(x, attn_mask=clip.attn_mask))
        pooled = text_global_pool(x, ids, clip.text_pool_type, eos_token_id=getattr(clip, "text_eos_id", None))  # fmt: skip
        projection = clip.text_projection
        if projection is not None:
            pooled = (
                projection(pooled) if isinstance(projection, nn.Linear) else pooled @ projection
            )
        return Encoded(pooled, x, ids == 0)
