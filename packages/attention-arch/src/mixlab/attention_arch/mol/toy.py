"""The toy MLLM lab: a tiny transformers ``LlavaForConditionalGeneration`` (``CLIPVisionConfig`` +
``LlamaConfig``, a word-level ``PreTrainedTokenizerFast``) trained here once and cached.

1. The vision encoder is pre-trained on :func:`~.tasks.encoder_labels` (the large shape, or
   "chart": what a web caption mentions) through a linear head on CLIP's pooled CLS token, then
   frozen. Each image comes with a recoloured view (the same scene in permuted hues), and its
   ``invariant_layers`` deepest layers are pulled to the same states on both views (weight
   ``invariance_weight``, 1 − cosine per token), as colour-jitter augmentation makes a
   contrastive encoder's deep features hue-invariant: those layers drop the small objects'
   colours, which the shallow ones keep (issue 65's premise).
2. Stage 1 trains the projector and the language model on the penultimate layer (LLaVA's
   ``vision_feature_layer = -2``) over every VQA question type.

Every system of the experiment starts from this base. :func:`toy_llava` returns it (training it
into the mixlab cache the first time: :func:`toy_folder`, keyed by the :class:`ToySpec` and the
source of :data:`TOY_CODE`); :func:`save_toy` writes it as a transformers folder with its
processor, which ``LlavaForConditionalGeneration.from_pretrained`` and the CLI load.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mixlab.attention_arch.mol.data import encode_prompts, image_token_count
from mixlab.attention_arch.mol.tasks import (
    ANSWERS,
    ENCODER_CLASSES,
    encoder_labels,
    make_vqa,
    question_words,
)
from mixlab.shared import is_count, progress, require
from mixlab.shared.cache import cached

__all__ = [
    "SPECIALS",
    "TOY_CODE",
    "ToySpec",
    "load_toy",
    "save_toy",
    "toy_folder",
    "toy_llava",
    "toy_tokenizer",
    "vision_states_of",
]

TOY_CODE = tuple(
    f"mixlab.attention_arch.mol.{name}"
    for name in ("toy", "tasks", "data", "training", "layers", "llava")
)
"""the modules whose source makes the cached toy (and the vision states cached from it)"""

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>", "<image>")


@dataclass(frozen=True)
class ToySpec:
    size: int = 32
    patch_size: int = 8
    vision_width: int = 64
    vision_depth: int = 6
    vision_heads: int = 4
    lm_width: int = 64
    lm_depth: int = 2
    lm_heads: int = 4
    encoder_images: int = 6000
    encoder_steps: int = 1500
    encoder_lr: float = 1e-3
    invariance_weight: float = 0.1
    invariant_layers: int = 2
    base_examples: int = 6000
    base_steps: int = 3000
    base_lr: float = 2e-3
    batch_size: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, int) and field.name != "seed":
                require(is_count(value), field.name, "an integer >= 1", value)
        require(self.invariant_layers <= self.vision_depth, "invariant_layers",
                f"at most vision_depth = {self.vision_depth}", self.invariant_layers)  # fmt: skip
        require(self.invariance_weight >= 0, "invariance_weight", "a number >= 0",
                self.invariance_weight)  # fmt: skip
        require(self.size % self.patch_size == 0, "patch_size", f"a divisor of size={self.size}",
                self.patch_size)  # fmt: skip


def toy_tokenizer():
    """Word-level: the specials, every question word and every answer; whitespace-split."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = [w for w in (*question_words(), *ANSWERS)]
    vocab = {w: i for i, w in enumerate(dict.fromkeys((*SPECIALS, *words)))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        unk_token="<unk>", extra_special_tokens={"image_token": "<image>"},
    )  # fmt: skip
    return tokenizer


