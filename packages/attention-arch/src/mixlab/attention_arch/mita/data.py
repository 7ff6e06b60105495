"""The experiment's canvases: labelled images whose object pixels are known, so what an attention
layer selects can be scored against them.

- :func:`counting_squares` (the quick testbed, issue 66): how many bright squares lie on a noisy
  canvas. The answer is spread over the whole image, so a token that sees only its neighbourhood
  cannot know it: attention's reach decides it.
- :func:`cluttered_digits`: scikit-learn's 8×8 digits, enlarged, on canvases full of digit
  fragments; the label is the digit. Training and test canvases place *different* source digits
  (the first 1400 of the 1797 and the rest), so test accuracy measures generalisation to unseen
  handwriting, not to unseen placements only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

TRAIN_SOURCES = 1400


@dataclass
class ClutteredDigits:
    """``images`` (n, 1, S, S) float32 in [0, 1], ``labels`` (n,), ``masks`` (n, S, S) bool: the
    object's pixels (the digit, or the squares to count)."""

    images: torch.Tensor
    labels: torch.Tensor
    masks: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def token_masks(self, patch_size: int) -> torch.Tensor:
        """(n, patches) bool: patches that hold at least one pixel of the digit."""
        n, size, _ = self.masks.shape
        grid = size // patch_size
        patches = self.masks.reshape(n, grid, patch_size, grid, patch_size)
        return patches.any(dim=(2, 4)).reshape(n, -1)


def counting_squares(
    n: int,
    *,
    canvas: int = 32,
    size: int = 2,
    max_count: int = 9,
    noise: float = 0.2,
    split: str = "train",
    seed: int = 0,
) -> ClutteredDigits:
    """``n`` canvases of side ``canvas``, each with c ~ U{0, …, ``max_count``} white squares of
    side ``size`` on uniform noise in [0, ``noise``]; the label is c. The squares sit in distinct
    cells of a ``size`` lattice, so they never overlap (they may touch). ``split`` seeds the
    draw apart: training and test canvases are different images."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    for name, value in (("n", n), ("size", size), ("max_count", max_count)):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    cells = canvas // size
    if max_count > cells * cells:
        raise ValueError(f"max_count={max_count} squares do not fit in {cells}×{cells} cells")
    if not 0 <= noise < 1:
        raise ValueError(f"noise must be in [0, 1), got {noise!r}")
    rng = np.random.default_rng([seed, 2 if split == "train" else 3])
    images = rng.uniform(0, noise, size=(n, canvas, canvas)).astype(np.float32)
    masks = np.zeros((n, canvas, canvas), bool)
    labels = rng.integers(0, max_count + 1, size=n)
    for i in range(n):
        for cell in rng.choice(cells * cells, labels[i], replace=False):
            row, column = divmod(int(cell), cells)
            masks[i, row * size : (row + 1) * size, column * size : (column + 1) * size] = True
    images[masks] = 1.0
    return ClutteredDigits(
        torch.from_numpy(images)[:, None], torch.from_numpy(labels), torch.from_numpy(masks)
    )


def cluttered_digits(
    n: int,
    *,
    canvas: int = 32,
    scale: int = 2,
    clutter: int = 4,
    split: str = "train",
    seed: int = 0,
) -> ClutteredDigits:
    """``n`` canvases of side ``canvas``, each one digit enlarged ``scale``× (nearest neighbour)
    at a random place, over ``clutter`` fragments (a quarter to a half of another digit) and
    uniform noise."""
    from sklearn.datasets import load_digits

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    digit_side = 8 * scale
    if canvas < digit_side:
        raise ValueError(
            f"canvas={canvas} is smaller than a digit ({digit_side} pixels at scale={scale})"
        )
    for name, value in (("n", n), ("scale", scale)):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    digits = load_digits()
    shapes = np.kron(digits.images / 16.0, np.ones((scale, scale))).astype(np.float32)
    sources = (
        np.arange(TRAIN_SOURCES) if split == "train" else np.arange(TRAIN_SOURCES, len(shapes))
    )
    rng = np.random.default_rng([seed, 0 if split == "train" else 1])
    images = np.zeros((n, canvas, canvas), np.float32)
    masks = np.zeros((n, canvas, canvas), bool)
    labels = np.zeros(n, np.int64)
    for i in range(n):
        for _ in range(clutter):
            other = shapes[rng.integers(TRAIN_SOURCES)]
            fh, fw = rng.integers(digit_side // 4, digit_side // 2 + 1, size=2)
            fy, fx = rng.integers(0, digit_side - fh + 1), rng.integers(0, digit_side - fw + 1)
            y, x = rng.integers(0, canvas - fh + 1), rng.integers(0, canvas - fw + 1)
            piece = other[fy : fy + fh, fx : fx + fw] * rng.uniform(0.5, 1.0)
            np.maximum(
                images[i, y : y + fh, x : x + fw], piece, out=images[i, y : y + fh, x : x + fw]
            )
        source = rng.choice(sources)
        y, x = rng.integers(0, canvas - digit_side + 1, size=2)
        shape = shapes[source]
        window = images[i, y : y + digit_side, x : x + digit_side]
        np.maximum(window, shape, out=window)
        masks[i, y : y + digit_side, x : x + digit_side] = shape > 0.25
        labels[i] = digits.target[source]
    images += rng.uniform(0, 0.15, size=images.shape).astype(np.float32)
    return ClutteredDigits(
        torch.from_numpy(np.clip(images, 0, 1))[:, None],
        torch.from_numpy(labels),
        torch.from_numpy(masks),
    )
