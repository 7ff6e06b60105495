"""The Mix-Opt experiment's Config and its registry entry, importable without torch or diffusers.

``mixlab list`` and ``mixlab run mix_opt --help`` read :data:`METHOD` from here; the experiment
(:mod:`mixlab.vision_mm.mix_opt.experiment`: torch, diffusers, peft) loads only when the method
runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mixlab.shared.claims import ClaimSpec
from mixlab.shared.config import ExperimentConfig, is_count, is_number, require
from mixlab.shared.registry import Method

SYSTEMS = ("bp_high", "bp_low", "zo_high", "random", "mix_opt", "bp_low_matched")
CLOSE_TO_ZO = 2.0
"""claim 1, "close to ZO-high": peak memory at most twice ZO-high's"""
WELL_BELOW_BP = 0.5
"""claim 1, "well below BP-high": peak memory at most half BP-high's"""
FIDELITY_SHARE = 0.75
"""claim 2, "close to BP-high": at least 3/4 of BP-high's fidelity gain over the base model"""
PREMISES = ("bp_low_adapts", "zo_high_progresses")
"""issue 63's premises of the quality claims: each mode Mix-Opt mixes works alone"""
ADAPT_MARGIN = 0.02
"""premise: BP-low alone must raise DINO_local over the un-personalized model by more than this on
every seed (and regime: BP-high must; fixed before measuring)"""
PROGRESS_SHARE = 0.1
"""premise: ZO-high alone must lower the full-resolution loss on the subject's photos (fixed noise
and timesteps) by at least this share of what BP-high lowers it, on every seed (fixed before
measuring)"""

CLAIMS = (
    ClaimSpec(
        key="memory_near_zo",
        text=f"Mix-Opt's peak training memory is close to ZO-high's (at most {CLOSE_TO_ZO:g}×) and "
        f"well below BP-high's (at most {WELL_BELOW_BP:g}×)",
        system="mix_opt",
        control="bp_low",
        why_control="backprop at low resolution alone: the memory-saving mode Mix-Opt mixes in, "
        "with no zeroth-order steps and no schedule",
        not_per_seed="peak memory is measured once by the memory probe on fixed shapes: no "
        "training seed enters it",
    ),
    ClaimSpec(
        key="fidelity_near_bp_high",
        text=f"On every seed, Mix-Opt's subject fidelity is close to BP-high's (at least "
        f"{FIDELITY_SHARE:.0%} of its gain over the un-personalized model) and above ZO-high's",
        system="mix_opt",
        control="bp_low",
        why_control="backprop at low resolution alone, with Mix-Opt's memory budget: if it keeps "
        "as much of BP-high's gain, the zeroth-order steps and the schedule add nothing",
        premises=PREMISES,
    ),
    ClaimSpec(
        key="less_distortion_than_bp_low",
        text="On every seed, Mix-Opt's structural distortion at full resolution is below BP-low's",
        system="mix_opt",
        control="bp_low_matched",
        why_control="BP-low alone for as many steps as Mix-Opt takes BP-low steps on the same "
        "seed: fewer low-resolution steps, no zeroth-order steps and no schedule. If it too "
        "distorts less than BP-low, Mix-Opt's lower distortion is only its shorter BP-low run",
        premises=PREMISES,
    ),
    ClaimSpec(
        key="schedule_beats_random",
        text="On every seed, the timestep-aware schedule beats timestep-agnostic random mixing at "
        "the same BP/ZO ratio, in subject fidelity and in structural distortion",
        system="mix_opt",
        control="random",
        why_control="random mixing at the same BP/ZO ratio (issue 63's control): the claim's own "
        "reference, the only system that differs from Mix-Opt by the schedule alone (its control "
        "outcome trivially fails)",
        premises=PREMISES,
    ),
)
BACKGROUND_NAMES = ("on_white", "on_black", "on_gray", "on_brown")
"""the caption backgrounds of :data:`mixlab.vision_mm.mix_opt.data.BACKGROUNDS` (a test keeps
them equal)"""
CAPTION_WORDS = (
    *("red", "green", "blue", "yellow", "magenta", "cyan"),
    *("circle", "square", "triangle", "star"),
    *BACKGROUND_NAMES,
)
"""the words a caption may use (:data:`~mixlab.vision_mm.mix_opt.data.VOCABULARY` without the
subject and null tokens), for checking CLI options without importing the data module"""
BASE_CHANNELS = (32, 64, 64)
"""block widths of the pre-trained shapes UNet (:class:`~mixlab.vision_mm.mix_opt.model.ModelSpec`)"""
BASE_TEXT_DIM = 64
CHANNEL_GROUPS = 8
"""the UNet's GroupNorm groups and attention heads: every block width is a multiple of it"""
MIN_RESOLUTION = 8
"""the evaluation networks pool three times by 2"""


