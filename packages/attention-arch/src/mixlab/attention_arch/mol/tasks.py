"""Procedural visual question answering whose fine-grained questions need detail a semantic
encoder discards (issue 23's experiment; spec §3e). Nothing is downloaded.

Every image is drawn with PIL at ``size``² on a dark, noisy background:

- a **scene** has one large shape (:data:`SHAPES`, radius ≈ size/5, a random grey), grey
  clutter specks, and one or two small squares (4–6 px at 64², scaled with ``size``) of the
  :data:`COLOURS`, the only hues in the scene (as V*'s targets stand out once found);
- a **chart** is a bar chart of four bars of distinct colours on axes, heights on a grid of 10
  levels.

Question types (:data:`QUESTION_TYPES`), each answered with one word, grouped into the tasks of
:data:`TASKS`:

- ``vstar``: the colour of the small object; whether it is left or right of the large shape
  (V*-like attribute and spatial questions);
- ``hrbench``: whether the two small objects have the same colour (HR-Bench-like, two instances);
- ``charxiv``: which bar is the tallest; bar three minus bar one in levels, binned into lower,
  close or higher (CharXiv-like, descriptive and reasoning);
- ``semantic``: the large shape (the control a semantic encoder answers well).

:func:`encoder_labels` are what a web caption would mention: the large shape of a scene, or
"chart". The vision encoder is pre-trained on them, and with ``recoloured=True`` each image comes
with a second rendering whose hues are permuted (the same scene, the small objects and bars in
other colours): the view pair that teaches its deep layers to ignore hue, as colour-jitter
augmentation does in contrastive pre-training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw

from mixlab.shared import is_count, require

__all__ = [
    "ANSWERS",
    "COLOURS",
    "ENCODER_CLASSES",
    "QUESTION_TYPES",
    "SHAPES",
    "TASKS",
    "VQASet",
    "encoder_labels",
    "make_vqa",
    "question_words",
]

SHAPES = ("circle", "square", "triangle", "cross")
COLOURS = {
    "red": (225, 45, 45),
    "green": (50, 190, 70),
    "blue": (50, 90, 235),
    "yellow": (240, 220, 50),
    "magenta": (215, 60, 210),
    "cyan": (50, 210, 220),
}
ORDINALS = ("first", "second", "third", "fourth")
DIFFERENCE_BINS = ("lower", "close", "higher")
"""bar three minus bar one: ≤ −2 levels, within ±1 level, ≥ +2 levels"""
ENCODER_CLASSES = (*SHAPES, "chart")

QUESTIONS = {
    "colour": "what colour is the small object ?",
    "position": "is the small object left or right of the large shape ?",
    "match": "do the two small objects have the same colour ?",
    "tallest": "which bar is the tallest ?",
    "difference": "is bar three lower than bar one , close , or higher ?",
    "shape": "what is the large shape ?",
}
QUESTION_TYPES = tuple(QUESTIONS)
TASKS = {
    "vstar": ("colour", "position"),
    "hrbench": ("match",),
    "charxiv": ("tallest", "difference"),
    "semantic": ("shape",),
}
FINE_TASKS = ("vstar", "hrbench", "charxiv")
TASK_OF = {q: task for task, questions in TASKS.items() for q in questions}
ANSWERS = (*COLOURS, "left", "right", "yes", "no", *ORDINALS, *DIFFERENCE_BINS, *SHAPES)


def question_words() -> list[str]:
    """Every word of every question, in a fixed order (the toy tokenizer's vocabulary)."""
    words: list[str] = []
    for text in QUESTIONS.values():
        words += [w for w in text.split() if w not in words]
    return words


@dataclass
class VQASet:
    """``images`` ``[n, 3, size, size]`` in [-1, 1]; ``questions``, ``answers`` and ``tasks``
    (question types, keys of :data:`QUESTIONS`) per image; ``labels``: the encoder's class."""

    images: torch.Tensor
    questions: list[str]
    answers: list[str]
    question_types: list[str]
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.answers)

    @property
    def tasks(self) -> list[str]:
        return [TASK_OF[q] for q in self.question_types]


def _background(size: int, rng: np.random.Generator) -> Image.Image:
    noise = rng.normal(30, 8, (size, size, 3)).clip(0, 255).astype(np.uint8)
    return Image.fromarray(noise)


def _large_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[float, float, float], colour):
    cx, cy, r = box
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif shape == "square":
        s = r * 0.9
        draw.rectangle([cx - s, cy - s, cx + s, cy + s], fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx - r, cy + 0.8 * r), (cx + r, cy + 0.8 * r)], fill=colour)
    else:  # cross: two bars a third of the diameter wide
        w = r / 3
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=colour)
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=colour)


def _free_spot(rng, size: int, side: int, taken: list[tuple[float, float, float]]):
    """A top-left corner for a ``side``-px square clear of the discs in ``taken`` (x, y, r)."""
    for _ in range(200):
        x, y = rng.integers(1, size - side - 1, 2)
        cx, cy = x + side / 2, y + side / 2
        if all(math.hypot(cx - tx, cy - ty) > tr + side for tx, ty, tr in taken):
            return int(x), int(y)
    raise RuntimeError("no free spot for a small object; the image is too small")


Palette = dict[str, tuple[int, int, int]]
"""a colour name -> the RGB it is drawn in (:data:`COLOURS` itself, or a permutation of it)"""


