"""Composed-retrieval data from local folders: FashionIQ's and Shoes' layouts, item
descriptions as JSON lines, image folders as galleries, and the toy catalogue written in
FashionIQ's layout (nothing is downloaded).

FashionIQ (as CLIP4Cir reads it)::

    root/captions/cap.{category}.{split}.json     [{"candidate": id, "target": id, "captions": [a, b]}, ...]
    root/image_splits/split.{category}.{split}.json   [id, ...]   (the gallery)
    root/images/{id}.png (or .jpg)

Shoes (Guo et al.'s relative captions)::

    root/relative_captions_shoes.json   [{"ReferenceImageName", "ImageName", "RelativeCaption"}, ...]
    root/{train,eval}_im_names.txt      one image file name per line (the split, and its gallery)
    root/**/<image file name>

Descriptions: ``{"id": ..., "description": ...}`` per line, for any of the two.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mixlab.shared.checks import check_count, check_input_folder, read_jsonl

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")

__all__ = [
    "CIRDataset",
    "ImageFiles",
    "evaluate_dataset",
    "image_folder",
    "index_files",
    "load_fashioniq",
    "load_images",
    "load_shoes",
    "read_descriptions",
    "write_toy",
]


@dataclass
class CIRDataset:
    """Triplets (reference id, modification text, target id), the gallery's ids, each id's
    image file and, where known, its description."""

    triplets: list[tuple[str, str, str]]
    gallery: list[str]
    paths: dict[str, Path]
    descriptions: dict[str, str] = field(default_factory=dict)
    categories: list[str] = field(default_factory=list)
    """per triplet, its FashionIQ category (empty for other layouts)"""

    def description_list(self, ids: list[str]) -> list[str] | None:
        """The descriptions of ``ids``, or None unless every one has a description."""
        if not self.descriptions or any(i not in self.descriptions for i in ids):
            return None
        return [self.descriptions[i] for i in ids]


def read_descriptions(path: Path, option: str = "--descriptions") -> dict[str, str]:
    return {
        str(r["id"]): str(r["description"])
        for r in read_jsonl(Path(path), option, ("id", "description"))
    }


def _image_paths(folder: Path) -> dict[str, Path]:
    return {p.stem: p for p in sorted(folder.rglob("*")) if p.suffix.lower() in IMAGE_SUFFIXES}


def load_fashioniq(
    root: str | Path, split: str = "val", categories: list[str] | None = None,
    descriptions: str | Path | None = None,
) -> CIRDataset:  # fmt: skip
    """The FashionIQ ``split`` of ``categories`` (default: every category with caption files);
    the two captions of a pair are joined with "and", as CLIP4Cir does."""
    root = Path(root)
    check_input_folder(root, "--data")
    for name in ("captions", "image_splits", "images"):
        if not (root / name).is_dir():
            raise ValueError(f"--data: {str(root)!r} has no {name}/ folder (FashionIQ's layout)")
    if categories is None:
        categories = sorted(
            {p.name.split(".")[1] for p in (root / "captions").glob(f"cap.*.{split}.json")}
        )
    if not categories:
        raise ValueError(
            f"--data: {str(root)!r} has no captions/cap.*.{split}.json (split {split!r} missing)"
        )
    triplets, gallery, owners = [], [], []
    for category in categories:
        for kind, name in (("captions", f"cap.{category}.{split}.json"),
                           ("image_splits", f"split.{category}.{split}.json")):  # fmt: skip
            if not (root / kind / name).is_file():
                raise ValueError(
                    f"--data: {str(root)!r} has no {kind}/{name} (split {split!r} missing)"
                )
        for entry in json.loads((root / "captions" / f"cap.{category}.{split}.json").read_text()):
            text = " and ".join(c.strip(" .") for c in entry["captions"] if c.strip(" ."))
            triplets.append((str(entry["candidate"]), text, str(entry["target"])))
            owners.append(category)
        gallery += [
            str(i)
            for i in json.loads(
                (root / "image_splits" / f"split.{category}.{split}.json").read_text()
            )
        ]
    paths = _image_paths(root / "images")
    _check_images(triplets, gallery, paths, root)
    extra = {} if descriptions is None else read_descriptions(Path(descriptions))
    return CIRDataset(triplets, list(dict.fromkeys(gallery)), paths, extra, owners)


def load_shoes(
    root: str | Path, split: str = "eval", descriptions: str | Path | None = None
) -> CIRDataset:
    """The Shoes ``split`` (``train`` or ``eval``): its triplets and its images as the gallery."""
    root = Path(root)
    check_input_folder(root, "--data", ("relative_captions_shoes.json", f"{split}_im_names.txt"))
    names = [
        n.strip() for n in (root / f"{split}_im_names.txt").read_text().splitlines() if n.strip()
    ]
    members = {Path(n).stem for n in names}
    triplets = []
    for entry in json.loads((root / "relative_captions_shoes.json").read_text()):
        reference, target = Path(entry["ReferenceImageName"]).stem, Path(entry["ImageName"]).stem
        if reference in members and target in members:
            triplets.append((reference, entry["RelativeCaption"].strip(), target))
    paths = _image_paths(root)
    gallery = [Path(n).stem for n in names]
    _check_images(triplets, gallery, paths, root)
    extra = {} if descriptions is None else read_descriptions(Path(descriptions))
    return CIRDataset(triplets, gallery, paths, extra)


def _check_images(triplets, gallery, paths, root: Path) -> None:
    if not gallery:
        raise ValueError(f"--data: the gallery of {str(root)!r} is empty")
    needed = {i for r, _, t in triplets for i in (r, t)} | set(gallery)
    missing = sorted(needed - paths.keys())
    if missing:
        raise ValueError(
            f"--data: {len(missing)} images of {str(root)!r} are missing, e.g. {missing[0]!r}"
        )


def image_folder(folder: str | Path) -> dict[str, Path]:
    """A gallery folder's images by file stem."""
    folder = Path(folder)
    check_input_folder(folder, "--gallery")
    paths = _image_paths(folder)
    if not paths:
        raise ValueError(
            f"--gallery: {str(folder)!r} holds no images ({', '.join(IMAGE_SUFFIXES)}): the gallery is empty"
        )
    return paths


