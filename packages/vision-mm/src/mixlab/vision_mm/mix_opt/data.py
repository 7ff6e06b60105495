"""Procedural captioned shapes: the pre-training data, the subject and the evaluation data.

A caption is three tokens, ``(colour, shape, background)``, e.g. ``("red", "circle",
"on_white")``. The subject to personalize is a striped, three-coloured star; its caption is
``("<sks>", "star", <background>)``: ``<sks>`` takes the colour slot and never occurs in
pre-training, like DreamBooth's rare identifier. Images are drawn at 4× size and box-filtered
down (anti-aliased) and scaled to [-1, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle", "star")
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 70, 220),
    "yellow": (235, 210, 40),
    "magenta": (210, 50, 200),
    "cyan": (40, 200, 210),
}
BACKGROUNDS = {
    "on_white": (235, 235, 235),
    "on_black": (20, 20, 20),
    "on_gray": (128, 128, 128),
    "on_brown": (120, 80, 40),
}
PATTERNS = ("solid", "stripes", "checker")
"""fills of the evaluation networks' training images (pre-training uses solid fills only)"""
SUBJECT_TOKEN = "<sks>"
NULL_TOKEN = "<null>"
VOCABULARY = (NULL_TOKEN, SUBJECT_TOKEN, *COLOURS, *SHAPES, *BACKGROUNDS)
TOKEN_ID = {token: i for i, token in enumerate(VOCABULARY)}
SUBJECT_STRIPES = ((230, 60, 40), (240, 200, 30), (40, 90, 220))
"""the subject's three stripe colours (red, yellow, blue), 3 px wide at 32 px, diagonal"""
SUPERSAMPLE = 4


def encode_caption(colour: str, shape: str, background: str) -> list[int]:
    """Token ids of a caption; unknown words raise a ValueError naming them."""
    words = (colour, shape, background)
    unknown = [w for w in words if w not in TOKEN_ID]
    if unknown:
        raise ValueError(f"caption words must come from VOCABULARY, got unknown {unknown}")
    return [TOKEN_ID[w] for w in words]


def _outline(shape: str, centre: tuple[float, float], radius: float, angle: float):
    cx, cy = centre
    if shape == "circle":
        return None
    corners = {"square": 4, "triangle": 3, "star": 10}[shape]
    radii = [radius, radius * 0.45] if shape == "star" else [radius]
    if shape == "square":
        radius *= 0.9 * np.sqrt(2)  # the square's side is ≈1.27 radius, like the circle's area
        radii = [radius]
    points = []
    for i in range(corners):
        a = angle + 2 * np.pi * i / corners
        r = radii[i % len(radii)]
        points.append((cx + r * np.sin(a), cy - r * np.cos(a)))
    return points


def _fill(pattern: str, colours: list[tuple[int, int, int]], size: int, rng) -> np.ndarray:
    """An RGB fill image (size × size × 3, uint8) of ``pattern`` in ``colours``."""
    yy, xx = np.mgrid[0:size, 0:size]
    period = 3 * SUPERSAMPLE
    if pattern == "solid":
        index = np.zeros_like(xx)
    elif pattern == "stripes":
        index = ((xx + yy + rng.integers(period)) // period) % len(colours)
    elif pattern == "checker":
        index = ((xx // period) + (yy // period)) % len(colours)
    else:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    return np.asarray(colours, dtype=np.uint8)[index]


def render(
    shape: str,
    fill: np.ndarray,
    background: tuple[int, int, int],
    *,
    centre: tuple[float, float],
    radius: float,
    angle: float,
    size: int,
) -> np.ndarray:
    """One image (size × size × 3, uint8): ``shape`` filled with ``fill`` (drawn at 4× size)."""
    big = size * SUPERSAMPLE
    mask = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(mask)
    c = (centre[0] * SUPERSAMPLE, centre[1] * SUPERSAMPLE)
    r = radius * SUPERSAMPLE
    outline = _outline(shape, c, r, angle)
    if outline is None:
        draw.ellipse([c[0] - r, c[1] - r, c[0] + r, c[1] + r], fill=255)
    else:
        draw.polygon(outline, fill=255)
    canvas = np.empty((big, big, 3), np.uint8)
    canvas[:] = background
    inside = np.asarray(mask) > 127
    canvas[inside] = fill[inside]
    return np.asarray(Image.fromarray(canvas).resize((size, size), Image.Resampling.BOX))


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


def _to_tensor(images: list[np.ndarray]) -> torch.Tensor:
    array = np.stack(images).astype(np.float32) / 127.5 - 1
    return torch.from_numpy(array).permute(0, 3, 1, 2).contiguous()


def _placement(rng, size: int) -> dict:
    radius = rng.uniform(0.25, 0.36) * size
    margin = radius + 1
    return {
        "centre": (rng.uniform(margin, size - margin), rng.uniform(margin, size - margin)),
        "radius": radius,
        "angle": rng.uniform(0, 2 * np.pi),
    }


def captioned_shapes(n: int, *, size: int = 32, seed: int = 0, patterns: bool = False) -> ShapeData:
    """``n`` random captioned shapes. ``patterns=True`` also draws striped and checked fills
    (random colours): the training data of the evaluation networks, not of the diffusion model."""
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
        fill = _fill(PATTERNS[pattern], colours, size * SUPERSAMPLE, rng)
        bg = BACKGROUNDS[background_names[background]]
        images.append(render(SHAPES[shape], fill, bg, size=size, **_placement(rng, size)))
        captions.append(
            encode_caption(colour_names[colour], SHAPES[shape], background_names[background])
        )
        labels.append((shape, pattern * len(colour_names) + colour, background))
    shape_l, fill_l, background_l = torch.tensor(labels).T
    return ShapeData(_to_tensor(images), torch.tensor(captions), shape_l, fill_l, background_l)


def subject_images(
    n: int = 4, *, background: str = "on_white", size: int = 32, seed: int = 0, shape: str = "star"
) -> ShapeData:
    """``n`` photos of the subject, the striped three-coloured star, on ``background``, at
    varied placements; captions ``("<sks>", "star", background)``. ``shape`` draws the same
    fill and placements as another shape (a control for the structural metric)."""
    if background not in BACKGROUNDS:
        raise ValueError(f"background must be one of {list(BACKGROUNDS)}, got {background!r}")
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    rng = np.random.default_rng(10_000 + seed)
    images = []
    for _ in range(n):
        fill = _fill("stripes", list(SUBJECT_STRIPES), size * SUPERSAMPLE, rng)
        images.append(
            render(shape, fill, BACKGROUNDS[background], size=size, **_placement(rng, size))
        )
    captions = torch.tensor([encode_caption(SUBJECT_TOKEN, "star", background)] * n)
    shape = torch.full((n,), SHAPES.index("star"))
    bg = torch.full((n,), list(BACKGROUNDS).index(background))
    return ShapeData(_to_tensor(images), captions, shape, torch.full((n,), -1), bg)
