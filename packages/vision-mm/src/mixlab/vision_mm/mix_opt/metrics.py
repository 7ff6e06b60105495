"""Quality of personalized samples, measured with networks trained here (no downloads).

- **Subject fidelity**: the mean cosine between the centred features of samples and of the
  subject's reference images in :class:`ShapeNet` trained to tell shapes and fills apart (our stand-in for
  DreamBench's DINO score: "DINO_local", never a DINO number), and the nearest-neighbour SSIM.
- **Prompt fidelity**: how often a locally trained background classifier finds the background
  the prompt asked for (our stand-in for CLIP-T).
- **Structural distortion**: 1 − IoU of the sample's Canny edge map against the outline of the
  nearest reference's silhouette (both dilated by one pixel), at the best shift within
  ``max_shift`` pixels, at full resolution.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from skimage.feature import canny
from skimage.metrics import structural_similarity
from torch import nn

from mixlab.shared import progress, save_state
from mixlab.shared.cache import cached
from mixlab.vision_mm.mix_opt.cache import load_cached
from mixlab.vision_mm.mix_opt.data import BACKGROUNDS, COLOURS, PATTERNS, SHAPES, captioned_shapes


class ShapeNet(nn.Module):
    """A small CNN: 32² image → ``widths[-1]``-d features → one linear head per attribute."""

    def __init__(self, heads: dict[str, int], widths: tuple[int, int, int] = (16, 32, 64)):
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
                nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
                nn.MaxPool2d(2),
            )  # fmt: skip

        a, b, c = widths
        self.trunk = nn.Sequential(
            block(3, a), block(a, b), block(b, c), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )
        self.heads = nn.ModuleDict({name: nn.Linear(c, n) for name, n in heads.items()})

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.trunk(images)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        features = self.features(images)
        return {name: head(features) for name, head in self.heads.items()}


@dataclass(frozen=True)
class EvalSpec:
    train_size: int = 8000
    steps: int = 1500
    widths: tuple[int, int, int] = (16, 32, 64)
    """block widths of :class:`ShapeNet`: 32/64/128 read held-out random shapes' shape and fill
    at 0.998 and 0.963 against 0.988 and 0.923, and took 2.7× as long to train (350 s, 2 cores)"""
    batch_size: int = 64
    lr: float = 2e-3
    seed: int = 1234


EVAL_CODE = ("mixlab.vision_mm.mix_opt.metrics", "mixlab.vision_mm.mix_opt.data",
             "mixlab.shared.shapes")  # fmt: skip
"""the code that trains the evaluation networks: part of their cache key"""


def _nets(spec: EvalSpec) -> tuple[ShapeNet, ShapeNet]:
    torch.manual_seed(spec.seed)
    fills = len(PATTERNS) * len(COLOURS)
    feature_net = ShapeNet({"shape": len(SHAPES), "fill": fills}, spec.widths)
    attribute_net = ShapeNet({"background": len(BACKGROUNDS)}, spec.widths)
    return feature_net, attribute_net


def evaluation_nets(spec: EvalSpec = EvalSpec()) -> tuple[ShapeNet, ShapeNet]:
    """(feature net: shape + fill heads, attribute net: background head), trained on captioned
    shapes with solid, striped and checked fills (a disjoint seed from the diffusion data) and
    cached; about a minute the first time."""

    def build(folder: Path) -> None:
        feature_net, attribute_net = _nets(spec)
        data = captioned_shapes(spec.train_size, seed=spec.seed, patterns=True)
        _fit(feature_net, data, spec, "evaluation feature net")
        _fit(attribute_net, data, spec, "evaluation background net")
        save_state(
            {"feature": feature_net.state_dict(), "attribute": attribute_net.state_dict()},
            folder / "nets",
        )

    folder = cached("mix_opt", "eval-nets", asdict(spec), build, code=EVAL_CODE)
    feature_net, attribute_net = _nets(spec)
    load_cached(
        folder / "nets",
        "cached evaluation networks",
        {"feature": feature_net, "attribute": attribute_net},
    )
    return feature_net.eval().requires_grad_(False), attribute_net.eval().requires_grad_(False)


def _fit(net: ShapeNet, data, spec: EvalSpec, description: str) -> None:
    generator = torch.Generator().manual_seed(spec.seed)
    optimizer = torch.optim.AdamW(net.parameters(), lr=spec.lr, weight_decay=1e-4)
    lr_schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, spec.lr, total_steps=spec.steps)
    net.train()
    with progress(spec.steps, description) as bar:
        for _ in range(spec.steps):
            index = torch.randint(len(data), (spec.batch_size,), generator=generator)
            images = data.images[index]
            images = images + 0.05 * torch.randn(images.shape, generator=generator)  # sample noise
            outputs = net(images)
            loss = sum(F.cross_entropy(outputs[h], getattr(data, h)[index]) for h in outputs)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            lr_schedule.step()
            bar.advance(loss=loss.item())
    net.eval()


@torch.inference_mode()
def feature_cosine(
    feature_net: ShapeNet,
    samples: torch.Tensor,
    references: torch.Tensor,
    center: torch.Tensor | None = None,
) -> float:
    """Mean pairwise cosine of the features of samples and references (DreamBench-style),
    after subtracting ``center`` (see :func:`feature_center`): the features after SiLU and
    pooling share a large common component that puts every pair of images near 0.9."""
    a, b = feature_net.features(samples), feature_net.features(references)
    if center is not None:
        a, b = a - center, b - center
    return (F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T).mean().item()


@torch.inference_mode()
def feature_center(feature_net: ShapeNet, n: int = 512, seed: int = 4321) -> torch.Tensor:
    """The mean feature of ``n`` generic captioned shapes (all fills): the common component."""
    return feature_net.features(captioned_shapes(n, seed=seed, patterns=True).images).mean(0)


def _numpy(images: torch.Tensor) -> np.ndarray:
    return images.detach().float().cpu().permute(0, 2, 3, 1).numpy()


def nearest_ssim(samples: torch.Tensor, references: torch.Tensor) -> float:
    """Mean over samples of the best SSIM against any reference (images in [-1, 1])."""
    s, r = _numpy(samples), _numpy(references)
    best = [max(structural_similarity(x, y, channel_axis=-1, data_range=2.0) for y in r) for x in s]
    return float(np.mean(best))


@torch.inference_mode()
def prompt_accuracy(
    attribute_net: ShapeNet, samples: torch.Tensor, backgrounds: torch.Tensor
) -> float:
    """Share of samples whose background the classifier reads as the requested one."""
    return (attribute_net(samples)["background"].argmax(-1) == backgrounds).float().mean().item()


def edge_maps(images: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    """Canny edges of the grey-level images, dilated by one pixel (B, H, W) bool."""
    grey = _numpy(images).mean(-1)
    edges = torch.from_numpy(np.stack([canny(g, sigma=sigma) for g in grey])).float()
    return F.max_pool2d(edges[:, None], 3, stride=1, padding=1)[:, 0] > 0


def outline_maps(references: torch.Tensor, threshold: float = 0.3) -> torch.Tensor:
    """The subject's structure: the outline of each reference's foreground (pixels farther than
    ``threshold`` from the corner colour), dilated by one pixel (B, H, W) bool."""
    corner = references[:, :, :1, :1]
    mask = ((references - corner).abs().amax(1) > threshold).float()[:, None]
    inner = -F.max_pool2d(-mask, 3, stride=1, padding=1)  # erosion
    outline = (mask - inner).clamp(min=0)
    return F.max_pool2d(outline, 3, stride=1, padding=1)[:, 0] > 0


def edge_iou(samples: torch.Tensor, references: torch.Tensor, max_shift: int = 4) -> float:
    """Mean over samples of the best IoU between the sample's edge map and a reference's
    outline (:func:`outline_maps`), over references and shifts within ±``max_shift`` pixels
    (placements differ; the structure is what counts). Edges the subject does not have (speckle,
    a broken silhouette) enlarge the union and lower the score."""
    a, b = edge_maps(samples).float(), outline_maps(references).float()
    h, w = a.shape[1:]
    padded = F.pad(a, (max_shift,) * 4)  # shifted in zeros, not wrapped around
    best = torch.zeros(len(a))
    for dy in range(2 * max_shift + 1):
        for dx in range(2 * max_shift + 1):
            shifted = padded[:, dy : dy + h, dx : dx + w]
            inter = torch.einsum("ahw,bhw->ab", shifted, b)
            union = shifted.sum((1, 2))[:, None] + b.sum((1, 2))[None] - inter
            best = torch.maximum(best, (inter / union.clamp(min=1)).max(1).values)
    return best.mean().item()