def _scene(question: str, size: int, rng: np.random.Generator, palette: Palette = COLOURS):
    image = _background(size, rng)
    draw = ImageDraw.Draw(image)
    shape = SHAPES[rng.integers(len(SHAPES))]
    radius = size * rng.uniform(0.17, 0.23)
    margin = radius + 1
    cx, cy = rng.uniform(margin, size - margin, 2)
    large_colour = (int(rng.integers(110, 256)),) * 3  # achromatic: the small squares carry the hue
    _large_shape(draw, shape, (cx, cy, radius), large_colour)
    taken = [(cx, cy, radius * 1.15)]
    for _ in range(rng.integers(4, 8)):  # grey clutter specks, 1-2 px
        side = int(rng.integers(1, 3)) * max(1, size // 64)
        x, y = _free_spot(rng, size, side, taken)
        grey = int(rng.integers(70, 160))
        draw.rectangle([x, y, x + side - 1, y + side - 1], fill=(grey, grey, grey))
    names = list(COLOURS)
    first = names[rng.integers(len(names))]
    colours = [first]
    if question == "match":  # same colour half of the time
        colours.append(first if rng.random() < 0.5 else names[rng.integers(len(names))])
    spots = []
    for colour in colours:
        side = int(rng.integers(4, 7)) * max(1, size // 64)
        x, y = _free_spot(rng, size, side, taken)
        taken.append((x + side / 2, y + side / 2, side))
        spots.append((x + side / 2, y + side / 2))
        draw.rectangle([x, y, x + side - 1, y + side - 1], fill=palette[colour])
    answer = {
        "colour": first,
        "position": "left" if spots[0][0] < cx else "right",
        "match": "yes" if colours[0] == colours[-1] else "no",
        "shape": shape,
    }[question]
    return image, answer, ENCODER_CLASSES.index(shape)


def _chart(question: str, size: int, rng: np.random.Generator, palette: Palette = COLOURS):
    image = _background(size, rng)
    draw = ImageDraw.Draw(image)
    levels = 10
    if question == "tallest":  # a unique maximum
        heights = rng.choice(np.arange(1, levels + 1), 4, replace=False)
    else:
        heights = rng.integers(1, levels + 1, 4)
    base, top = size * 0.9, size * 0.1
    left, width = size * 0.12, size * 0.8
    draw.line([(left, top), (left, base), (left + width, base)], fill=(200, 200, 200))
    step = (base - top) / levels
    slot = width / 4
    colours = rng.permutation(list(COLOURS))[:4]
    for i, (h, colour) in enumerate(zip(heights, colours, strict=True)):
        x0 = left + slot * i + slot * 0.2
        draw.rectangle([x0, base - h * step, x0 + slot * 0.6, base - 1], fill=palette[colour])
    difference = int(heights[2] - heights[0])
    answer = {
        "tallest": ORDINALS[int(np.argmax(heights))],
        "difference": DIFFERENCE_BINS[0 if difference <= -2 else 2 if difference >= 2 else 1],
    }[question]
    return image, answer, ENCODER_CLASSES.index("chart")


def make_vqa(
    n: int,
    *,
    size: int = 64,
    seed: int = 0,
    question_types: tuple[str, ...] = QUESTION_TYPES,
    palette_seed: int | None = None,
) -> VQASet:
    """``n`` image-question-answer triples, the question types in turn (balanced), drawn from
    ``seed``: the same arguments give the same set. With ``palette_seed`` every image draws its
    colours through a random permutation of :data:`COLOURS` (its own, from ``palette_seed``):
    the same scenes as without it, recoloured; the answers stay those of the original colours."""
    require(is_count(n), "n", "an integer >= 1", n)
    require(is_count(size, 32), "size", "an integer >= 32", size)
    require(len(question_types) > 0 and all(q in QUESTIONS for q in question_types),
            "question_types", f"names from {QUESTION_TYPES}", question_types)  # fmt: skip
    rng = np.random.default_rng(seed)
    palettes = None if palette_seed is None else np.random.default_rng(palette_seed)
    names = list(COLOURS)
    images, answers, labels, types = [], [], [], []
    for i in range(n):
        question = question_types[i % len(question_types)]
        draw = _chart if TASK_OF[question] == "charxiv" else _scene
        palette = COLOURS
        if palettes is not None:  # its own generator: the scene's draws stay the same
            palette = dict(
                zip(
                    names,
                    (COLOURS[names[k]] for k in palettes.permutation(len(names))),
                    strict=True,
                )
            )
        image, answer, label = draw(question, size, rng, palette)
        images.append(np.asarray(image))
        answers.append(answer)
        labels.append(label)
        types.append(question)
    pixels = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 127.5 - 1
    return VQASet(pixels, [QUESTIONS[q] for q in types], answers, types, torch.tensor(labels))


def encoder_labels(
    n: int, *, size: int = 64, seed: int = 0, recoloured: bool = False
) -> tuple[torch.Tensor, ...]:
    """Images and their caption-level labels (:data:`ENCODER_CLASSES`) for pre-training the
    vision encoder: scenes and charts in the proportion of :func:`make_vqa`'s question types.
    ``recoloured``: also each image in permuted hues (``make_vqa``'s ``palette_seed``), third."""
    data = make_vqa(n, size=size, seed=seed)
    if not recoloured:
        return data.images, data.labels
    views = make_vqa(n, size=size, seed=seed, palette_seed=seed + 1_000_003)
    return data.images, data.labels, views.images