def downsampling_factor(channels: tuple[int, ...]) -> int:
    """2^(levels − 1): what the shapes UNet (:func:`~mixlab.vision_mm.mix_opt.model.build_unet`)
    of ``channels`` shrinks its input by; resolutions must be multiples of it."""
    return 2 ** (len(channels) - 1)


def check_base_unet(channels: object, text_dim: object, *, prefix: str = "") -> None:
    """Raise a ValueError naming the field unless ``channels`` (>= 2 levels, each a positive
    multiple of 8) and ``text_dim`` (>= 1) describe a UNet :func:`build_unet` can make."""
    require(
        isinstance(channels, tuple | list)
        and len(channels) >= 2
        and all(is_count(c) and c % CHANNEL_GROUPS == 0 for c in channels),
        f"{prefix}base_channels",
        f"at least two block widths, each a positive multiple of {CHANNEL_GROUPS}",
        channels,
    )
    require(is_count(text_dim), f"{prefix}base_text_dim", "an integer >= 1", text_dim)


def check_resolutions(resolution: object, low_resolution: object, factor: int, *, prefix: str = ""):
    """Raise a ValueError naming the option unless both resolutions are multiples of ``factor``,
    at least :data:`MIN_RESOLUTION` (full) and low <= full."""
    for name, value in (("resolution", resolution), ("low_resolution", low_resolution)):
        require(is_count(value), prefix + name, "an integer >= 1", value)
        require(
            value % factor == 0,
            prefix + name,
            f"a multiple of the UNet's downsampling factor {factor}",
            value,
        )
    require(
        resolution >= MIN_RESOLUTION,
        prefix + "resolution",
        f"an integer >= {MIN_RESOLUTION}",
        resolution,
    )
    require(
        low_resolution <= resolution,
        prefix + "low_resolution",
        f"<= resolution {resolution}",
        low_resolution,
    )