def toy_config(spec: ToySpec, tokenizer):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision = CLIPVisionConfig(
        hidden_size=spec.vision_width, intermediate_size=2 * spec.vision_width,
        num_hidden_layers=spec.vision_depth, num_attention_heads=spec.vision_heads,
        image_size=spec.size, patch_size=spec.patch_size,
    )  # fmt: skip
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.lm_width, intermediate_size=2 * spec.lm_width,
        num_hidden_layers=spec.lm_depth, num_attention_heads=spec.lm_heads,
        num_key_value_heads=spec.lm_heads, max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False,
        # 1/sqrt(width): Llama's 0.02 is sized for width ~4096; at width 64 it leaves q·k near
        # zero, and attention learnt to find one small object only after thousands of steps
        initializer_range=spec.lm_width**-0.5,
    )  # fmt: skip
    return LlavaConfig(
        vision_config=vision, text_config=text,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-2, vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
    )  # fmt: skip


def toy_processor(tokenizer, spec: ToySpec):
    """LLaVA's processor for the toy: images resized to ``size``² and scaled to [-1, 1]."""
    from transformers import CLIPImageProcessor, LlavaProcessor

    image_processor = CLIPImageProcessor(
        size={"shortest_edge": spec.size}, crop_size={"height": spec.size, "width": spec.size},
        image_mean=[0.5] * 3, image_std=[0.5] * 3, do_convert_rgb=True,
    )  # fmt: skip
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer,
                          patch_size=spec.patch_size, vision_feature_select_strategy="default",
                          num_additional_image_tokens=1)  # fmt: skip


