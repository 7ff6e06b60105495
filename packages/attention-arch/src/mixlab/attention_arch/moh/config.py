"""The MoH experiment's :class:`Config`, its systems, and the registry entry :data:`METHOD`.

Light on purpose (standard library and ``mixlab.shared`` only): ``mixlab list`` reads it without
importing torch; :mod:`.experiment` loads on ``mixlab run moh``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, ClassVar

from mixlab.shared.claims import ClaimSpec
from mixlab.shared.config import ExperimentConfig, is_count, require
from mixlab.shared.registry import Method

PLAIN, PLAIN_FLOPS, ZIGMA, STATIC, MOH, DIT = (
    "plain Mamba", "plain Mamba (equal FLOPs)", "ZigMa multi-scan", "static MoE", "MoH", "DiT",
)  # fmt: skip
MOH_LEVELS, MOH_TRANSFORMS, MOH_DEPTH = (
    "MoH levels only",
    "MoH transformations only",
    "MoH depth only",
)
EXPERTS = ("raster", "zigzag", "conv", "mlp")
LEVELS = (1, 2, 4)


def system_architecture(system: str, expand: float, top_k: int | None = 1) -> dict[str, Any]:
    """The :class:`~.model.MoHDiffusion` arguments that make ``system`` (besides the shared
    width, depth, patch and state size; baselines' widths are then matched in parameters, plain
    Mamba (equal FLOPs)'s in FLOPs). ``top_k``: the routed systems' hard routes (None: soft)."""
    routed_experts = {"experts": EXPERTS, "expert_expand": expand / 2, "top_k": top_k}
    return {
        PLAIN: {},
        PLAIN_FLOPS: {},
        ZIGMA: {"layer_orders": ("raster", "zigzag", "raster_t", "zigzag_t")},
        STATIC: {"levels": LEVELS, **routed_experts, "depth_gate": True, "routing": "static"},
        MOH: {"levels": LEVELS, **routed_experts, "depth_gate": True},
        MOH_LEVELS: {"levels": LEVELS, "top_k": top_k},
        MOH_TRANSFORMS: routed_experts,
        MOH_DEPTH: {"depth_gate": True},
        DIT: {"mixer": "attention"},
    }[system]


SYSTEMS = (PLAIN, PLAIN_FLOPS, ZIGMA, STATIC, MOH, MOH_LEVELS, MOH_TRANSFORMS, MOH_DEPTH, DIT)
QUICK_SYSTEMS = (PLAIN, PLAIN_FLOPS, STATIC, MOH, DIT)
MATCHED_IN_FLOPS = (PLAIN_FLOPS,)
"""systems sized to MoH's FLOPs instead of its parameters"""
DATASETS = ("digits", "faces", "shapes")
STATIC_CONTROL = (
    "the static MoE (issue 67's control): MoH's levels, experts, depth gate and top-k at matched "
    "parameters, routed by learned weights that do not depend on t (top-1: one fixed route per "
    "block), so it lacks only the routing on the timestep"
)
CLAIMS = (
    ClaimSpec(
        key="fid_below_plain",
        text="{data}: MoH's FID_local is at least {fid_gain:.0%} below plain Mamba's (matched "
        "parameters and steps)",
        system=MOH,
        control=STATIC,
        why_control=STATIC_CONTROL,
        threshold="fid_gain",
        ceiling=1.0,
    ),
    ClaimSpec(
        key="fid_below_static",
        text="{data}: MoH's FID_local is below the static MoE's (routing on t is what helps)",
        system=MOH,
        control=PLAIN_FLOPS,
        why_control="plain bidirectional Mamba whose forward costs the FLOPs of MoH's costliest "
        "route (no hierarchy, experts or routing, same steps): if it beats the static MoE too, "
        "beating the static MoE says nothing about routing on t",
        threshold=0.0,
    ),
    ClaimSpec(
        key="converges_faster",
        text="{data}: MoH reaches plain Mamba's final FID_local within {convergence_share:.0%} of "
        "the steps ({curve_points} checkpoints)",
        system=MOH,
        control=STATIC,
        why_control=STATIC_CONTROL,
        premises=("plain_above_floor",),
        threshold="convergence_share",
        floor=0.0,
        ceiling=1.0,
    ),
    ClaimSpec(
        key="routes_move_with_t",
        text="{data}: MoH's routes move with t (total variation between the lowest and highest t "
        "deciles >= {min_route_tv:g})",
        system=MOH,
        control=STATIC,
        why_control=STATIC_CONTROL + " (its routes are constant in t by construction: it fails)",
        threshold="min_route_tv",
        floor=0.0,
        ceiling=1.0,
    ),
    ClaimSpec(
        key="skips_blocks",
        text="{data}: with the depth gate MoH runs at most {max_block_share:.0%} of the block "
        "evaluations of a sampling trajectory",
        system=MOH,
        control=STATIC,
        why_control=STATIC_CONTROL + " (it has the same depth gate, static in t)",
        threshold="max_block_share",
        floor=0.0,
        ceiling=1.0,
    ),
)
"""the claims (issue 22), each judged per dataset; their systems are among :data:`SYSTEMS`"""


@dataclass
class Config(ExperimentConfig):
    """Defaults are the quick profile: sklearn digits 8x8, patch 2 (4x4 tokens), width 64, 4
    blocks; plain Mamba (matched parameters and equal FLOPs), the static MoE, MoH (top-1 routes:
    one expert call per block, as plain Mamba) and DiT trained with the same batches, 750 steps
    and seeds, 3 seeds, scored on DDIM samples against one half of the real digits in the feature
    space of a CNN trained here on them (cached, seconds), the other half giving the real-vs-real
    floor; about 8 minutes on 2 cores, two workers, from an empty cache. Full (one large GPU):
    digits 16x16, lfw faces 24x24 and captioned shape scenes 32x32, width 256, 12 blocks, every
    system and ablation."""

    datasets: tuple[tuple[str, int], ...] = (("digits", 8),)
    """``(source, image size)`` pairs: sources from :data:`DATASETS`"""
    systems: tuple[str, ...] = QUICK_SYSTEMS
    """systems trained from scratch: plain Mamba (matched parameters, and equal FLOPs: as MoH's
    costliest route), ZigMa multi-scan, static MoE, MoH, its three single-part ablations
    (levels, transformations, depth only) and DiT"""
    n_seeds: int = 3
    """seeds per system and dataset: seed, seed + 1, ... (every claim is judged on each)"""
    patch_size: int = 2
    """side in pixels of each square patch (one token each)"""
    width: int = 64
    """MoH's width; the baselines' widths are chosen to match its parameters"""
    depth: int = 4
    """blocks of every network (DiT's transformer blocks alike)"""
    d_state: int = 4
    """Mamba's SSM state size N per channel (Mamba's default: 16)"""
    expand: float = 1.0
    """Mamba's d_inner = expand x width (MoH's two scan experts take half each)"""
    top_k: int | None = 1
    """the routed systems' hard routes: the top-k levels and experts of each block run, on the
    samples routed to them (1: one expert call per block and sample, plain Mamba's count); None
    routes softly (every level runs every expert: 12 calls per block)"""
    steps: int = 750
    """training steps of every system (the quick run at f1a9d55 took 1,500: 26 minutes)"""
    batch_size: int = 64
    """images per training step"""
    lr: float = 2e-3
    """AdamW peak learning rate (linear warm-up over 5 % of the steps, then cosine to 0)"""
    prediction: str = "sample"
    """what the networks predict: "epsilon", "v_prediction" or "sample" (x0)"""
    workers: int = 2
    """processes that train cells side by side (one torch thread each)"""
    depth_weight: float = 0.05
    """λ_d, the compute penalty of the depth gate"""
    n_samples: int = 1000
    """DDIM samples scored at the end of training, against one half of the real images; at most
    the other half's size (899 digits), which scored the same way is the real-vs-real floor
    (FID_local's bias shrinks with n, so both are scored at the same n)"""
    sample_steps: int = 25
    """DDIM steps of the final samples"""
    curve_points: int = 5
    """checkpoints (evenly spaced) scored during training: the FID_local-over-steps curves"""
    curve_samples: int = 250
    """DDIM samples scored at each curve checkpoint"""
    curve_sample_steps: int = 20
    """DDIM steps of the curve checkpoints' samples"""
    feature_steps: int = 600
    """training steps of the CNN whose feature space the metrics use (cached per dataset)"""
    class_conditional: bool = True
    """train class-conditional models on labelled images (label dropout 0.1) and sample with
    the labels of random real images; routes read t only either way"""
    guidance_scale: float = 1.0
    """classifier-free guidance when a dataset is conditional (captioned shapes)"""
    param_tolerance: float = 0.10
    """regime: every system matched in parameters within this share of MoH's (plain Mamba at
    equal FLOPs: its forward FLOPs within this share of MoH's costliest route's)"""
    max_gaussian_share: float = 0.5
    """regime: plain Mamba's FID_local at most this share of the Gaussian fit's ..."""
    min_recognisable: float = 0.6
    """... and at least this share of its samples labelled with confidence >= 0.9"""
    headroom: float = 0.2
    """regime: plain Mamba's FID_local lies clearly above the real-vs-real floor, a generator
    at the floor gaining at least this share on it (1 - floor / plain; the default is twice
    fid_gain's)"""
    fid_gain: float = 0.10
    """claim 1: MoH's FID_local at least this share below plain Mamba's"""
    convergence_share: float = 0.7
    """claim 3: MoH reaches plain Mamba's final FID_local within this share of the steps"""
    min_route_tv: float = 0.2
    """claim 4: total variation between the mean routes of the lowest and highest t deciles"""
    max_block_share: float = 0.8
    """claim 5: share of block evaluations per sampling trajectory with the depth gate"""

    SYSTEMS: ClassVar[tuple[str, ...]] = SYSTEMS
    TIMINGS: ClassVar[tuple[str, ...]] = (
        "sample_s", "sample_s_std", "train_s", "train_s_std", "train_step_s", "train_step_s_std",
    )  # fmt: skip
    CLAIMS: ClassVar[tuple[ClaimSpec, ...]] = CLAIMS
    ALLOWED_EDGE_VALUES: ClassVar[dict[str, tuple[Any, ...]]] = {
        "depth_weight": (0, 0.0),
        "fid_gain": (0, 0.0),
        "param_tolerance": (0, 0.0),
    }
    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {},
        "full": {
            "datasets": (("digits", 16), ("faces", 24), ("shapes", 32)),
            "systems": SYSTEMS,
            "n_seeds": 3,
            "width": 256,
            "depth": 12,
            "d_state": 16,
            "expand": 2.0,
            "steps": 20_000,
            "batch_size": 128,
            "lr": 2e-4,
            "n_samples": 5000,
            "curve_samples": 1000,
            "guidance_scale": 2.0,
        },
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            isinstance(self.datasets, tuple | list) and len(self.datasets) > 0
            and all(isinstance(d, tuple | list) and len(d) == 2 and d[0] in DATASETS
                    and is_count(d[1], 8) for d in self.datasets),
            "datasets", f"(source, size >= 8) pairs with sources from {DATASETS}", self.datasets,
        )  # fmt: skip
        require(
            isinstance(self.systems, tuple | list)
            and {MOH, PLAIN, PLAIN_FLOPS, STATIC} <= set(self.systems)
            and all(s in SYSTEMS for s in self.systems) and len(set(self.systems)) == len(self.systems),
            "systems", f"distinct names from {SYSTEMS}, MoH, both plain Mambas and the static MoE "
            "among them (the claims and their controls compare them)", self.systems,
        )  # fmt: skip
        require(self.top_k is None or (is_count(self.top_k) and self.top_k <= 2), "top_k",
                "None (soft routes), 1 or 2", self.top_k)  # fmt: skip
        require(self.prediction in ("epsilon", "v_prediction", "sample"), "prediction",
                "'epsilon', 'v_prediction' or 'sample'", self.prediction)  # fmt: skip
        for name in ("workers", "n_seeds", "patch_size", "width", "depth", "d_state", "steps", "batch_size",
                     "n_samples", "sample_steps", "curve_points", "curve_samples",
                     "curve_sample_steps", "feature_steps"):  # fmt: skip
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(self.curve_points <= self.steps, "curve_points", f"at most steps={self.steps}",
                self.curve_points)  # fmt: skip
        require(self.width % 4 == 0, "width", "a multiple of 4", self.width)
        for _source, size in self.datasets:
            require(size % self.patch_size == 0, "patch_size",
                    f"a divisor of every image size (here {size})", self.patch_size)  # fmt: skip
            grid = size // self.patch_size
            require(grid % max(LEVELS) == 0, "datasets",
                    f"image sizes whose token grid is a multiple of {max(LEVELS)} (MoH's levels)",
                    self.datasets)  # fmt: skip
        for name in ("expand", "lr", "guidance_scale"):
            value = getattr(self, name)
            require(isinstance(value, numbers.Real) and value > 0, name, "a number > 0", value)
        for name in ("param_tolerance", "max_gaussian_share", "min_recognisable", "headroom", "fid_gain",
                     "convergence_share", "min_route_tv", "max_block_share", "depth_weight"):  # fmt: skip
            value = getattr(self, name)
            require(isinstance(value, numbers.Real) and 0 <= value <= 1, name,
                    "a number in [0, 1]", value)  # fmt: skip

    def curve_steps(self) -> tuple[int, ...]:
        return tuple(
            round(self.steps * (i + 1) / self.curve_points) for i in range(self.curve_points)
        )


METHOD = Method(
    name="moh",
    domain="attention-arch",
    paper=(
        "MoH: Mixture-of-Hierarchical Experts for Mamba diffusion (paper not found; the "
        "algorithm is reconstructed from DiM, ZigMa and DiT)"
    ),
    claim=(
        "Routing a Mamba diffusion backbone on the timestep over representation levels, "
        "feature transformations and depth lowers FID against a plain Mamba backbone and a "
        "static mixture at matched parameters, converges in fewer steps and skips blocks."
    ),
    config=Config,
    run="mixlab.attention_arch.moh.experiment:run",
    headline_plot="fid_over_steps.png",
)
