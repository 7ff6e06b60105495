"""Procedural captioned shapes: the pre-training data, the subject and the evaluation data.

A caption is three tokens, ``(colour, shape, background)``, e.g. ``("red", "circle",
"on_white")``. The subject to personalize is a striped, three-coloured star; its caption is
``("<sks>", "star", <background>)``: ``<sks>`` takes the colour slot and never occurs in
pre-training, like DreamBooth's rare identifier. Pre-training uses solid fills only; the
evaluation networks also train on :data:`PATTERNS`' stripes and checks. Two layouts: ``"centred"``
(:func:`centred_placement`, one fixed placement: the pre-training data and the subject, whose
photos then differ in their stripes' phase) and ``"random"`` (anywhere, any size and angle: the evaluation
networks, so they read shapes wherever a sample puts them). The drawing (4× size,
box-filtered down, scaled to [-1, 1]), the placements and the colour, shape and background names
are :mod:`mixlab.shared.shapes`', shared with MoH; re-exported here under their old names.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mixlab.shared.shapes import (
    BACKGROUNDS,
    COLOURS,
    PATTERNS,
    SHAPES,
    SUPERSAMPLE,
    encode_words,
    pattern_fill,
    placement,
    render,
    to_tensor,
)

__all__ = [
    "BACKGROUNDS",
    "COLOURS",
    "NULL_TOKEN",
    "PATTERNS",
    "SHAPES",
    "SUBJECT_STRIPES",
    "SUBJECT_TOKEN",
    "SUPERSAMPLE",
    "TOKEN_ID",
    "VALIDATION_SUBJECT",
    "VOCABULARY",
    "ShapeData",
    "captioned_shapes",
    "centred_placement",
    "encode_caption",
    "render",
    "subject_images",
]

SUBJECT_TOKEN = "<sks>"
NULL_TOKEN = "<null>"
VOCABULARY = (NULL_TOKEN, SUBJECT_TOKEN, *COLOURS, *SHAPES, *BACKGROUNDS)
TOKEN_ID = {token: i for i, token in enumerate(VOCABULARY)}
LAYOUTS = ("centred", "random")
SUBJECT_STRIPES = ((230, 60, 40), (240, 200, 30), (40, 90, 220))
"""the subject's three stripe colours (red, yellow, blue), 3 px wide at 32 px, diagonal"""
VALIDATION_SUBJECT = {
    "shape": "square",
    "noun": "square",
    "stripes": ((40, 170, 70), (220, 60, 200), (40, 200, 220)),
}
"""the subject the experiment tunes step sizes and the low resolution on: a square striped green,
magenta and cyan, captioned ``("<sks>", "square", background)``; never the test subject"""


def encode_caption(colour: str, shape: str, background: str) -> list[int]:
    """Token ids of a caption; unknown words raise a ValueError naming them."""
    return encode_words((colour, shape, background), TOKEN_ID, vocabulary="VOCABULARY")


@dataclass
class ShapeData:
    """Images (N, 3, size, size) in [-1, 1], captions (N, 3) token ids, and the attributes as
    integer labels: ``shape`` (index in SHAPES), ``fill`` (colour index; for the evaluation
    data, PATTERNS index · len(COLOURS) + colour index) and ``background``."""

    images: torch.Tensor
    captions: torch.Tensor
    shape: torch.Tensor
    fill: torch.Tensor
    background: torch.Tensor

    def __len__(self) -> int:
        return len(self.images)


def centred_placement(rng, size: int) -> dict:
    """One fixed placement, the same for every image: centred, radius 0.34·size, upright (the
    keyword arguments of :func:`render`; ``rng`` is unused). Each caption is then one image, a
    family a small UNet learns to draw recognisably in minutes on two cores, where the random
    placements left it drawing blobs after 1,500 steps."""
    return {"centre": (size / 2, size / 2), "radius": 0.34 * size, "angle": 0.0}


def _placer(layout: str):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
    return centred_placement if layout == "centred" else placement


def captioned_shapes(
    n: int, *, size: int = 32, seed: int = 0, patterns: bool = False, layout: str = "random"
) -> ShapeData:
    """``n`` random captioned shapes placed by ``layout`` (one of :data:`LAYOUTS`).
    ``patterns=True`` also draws striped and checked fills (random colours): the training data of
    the evaluation networks, not of the diffusion model."""
    place = _placer(layout)
    rng = np.random.default_rng(seed)
    colour_names, background_names = list(COLOURS), list(BACKGROUNDS)
    images, captions, labels = [], [], []
    for _ in range(n):
        shape = int(rng.integers(len(SHAPES)))
        colour = int(rng.integers(len(colour_names)))
        background = int(rng.integers(len(background_names)))
        pattern = int(rng.integers(len(PATTERNS))) if patterns else 0
        colours = [COLOURS[colour_names[colour]]]
        if pattern:
            others = rng.choice([c for c in range(len(colour_names)) if c != colour], 2, False)
            colours += [COLOURS[colour_names[o]] for o in others]
        fill = pattern_fill(PATTERNS[pattern], colours, size * SUPERSAMPLE, rng)
        bg = BACKGROUNDS[background_names[background]]
        images.append(render(SHAPES[shape], fill, bg, size=size, **place(rng, size)))
        captions.append(
            encode_caption(colour_names[colour], SHAPES[shape], background_names[background])
        )
        labels.append((shape, pattern * len(colour_names) + colour, background))
    shape_l, fill_l, background_l = torch.tensor(labels).T
    return ShapeData(to_tensor(images), torch.tensor(captions), shape_l, fill_l, background_l)


def subject_images(
    n: int = 4,
    *,
    background: str = "on_white",
    size: int = 32,
    seed: int = 0,
    shape: str = "star",
    layout: str = "centred",
    stripes: tuple[tuple[int, int, int], ...] = SUBJECT_STRIPES,
    noun: str = "star",
) -> ShapeData:
    """``n`` photos of the subject, the striped three-coloured star, on ``background``, placed by
    ``layout`` (centred: one placement, the stripes' phase varies); captions ``("<sks>", noun,
    background)``. ``shape`` draws the same fill and placements as another shape (a control for
    the structural metric); ``stripes`` and ``noun`` make another subject
    (``**VALIDATION_SUBJECT``)."""
    place = _placer(layout)
    if background not in BACKGROUNDS:
        raise ValueError(f"background must be one of {list(BACKGROUNDS)}, got {background!r}")
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    rng = np.random.default_rng(10_000 + seed)
    images = []
    for _ in range(n):
        fill = pattern_fill("stripes", list(stripes), size * SUPERSAMPLE, rng)
        images.append(render(shape, fill, BACKGROUNDS[background], size=size, **place(rng, size)))
    captions = torch.tensor([encode_caption(SUBJECT_TOKEN, noun, background)] * n)
    shape = torch.full((n,), SHAPES.index(noun))
    bg = torch.full((n,), list(BACKGROUNDS).index(background))
    return ShapeData(to_tensor(images), captions, shape, torch.full((n,), -1), bg)