def load_images(paths: list[Path], size: int):
    """``[n, 3, size, size]`` float tensor in [0, 1]: each image as RGB, its shorter side resized
    to ``size`` and centre-cropped (CLIP's preprocessing, without the normalisation the towers
    apply)."""
    import torch
    from PIL import Image

    check_count(size, "size")
    out = np.empty((len(paths), 3, size, size), dtype=np.float32)
    for i, path in enumerate(paths):
        with Image.open(path) as image:
            image = image.convert("RGB")
            scale = size / min(image.size)
            w, h = max(size, round(image.width * scale)), max(size, round(image.height * scale))
            image = image.resize((w, h), Image.BICUBIC)
            left, top = (w - size) // 2, (h - size) // 2
            image = image.crop((left, top, left + size, top + size))
            out[i] = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255
    return torch.from_numpy(out)


class ImageFiles:
    """Image files read on indexing, ``[n, 3, size, size]`` in [0, 1] per index: a training set at
    real sizes (FashionIQ's 18k triplets at 224²: about 20 GB as floats) does not fit in memory
    as one tensor. Stands in for the image tensors of :class:`~.training.TripletData`."""

    def __init__(self, paths: list[Path], size: int) -> None:
        check_count(size, "size")
        self.paths, self.size = list(paths), size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, rows):
        if isinstance(rows, slice):
            rows = range(len(self.paths))[rows]
        elif hasattr(rows, "tolist"):  # a tensor or array of row indices
            rows = rows.tolist()
        return load_images([self.paths[i] for i in rows], self.size)


