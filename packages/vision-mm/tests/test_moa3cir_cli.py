"""MoA3CIR's loaders on tiny folders in FashionIQ's and Shoes' layouts, and the command line end
to end (make-data, train, index, search, eval) with its one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from mixlab.vision_mm.cli import main
from mixlab.vision_mm.moa3cir.data import load_fashioniq, load_shoes, write_toy


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return write_toy(tmp_path_factory.mktemp("toy") / "fiq", train=12, val=6, size=16)


def test_fashioniq_loader_reads_the_layout(toy):
    data = load_fashioniq(toy, "val", descriptions=toy / "descriptions.jsonl")
    assert len(data.triplets) == 6
    assert data.categories == ["toy"] * 6
    reference, text, target = data.triplets[0]
    assert text
    assert reference in data.paths
    assert target in data.gallery
    assert data.description_list([reference, target]) is not None
    assert len(load_fashioniq(toy, "train").triplets) == 12


def test_fashioniq_folder_missing_a_split_is_refused(toy, tmp_path):
    with pytest.raises(ValueError, match="split 'test' missing"):
        load_fashioniq(toy, "test")
    (tmp_path / "captions").mkdir()
    with pytest.raises(ValueError, match="no image_splits/ folder"):
        load_fashioniq(tmp_path, "val")


def test_image_files_read_rows_like_a_tensor(toy):
    from mixlab.vision_mm.moa3cir.data import ImageFiles, load_images

    paths = sorted((toy / "images").glob("*.png"))[:5]
    files, stacked = ImageFiles(paths, 16), load_images(paths, 16)
    assert len(files) == 5
    assert (files[torch.tensor([3, 1])] == stacked[[3, 1]]).all()
    assert (files[1:4] == stacked[1:4]).all()
    assert (files[range(2)] == stacked[:2]).all()


def test_shoes_loader(tmp_path):
    for name in ("a", "b", "c"):
        folder = tmp_path / "womens_clogs"
        folder.mkdir(exist_ok=True)
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / f"img_{name}.jpg")
    captions = [{"ReferenceImageName": "img_a.jpg", "ImageName": "img_b.jpg", "RelativeCaption": "is red"},
                {"ReferenceImageName": "img_b.jpg", "ImageName": "img_z.jpg", "RelativeCaption": "is blue"}]  # fmt: skip
    (tmp_path / "relative_captions_shoes.json").write_text(json.dumps(captions))
    (tmp_path / "eval_im_names.txt").write_text("img_a.jpg\nimg_b.jpg\nimg_c.jpg\n")
    data = load_shoes(tmp_path, "eval")
    assert data.triplets == [("img_a", "is red", "img_b")]
    assert data.gallery == ["img_a", "img_b", "img_c"]


def test_cli_trains_indexes_searches_and_evaluates(toy, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["moa3cir", "train", "--data", str(toy), "--out", str(run), "--image-size", "16",
                 "--tower-steps", "2", "--steps", "2", "--batch-size", "4", "--heads", "4",
                 "--groups", "2", "--shared-heads", "2"]) == 0  # fmt: skip
    assert (run / "model" / "moa3cir.json").is_file()
    index = tmp_path / "gallery.safetensors"
    assert main(["moa3cir", "index", "--model", str(run / "model"), "--gallery", str(toy / "images"),
                 "--out", str(index)]) == 0  # fmt: skip
    capsys.readouterr()
    image = next((toy / "images").glob("val-*-ref.png"))
    assert main(["moa3cir", "search", "--model", str(run / "model"), "--index", str(index), "--image", str(image),
                 "--text", "make it blue", "--description", "a red dress", "--k", "3"]) == 0  # fmt: skip
    hits = json.loads(capsys.readouterr().out)
    assert len(hits) == 3
    assert hits[0]["score"] >= hits[-1]["score"]
    assert main(["moa3cir", "eval", "--model", str(run / "model"), "--data", str(toy)]) == 0
    recall = json.loads(capsys.readouterr().out)
    assert 0 <= recall["R@1"] <= recall["R@10"] <= recall["R@50"] == 1.0  # 12 gallery items
    assert "toy/R@10" in recall
    # a second run into the same folder must say --resume
    assert main(["moa3cir", "train", "--data", str(toy), "--out", str(run), "--image-size", "16",
                 "--tower-steps", "2", "--steps", "2", "--batch-size", "4", "--heads", "4",
                 "--groups", "2", "--shared-heads", "2"]) == 2  # fmt: skip
    assert "pass --resume" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--data", "toy", "--out", "{tmp}/r", "--head", "clip"], "--head must be one of"),
        (
            ["train", "--data", "toy", "--out", "{tmp}/r", "--steps", "0"],
            "--steps must be an integer >= 1",
        ),
        (["train", "--data", "{tmp}", "--out", "{tmp}/r"], "is neither FashionIQ's layout"),
        (
            ["train", "--data", "{toy}", "--out", "{tmp}/r", "--route-supervision", "1"],
            "--route-supervision: only --data toy knows",
        ),
        (
            ["train", "--data", "toy", "--out", "{tmp}/r", "--route-supervision", "-1"],
            "--route-supervision must be a number >= 0",
        ),
        (
            ["train", "--data", "{toy}", "--out", "{tmp}/r", "--clip", "ViT-Q-99"],
            "--clip must be 'tiny' or an open_clip",
        ),
        (
            ["index", "--model", "{tmp}", "--gallery", "{tmp}", "--out", "{tmp}/i.safetensors"],
            "holds no images",
        ),
        (
            ["index", "--model", "{tmp}", "--gallery", "{toy}/images", "--out", "{tmp}/i.bin"],
            "--out must end in",
        ),
        (
            [
                "search",
                "--model",
                "{tmp}",
                "--index",
                "{tmp}/none.safetensors",
                "--image",
                "x.png",
                "--text",
                "red",
            ],
            "does not exist",
        ),
        (
            ["eval", "--model", "{tmp}", "--data", "{toy}", "--split", "test"],
            "split 'test' missing",
        ),
    ],
)
def test_cli_errors_are_one_line_with_exit_2(toy, tmp_path, capsys, argv, message):
    argv = [a.format(tmp=tmp_path, toy=toy) for a in argv]
    assert main(["moa3cir", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert "\n" not in err


def test_garbage_pretrained_weights_are_refused_by_name(tmp_path):
    """Issue 80: a --pretrained file of garbage was a torch.load traceback."""
    from mixlab.shared.files import CheckpointError
    from mixlab.vision_mm.moa3cir.cli import _towers

    garbage = tmp_path / "vit.bin"
    garbage.write_bytes(b"not weights" * 20)
    with pytest.raises(CheckpointError, match="vit.bin: damaged or not a ViT-B-32 weights file"):
        _towers("ViT-B-32", garbage, 224, "none")
