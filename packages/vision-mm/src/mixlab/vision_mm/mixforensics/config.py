"""The MixForensics experiment's Config and registry entry, importable without torch (``mixlab
list`` reads :data:`METHOD`; :mod:`mixlab.vision_mm.mixforensics.experiment` loads only when the
method runs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mixlab.shared.claims import ClaimSpec
from mixlab.shared.config import ExperimentConfig, is_count, require
from mixlab.shared.registry import Method

EXPERIMENT_SYSTEMS = ("voting", "voting-residual", "univfd-style", "frame-difference", "decof-style", "timesformer",
                      "mean-frame", "sfb", "sfb-bir")  # fmt: skip
"""every system the experiment knows (see :mod:`~.experiment`)"""
QUICK_SYSTEMS = tuple(s for s in EXPERIMENT_SYSTEMS if s not in ("voting-residual", "timesformer"))
"""the quick profile's: TimeSformer (at chance at this budget, 110 s a cell) and voting on
residuals (an ablation the mean frame now answers), both in no claim, run in the full profile
(with them the cold quick run was on course for 15 minutes on 2 cores)"""
BACKBONES = ("small-cnn", "torchvision/resnet18", "torchvision/resnet50")
LEVEL_WITH_VOTING = -0.01
"""claim 1: SFB+BIR's seen AUC may trail per-frame voting's by at most this"""
BEATS_SFB = 0.02
"""claim 2: SFB+BIR's AUC lead over SFB alone on unseen families and under JPEG"""
BEATS_VOTING_PARTIAL = 0.03
"""claim 3: SFB+BIR's AUC lead over per-frame voting on splicing and continuation"""
GAIN_RATIO = 2.0
"""claim 4: SFB+BIR's seen-AUC gain from 1 frame to all, as a multiple of voting's"""
BIR_SHARE = 0.05
"""premise of claim 2: BIR's term λ·JS is at least this share of SFB+BIR's training loss (mean
over its training steps), else BIR is inert and the claim says nothing about it"""
MEAN_FRAME = (
    "the deterministic mean frame (of the high-pass residuals when SFB blends residuals), one "
    "encoder pass: SFB's input without random blends or BIR (issue 73's control for every claim)"
)

CLAIMS = (
    ClaimSpec(
        key="level_with_voting",
        text="(1) Seen families: SFB+BIR within 0.01 AUC of per-frame voting, or above, with at "
        "most half its encoder passes",
        system="sfb-bir",
        control="mean-frame",
        why_control=MEAN_FRAME,
    ),
    ClaimSpec(
        key="bir_beats_sfb",
        text=f"(2) SFB+BIR beats SFB alone by >= {BEATS_SFB:g} AUC on unseen families and under "
        "JPEG re-compression",
        system="sfb-bir",
        control="mean-frame",
        why_control=MEAN_FRAME,
        premises=("bir_acts",),
    ),
    ClaimSpec(
        key="beats_voting_on_partial",
        text=f"(3) SFB+BIR beats per-frame voting by >= {BEATS_VOTING_PARTIAL:g} AUC on temporal "
        "splicing and on conditional continuation",
        system="sfb-bir",
        control="mean-frame",
        why_control=MEAN_FRAME,
    ),
    ClaimSpec(
        key="gains_more_from_frames",
        text=f"(4) From 1 to {{frames}} frames, SFB+BIR's seen AUC gain is >= {GAIN_RATIO:g}x "
        "voting's",
        system="sfb-bir",
        control="mean-frame",
        why_control=f"{MEAN_FRAME}; scored at each frame budget like the frame systems",
    ),
)


