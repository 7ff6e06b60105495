"""The experiment's one-time work, cached by :mod:`~.experiment`: the phase-1 data the towers and
the attribute classifier train on, the rendered splits and gallery, and the frozen towers'
features of each (saved as safetensors). Its source, with the towers, training, catalogue and
augmentation modules, keys the cache entries: a change here trains the towers again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixlab.vision_mm.moa3cir.config import Config

TEST_SEED = 2026

__all__ = [
    "TEST_SEED",
    "clip_config",
    "gallery",
    "gallery_features",
    "load_features",
    "make_split",
    "new_towers",
    "phase1_data",
    "save_features",
]


def clip_config(config: Config) -> dict[str, Any]:
    return {"embed_dim": config.embed_dim, "width": config.clip_width, "layers": config.clip_layers,
            "heads": config.clip_heads, "image_size": config.size, "patch_size": config.patch,
            "context_length": config.context_length}  # fmt: skip


def new_towers(config: Config, seed: int):
    from mixlab.vision_mm.moa3cir.towers import ClipTowers, tiny_clip

    torch.manual_seed(seed)
    return ClipTowers(tiny_clip(**clip_config(config)))


def phase1_data(config: Config):
    """Items (images, descriptions) and sum-fusion triplets, no held-out pair."""
    from mixlab.vision_mm.moa3cir.catalogue import (
        all_items,
        describe,
        is_held_out,
        make_triplets,
        render,
    )  # fmt: skip
    from mixlab.vision_mm.moa3cir.training import TripletData

    rng = np.random.default_rng(config.seed + 101)
    pool = all_items()[~is_held_out(all_items())]
    items = pool[rng.integers(len(pool), size=config.tower_items)]
    images = torch.from_numpy(render(items, rng, config.size))
    descriptions = describe(items, rng, config.noise)
    references = pool[rng.integers(len(pool), size=config.tower_triplets)]
    triplets = make_triplets(
        references, rng, confound=config.confound, allowed=~is_held_out(all_items())
    )
    data = TripletData(torch.from_numpy(render(triplets.reference, rng, config.size)),
                       torch.from_numpy(render(triplets.target, rng, config.size)), triplets.texts,
                       describe(triplets.reference, rng, config.noise),
                       describe(triplets.target, rng, config.noise))  # fmt: skip
    return items, images, descriptions, data


def save_features(features, path: Path) -> None:
    from safetensors.torch import save_file

    tensors = {"target_image": features.target_image}
    if features.target_description is not None:
        tensors["target_description"] = features.target_description
    for name in ("image", "text", "description"):
        part = getattr(features.query, name)
        if part is None:
            continue
        tensors[f"{name}.pooled"], tensors[f"{name}.tokens"] = part.pooled, part.tokens
        if part.padding is not None:
            tensors[f"{name}.padding"] = part.padding
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


def load_features(path: Path):
    from safetensors.torch import load_file

    from mixlab.vision_mm.moa3cir.model import QueryFeatures
    from mixlab.vision_mm.moa3cir.towers import Encoded
    from mixlab.vision_mm.moa3cir.training import TripletFeatures

    t = load_file(str(path))

    def part(name: str) -> Encoded | None:
        if f"{name}.pooled" not in t:
            return None
        return Encoded(t[f"{name}.pooled"], t[f"{name}.tokens"], t.get(f"{name}.padding"))

    query = QueryFeatures(part("image"), part("text"), part("description"))
    return TripletFeatures(query, t["target_image"], t.get("target_description"))


def make_split(config: Config, split: str, model, classifier) -> tuple[Any, dict[str, Any]]:
    """Raw triplets of ``split`` (``natural``, ``augment``, ``validation`` or ``test``) and their
    facts; validation is drawn like the test queries from another seed (for pilots: the test
    split is not looked at while the design changes)."""
    from mixlab.vision_mm.moa3cir.augment import controlled_edits
    from mixlab.vision_mm.moa3cir.catalogue import (
        all_items,
        describe,
        is_held_out,
        item_index,
        make_triplets,
        render,
    )  # fmt: skip
    from mixlab.vision_mm.moa3cir.training import TripletData

    allowed = ~is_held_out(all_items())
    pool = all_items()[allowed]
    seeds = {"natural": 202, "augment": 303, "validation": 505, "test": TEST_SEED}
    rng = np.random.default_rng(config.seed + seeds[split])
    facts: dict[str, Any] = {}
    if split == "augment":
        references = pool[rng.integers(len(pool), size=config.augment)]
        triplets, ref_images, target_images, kept = controlled_edits(references, rng, classifier,
                                                                     size=config.size, allowed=allowed)  # fmt: skip
        facts["kept"] = kept
    else:
        source = pool if split == "natural" else all_items()
        references = source[rng.integers(len(source), size=config.train_triplets if split == "natural"
                                         else config.test_queries)]  # fmt: skip
        triplets = make_triplets(references, rng, confound=config.confound if split == "natural" else 0.0,
                                 allowed=allowed if split == "natural" else None)  # fmt: skip
        ref_images = render(triplets.reference, rng, config.size)
        target_images = render(triplets.target, rng, config.size)
    data = TripletData(torch.from_numpy(ref_images), torch.from_numpy(target_images), triplets.texts,
                       describe(triplets.reference, rng, config.noise),
                       describe(triplets.target, rng, config.noise))  # fmt: skip
    facts.update({"count": len(triplets), "stated": [list(s) for s in triplets.stated],
                  "target": item_index(triplets.target).tolist(),
                  "held_out": is_held_out(triplets.target).tolist()})  # fmt: skip
    return data, facts


def gallery(config: Config) -> tuple[torch.Tensor, list[str]]:
    from mixlab.vision_mm.moa3cir.catalogue import all_items, describe, render

    rng = np.random.default_rng(config.seed + TEST_SEED + 1)
    items = all_items()
    return torch.from_numpy(render(items, rng, config.size)), describe(items, rng, config.noise)


@torch.no_grad()
def gallery_features(model, images: torch.Tensor, descriptions: list[str]):
    """The gallery as target features (pooled image and description; no query side)."""
    from mixlab.vision_mm.moa3cir.model import QueryFeatures
    from mixlab.vision_mm.moa3cir.towers import Encoded
    from mixlab.vision_mm.moa3cir.training import TripletFeatures

    image, description = [], []
    for start in range(0, len(images), 256):
        rows = slice(start, start + 256)
        image.append(model.image(images[rows], "target_image").pooled)
        ids = model.tokenize(descriptions[rows])
        description.append(model.text(ids, "target_description").pooled)
    empty = Encoded(torch.zeros(0), torch.zeros(0))
    return TripletFeatures(QueryFeatures(empty, empty), torch.cat(image), torch.cat(description))
