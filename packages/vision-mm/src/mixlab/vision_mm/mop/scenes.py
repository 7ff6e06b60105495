"""Paired multi-modality scenes for privileged-modality training (spec §4e).

One latent scene of 2–4 shapes (circle, square, triangle) in colours, each at a depth in [0, 1]
(0 nearest), renders three modalities:

- ``rgb`` [3, S, S]: colour on a grey background, painted far to near so that nearer shapes
  occlude (masks from :func:`mixlab.shared.shapes.shape_mask`), each shape's size shrinking with
  depth: depth shows only through occlusion and a noisy size cue (every shape also has its own
  base size);
- ``depth`` [1, S, S]: a distance rendering (brighter is nearer, background 0), with shape and
  depth order plain to see and no colour;
- ``edge`` [1, S, S]: the outline sketch of the visible shapes (the full profile's third
  modality): shape and count, depth only through occlusion, no colour.

Questions, each about the leftmost and rightmost shapes (by centre x): ``colour`` (RGB only),
``shape`` and ``count`` (both), ``depth`` order ("which is nearer, the leftmost or the rightmost
shape?"; plain in depth, a weak cue in RGB). Every scene and question is drawn from a seeded
``numpy.random.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mixlab.shared.checks import check_count
from mixlab.shared.shapes import COLOURS as SHARED_COLOURS
from mixlab.shared.shapes import shape_mask

SHAPES = ("circle", "square", "triangle")
COLOURS = {name: SHARED_COLOURS[name] for name in ("red", "green", "blue", "yellow")}
"""the shared renderer's RGB colours (0–255)"""
QUESTION_TYPES = ("colour", "shape", "count", "depth")
MODALITY_CHANNELS = {"rgb": 3, "depth": 1, "edge": 1}
ANSWERABLE = {
    "rgb": ("colour", "shape", "count"),
    "depth": ("shape", "count", "depth"),
    "edge": ("shape", "count"),
}
"""question types a modality answers plainly (RGB carries depth order only through weak cues:
the privileged modality's part to transfer)"""

__all__ = [
    "ANSWERABLE",
    "COLOURS",
    "MODALITY_CHANNELS",
    "QUESTION_TYPES",
    "SHAPES",
    "Scene",
    "Scenes",
    "make_scenes",
    "question_answer",
    "render",
    "vocabulary",
]


@dataclass
class Scene:
    """Shapes as parallel lists: kind, colour name, centre (x, y) in [0, 1]², base radius, depth."""

    kinds: list[str]
    colours: list[str]
    centres: np.ndarray
    radii: np.ndarray
    depths: np.ndarray

    @property
    def leftmost(self) -> int:
        return int(np.argmin(self.centres[:, 0]))

    @property
    def rightmost(self) -> int:
        return int(np.argmax(self.centres[:, 0]))


def _draw_scene(rng: np.random.Generator) -> Scene:
    """The leftmost shape in the left fifth band, the rightmost in the right one and the 0–2
    others in the middle (one above the other), so "leftmost" and "rightmost" name places an
    attention probe can find; neighbours may still overlap (the occlusion cue)."""
    count = int(rng.integers(2, 5))
    xs = [rng.uniform(0.12, 0.3), rng.uniform(0.7, 0.88)]
    ys = list(rng.uniform(0.2, 0.8, 2))
    middle_ys = (rng.uniform(0.15, 0.4), rng.uniform(0.6, 0.85))
    for k in range(count - 2):
        xs.append(rng.uniform(0.42, 0.58))
        ys.append(middle_ys[k] if count == 4 else rng.uniform(0.2, 0.8))
    return Scene(
        kinds=[SHAPES[i] for i in rng.integers(len(SHAPES), size=count)],
        colours=[list(COLOURS)[i] for i in rng.integers(len(COLOURS), size=count)],
        centres=np.stack([xs, ys], 1),
        radii=rng.uniform(0.10, 0.16, count),
        depths=rng.permutation(
            np.linspace(0.0, 1.0, count) * rng.uniform(0.8, 1.0) + rng.uniform(0, 0.1)
        ),
    )


