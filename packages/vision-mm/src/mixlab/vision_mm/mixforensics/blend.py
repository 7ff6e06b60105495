"""Stochastic Frame Blending (SFB) and Blend Invariance Regularisation (BIR), reconstructed from
the abstract (spec §6(a)): blend several frames of a clip into one composite *before* the image
encoder, so that cues spread over frames meet inside one forward pass.

x̃ = Σᵢ wᵢ fᵢ over n ~ U{2..n_max} frames, w ~ Dirichlet(α·1ₙ) (training); at inference R fixed
blends average the frames r, r + R, r + 2R, … (every frame once), or one uniform blend.
BIR is AugMix's Jensen–Shannon consistency between two blends of a clip (Hendrycks et al. 2020,
eq. 1, two views here) plus an optional MSE between their normalised embeddings.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mixlab.shared.checks import check_choice, check_count, check_number

DOMAINS = ("pixel", "residual")
SAMPLING = ("random", "strided")


def check_video(video: torch.Tensor, name: str = "video") -> None:
    """``video`` is (B, T, C, H, W) with T >= 2 frames of C in {1, 3} channels; a (B, C, T, H, W)
    tensor (PyTorchVideo's layout) is refused by name."""
    if not isinstance(video, torch.Tensor) or video.ndim != 5:
        shape = tuple(video.shape) if isinstance(video, torch.Tensor) else type(video).__name__
        raise ValueError(f"{name} must be a (B, T, C, H, W) tensor, got shape {shape}")
    if video.shape[2] not in (1, 3) and video.shape[1] in (1, 3):
        raise ValueError(f"{name} must be (B, T, C, H, W), got {tuple(video.shape)}: this looks like "
                         "(B, C, T, H, W); use video.transpose(1, 2)")  # fmt: skip
    if video.shape[2] not in (1, 3):
        raise ValueError(
            f"{name} must have 1 or 3 channels at dim 2 (B, T, C, H, W), got {tuple(video.shape)}"
        )
    if video.shape[1] < 2:
        raise ValueError(f"{name} must have at least 2 frames (dim 1), got {video.shape[1]}")


def gaussian_blur(images: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    """Separable Gaussian blur (radius ⌈2.5σ⌉, reflect padding) of every H × W plane of
    ``images`` (..., H, W), as one depthwise convolution; σ <= 0 returns the images."""
    if sigma <= 0:
        return images
    radius = max(1, int(np.ceil(2.5 * sigma)))
    t = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    kernel = torch.exp(-(t**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    shape = images.shape
    x = images.reshape(1, -1, *shape[-2:])  # every image plane a channel
    planes = x.shape[1]
    x = F.pad(x, (radius,) * 4, mode="reflect")
    x = F.conv2d(x, kernel.view(1, 1, 1, -1).expand(planes, 1, 1, -1), groups=planes)
    x = F.conv2d(x, kernel.view(1, 1, -1, 1).expand(planes, 1, -1, 1), groups=planes)
    return x.reshape(shape)


def high_pass(images: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    """x − blur(x) per channel: the residual that keeps fine forensic traces and drops content."""
    return images - gaussian_blur(images, sigma)


class StochasticFrameBlend(nn.Module):
    """Blend frames of (T, C, H, W) or (B, T, C, H, W) clips into (C, H, W) / (B, C, H, W).

    ``sampling="random"`` picks n distinct frames anywhere; ``"strided"`` picks n frames
    ``stride`` apart inside the clip (a random stride and start). ``domain="residual"`` blends
    high-pass residuals (x − blur(x)) instead of pixels. Draws come from ``rng`` (a NumPy
    Generator, else one seeded with ``seed``), so a seeded run blends the same way every time.
    """

    def __init__(
        self, n_max: int = 4, alpha: float = 1.0, *, sampling: str = "random", domain: str = "residual",
        seed: int | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        check_count(n_max, "n_max", minimum=2)
        check_number(alpha, "alpha", alpha > 0, "a finite number > 0")
        check_choice(sampling, "sampling", SAMPLING)
        check_choice(domain, "domain", DOMAINS)
        self.n_max, self.alpha, self.sampling, self.domain = n_max, float(alpha), sampling, domain
        self.rng = np.random.default_rng(seed)

    def extra_repr(self) -> str:
        return f"n_max={self.n_max}, alpha={self.alpha}, sampling={self.sampling!r}, domain={self.domain!r}"

    def sample_weights(
        self, batch: int, frames: int, rng: np.random.Generator | None = None
    ) -> torch.Tensor:
        """(batch, frames) blend weights: n ~ U{2..min(n_max, frames)} non-zero entries per row,
        Dirichlet(α·1ₙ) distributed (so they sum to 1, each with mean 1/n)."""
        check_count(frames, "frames", minimum=2)
        rng = self.rng if rng is None else rng
        weights = np.zeros((batch, frames), dtype=np.float32)
        for row in range(batch):
            n = int(rng.integers(2, min(self.n_max, frames) + 1))
            if self.sampling == "random":
                chosen = rng.choice(frames, size=n, replace=False)
            else:
                stride = int(rng.integers(1, (frames - 1) // (n - 1) + 1))
                start = int(rng.integers(0, frames - stride * (n - 1)))
                chosen = start + stride * np.arange(n)
            weights[row, chosen] = rng.dirichlet(np.full(n, self.alpha))
        return torch.from_numpy(weights)

    @staticmethod
    def fixed_weights(frames: int, blends: int) -> torch.Tensor:
        """(R, frames) inference weights, R = ``blends``: blend r averages frames r, r + R,
        r + 2R, … uniformly. Each blend must mix >= 2 frames, so R <= frames // 2 (one frame:
        R = 1, the frame itself); more is refused, not capped (a 6-frame clip cannot give 4)."""
        check_count(blends, "blends")
        most = max(1, frames // 2)
        if blends > most:
            raise ValueError(
                f"blends must be at most {most} for {frames} frames (each blend mixes >= 2 "
                f"frames), got {blends}: use fewer blends or more frames"
            )
        count = blends
        weights = torch.zeros(count, frames)
        for r in range(count):
            weights[r, r::count] = 1.0
        return weights / weights.sum(1, keepdim=True)

    def forward(self, clips: torch.Tensor, rng: np.random.Generator | None = None) -> torch.Tensor:
        """One random blend per clip."""
        single = clips.ndim == 4
        video = clips[None] if single else clips
        check_video(video, "clips")
        out = self.combine(self.prepare(video), rng)
        return out[0] if single else out

    def prepare(self, video: torch.Tensor) -> torch.Tensor:
        """(B, T, C, H, W) frames in the blending domain: pixels, or high-pass residuals."""
        return high_pass(video) if self.domain == "residual" else video

    def combine(
        self, prepared: torch.Tensor, rng: np.random.Generator | None = None
    ) -> torch.Tensor:
        """One random blend per clip of frames already in the blending domain (:meth:`prepare`):
        residuals are linear, so blending them is the residual of the blend."""
        weights = self.sample_weights(prepared.shape[0], prepared.shape[1], rng)
        return torch.einsum("bt,btchw->bchw", weights.to(prepared), prepared)

    def uniform(self, clips: torch.Tensor) -> torch.Tensor:
        """The deterministic uniform blend (the frames' mean): it ignores frame order."""
        single = clips.ndim == 4
        video = clips[None] if single else clips
        check_video(video, "clips")
        out = self.prepare(video).mean(1)
        return out[0] if single else out

    def fixed(self, clips: torch.Tensor, blends: int) -> torch.Tensor:
        """(B, R, C, H, W): the R fixed inference blends of :meth:`fixed_weights`."""
        x = self.prepare(clips)
        weights = self.fixed_weights(clips.shape[1], blends)
        return torch.einsum("rt,btchw->brchw", weights.to(x), x)


def js_divergence(logits_a: torch.Tensor, logits_b: torch.Tensor) -> torch.Tensor:
    """Mean Jensen–Shannon divergence between the Bernoulli predictions σ(a) and σ(b):
    ½KL(p‖m) + ½KL(q‖m), m = (p + q)/2 (AugMix's consistency, two views). Symmetric, 0 iff equal."""
    p = torch.stack([torch.sigmoid(logits_a), torch.sigmoid(-logits_a)], -1)
    q = torch.stack([torch.sigmoid(logits_b), torch.sigmoid(-logits_b)], -1)
    m = ((p + q) / 2).clamp_min(1e-7).log()
    kl_p = F.kl_div(m, p, reduction="none").sum(-1)
    kl_q = F.kl_div(m, q, reduction="none").sum(-1)
    return (0.5 * (kl_p + kl_q)).mean()


class BlendInvarianceLoss(nn.Module):
    """L = mean over views of BCE(pᵛ, y) + λ·JS(p¹‖p²) + μ·‖ẑ¹ − ẑ²‖² (ẑ: L2-normalised
    embeddings). With λ = μ = 0 it is plain BCE on every view (SFB without BIR)."""

    def __init__(self, consistency: float = 1.0, embedding: float = 0.0) -> None:
        super().__init__()
        check_number(consistency, "consistency", consistency >= 0, "a finite number >= 0")
        check_number(embedding, "embedding", embedding >= 0, "a finite number >= 0")
        self.consistency, self.embedding = float(consistency), float(embedding)

    def forward(
        self, logits: torch.Tensor, labels: torch.Tensor, embeddings: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``logits`` (V, B) of V views of B clips, ``labels`` (B,) in {0, 1}, ``embeddings``
        (V, B, d) or None. The consistency terms need V >= 2 (pairs 1–2 are used)."""
        target = labels.to(logits.dtype).expand_as(logits)
        bce = F.binary_cross_entropy_with_logits(logits, target)
        total, logs = bce, {"bce": float(bce.detach())}
        if logits.shape[0] >= 2 and self.consistency > 0:
            js = js_divergence(logits[0], logits[1])
            total = total + self.consistency * js
            logs["js"] = float(js.detach())
        if logits.shape[0] >= 2 and self.embedding > 0 and embeddings is not None:
            z = F.normalize(embeddings, dim=-1)
            mse = (z[0] - z[1]).pow(2).sum(-1).mean()
            total = total + self.embedding * mse
            logs["embedding"] = float(mse.detach())
        return total, logs
