"""Controlled-edit augmentation: exact counterfactual triplets from the attribute tables, kept
only where a locally trained attribute classifier sees the requested visible attributes in the
rendered target (the stand-in for the paper's LVLM-driven generation and checking, spec §5e).

Material is never visible: a material edit is checked on its other attributes and trusted to
the description, which states it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mixlab.shared import progress
from mixlab.vision_mm.moa3cir.catalogue import ATTRIBUTES, VISIBLE, Triplets, make_triplets, render

__all__ = ["AttributeClassifier", "controlled_edits", "train_attribute_classifier"]


class AttributeClassifier(nn.Module):
    """A small CNN with one softmax head per visible attribute."""

    def __init__(self, size: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
        )  # fmt: skip
        self.heads = nn.ModuleDict(
            {name: nn.Linear(64 * 16, len(ATTRIBUTES[name])) for name in VISIBLE}
        )

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.features(images)
        return {name: head(x) for name, head in self.heads.items()}

    @torch.no_grad()
    def predict(self, images: torch.Tensor, batch_size: int = 512) -> np.ndarray:
        """``[n, len(VISIBLE)]`` predicted value indices."""
        self.eval()
        out = []
        for start in range(0, len(images), batch_size):
            logits = self(images[start : start + batch_size])
            out.append(torch.stack([logits[n].argmax(-1) for n in VISIBLE], 1))
        return torch.cat(out).numpy()


def train_attribute_classifier(
    images: torch.Tensor, items: np.ndarray, steps: int, *, seed: int = 0, batch_size: int = 128
) -> AttributeClassifier:
    """Fit on ``images`` of ``items`` (rows of :func:`~.catalogue.all_items`)."""
    torch.manual_seed(seed)
    model = AttributeClassifier(images.shape[-1])
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    labels = torch.as_tensor(items[:, : len(VISIBLE)], dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    with progress(steps, "attribute classifier") as bar:
        for _ in range(steps):
            rows = torch.randint(len(images), (batch_size,), generator=generator)
            logits = model(images[rows])
            loss = sum(F.cross_entropy(logits[n], labels[rows, k]) for k, n in enumerate(VISIBLE))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            bar.advance(loss=loss.item())
    return model.eval()


def controlled_edits(
    references: np.ndarray,
    rng: np.random.Generator,
    classifier: AttributeClassifier,
    *,
    size: int = 32,
    allowed: np.ndarray | None = None,
) -> tuple[Triplets, np.ndarray, np.ndarray, float]:
    """Exact triplets (no unstated change) from ``references``: (the kept triplets, their
    reference and target images, the share kept)."""
    triplets = make_triplets(references, rng, confound=0.0, allowed=allowed)
    reference_images = render(triplets.reference, rng, size)
    target_images = render(triplets.target, rng, size)
    seen = classifier.predict(torch.from_numpy(target_images))
    kept = (seen == triplets.target[:, : len(VISIBLE)]).all(1)
    chosen = Triplets(triplets.reference[kept], triplets.target[kept],
                      [t for t, k in zip(triplets.texts, kept, strict=True) if k],
                      [s for s, k in zip(triplets.stated, kept, strict=True) if k],
                      triplets.confounded[kept])  # fmt: skip
    return chosen, reference_images[kept], target_images[kept], float(kept.mean())
