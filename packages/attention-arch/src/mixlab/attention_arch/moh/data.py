"""The images MoH trains on: small built-in sets, the shared captioned shape scenes, or a folder.

``load_images(source)`` returns an :class:`ImageData` whose images are float32 ``[N, C, H, W]``
in [-1, 1], with class labels where the source has them (for class-conditioned sampling and a
class-aware metric) and captions where it has them (text-conditioned sampling):

- ``"digits"``: scikit-learn's 1,797 handwritten digits, 8×8 grayscale (values 0–16), labels 0–9.
- ``"faces"``: scikit-image's ``lfw_subset``, 200 grayscale 25×25 crops, the first 100 faces
  (label 1) and the last 100 non-faces (label 0); 24×24 by default.
- ``"shapes"``: :func:`mixlab.shared.shapes.shape_scenes`, :data:`SHAPE_SCENES` RGB scenes of
  1–3 coloured shapes with template captions; the label is the first object's colour and shape.
- a folder: every .png/.jpg/.jpeg/.bmp under it (sorted by path), grayscale if all of them are,
  else RGB, centre-cropped to a square; labels from the class sub-folders when the images all
  sit in sub-folders of the root (as torchvision's ``ImageFolder``), else none.

Resizing is bilinear with antialiasing (``F.interpolate(..., antialias=True)``; PIL's bilinear
filter for folders, which widens its support when shrinking).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mixlab.shared import is_count, require

__all__ = ["IMAGE_SUFFIXES", "SHAPE_SCENES", "ImageData", "load_images"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
SHAPE_SCENES = 2048
"""scenes drawn for ``"shapes"`` (about 3 s on one CPU core)"""
_DEFAULT_SIZE = {"digits": 8, "faces": 24, "shapes": 32}
_FOLDER_SIZE = 32
_GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "F")


@dataclass
class ImageData:
    """A set of images with what a source knows about them."""

    images: torch.Tensor
    """float32 [N, C, H, W] in [-1, 1]"""
    labels: torch.Tensor | None
    """long [N] class indices, or None"""
    num_classes: int | None
    """the number of classes the labels index, or None"""
    captions: torch.Tensor | None
    """long [N, S] token ids (right-padded), or None"""
    vocab_size: int | None
    """the number of caption tokens, or None"""
    name: str
    """the source: "digits", "faces", "shapes" or the folder's name"""

    def __len__(self) -> int:
        return len(self.images)


def _resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """[N, C, h, w] → [N, C, size, size], bilinear with antialiasing, clamped to [-1, 1]."""
    if images.shape[-2:] == (size, size):
        return images
    resized = F.interpolate(images, size=(size, size), mode="bilinear", antialias=True)
    return resized.clamp(-1, 1)


def _digits(size: int) -> ImageData:
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = torch.from_numpy(digits.images.astype(np.float32))  # [N, 8, 8], 0..16
    images = _resize((pixels / 8 - 1).unsqueeze(1), size)
    labels = torch.from_numpy(digits.target).long()
    return ImageData(images, labels, 10, None, None, "digits")


def _faces(size: int) -> ImageData:
    from skimage.data import lfw_subset

    pixels = torch.from_numpy(lfw_subset().astype(np.float32))  # [200, 25, 25] in [0, 1]
    images = _resize((pixels * 2 - 1).unsqueeze(1), size)
    labels = torch.cat([torch.ones(100), torch.zeros(100)]).long()  # faces first
    return ImageData(images, labels, 2, None, None, "faces")


def _shapes(size: int, seed: int) -> ImageData:
    from mixlab.shared.shapes import SCENE_CLASSES, SCENE_VOCABULARY, shape_scenes

    scenes = shape_scenes(SHAPE_SCENES, size=size, seed=seed)
    return ImageData(
        scenes.images,
        scenes.labels,
        SCENE_CLASSES,
        scenes.captions,
        len(SCENE_VOCABULARY),
        "shapes",
    )


def _read(path: Path, what: Callable):
    """``what(image)`` of the image at ``path``; an unreadable file raises a ValueError naming it."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return what(image)
    except OSError as error:  # PIL's UnidentifiedImageError and truncated files included
        raise ValueError(f"{path} is not a readable image: {error}") from None


def _folder(root: Path, size: int) -> ImageData:
    from PIL import Image

    files = sorted(
        (p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES),
        key=lambda p: p.relative_to(root).parts,
    )
    require(bool(files), "source", f"a folder holding {'/'.join(IMAGE_SUFFIXES)} images", str(root))

    modes = [_read(p, lambda image: image.mode) for p in files]  # headers only
    mode = "L" if all(m in _GRAYSCALE_MODES for m in modes) else "RGB"
    arrays = []
    for path in files:
        image = _read(path, lambda image: image.convert(mode))
        side = min(image.size)
        left, top = (image.width - side) // 2, (image.height - side) // 2
        square = image.crop((left, top, left + side, top + side))
        square = square.resize((size, size), Image.Resampling.BILINEAR)
        arrays.append(np.asarray(square, dtype=np.float32).reshape(size, size, -1))
    images = torch.from_numpy(np.stack(arrays) / 127.5 - 1).permute(0, 3, 1, 2).contiguous()

    # ImageFolder's rule: one sub-folder of the root per class, classes sorted by name
    parts = [p.relative_to(root).parts for p in files]
    labels, num_classes = None, None
    if all(len(p) > 1 for p in parts):
        classes = sorted({p[0] for p in parts})
        index = {name: i for i, name in enumerate(classes)}
        labels = torch.tensor([index[p[0]] for p in parts], dtype=torch.long)
        num_classes = len(classes)
    return ImageData(images.float(), labels, num_classes, None, None, root.name)


def load_images(source: str, *, size: int | None = None, seed: int = 0) -> ImageData:
    """The images of ``source`` ("digits", "faces", "shapes" or a folder of images) at
    ``size`` × ``size`` (default: 8 for digits, 24 for faces, 32 for shapes and folders).
    ``seed`` draws the shape scenes; the other sources are fixed."""
    require(
        size is None or is_count(size, 8), "size", "an integer >= 8 (or None: the default)", size
    )
    if source in _DEFAULT_SIZE:
        size = size or _DEFAULT_SIZE[source]
        if source == "digits":
            return _digits(size)
        if source == "faces":
            return _faces(size)
        return _shapes(size, seed)
    root = Path(source)
    require(root.is_dir(), "source", "'digits', 'faces', 'shapes' or a folder of images", source)
    return _folder(root, size or _FOLDER_SIZE)