def render(scene: Scene, size: int = 32) -> dict[str, np.ndarray]:
    """``{"rgb": [3, size, size], "depth": [1, size, size]}`` float32 in [0, 1], and
    ``"segmentation"`` [size, size] int64: the visible shape's kind (1 + index in SHAPES, 0 for
    the background), the encoder's generic pre-training label."""
    rgb = np.full((3, size, size), 0.5, dtype=np.float32)
    depth = np.zeros((1, size, size), dtype=np.float32)
    segmentation = np.zeros((size, size), dtype=np.int64)
    instance = np.zeros((size, size), dtype=np.int64)
    for i in np.argsort(-scene.depths):  # far to near: nearer shapes paint over
        scale = 1.25 - 0.5 * scene.depths[i]  # nearer looks bigger: the RGB depth cue
        centre = (scene.centres[i, 0] * size, scene.centres[i, 1] * size)
        angle = np.pi / 4 if scene.kinds[i] == "square" else 0.0  # squares upright, not diamonds
        mask = shape_mask(scene.kinds[i], centre, scene.radii[i] * scale * size, angle, size)
        rgb[:, mask] = np.asarray(COLOURS[scene.colours[i]], dtype=np.float32)[:, None] / 255
        depth[0, mask] = 1.0 - 0.8 * scene.depths[i]
        segmentation[mask] = 1 + SHAPES.index(scene.kinds[i])
        instance[mask] = 1 + i
    # the edge sketch: 1 where a pixel's visible shape differs from its right or lower neighbour's
    edge = np.zeros((1, size, size), dtype=np.float32)
    edge[0, :, :-1] = np.maximum(edge[0, :, :-1], instance[:, :-1] != instance[:, 1:])
    edge[0, :-1, :] = np.maximum(edge[0, :-1, :], instance[:-1, :] != instance[1:, :])
    return {"rgb": rgb, "depth": depth, "edge": edge, "segmentation": segmentation}


def question_answer(scene: Scene, kind: str) -> tuple[str, str]:
    """The question of type ``kind`` about ``scene`` and its one-word answer."""
    left, right = scene.leftmost, scene.rightmost
    if kind == "colour":
        return "what colour is the leftmost shape?", scene.colours[left]
    if kind == "shape":
        return "what shape is the rightmost shape?", scene.kinds[right]
    if kind == "count":
        return "how many shapes are there?", str(len(scene.kinds))
    if kind == "depth":
        nearer = "leftmost" if scene.depths[left] < scene.depths[right] else "rightmost"
        return "which is nearer, the leftmost or the rightmost shape?", nearer
    raise ValueError(f"question type must be one of {list(QUESTION_TYPES)}, got {kind!r}")


def vocabulary() -> list[str]:
    """Every word of the questions and answers (for a word-level tokenizer)."""
    words = []
    for kind in QUESTION_TYPES:
        for count in (2, 3, 4):
            scene = Scene(["circle"] * count, ["red"] * count, np.linspace(0.2, 0.8, 2 * count).reshape(count, 2),
                          np.full(count, 0.1), np.arange(count, dtype=float))  # fmt: skip
            words += question_answer(scene, kind)[0].split()
    words += [*SHAPES, *COLOURS, "2", "3", "4", "leftmost", "rightmost"]
    return list(dict.fromkeys(words))


@dataclass
class Scenes:
    """A rendered split: ``images[modality]`` [M, C, S, S] float32, the visible kind per pixel
    ``segmentation`` [M, S, S], and questions with the row of their scene in ``scene`` (one
    question per scene, or one of every type)."""

    images: dict[str, np.ndarray]
    questions: list[str]
    answers: list[str]
    types: list[str]
    segmentation: np.ndarray
    scene: np.ndarray

    def __len__(self) -> int:
        return len(self.questions)


def make_scenes(
    count: int, seed: int, *, size: int = 32, types: tuple[str, ...] = QUESTION_TYPES,
    every_type: bool = False,
) -> Scenes:  # fmt: skip
    """``count`` scenes, each rendered in both modalities with one question of a type drawn in
    turn from ``types`` (``every_type``: one question of each type)."""
    check_count(count, "count")
    unknown = [t for t in types if t not in QUESTION_TYPES]
    if unknown or not types:
        raise ValueError(f"types must be names from {list(QUESTION_TYPES)}, got {list(types)}")
    rng = np.random.default_rng(seed)
    images: dict[str, list[np.ndarray]] = {m: [] for m in MODALITY_CHANNELS}
    questions, answers, kinds, segmentation, rows = [], [], [], [], []
    for i in range(count):
        scene = _draw_scene(rng)
        rendered = render(scene, size)
        for modality in MODALITY_CHANNELS:
            images[modality].append(rendered[modality])
        segmentation.append(rendered["segmentation"])
        for kind in types if every_type else (types[i % len(types)],):
            question, answer = question_answer(scene, kind)
            questions.append(question)
            answers.append(answer)
            kinds.append(kind)
            rows.append(i)
    images_ = {m: np.stack(v) for m, v in images.items()}
    return Scenes(images_, questions, answers, kinds, np.stack(segmentation), np.array(rows))
