"""Prompts and data folders for MoL's LLaVA: the same encoding serves the toy experiment (on cached
vision states) and a user's model and data (``mixlab-attn mol train/eval``).

A data folder holds images and ``data.jsonl``, one ``{"image", "question", "answer", "task"}``
record per line (``image`` relative to the folder; ``task`` optional, a label for per-task
accuracy).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from mixlab.shared import require

__all__ = ["EncodedPrompts", "VQARecords", "encode_prompts", "image_token_count", "load_records",
           "write_records"]  # fmt: skip

IMAGE_PLACEHOLDER = "<image>"


def image_token_count(config) -> int:
    """How many placeholders one image fills in a LLaVA-1.5 prompt: one per patch, and the CLS
    token unless ``vision_feature_select_strategy`` is ``"default"`` (transformers' rule)."""
    vision = config.vision_config
    patches = (vision.image_size // vision.patch_size) ** 2
    has_cls = getattr(vision, "model_type", "") in ("clip_vision_model", "clip")
    keeps_cls = has_cls and config.vision_feature_select_strategy != "default"
    return patches + int(keeps_cls)


@dataclass
class EncodedPrompts:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    """-100 everywhere but the answer's tokens"""
    answer_start: torch.Tensor
    """index of each answer's first token (its prediction sits one position earlier)"""

    def select(self, index: torch.Tensor) -> EncodedPrompts:
        """The rows ``index`` of every field."""
        return EncodedPrompts(self.input_ids[index], self.attention_mask[index],
                              self.labels[index], self.answer_start[index])  # fmt: skip


def _prompt(tokenizer, question: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": f"{IMAGE_PLACEHOLDER}\n{question}"}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{IMAGE_PLACEHOLDER} {question}"


def encode_prompts(tokenizer, questions: list[str], answers: list[str] | None, *,
                   image_tokens: int, image_token: str = IMAGE_PLACEHOLDER,
                   left_pad: bool = False) -> EncodedPrompts:  # fmt: skip
    """Token ids of ``image_tokens`` placeholders, each question (the chat template's user
    turn when the tokenizer has one) and, when given, the answer; right-padded (training), or
    left-padded for ``generate``."""
    require(len(questions) > 0, "questions", "at least one question", 0)
    require(answers is None or len(answers) == len(questions), "answers",
            f"one answer per question ({len(questions)})", None if answers is None else len(answers))  # fmt: skip
    rows, starts = [], []
    for i, question in enumerate(questions):
        text = _prompt(tokenizer, question).replace(IMAGE_PLACEHOLDER, image_token * image_tokens)
        ids = tokenizer(text)["input_ids"]
        starts.append(len(ids))
        if answers is not None:
            ids = ids + tokenizer(" " + answers[i], add_special_tokens=False)["input_ids"]
        rows.append(ids)
    length = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(rows), length), pad, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, -100)
    for i, (ids, start) in enumerate(zip(rows, starts, strict=True)):
        offset = length - len(ids) if left_pad else 0
        input_ids[i, offset : offset + len(ids)] = torch.tensor(ids)
        attention_mask[i, offset : offset + len(ids)] = 1
        labels[i, offset + start : offset + len(ids)] = input_ids[
            i, offset + start : offset + len(ids)
        ]
        starts[i] += offset
    return EncodedPrompts(input_ids, attention_mask, labels, torch.tensor(starts))


@dataclass
class VQARecords:
    images: list[Path]
    questions: list[str]
    answers: list[str]
    tasks: list[str]

    def __len__(self) -> int:
        return len(self.questions)


def load_records(directory: str | Path) -> VQARecords:
    """The records of a data folder (module docstring); a clear error for a malformed one."""
    directory = Path(directory)
    path = directory / "data.jsonl"
    require(path.is_file(), "data", "a folder with images and data.jsonl", str(directory))
    records = VQARecords([], [], [], [])
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"data: line {number} of {path} is not JSON ({error.msg})") from None
        require(isinstance(record, dict) and all(k in record for k in ("image", "question", "answer")),
                "data", "records with image, question and answer", f"line {number}: {line[:80]}")  # fmt: skip
        image = directory / record["image"]
        require(image.is_file(), "data", "image paths relative to the folder", str(image))
        records.images.append(image)
        records.questions.append(str(record["question"]))
        records.answers.append(str(record["answer"]))
        records.tasks.append(str(record.get("task", "all")))
    require(len(records) > 0, "data", "at least one record in data.jsonl", 0)
    return records


def write_records(directory: str | Path, images: torch.Tensor, questions: list[str],
                  answers: list[str], tasks: list[str]) -> Path:  # fmt: skip
    """A data folder from images in [-1, 1] ``[n, 3, h, w]`` (PNG files) and their records."""
    from PIL import Image

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    pixels = ((images + 1) * 127.5).round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()
    lines = []
    for i, (question, answer, task) in enumerate(zip(questions, answers, tasks, strict=True)):
        name = f"{i:05d}.png"
        Image.fromarray(pixels[i]).save(directory / name)
        lines.append(
            json.dumps({"image": name, "question": question, "answer": answer, "task": task})
        )
    (directory / "data.jsonl").write_text("\n".join(lines) + "\n")
    return directory
