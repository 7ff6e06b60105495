"""The experiment's bases: the shared toy ViT pre-trained on both modalities, unpaired, on one
generic label, then frozen as in OneLLM; and the toy Llama pre-trained on the question–answer text.

The encoder's label is dense and says nothing about the questions' relations: the kind of shape
visible at each patch's centre (background, circle, square, triangle), read by a linear head from
every patch token of the last layer. Each step draws a batch of one modality (alternating), so the
trunk sees RGB and depth scenes but never a pair. The head is dropped after.

The frozen encoder's hidden states of the train and test scenes, which every system trains and is
tested on, are made here too (:func:`encode_scenes`): the experiment caches them keyed by this
module's source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mixlab.shared import progress
from mixlab.shared.files import write_json_atomic
from mixlab.vision_mm.mop.encoder import SharedEncoder, toy_trunk
from mixlab.vision_mm.mop.scenes import MODALITY_CHANNELS, SHAPES, make_scenes

__all__ = [
    "EncoderSpec",
    "LMSpec",
    "depth_order_cnn",
    "encode_scenes",
    "patch_labels",
    "pretrain_encoder",
    "pretrain_lm",
    "toy_lm",
]


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
    modalities: tuple[str, ...] = ("rgb", "depth")
    seed: int = 0

    def build(self) -> SharedEncoder:
        modalities = {m: (MODALITY_CHANNELS[m], self.size, self.patch) for m in self.modalities}
        return SharedEncoder(toy_trunk(self.dim, self.depth, self.heads), modalities)


def patch_labels(segmentation: np.ndarray, patch: int) -> np.ndarray:
    """[M, S, S] visible kinds to [M, (S/patch)²]: the kind at each patch's centre."""
    centre = patch // 2
    return segmentation[:, centre::patch, centre::patch].reshape(len(segmentation), -1)


def pretrain_encoder(spec: EncoderSpec) -> tuple[SharedEncoder, dict[str, float]]:
    """Train the trunk and both tokenizers on unpaired per-patch kind labels; returns the encoder
    (trunk frozen) and the held-out per-patch accuracy per modality."""
    torch.manual_seed(spec.seed)
    encoder = spec.build()
    head = nn.Linear(encoder.dim, 1 + len(SHAPES))
    data = {}
    for k, modality in enumerate(spec.modalities):  # a separate draw per modality: unpaired
        scenes = make_scenes(spec.scenes, spec.seed * 10 + k, size=spec.size)
        labels = patch_labels(scenes.segmentation, spec.patch)
        data[modality] = (torch.tensor(scenes.images[modality]), torch.tensor(labels))
    parameters = [*encoder.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=spec.lr, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, spec.lr, total_steps=spec.steps, pct_start=0.1
    )
    generator = torch.Generator().manual_seed(spec.seed)
    modalities = list(data)
    with progress(spec.steps, "pre-training the shared encoder") as bar:
        for step in range(spec.steps):
            modality = modalities[step % len(modalities)]
            images, labels = data[modality]
            rows = torch.randint(len(labels), (spec.batch_size,), generator=generator)
            logits = head(encoder.hidden_states(modality, images[rows])[-1][:, 1:])
            loss = F.cross_entropy(logits.flatten(0, 1), labels[rows].flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            bar.advance(loss=loss.item())
    accuracy = {}
    with torch.no_grad():
        for k, modality in enumerate(modalities):
            test = make_scenes(spec.test_scenes, 10_000 + k, size=spec.size)
            logits = head(
                encoder.hidden_states(modality, torch.tensor(test.images[modality]))[-1][:, 1:]
            )
            hits = logits.argmax(-1).numpy() == patch_labels(test.segmentation, spec.patch)
            accuracy[modality] = float(hits.mean())
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
    with progress(spec.steps, "pre-training the toy Llama") as bar:
        for _ in range(spec.steps):
            rows = encoded.rows(torch.randint(len(train), (spec.batch_size,), generator=generator))
            loss = lm(
                input_ids=rows.input_ids, attention_mask=rows.attention_mask, labels=rows.labels
            ).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            bar.advance(loss=loss.item())
    lm.eval()
    test = make_scenes(400, 20_000)
    held = encode_qa(tokenizer, test.questions, test.answers)
    with torch.no_grad():
        logits = lm(input_ids=held.input_ids, attention_mask=held.attention_mask).logits
    return lm, tokenizer, float(answer_hits(logits, held.labels).float().mean())


def depth_order_cnn(
    scenes: int, test_scenes: int, *, size: int = 32, steps: int = 3000, batch_size: int = 64,
    seed: int = 0, test_seed: int = 2026,
) -> float:  # fmt: skip
    """The information check: a small CNN trained on RGB alone to say whether the leftmost shape
    is nearer than the rightmost, on ``scenes`` scenes; its held-out accuracy (is the depth cue
    in RGB's pixels at all?)."""
    torch.manual_seed(seed)
    train = make_scenes(scenes, seed + 7_000, size=size, types=("depth",))
    test = make_scenes(test_scenes, test_seed, size=size, types=("depth",))
    x, xt = torch.tensor(train.images["rgb"]), torch.tensor(test.images["rgb"])
    y = torch.tensor([a == "leftmost" for a in train.answers], dtype=torch.float32)
    yt = np.array([a == "leftmost" for a in test.answers])
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.Flatten(),
        nn.Linear(64 * (size // 4) ** 2, 128), nn.ReLU(), nn.Linear(128, 1),
    )  # fmt: skip
    optimizer = torch.optim.Adam(net.parameters(), 1e-3)
    generator = torch.Generator().manual_seed(seed)
    with progress(steps, "information CNN") as bar:
        for _ in range(steps):
            rows = torch.randint(len(y), (batch_size,), generator=generator)
            loss = F.binary_cross_entropy_with_logits(net(x[rows])[:, 0], y[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            bar.advance(loss=loss.item())
    with torch.no_grad():
        predicted = torch.cat([net(xt[i : i + 256])[:, 0] for i in range(0, len(xt), 256)]) > 0
    return float((predicted.numpy() == yt).mean())


def encode_scenes(
    folder: Path, encoder: SharedEncoder, split: str, count: int, seed: int, *, size: int,
    modalities: Sequence[str],
) -> None:  # fmt: skip
    """``count`` scenes (``seed``) of ``split`` as the frozen ``encoder``'s hidden states per
    modality (``folder/<modality>.npy``, float16) and their questions (``folder/questions.json``):
    the experiment's cached features."""
    # training scenes carry a question of every type; test scenes one each, in turn
    scenes = make_scenes(count, seed, size=size, every_type=split == "train")
    with torch.no_grad():
        for modality in modalities:
            states = encoder.stacked_states(modality, torch.tensor(scenes.images[modality]))
            np.save(folder / f"{modality}.npy", states.half().numpy())
    questions = {
        "questions": scenes.questions,
        "answers": scenes.answers,
        "types": scenes.types,
        "scene": scenes.scene.tolist(),
    }
    write_json_atomic(folder / "questions.json", questions)
