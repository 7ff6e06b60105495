"""The experiment's base encoder (issue 28, in progress): the shared toy ViT pre-trained on both
modalities, unpaired, on one generic label (how many shapes), then frozen as in OneLLM.

Each step draws a batch of one modality (alternating), so the trunk sees RGB and depth scenes but
never a pair; a linear head on the class token predicts the count. The head is dropped after.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mixlab.vision_mm.mop.encoder import SharedEncoder, toy_trunk
from mixlab.vision_mm.mop.scenes import MODALITY_CHANNELS, make_scenes

__all__ = ["EncoderSpec", "LMSpec", "count_labels", "pretrain_encoder", "pretrain_lm", "toy_lm"]

COUNTS = (2, 3, 4)


@dataclass(frozen=True)
class EncoderSpec:
    size: int = 32
    patch: int = 4
    dim: int = 64
    depth: int = 6
    heads: int = 4
    scenes: int = 4000
    """scenes per modality, drawn separately for each (unpaired)"""
    test_scenes: int = 500
    """held-out scenes per modality for the reported count accuracy"""
    steps: int = 1500
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0

    def build(self) -> SharedEncoder:
        modalities = {m: (c, self.size, self.patch) for m, c in MODALITY_CHANNELS.items()}
        return SharedEncoder(toy_trunk(self.dim, self.depth, self.heads), modalities)


def count_labels(questions_scenes) -> np.ndarray:
    """Shape counts (as class indices) of scenes drawn with ``types=("count",)``."""
    return np.array([COUNTS.index(int(a)) for a in questions_scenes.answers])


def pretrain_encoder(spec: EncoderSpec) -> tuple[SharedEncoder, dict[str, float]]:
    """Train the trunk and both tokenizers on unpaired count labels; returns the encoder (trunk
    frozen) and the held-out count accuracy per modality."""
    torch.manual_seed(spec.seed)
    encoder = spec.build()
    head = nn.Linear(encoder.dim, len(COUNTS))
    data = {}
    for k, modality in enumerate(MODALITY_CHANNELS):  # a separate draw per modality: unpaired
        scenes = make_scenes(spec.scenes, spec.seed * 10 + k, size=spec.size, types=("count",))
        data[modality] = (torch.tensor(scenes.images[modality]), torch.tensor(count_labels(scenes)))
    parameters = [*encoder.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=spec.lr, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, spec.lr, total_steps=spec.steps, pct_start=0.1
    )
    generator = torch.Generator().manual_seed(spec.seed)
    modalities = list(data)
    for step in range(spec.steps):
        modality = modalities[step % len(modalities)]
        images, labels = data[modality]
        rows = torch.randint(len(labels), (spec.batch_size,), generator=generator)
        logits = head(encoder.hidden_states(modality, images[rows])[-1][:, 0])
        loss = F.cross_entropy(logits, labels[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    accuracy = {}
    with torch.no_grad():
        for k, modality in enumerate(modalities):
            test = make_scenes(spec.test_scenes, 10_000 + k, size=spec.size, types=("count",))
            logits = head(
                encoder.hidden_states(modality, torch.tensor(test.images[modality]))[-1][:, 0]
            )
            accuracy[modality] = float((logits.argmax(-1).numpy() == count_labels(test)).mean())
    for parameter in encoder.trunk.parameters():
        parameter.requires_grad_(False)
    return encoder, accuracy


@dataclass(frozen=True)
class LMSpec:
    """The toy Llama: pre-trained on the questions and answers alone (no image), so it knows the
    format and the answer priors before any system attaches a modality."""

    width: int = 64
    depth: int = 2
    heads: int = 4
    examples: int = 4000
    steps: int = 600
    batch_size: int = 64
    lr: float = 2e-3
    seed: int = 0


def toy_lm(spec: LMSpec, tokenizer):
    """A ``LlamaForCausalLM`` sized by ``spec`` for ``tokenizer``'s vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.width, intermediate_size=2 * spec.width,
        num_hidden_layers=spec.depth, num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
        max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False,
        # 1/sqrt(width): Llama's 0.02 is sized for width ~4096 and leaves q·k near zero at 64
        initializer_range=spec.width**-0.5,
    )  # fmt: skip
    torch.manual_seed(spec.seed)
    return LlamaForCausalLM(config)


def pretrain_lm(spec: LMSpec) -> tuple[torch.nn.Module, object, float]:
    """The toy tokenizer and Llama trained on question–answer text; also its held-out exact-match
    accuracy (the blind, question-only prior)."""
    from mixlab.vision_mm.mop.scenes import vocabulary
    from mixlab.vision_mm.mop.text import answer_hits, encode_qa, word_tokenizer

    tokenizer = word_tokenizer(vocabulary())
    lm = toy_lm(spec, tokenizer)
    train = make_scenes(spec.examples, spec.seed + 500)
    encoded = encode_qa(tokenizer, train.questions, train.answers)
    optimizer = torch.optim.AdamW(lm.parameters(), lr=spec.lr, weight_decay=0.01)
    generator = torch.Generator().manual_seed(spec.seed)
    lm.train()
    for _ in range(spec.steps):
        rows = encoded.rows(torch.randint(len(train), (spec.batch_size,), generator=generator))
        loss = lm(
            input_ids=rows.input_ids, attention_mask=rows.attention_mask, labels=rows.labels
        ).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    lm.eval()
    test = make_scenes(400, 20_000)
    held = encode_qa(tokenizer, test.questions, test.answers)
    with torch.no_grad():
        logits = lm(input_ids=held.input_ids, attention_mask=held.attention_mask).logits
    return lm, tokenizer, float(answer_hits(logits, held.labels).float().mean())