def pretrain_encoder(tower, spec: ToySpec) -> float:
    """Train ``tower`` (a CLIPVisionModel) with a linear head on caption labels, on each image
    and its recoloured view, its deepest ``spec.invariant_layers`` layers pulled to agree on the
    two (module docstring); returns the held-out accuracy."""
    images, labels, views = encoder_labels(
        spec.encoder_images, size=spec.size, seed=spec.seed + 1, recoloured=True
    )
    head = torch.nn.Linear(spec.vision_width, len(ENCODER_CLASSES))
    params = [*tower.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(params, lr=spec.encoder_lr, weight_decay=0.05)
    generator = torch.Generator().manual_seed(spec.seed)
    tower.train()
    with progress(spec.encoder_steps, "toy MLLM: pre-train the vision encoder") as bar:
        for _ in range(spec.encoder_steps):
            index = torch.randint(len(labels), (spec.batch_size,), generator=generator)
            out = tower(pixel_values=torch.cat([images[index], views[index]]),
                        output_hidden_states=True)  # fmt: skip
            loss = torch.nn.functional.cross_entropy(
                head(out.pooler_output), labels[index].repeat(2)
            )
            deep = out.hidden_states[len(out.hidden_states) - spec.invariant_layers :]
            disagreement = torch.stack([  # 1 − cos per token, the two views of each image
                1 - torch.nn.functional.cosine_similarity(*states.chunk(2), dim=-1).mean()
                for states in deep
            ]).mean()  # fmt: skip
            loss = loss + spec.invariance_weight * disagreement
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            bar.advance(loss=loss.item(), disagreement=disagreement.item())
    tower.eval()
    test_images, test_labels = encoder_labels(1000, size=spec.size, seed=spec.seed + 2)
    with torch.no_grad():
        predicted = head(tower(pixel_values=test_images).pooler_output).argmax(-1)
    return float((predicted == test_labels).float().mean())


@torch.no_grad()
def vision_states_of(model, images: torch.Tensor, batch_size: int = 500) -> list[torch.Tensor]:
    """Every layer's frozen states (CLS dropped) of ``images``, in float16 ``[n, tokens, d]``."""
    parts = []
    with progress(-(-len(images) // batch_size), "vision states (batches)") as bar:
        for i in range(0, len(images), batch_size):
            parts.append(model.vision_states(images[i : i + batch_size]))
            bar.advance()
    return [torch.cat([p[layer] for p in parts]).half() for layer in range(len(parts[0]))]


def _train_base(llava, tokenizer, spec: ToySpec) -> dict[str, Any]:
    from mixlab.attention_arch.mol.layers import FixedLayer
    from mixlab.attention_arch.mol.llava import MoLLlava
    from mixlab.attention_arch.mol.training import TrainSpec, answer_hits, cached_batches, train

    config = llava.config
    model = MoLLlava(llava, FixedLayer(spec.vision_width, -2, spec.vision_depth))
    tokens = image_token_count(config)
    out: dict[str, Any] = {}
    batches, types = {}, []
    for split, n, seed in (
        ("train", spec.base_examples, spec.seed + 3),
        ("test", 600, spec.seed + 4),
    ):
        data = make_vqa(n, size=spec.size, seed=seed)
        prompts = encode_prompts(tokenizer, data.questions, data.answers, image_tokens=tokens)
        batches[split] = (cached_batches(vision_states_of(model, data.images), prompts), len(data))
        types = data.question_types
    train(model, *batches["train"], TrainSpec(steps=spec.base_steps, batch_size=spec.batch_size,
                                              lr=spec.base_lr, trainable="all", seed=spec.seed),
          description="toy MLLM: stage 1 on layer -2")  # fmt: skip
    hits, _ = answer_hits(model, *batches["test"])
    for question in dict.fromkeys(types):
        picked = torch.tensor([t == question for t in types])
        out[f"base_accuracy_{question}"] = float(hits[picked].float().mean())
    return out


def toy_llava(spec: ToySpec | None = None, *, cache: bool = True, log=None):
    """The trained toy ``(llava, processor, info)``: with ``cache`` from :func:`toy_folder` (trained
    into the mixlab cache the first time), else trained here (encoder pre-training, then stage 1).
    ``info`` holds the encoder's accuracy and the one-time training seconds; ``log`` (a function
    of one line, optional) is told when each training stage starts."""
    spec = spec or ToySpec()
    if cache:
        return load_toy(toy_folder(spec, log=log))
    llava, processor, info = _train_toy(spec, log)
    return llava.eval(), processor, info


def toy_folder(spec: ToySpec | None = None, *, log=None) -> Path:
    """The cache entry of the toy of ``spec`` (``cache_dir("mol")/toy-<digest>``, a transformers
    folder with ``toy.json``), trained into it by :func:`mixlab.shared.cache.cached` when absent;
    keyed by ``spec`` and the source of :data:`TOY_CODE`."""
    spec = spec or ToySpec()

    def build(folder: Path) -> None:
        _write_toy(*_train_toy(spec, log), folder)

    return cached("mol", "toy", dataclasses.asdict(spec), build, code=TOY_CODE)


def load_toy(folder: str | Path):
    """``(llava, processor, info)`` of a toy folder (:func:`toy_folder` or :func:`save_toy`)."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    folder = Path(folder)
    llava = LlavaForConditionalGeneration.from_pretrained(folder)
    info = json.loads((folder / "toy.json").read_text())
    return llava.eval(), AutoProcessor.from_pretrained(folder), info


def _train_toy(spec: ToySpec, log=None):
    from transformers import LlavaForConditionalGeneration

    torch.manual_seed(spec.seed)
    tokenizer = toy_tokenizer()
    llava = LlavaForConditionalGeneration(toy_config(spec, tokenizer))
    started = time.perf_counter()
    if log is not None:
        log(f"toy MLLM: pre-training the vision encoder ({spec.encoder_steps} steps)")
    info: dict[str, Any] = {"encoder_accuracy": pretrain_encoder(llava.model.vision_tower, spec)}
    info["encoder_s"] = time.perf_counter() - started
    if log is not None:
        log(f"toy MLLM: stage 1 on layer -2 ({spec.base_steps} steps)")
    info.update(_train_base(llava, tokenizer, spec))
    info["train_s"] = time.perf_counter() - started
    info["spec"] = dataclasses.asdict(spec)
    return llava, toy_processor(tokenizer, spec), info


def _write_toy(llava, processor, info: dict[str, Any], folder: Path) -> None:
    llava.save_pretrained(folder)
    processor.save_pretrained(folder)
    (folder / "toy.json").write_text(json.dumps(info, indent=1))


def save_toy(llava, processor, info: dict[str, Any], folder: str | Path) -> Path:
    """The toy as a transformers folder (model, processor) plus ``toy.json`` (how it was made)."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    _write_toy(llava, processor, info, tmp)
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder
