"""Procedural coloured shapes: one renderer that Mix-Opt and MoH share (MoP draws its masks).

A shape (circle, square, triangle, star) of a colour, or of a pattern of colours, is drawn at a
placement (centre, radius, angle, in output pixels) on a plain background. Images are drawn at
:data:`SUPERSAMPLE`× size and box-filtered down (anti-aliased); :func:`to_tensor` scales them to
[-1, 1]. :func:`shape_scenes` draws 1–3 shapes per image with template captions ("a red circle
above a blue square"), for text-conditioned generation.

Mix-Opt caches a base model trained on images these functions draw: a change to what
:func:`render`, :func:`pattern_fill` or :func:`placement` return, or to the order in which they
draw from the generator, changes its data and leaves that cache stale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw

from mixlab.shared.config import is_count, require

__all__ = [
    "BACKGROUNDS",
    "COLOURS",
    "PATTERNS",
    "SCENE_CLASSES",
    "SCENE_PAD_ID",
    "SCENE_TOKEN_ID",
    "SCENE_VOCABULARY",
    "SHAPES",
    "SUPERSAMPLE",
    "ShapeScenes",
    "encode_words",
    "outline",
    "pattern_fill",
    "placement",
    "render",
    "scene_caption_length",
    "shape_mask",
    "shape_scenes",
    "to_tensor",
]

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
"""fills: one colour; diagonal stripes and a checkerboard of 3 px (at output size) per colour"""
SUPERSAMPLE = 4


def encode_words(
    words: Sequence[str], token_id: Mapping[str, int], *, vocabulary: str = "the vocabulary"
) -> list[int]:
    """Token ids of ``words``; unknown words raise a ValueError naming them (and ``vocabulary``)."""
    unknown = [w for w in words if w not in token_id]
    if unknown:
        raise ValueError(f"caption words must come from {vocabulary}, got unknown {unknown}")
    return [token_id[w] for w in words]


def outline(shape: str, centre: tuple[float, float], radius: float, angle: float):
    """The polygon of ``shape`` (a list of (x, y)), or None for a circle. A square's half
    diagonal is 1.27·radius, so that its area is close to the circle's; a star's inner radius is
    0.45·radius."""
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


def shape_mask(
    shape: str, centre: tuple[float, float], radius: float, angle: float, size: int
) -> np.ndarray:
    """The pixels (bool, size × size) inside ``shape`` at a placement in pixels of this size."""
    mask = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(mask)
    polygon = outline(shape, centre, radius, angle)
    if polygon is None:
        draw.ellipse(
            [centre[0] - radius, centre[1] - radius, centre[0] + radius, centre[1] + radius],
            fill=255,
        )
    else:
        draw.polygon(polygon, fill=255)
    return np.asarray(mask) > 127


def pattern_fill(pattern: str, colours: list[tuple[int, int, int]], size: int, rng) -> np.ndarray:
    """An RGB fill image (size × size × 3, uint8) of ``pattern`` in ``colours``; ``size`` is the
    supersampled size. Stripes draw their phase from ``rng``; the other patterns draw nothing."""
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


def _paint(
    canvas: np.ndarray,
    shape: str,
    fill: np.ndarray | tuple[int, int, int],
    *,
    centre: tuple[float, float],
    radius: float,
    angle: float,
) -> None:
    """Paint ``shape`` filled with ``fill`` (an image the canvas's size, or one RGB colour) onto
    the supersampled ``canvas`` in place (placement in output pixels)."""
    c = (centre[0] * SUPERSAMPLE, centre[1] * SUPERSAMPLE)
    inside = shape_mask(shape, c, radius * SUPERSAMPLE, angle, canvas.shape[0])
    fill = np.asarray(fill, dtype=np.uint8)
    canvas[inside] = fill[inside] if fill.ndim == 3 else fill


def _blank(background: tuple[int, int, int], size: int) -> np.ndarray:
    canvas = np.empty((size * SUPERSAMPLE, size * SUPERSAMPLE, 3), np.uint8)
    canvas[:] = background
    return canvas


def _downsample(canvas: np.ndarray, size: int) -> np.ndarray:
    return np.asarray(Image.fromarray(canvas).resize((size, size), Image.Resampling.BOX))


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
    canvas = _blank(background, size)
    _paint(canvas, shape, fill, centre=centre, radius=radius, angle=angle)
    return _downsample(canvas, size)


def placement(rng, size: int) -> dict:
    """A random placement of one shape in a size × size image: radius 0.25–0.36·size, fully
    inside with a 1 px margin, any angle; the keyword arguments of :func:`render`."""
    radius = rng.uniform(0.25, 0.36) * size
    margin = radius + 1
    return {
        "centre": (rng.uniform(margin, size - margin), rng.uniform(margin, size - margin)),
        "radius": radius,
        "angle": rng.uniform(0, 2 * np.pi),
    }


def to_tensor(images: list[np.ndarray]) -> torch.Tensor:
    """uint8 images (H × W × 3 each) → a float32 tensor [N, 3, H, W] in [-1, 1]."""
    array = np.stack(images).astype(np.float32) / 127.5 - 1
    return torch.from_numpy(array).permute(0, 3, 1, 2).contiguous()


# ---- multi-shape scenes with template captions (MoH) -------------------------------------------

SCENE_VOCABULARY = (
    "<pad>",
    "a",
    "and",
    "above",
    "below",
    "left",
    "right",
    "of",
    *COLOURS,
    *SHAPES,
)
SCENE_TOKEN_ID = {token: i for i, token in enumerate(SCENE_VOCABULARY)}
SCENE_PAD_ID = SCENE_TOKEN_ID["<pad>"]
SCENE_CLASSES = len(COLOURS) * len(SHAPES)
"""classes of a scene's label: the first object's colour index · len(SHAPES) + shape index"""
_MAX_SCENE_SHAPES = 3


def scene_caption_length(max_shapes: int) -> int:
    """Tokens of the longest caption of up to ``max_shapes`` objects: "a red circle" (3), then
    "left of a blue square" (5), then "and left of a green star" (6) per further object."""
    return 3 + 5 * (max_shapes >= 2) + 6 * max(max_shapes - 2, 0)


@dataclass
class ShapeScenes:
    """Images [N, 3, size, size] in [-1, 1] (float32), captions [N, S] token ids in
    :data:`SCENE_VOCABULARY` right-padded with :data:`SCENE_PAD_ID` (S =
    :func:`scene_caption_length` of ``max_shapes``), labels [N] (the first object's colour and
    shape, see :data:`SCENE_CLASSES`) and the captions as text."""

    images: torch.Tensor
    captions: torch.Tensor
    labels: torch.Tensor
    texts: list[str]

    def __len__(self) -> int:
        return len(self.images)


def _relation(first: tuple[float, float], other: tuple[float, float]) -> tuple[str, ...]:
    """Where ``first`` is relative to ``other`` along the axis they differ most (y points down)."""
    dx, dy = first[0] - other[0], first[1] - other[1]
    if abs(dy) > abs(dx):
        return ("above",) if dy < 0 else ("below",)
    return ("left", "of") if dx < 0 else ("right", "of")


def _scene_layout(rng, count: int, size: int) -> list[dict]:
    """``count`` placements that do not overlap (centres at least 1.15·(r_i + r_j) + 1 apart, the
    square's corners included) and whose direction from the first object is clear (|dx| and |dy|
    differ by at least 0.08·size), so that the caption's relations are unambiguous."""
    for _ in range(1000):
        radii = rng.uniform(0.55, 0.75, count) * size / (count + 1.5)
        centres = []
        for r in radii:
            for _ in range(100):
                c = (rng.uniform(r + 0.5, size - r - 0.5), rng.uniform(r + 0.5, size - r - 0.5))
                apart = all(
                    np.hypot(c[0] - o[0], c[1] - o[1]) >= 1.15 * (r + ro) + 1
                    for o, ro in zip(centres, radii, strict=False)
                )
                clear = not centres or abs(
                    abs(c[0] - centres[0][0]) - abs(c[1] - centres[0][1])
                ) >= (0.08 * size)
                if apart and clear:
                    centres.append(c)
                    break
            else:
                break  # no room: draw new radii
        if len(centres) == count:
            angles = rng.uniform(0, 2 * np.pi, count)
            return [
                {"centre": c, "radius": float(r), "angle": float(a)}
                for c, r, a in zip(centres, radii, angles, strict=True)
            ]
    raise RuntimeError(f"could not lay out {count} shapes in a {size} px image")


def shape_scenes(n: int, *, size: int = 32, max_shapes: int = 3, seed: int = 0) -> ShapeScenes:
    """``n`` scenes of 1–``max_shapes`` solid shapes of distinct (colour, shape) on a random
    background, captioned from the first object's view: "a red circle", "a red circle above a
    blue square", "a red circle above a blue square and left of a green star". The label is the
    first object's colour and shape. The same arguments give the same scenes."""
    require(is_count(n, 0), "n", "an integer >= 0", n)
    require(is_count(size, 8), "size", "an integer >= 8", size)
    require(
        is_count(max_shapes) and max_shapes <= _MAX_SCENE_SHAPES,
        "max_shapes",
        f"an integer in [1, {_MAX_SCENE_SHAPES}]",
        max_shapes,
    )
    rng = np.random.default_rng(seed)
    colour_names, background_names = list(COLOURS), list(BACKGROUNDS)
    length = scene_caption_length(max_shapes)
    images, captions, labels, texts = [], [], [], []
    for _ in range(n):
        count = int(rng.integers(1, max_shapes + 1))
        objects = rng.choice(SCENE_CLASSES, count, replace=False)  # (colour, shape) pairs
        background = BACKGROUNDS[background_names[int(rng.integers(len(background_names)))]]
        layout = _scene_layout(rng, count, size)
        canvas = _blank(background, size)
        words = []
        for i, (obj, where) in enumerate(zip(objects, layout, strict=True)):
            colour, shape = colour_names[obj // len(SHAPES)], SHAPES[obj % len(SHAPES)]
            _paint(canvas, shape, COLOURS[colour], **where)
            if i >= 2:
                words.append("and")
            if i >= 1:
                words += _relation(layout[0]["centre"], where["centre"])
            words += ["a", colour, shape]
        images.append(_downsample(canvas, size))
        ids = encode_words(words, SCENE_TOKEN_ID, vocabulary="SCENE_VOCABULARY")
        captions.append(ids + [SCENE_PAD_ID] * (length - len(ids)))
        labels.append(int(objects[0]))
        texts.append(" ".join(words))
    images_t = to_tensor(images) if images else torch.empty(0, 3, size, size)
    captions_t = torch.tensor(captions, dtype=torch.long).reshape(n, length)
    return ShapeScenes(images_t, captions_t, torch.tensor(labels, dtype=torch.long), texts)