def write_toy(
    out: str | Path, *, train: int = 2000, val: int = 500, size: int = 32, seed: int = 0
) -> Path:
    """The procedural catalogue in FashionIQ's layout (category ``toy``), with every item's
    description in ``descriptions.jsonl``: ``train`` and ``val`` triplets, each split's gallery
    the items its triplets touch."""
    from PIL import Image

    from mixlab.vision_mm.moa3cir.catalogue import all_items, describe, make_triplets, render

    out = Path(out)
    for name in ("captions", "image_splits", "images"):
        (out / name).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    items = all_items()
    lines = []
    for split, count in (("train", train), ("val", val)):
        check_count(count, split)
        triplets = make_triplets(items[rng.integers(len(items), size=count)], rng)
        captions, ids = [], []
        for k in range(count):
            pair = []
            for role, row in (("ref", triplets.reference[k]), ("tgt", triplets.target[k])):
                name = f"{split}-{k:05d}-{role}"
                image = render(row[None], rng, size)[0].transpose(1, 2, 0)
                Image.fromarray((image * 255).round().astype(np.uint8)).save(
                    out / "images" / f"{name}.png"
                )
                lines.append(json.dumps({"id": name, "description": describe(row[None], rng)[0]}))
                pair.append(name)
            captions.append(
                {"candidate": pair[0], "target": pair[1], "captions": [triplets.texts[k]]}
            )
            ids += pair
        (out / "captions" / f"cap.toy.{split}.json").write_text(json.dumps(captions))
        (out / "image_splits" / f"split.toy.{split}.json").write_text(json.dumps(ids))
    (out / "descriptions.jsonl").write_text("\n".join(lines) + "\n")
    return out


def index_files(model, paths: list[Path], ids: list[str], descriptions: list[str] | None = None,
                batch_size: int = 256):  # fmt: skip
    """A :class:`~.model.RetrievalIndex` of image files, loaded ``batch_size`` at a time (a
    FashionIQ gallery does not fit in memory as one tensor)."""
    import torch

    from mixlab.vision_mm.moa3cir.model import RetrievalIndex, check_same_count

    if not paths:
        raise ValueError("the gallery is empty: give at least one image")
    check_same_count("descriptions", descriptions, paths)
    chunks = []
    for start in range(0, len(paths), batch_size):
        images = load_images(paths[start : start + batch_size], model.towers.image_size)
        chunk = None if descriptions is None else descriptions[start : start + batch_size]
        chunks.append(model.build_index(images, ids[start : start + batch_size], chunk).embeddings)
    return RetrievalIndex(torch.cat(chunks), list(ids))


def evaluate_dataset(model, dataset: CIRDataset, ks: tuple[int, ...] = (1, 10, 50),
                     batch_size: int = 256) -> dict[str, float]:  # fmt: skip
    """R@K of every triplet against the dataset's gallery (descriptions used where every item
    has one), overall and per FashionIQ category."""
    import torch

    from mixlab.vision_mm.moa3cir.model import recall_at_k, target_ranks

    row_of = {i: k for k, i in enumerate(dataset.gallery)}
    kept = [t for t in dataset.triplets if t[2] in row_of]
    if not kept:
        raise ValueError("--data: no triplet's target is in the gallery")
    index = index_files(model, [dataset.paths[i] for i in dataset.gallery], dataset.gallery,
                        dataset.description_list(dataset.gallery), batch_size)  # fmt: skip
    ranks = []
    with torch.no_grad():
        model.eval()
        for start in range(0, len(kept), batch_size):
            chunk = kept[start : start + batch_size]
            references = [r for r, _, _ in chunk]
            images = load_images([dataset.paths[r] for r in references], model.towers.image_size)
            queries = model.encode_query(
                images, [t for _, t, _ in chunk], dataset.description_list(references)
            )
            targets = torch.tensor([row_of[t] for _, _, t in chunk])
            ranks.append(target_ranks(queries.float(), index.embeddings, targets))
    ranks = torch.cat(ranks)
    out = recall_at_k(ranks, ks)
    if dataset.categories:
        owners = [
            c for c, t in zip(dataset.categories, dataset.triplets, strict=True) if t[2] in row_of
        ]
        for category in sorted(set(owners)):
            rows = torch.tensor([o == category for o in owners])
            out.update({f"{category}/{k}": v for k, v in recall_at_k(ranks[rows], ks).items()})
    return out
