"""The experiment's data and its frozen encoder, made once and cached by :mod:`~.experiment`:
the training and test clips of each split (:func:`make_data`) and the UnivFD-style and DeCoF-style generic
encoder (:func:`train_frozen_encoder`). Their source, with the clip generator's, keys the cache
entries: a change here makes them again.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mixlab.shared import progress
from mixlab.shared.device import resolve_device
from mixlab.vision_mm.mixforensics.config import Config

__all__ = ["data_key", "make_data", "test_kinds", "traces", "train_frozen_encoder", "train_kinds"]


def traces(config: Config):
    from mixlab.vision_mm.mixforensics.clips import Traces

    return Traces(flicker=config.flicker, checker=config.checker, checker_drift=config.checker_drift,
                  smooth=config.smooth, drift=config.drift, warp=config.warp,
                  sensor=(config.sensor_low, config.sensor_high))  # fmt: skip


def data_key(config: Config) -> dict[str, Any]:
    """The config fields the clips depend on."""
    key = {"traces": traces(config).__dict__, "frames": config.frames, "size": config.size,
           "train": config.train_clips, "real": config.test_real, "per_kind": config.test_per_kind,
           "jpeg": config.jpeg_quality, "seed": config.seed}  # fmt: skip
    if config.generator_family:
        key["generator"] = {"strength": config.sdedit_strength}
    return key


def train_kinds(config: Config) -> list[str]:
    from mixlab.vision_mm.mixforensics.clips import SEEN

    real = config.train_clips // 2
    return ["real"] * real + [SEEN[i % len(SEEN)] for i in range(config.train_clips - real)]


def test_kinds(config: Config) -> dict[str, list[str]]:
    """Test set name → the kinds of its clips (``jpeg-*`` sets are re-compressed copies)."""
    from mixlab.vision_mm.mixforensics.clips import FAMILIES, PARTIAL

    sets = {"real": ["real"] * config.test_real}
    sets.update({kind: [kind] * config.test_per_kind for kind in (*FAMILIES, *PARTIAL)})
    return sets


def make_data(config: Config, split: str) -> dict[str, torch.Tensor]:
    """The clips of ``split`` (:func:`~.experiment.dataset`), made now."""
    from mixlab.vision_mm.mixforensics.clips import SEEN, jpeg, make_set

    made: dict[str, torch.Tensor] = {}
    common = {"frames": config.frames, "size": config.size, "traces": traces(config)}
    if split == "train":
        kinds = train_kinds(config)
        made["clips"] = make_set(kinds, config.seed * 7919 + 1, split="train", **common)
        made["labels"] = torch.tensor([k != "real" for k in kinds], dtype=torch.uint8)
        return made
    base = {"test": 2026, "validation": 505}[split]
    for i, (name, kinds) in enumerate(test_kinds(config).items()):
        made[name] = make_set(kinds, config.seed * 7919 + base + i, split="test", **common)
    for name in ("real", *SEEN):
        made[f"jpeg-{name}"] = torch.stack([jpeg(c, config.jpeg_quality) for c in made[name]])
    if config.generator_family:  # F is scored against real shape clips of the same moves
        from mixlab.vision_mm.mixforensics.generated import shape_clips

        made["F-real"], made["F"] = shape_clips(config.test_per_kind, config.seed * 7919 + base + 99,
                                                frames=config.frames, size=config.size,
                                                strength=config.sdedit_strength, traces=traces(config))  # fmt: skip
    return made


def train_frozen_encoder(config: Config) -> torch.nn.Module:
    """the UnivFD-style and DeCoF-style generic encoder (:func:`~.experiment.frozen_encoder`), trained now
    to name the source picture of single real training frames (on the CPU when it returns)."""
    from mixlab.vision_mm.mixforensics.clips import TRAIN_PICTURES, make_set
    from mixlab.vision_mm.mixforensics.model import build_backbone, normalise

    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        encoder = build_backbone(config.backbone)
    count = max(200, config.train_clips // 4)
    pictures = np.random.default_rng(config.seed + 11).integers(len(TRAIN_PICTURES), size=count)
    clips = make_set(
        ["real"] * count,
        config.seed * 7919 + 31,
        frames=config.frames,
        size=config.size,
        split="train",
        traces=traces(config),
        sources=[TRAIN_PICTURES[p] for p in pictures],
    )
    head = torch.nn.Linear(encoder.feature_dim, len(TRAIN_PICTURES))
    device = resolve_device(config.device)
    model = torch.nn.Sequential(encoder, head).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    labels = torch.from_numpy(pictures)
    generator = torch.Generator().manual_seed(config.seed)
    with progress(config.encoder_steps, "pre-training the frozen encoder") as bar:
        for _ in range(config.encoder_steps):
            rows = torch.randint(len(clips), (config.batch_size * 2,), generator=generator)
            frames = torch.randint(config.frames, (len(rows),), generator=generator)
            images = normalise(clips[rows, frames].float() / 255, encoder)  # as the detectors will
            loss = torch.nn.functional.cross_entropy(
                model(images.to(device)), labels[rows].to(device)
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            bar.advance(loss=loss.item())
    return encoder.cpu()