@dataclass
class Config(ExperimentConfig):
    """Defaults are the quick profile (8 frames at 32², 3 seeds, about 11 minutes on 2 CPU cores
    from an empty cache); full is the issue's GPU run (16 frames at 64², ResNet-18, 5 seeds,
    every system)."""

    n_seeds: int = 3
    """seeds per system: seed, seed + 1, ... (claims are paired t-tests over them)"""
    systems: tuple[str, ...] = QUICK_SYSTEMS
    """detectors trained and scored: per-frame voting (pixels, residuals), UnivFD-style, frame
    difference, DeCoF-style, TimeSformer, the mean frame (every claim's control), SFB and
    SFB+BIR"""
    frames: int = 8
    """frames per clip (the frame budgets go 1, 2, 4, ... up to it)"""
    size: int = 32
    """frame side in pixels (square frames)"""
    backbone: str = "small-cnn"
    """the image backbone every system but TimeSformer shares (built from config, random weights)"""
    train_clips: int = 2400
    """half real, half fakes of the seen families A–C"""
    test_real: int = 300
    """real test clips (the negatives every test family is scored against)"""
    test_per_kind: int = 150
    """clips per fake family, per partial-forgery kind and per control"""
    steps: int = 300
    """training steps of every detector (AdamW, cosine decay)"""
    batch_size: int = 32
    """clips per step; frame systems see two views of each (two frames, differences or blends)"""
    lr: float = 3e-3
    """AdamW learning rate of every detector and of the frozen encoder's pre-training"""
    encoder_steps: int = 400
    """the UnivFD-style and DeCoF-style frozen encoder: pre-trained here to name the source picture of real
    frames (a generic image encoder, blind to the traces)"""
    n_max: int = 4
    """SFB: most frames in one training blend (n ~ U{2..n_max}, capped at frames)"""
    alpha: float = 1.0
    """SFB: Dirichlet concentration α of the training blend weights (1: uniform on the simplex)"""
    blends: int = 4
    """R, the fixed blends averaged at inference"""
    domain: str = "residual"
    """SFB blends high-pass residuals (x − blur(x)) or pixels"""
    consistency: float = 4.0
    """λ of BIR's Jensen–Shannon term"""
    embedding: float = 0.0
    """μ of BIR's embedding MSE"""
    jpeg_quality: int = 75
    """PIL JPEG quality of the re-compressed test copies (real and seen families A–C)"""
    generator_family: bool = False
    """test on family F too: frames regenerated by the cached Mix-Opt UNet (SDEdit), against
    real shape clips of the same moves (the full profile: the UNet takes about 50 minutes to
    pre-train on 2 CPU cores)"""
    sdedit_strength: float = 0.3
    """family F: SDEdit noise level t₀ / T (the frame is noised to t₀, then denoised with DDIM)"""
    timesformer_width: int = 80
    """TimeSformer's hidden size (4 heads; MLP 4× as wide)"""
    timesformer_patch: int = 8
    """TimeSformer's patch side: 8 gives a 4 × 4 grid per 32² frame (4 px patches cost 5× the time)"""
    flicker: float = 0.06
    """trace A: standard deviation of the band-pass texture (pixel values in [0, 1]), times a
    per-frame |N(0, 1)| flicker"""
    checker: float = 0.065
    """trace B: amplitude of the period-2 up-sampling grid (pixel values in [0, 1], scaled by
    0.5 + the pixel's value)"""
    checker_drift: float = 0.35
    """trace B: phase drift of the grid per frame (radians)"""
    smooth: float = 0.0
    """trace C: Gaussian blur (pixels) of the noise field every frame reuses (0: distributed as
    sensor noise, so a single frame of C looks real)"""
    drift: float = 0.04
    """trace D (unseen): standard deviation of the per-frame step of the exposure (a relative
    gain) and colour (pixel values in [0, 1]) random walks"""
    warp: float = 0.8
    """trace E (unseen): displacement (pixels) of the non-rigid background warp"""
    sensor_low: float = 0.015
    """every clip: lowest per-clip sensor noise standard deviation (pixel values in [0, 1])"""
    sensor_high: float = 0.025
    """every clip: highest per-clip sensor noise standard deviation (pixel values in [0, 1])"""
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

    SYSTEMS: ClassVar[tuple[str, ...]] = EXPERIMENT_SYSTEMS
    CLAIMS: ClassVar[tuple[ClaimSpec, ...]] = CLAIMS

    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {},
        "full": {
            "systems": EXPERIMENT_SYSTEMS,
            "n_seeds": 5,
            "frames": 16,
            "size": 64,
            "backbone": "torchvision/resnet18",
            "train_clips": 10_000,
            "test_real": 1000,
            "test_per_kind": 500,
            "steps": 3000,
            "batch_size": 64,
            "lr": 1e-3,
            "encoder_steps": 2000,
            "timesformer_width": 256,
            "generator_family": True,
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
        require(self.blends <= self.frames // 2, "blends",
                f"an integer from 1 to frames // 2 = {self.frames // 2} (each blend mixes >= 2 frames)",
                self.blends)  # fmt: skip
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
        require("mean-frame" in self.systems, "systems",
                "names including 'mean-frame' (the control of every claim: without it no claim "
                "could be judged)", self.systems)  # fmt: skip
        for name in ("lr", "alpha"):
            require(getattr(self, name) > 0, name, "a finite number > 0", getattr(self, name))
        for name in ("consistency", "embedding", "smooth"):
            require(getattr(self, name) >= 0, name, "a finite number >= 0", getattr(self, name))
        for name in ("flicker", "checker", "checker_drift", "drift", "warp", "sensor_low"):
            require(getattr(self, name) > 0, name, "a finite number > 0", getattr(self, name))
        require(self.sensor_high >= self.sensor_low, "sensor_high", f"a number >= sensor_low = {self.sensor_low}",
                self.sensor_high)  # fmt: skip
        require(
            isinstance(self.generator_family, bool),
            "generator_family",
            "a bool",
            self.generator_family,
        )
        require(
            0 < self.sdedit_strength <= 1,
            "sdedit_strength",
            "a number in (0, 1]",
            self.sdedit_strength,
        )
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

__all__ = [
    "BACKBONES",
    "BEATS_SFB",
    "BEATS_VOTING_PARTIAL",
    "BIR_SHARE",
    "CLAIMS",
    "EXPERIMENT_SYSTEMS",
    "GAIN_RATIO",
    "LEVEL_WITH_VOTING",
    "METHOD",
    "QUICK_SYSTEMS",
    "Config",
]