@dataclass
class Config(ExperimentConfig):
    """Defaults are the quick profile (a few minutes on 2 CPU cores once the shapes UNet is
    cached); full runs 3 seeds, more steps and more samples."""

    pretrain_steps: int = 1500
    """steps of the cached shapes UNet (batch 16)"""
    pretrain_images: int = 20000
    """captioned shapes the shapes UNet is pre-trained on"""
    pretrain_low_share: float = 0.5
    """share of the shapes UNet's pre-training steps taken at ``low_resolution`` (area-downsampled
    images), as Stable Diffusion saw 256² before 512²; in [0, 1). A model pre-trained at 32² only
    learned nothing from BP-low at 16² or 24² that carried to 32² (issue 63)"""
    base_channels: tuple[int, ...] = BASE_CHANNELS
    """block widths of the shapes UNet (each a multiple of 8; tests use a tiny one)"""
    base_text_dim: int = BASE_TEXT_DIM
    """width of the caption encoder's states (the UNet's cross-attention dimension)"""
    eval_net_steps: int = 1500
    """training steps of the cached evaluation networks"""
    eval_net_images: int = 8000
    """captioned shapes the evaluation networks are trained on"""
    subject_images: int = 4
    """photos of the subject to personalize on"""
    subject_background: str = "on_white"
    """background of the subject photos (one of BACKGROUND_NAMES)"""
    steps: int = 200
    """personalization steps of every system (quick: 200, so a fresh machine pre-trains and runs
    the quick profile within 20 minutes)"""
    batch_size: int = 4
    """subject images (drawn with replacement) per personalization step, BP and ZO alike"""
    resolution: int = 32
    """full (BP-high, ZO-high) resolution; a multiple of the UNet's downsampling factor"""
    low_resolution: int = 16
    """the low resolution the shapes UNet is pre-trained at (on ``pretrain_low_share`` of its
    steps); BP-low's own is chosen from ``tune_low_resolutions``"""
    rank: int = 4
    """LoRA rank"""
    tune_steps: int = 100
    """steps of each tuning run on the validation subject (a green/magenta/cyan striped square),
    scored by the subject fidelity of its samples"""
    tune_bp_lrs: tuple[float, ...] = (1e-3, 3e-3, 1e-2, 3e-2)
    """BP-high's candidate AdamW learning rates (each > 0; as many candidates as every tuned
    system gets)"""
    tune_low_resolutions: tuple[int, ...] = (16, 24)
    """BP-low's candidate resolutions, crossed with ``tune_low_bp_lrs``"""
    tune_low_bp_lrs: tuple[float, ...] = (3e-3, 1e-2)
    """BP-low's candidate AdamW learning rates"""
    tune_zo_lrs: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1)
    """ZO-high's candidate step sizes η (each > 0): 0.2 diverged on one of three seeds (its loss
    on the subject's photos rose from 0.10 to 0.90) in a run where tuning had chosen it"""
    zo_eps: float = 1e-2
    """ZO perturbation scale ε (> 0)"""
    kappa: float = 10.0
    """steepness of Mix-Opt's timestep switch (>= 0; 0: timestep-agnostic)"""
    t0: float = 0.5
    """normalised timestep where the switch is ½ (in [0, 1])"""
    gamma: float = 1.0
    """how fast ZO-high takes over with progress (>= 0)"""
    p_min: float = 0.0
    """floor of p_ZO (in [0, 1])"""
    n_seeds: int = 3
    """seeds per system: seed, seed + 1, ... (claims are judged on every seed)"""
    samples_per_prompt: int = 4
    """samples per background prompt (twice as many for the training background)"""
    sampling_steps: int = 25
    """DDIM steps per sample"""
    guidance: float = 1.0
    """classifier-free guidance scale (>= 1; 1: none). The base model's samples of its own
    captions read as asked (shape and colour) 91 % of the time unguided and 68 % at guidance 2,
    in a check with the first (wider) evaluation networks"""
    systems: tuple[str, ...] = SYSTEMS
    """the systems compared (all of SYSTEMS: the claims compare them)"""
    memory_resolution: int = 64
    """full resolution of the memory probe (BP-low at the same fraction of it as training): the
    experiment's UNet at a size where every mode adds enough memory to measure"""
    memory_batch_size: int = 12
    """batch of the memory probe"""
    workers: int = 2
    """processes that train cells side by side (one torch thread each)"""

    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {},
        "full": {"steps": 600, "tune_steps": 300, "samples_per_prompt": 8},
    }
    SYSTEMS: ClassVar[tuple[str, ...]] = ("base", *SYSTEMS)
    """every system the claims read: ``base`` is the un-personalized model"""
    TIMINGS: ClassVar[tuple[str, ...]] = ("seconds_per_step", "train_seconds")
    CLAIMS: ClassVar[tuple[ClaimSpec, ...]] = CLAIMS

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in (
            "pretrain_steps", "pretrain_images", "eval_net_steps", "eval_net_images",
            "subject_images", "steps", "batch_size", "rank", "n_seeds", "samples_per_prompt",
            "sampling_steps", "memory_resolution", "memory_batch_size", "tune_steps", "workers",
        ):  # fmt: skip
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        check_base_unet(self.base_channels, self.base_text_dim)
        self.base_channels = tuple(self.base_channels)
        check_resolutions(
            self.resolution, self.low_resolution, downsampling_factor(self.base_channels)
        )
        factor = downsampling_factor(self.base_channels)
        require(is_number(self.zo_eps) and self.zo_eps > 0, "zo_eps", "a finite number > 0",
                self.zo_eps)  # fmt: skip
        for name in ("tune_bp_lrs", "tune_low_bp_lrs", "tune_zo_lrs"):
            value = getattr(self, name)
            require(
                isinstance(value, tuple | list) and value and all(is_number(v) and v > 0 for v in value),
                name, "a non-empty tuple of finite numbers > 0", value,
            )  # fmt: skip
            setattr(self, name, tuple(value))
        lows = self.tune_low_resolutions
        require(
            isinstance(lows, tuple | list) and lows
            and all(is_count(v) and v % factor == 0 and v <= self.resolution for v in lows),
            "tune_low_resolutions",
            f"a non-empty tuple of multiples of {factor} <= resolution {self.resolution}", lows,
        )  # fmt: skip
        self.tune_low_resolutions = tuple(lows)
        budgets = (len(self.tune_bp_lrs), len(lows) * len(self.tune_low_bp_lrs),
                   len(self.tune_zo_lrs))  # fmt: skip
        require(
            len(set(budgets)) == 1,
            "tune_zo_lrs",
            "as many candidates as tune_bp_lrs and tune_low_resolutions × tune_low_bp_lrs (the "
            "same tuning budget for every system)",
            f"{budgets[2]} against {budgets[0]} and {budgets[1]}",
        )
        require(
            self.memory_resolution % factor == 0
            and all((self.memory_resolution * low) % (self.resolution * factor) == 0
                    for low in self.tune_low_resolutions),
            "memory_resolution",
            f"a multiple of the UNet's downsampling factor {factor} whose share low / "
            f"{self.resolution} is one too, for every low in tune_low_resolutions",
            self.memory_resolution,
        )  # fmt: skip
        for name in ("kappa", "gamma"):
            value = getattr(self, name)
            require(is_number(value) and value >= 0, name, "a finite number >= 0", value)
        require(
            is_number(self.pretrain_low_share) and 0 <= self.pretrain_low_share < 1,
            "pretrain_low_share",
            "a number in [0, 1)",
            self.pretrain_low_share,
        )
        for name in ("t0", "p_min"):
            value = getattr(self, name)
            require(is_number(value) and 0 <= value <= 1, name, "a number in [0, 1]", value)
        require(
            is_number(self.guidance) and self.guidance >= 1,
            "guidance",
            "a finite number >= 1 (1: no classifier-free guidance)",
            self.guidance,
        )
        require(
            self.subject_background in BACKGROUND_NAMES,
            "subject_background",
            f"one of {list(BACKGROUND_NAMES)}",
            self.subject_background,
        )
        require(
            isinstance(self.systems, tuple | list)
            and all(isinstance(s, str) for s in self.systems),
            "systems",
            "a tuple of system names",
            self.systems,
        )
        unknown = [s for s in self.systems if s not in SYSTEMS]
        require(not unknown, "systems", f"names from {list(SYSTEMS)}", self.systems)
        require(
            sorted(self.systems) == sorted(SYSTEMS),
            "systems",
            f"all of {SYSTEMS}, once each (the claims compare them)",
            self.systems,
        )
        self.systems = tuple(self.systems)

    def memory_low_resolution(self, low_resolution: int) -> int:
        """BP-low's resolution in the memory probe: ``low_resolution``'s share of
        memory_resolution."""
        return self.memory_resolution * low_resolution // self.resolution


METHOD = Method(
    name="mix_opt",
    domain="vision-mm",
    paper=(
        "Mix-Opt: memory-efficient diffusion personalization mixing low-resolution backprop and "
        "high-resolution zeroth-order optimization (Choi et al., arXiv 2507.10029)"
    ),
    claim=(
        "Choosing per step, by a timestep- and progress-aware probability, between backprop on "
        "downsampled images and zeroth-order steps at full resolution personalizes a diffusion "
        "model about as well as full-resolution backprop, at close to zeroth-order memory."
    ),
    config=Config,
    run="mixlab.vision_mm.mix_opt.experiment:run",
    headline_plot="subject_fidelity.png",
)

__all__ = [
    "BACKGROUND_NAMES",
    "CAPTION_WORDS",
    "CLAIMS",
    "CLOSE_TO_ZO",
    "FIDELITY_SHARE",
    "METHOD",
    "SYSTEMS",
    "WELL_BELOW_BP",
    "Config",
]
