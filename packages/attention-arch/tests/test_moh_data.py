"""MoH's image sources: digits and faces (shape, range, labels, resizing), the shared shape scenes
(deterministic, captioned), a folder with and without class sub-folders, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mixlab.attention_arch.moh import data
from mixlab.attention_arch.moh.data import load_images
from mixlab.shared.shapes import SCENE_PAD_ID, SCENE_VOCABULARY, shape_scenes

torch.set_num_threads(1)


def in_range(images: torch.Tensor) -> bool:
    return images.dtype == torch.float32 and images.min() >= -1 and images.max() <= 1


def test_digits_are_8x8_in_range_with_ten_labels():
    digits = load_images("digits")
    assert digits.images.shape == (1797, 1, 8, 8)
    assert in_range(digits.images)
    assert digits.images.min() == -1
    assert digits.images.max() == 1
    assert digits.labels.dtype == torch.long
    assert set(digits.labels.tolist()) == set(range(10))
    assert digits.num_classes == 10
    assert digits.captions is None
    assert digits.vocab_size is None
    assert digits.name == "digits"


def test_digits_resize_to_16_keeps_the_image():
    small, big = load_images("digits"), load_images("digits", size=16)
    assert big.images.shape == (1797, 1, 16, 16)
    assert in_range(big.images)
    assert torch.equal(small.labels, big.labels)
    pooled = torch.nn.functional.avg_pool2d(big.images[:50], 2)
    assert (pooled - small.images[:50]).abs().mean() < 0.15  # the same digits, upsampled


def test_faces_are_100_faces_then_100_others():
    faces = load_images("faces")
    assert faces.images.shape == (200, 1, 24, 24)
    assert in_range(faces.images)
    assert faces.labels.tolist() == [1] * 100 + [0] * 100
    assert faces.num_classes == 2
    assert load_images("faces", size=32).images.shape == (200, 1, 32, 32)


def test_shapes_are_captioned_and_the_same_for_the_same_seed(monkeypatch):
    monkeypatch.setattr(data, "SHAPE_SCENES", 24)
    first, again, other = (load_images("shapes", seed=s) for s in (0, 0, 1))
    assert first.images.shape == (24, 3, 32, 32)
    assert in_range(first.images)
    assert torch.equal(first.images, again.images)
    assert torch.equal(first.captions, again.captions)
    assert not torch.equal(first.images, other.images)
    assert first.captions.dtype == torch.long
    assert first.captions.shape == (24, 14)
    assert first.vocab_size == len(SCENE_VOCABULARY)
    assert 0 <= int(first.captions.max()) < 32
    assert first.num_classes == 24
    assert first.labels.max() < 24
    assert load_images("shapes", size=16).images.shape == (24, 3, 16, 16)


def test_scene_captions_name_the_first_object_and_match_the_label():
    scenes = shape_scenes(40, seed=2)
    counts = set()
    for text, ids, label in zip(scenes.texts, scenes.captions, scenes.labels, strict=True):
        words = text.split()
        kept = [SCENE_VOCABULARY[i] for i in ids.tolist() if i != SCENE_PAD_ID]
        assert kept == words
        assert words[0] == "a"
        colour, shape = words[1:3]
        assert SCENE_VOCABULARY.index(colour) - 8 == label // 4  # colours follow the 8 words
        assert SCENE_VOCABULARY.index(shape) - 14 == label % 4
        counts.add(words.count("a"))
    assert counts == {1, 2, 3}
    assert shape_scenes(5, max_shapes=1, seed=2).captions.shape == (5, 3)


def write(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def test_a_folder_of_grayscale_pngs_is_cropped_and_resized(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(3):
        write(tmp_path / "imgs" / f"{i}.png", rng.integers(0, 256, (20, 30), np.uint8))
    white = np.full((40, 40), 255, np.uint8)
    write(tmp_path / "imgs" / "deep" / "3.PNG", white)  # found recursively, any case
    (tmp_path / "imgs" / "notes.txt").write_text("not an image")
    loaded = load_images(str(tmp_path / "imgs"), size=8)
    assert loaded.images.shape == (4, 1, 8, 8)
    assert in_range(loaded.images)
    assert loaded.labels is None
    assert loaded.num_classes is None
    assert loaded.name == "imgs"
    assert torch.all(loaded.images[3] == 1)  # sorted by path: deep/3.PNG is last
    assert load_images(str(tmp_path / "imgs")).images.shape == (4, 1, 32, 32)


def test_class_subfolders_give_labels_in_sorted_order(tmp_path):
    colours = {"red": (255, 0, 0), "blue": (0, 0, 255), "green": (0, 255, 0)}
    for name, rgb in colours.items():
        for i in range(2):
            write(tmp_path / name / f"{i}.jpg", np.full((12, 16, 3), rgb, np.uint8))
    write(tmp_path / "blue" / "gray.png", np.zeros((9, 9), np.uint8))  # one RGB: all RGB
    loaded = load_images(str(tmp_path), size=8)
    assert loaded.images.shape == (7, 3, 8, 8)
    assert loaded.num_classes == 3
    assert loaded.labels.tolist() == [0, 0, 0, 1, 1, 2, 2]  # blue, green, red
    assert loaded.images[3, 1].mean() > 0.9
    assert loaded.images[3, 0].mean() < -0.9


@pytest.mark.parametrize(
    ("source", "size", "message"),
    [
        ("mnist", None, "source must be 'digits', 'faces', 'shapes' or a folder of images"),
        ("digits", 4, "size must be an integer >= 8"),
        ("shapes", 16.0, "size must be an integer >= 8"),
        ("EMPTY", None, "source must be a folder holding .png/.jpg/.jpeg/.bmp images"),
        ("BROKEN", None, "is not a readable image"),
    ],
)
def test_bad_sources_and_sizes_raise_clear_errors(source, size, message, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("text")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "a.png").write_bytes(b"not a png")
    source = {"EMPTY": str(tmp_path / "empty"), "BROKEN": str(tmp_path / "broken")}.get(
        source, source
    )
    with pytest.raises(ValueError, match=message):
        load_images(source, size=size)
