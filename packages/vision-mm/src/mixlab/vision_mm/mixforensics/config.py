"""The MixForensics experiment's Config and registry entry, importable without torch (``mixlab
list`` reads :data:`METHOD`; :mod:`mixlab.vision_mm.mixforensics.experiment` loads only when the
method runs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mixlab.shared.config import ExperimentConfig, is_count, require
from mixlab.shared.registry import Method

EXPERIMENT_SYSTEMS = ("voting", "voting-residual", "univfd", "frame-difference", "decof", "timesformer", "mean-frame", "sfb",
                      "sfb-bir")  # fmt: skip
"""every system the experiment knows (see :mod:`~.experiment`)"""
BACKBONES = ("small-cnn", "resnet18", "resnet50")


@dataclass
class Config(ExperimentConfig):
    """Defaults are the quick profile (8 frames at 32², 3 seeds, minutes on 2 CPU cores); full
    is the issue's GPU run (16 frames at 64², ResNet-18, 5 seeds)."""

    n_seeds: int = 3
    systems: tuple[str, ...] = EXPERIMENT_SYSTEMS
    frames: int = 8
    size: int = 32
    backbone: str = "small-cnn"
    """the image backbone every system but TimeSformer shares (built from config, random weights)"""
    train_clips: int = 2400
    """half real, half fakes of the seen families A–C"""
    test_real: int = 300
    test_per_kind: int = 150
    """clips per fake family, per partial-forgery kind and per control"""
    steps: int = 300
    batch_size: int = 32
    """clips per step; frame systems see two views of each (two frames, differences or blends)"""
    lr: float = 3e-3
    encoder_steps: int = 400
    """UnivFD's and DeCoF's frozen encoder: pre-trained here to name the source picture of real
    frames (a generic image encoder, blind to the traces)"""
    n_max: int = 4
    alpha: float = 1.0
    blends: int = 4
    """R, the fixed blends averaged at inference"""
    domain: str = "residual"
    """SFB blends high-pass residuals (x − blur(x)) or pixels"""
    consistency: float = 4.0
    """λ of BIR's Jensen–Shannon term"""
    embedding: float = 0.0
    """μ of BIR's embedding MSE"""
    jpeg_quality: int = 75
    timesformer_width: int = 80
    timesformer_patch: int = 8
    """TimeSformer's patch side: 8 gives a 4 × 4 grid per 32² frame (4 px patches cost 5× the time)"""
    flicker: float = 0.05
    checker: float = 0.055
    checker_drift: float = 0.35
    smooth: float = 0.0
    drift: float = 0.04
    warp: float = 0.8
    sensor_low: float = 0.015
    sensor_high: float = 0.025
    leak_max: float = 0.6
    """regime: a logistic regression on global statistics stays at AUC <= this (no shortcut)"""
    learnable: float = 0.70
    """regime: per-frame voting's seen-family AUC from 1 frame >= this"""
    saturated: float = 0.95
    """regime: per-frame voting's seen-family AUC from all frames <= this"""
    workers: int = 2
    """processes that train systems side by side (one torch thread each)"""

    ALLOWED_EDGE_VALUES: ClassVar[dict[str, tuple[Any, ...]]] = {
        "seed": (0,),
        "embedding": (0, 0.0),
        "consistency": (0, 0.0),
        "smooth": (0, 0.0),
    }
    """no embedding term, no JS term (BIR off), unsmoothed reused noise"""

    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {},
        "full": {
            "n_seeds": 5,
            "frames": 16,
            "size": 64,
            "backbone": "resnet18",
            "train_clips": 10_000,
            "test_real": 1000,
            "test_per_kind": 500,
            "steps": 3000,
            "batch_size": 64,
            "lr": 1e-3,
            "encoder_steps": 2000,
            "timesformer_width": 256,
        },
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        counts = ("n_seeds", "frames", "size", "train_clips", "test_real", "test_per_kind", "steps",
                  "batch_size", "encoder_steps", "blends", "timesformer_width", "timesformer_patch",
                  "workers")  # fmt: skip
        for name in counts:
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(self.frames >= 2, "frames", "an integer >= 2", self.frames)
        require(self.size >= 16 and self.size % 4 == 0, "size", "a multiple of 4 >= 16", self.size)
        require(self.train_clips >= 6, "train_clips", "an integer >= 6", self.train_clips)
        require(is_count(self.n_max) and self.n_max >= 2, "n_max", "an integer >= 2", self.n_max)
        require(self.size % self.timesformer_patch == 0, "timesformer_patch", f"a divisor of size = {self.size}",
                self.timesformer_patch)  # fmt: skip
        require(self.timesformer_width % 4 == 0, "timesformer_width", "a multiple of 4 (4 heads)",
                self.timesformer_width)  # fmt: skip
        require(is_count(self.jpeg_quality) and self.jpeg_quality <= 95, "jpeg_quality",
                "an integer in [1, 95]", self.jpeg_quality)  # fmt: skip
        require(self.backbone in BACKBONES, "backbone", f"one of {list(BACKBONES)}", self.backbone)
        require(
            self.domain in ("pixel", "residual"), "domain", "'pixel' or 'residual'", self.domain
        )
        ok = isinstance(self.systems, tuple | list) and len(self.systems) > 0
        ok = ok and len(set(self.systems)) == len(self.systems)
        require(ok and all(s in EXPERIMENT_SYSTEMS for s in self.systems), "systems",
                f"distinct names from {list(EXPERIMENT_SYSTEMS)}", self.systems)  # fmt: skip
        needed = ("voting", "sfb", "sfb-bir")
        require(all(s in self.systems for s in needed), "systems", f"names including {list(needed)}",
                self.systems)  # fmt: skip
        for name in ("lr", "alpha"):
            require(getattr(self, name) > 0, name, "a finite number > 0", getattr(self, name))
        for name in ("consistency", "embedding", "smooth"):
            require(getattr(self, name) >= 0, name, "a finite number >= 0", getattr(self, name))
        for name in ("flicker", "checker", "checker_drift", "drift", "warp", "sensor_low"):
            require(getattr(self, name) > 0, name, "a finite number > 0", getattr(self, name))
        require(self.sensor_high >= self.sensor_low, "sensor_high", f"a number >= sensor_low = {self.sensor_low}",
                self.sensor_high)  # fmt: skip
        for name in ("leak_max", "learnable", "saturated"):
            require(0 < getattr(self, name) <= 1, name, "a number in (0, 1]", getattr(self, name))


METHOD = Method(
    name="mixforensics",
    domain="vision-mm",
    paper="MixForensics: blend-then-encode detection of AI-generated video with Stochastic Frame Blending and Blend Invariance Regularization (reconstructed from the abstract; paper not found)",
    claim="Blending frames before one image encoder (SFB) with a blend-consistency regulariser (BIR) detects AI-generated video as well as per-frame voting with half its encoder passes, generalises better to unseen generators and partial forgeries, and gains more from more frames",
    config=Config,
    run="mixlab.vision_mm.mixforensics.experiment:run",
    headline_plot="auc.png",
)

__all__ = ["BACKBONES", "EXPERIMENT_SYSTEMS", "METHOD", "Config"]
