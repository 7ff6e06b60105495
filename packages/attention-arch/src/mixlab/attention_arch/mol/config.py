"""The MoL experiment's :class:`Config`, its systems, and the registry entry :data:`METHOD`.

Light on purpose (standard library and ``mixlab.shared`` only): ``mixlab list`` reads it without
importing torch; :mod:`.experiment` loads on ``mixlab run mol``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, ClassVar

from mixlab.shared.claims import ClaimSpec
from mixlab.shared.config import ExperimentConfig, is_count, require
from mixlab.shared.registry import Method

LAST, PENULTIMATE, UNIFORM, CONCAT, STATIC = (
    "last layer", "penultimate (LLaVA)", "uniform average", "DenseConnector concat",
    "static mixture",
)  # fmt: skip
BEST_FIXED = "best fixed layer (validation)"
"""per seed, the fixed layer with the best fine-grained accuracy on the validation split, scored
on the test split (a pseudo-system: no cell of its own)"""
MOL_IMAGE, MOL_PATCH, MOL_HYBRID = "MoL-image", "MoL-patch", "MoL-hybrid"
ROUTED = (MOL_IMAGE, MOL_PATCH, MOL_HYBRID)
BLENDS = (UNIFORM, CONCAT, STATIC, *ROUTED)
"""systems that read every candidate layer"""
SYSTEMS = (LAST, PENULTIMATE, *BLENDS, BEST_FIXED)
"""the systems the claims' tests read (the shallow fixed layers, ``layer l``, also run)"""
STATIC_CONTROL = (
    "the static learned mixture: the same mixer over the same layers with learned weights that "
    "ignore the instruction, so it lacks only MoL's idea"
)
CLAIMS = (
    ClaimSpec(
        key="beats_penultimate",
        text="MoL-hybrid beats the penultimate layer by at least {fine_gain:g} on the mean of the "
        "fine-grained tasks and loses at most {semantic_loss:g} on the semantic control",
        system=MOL_HYBRID,
        control=BEST_FIXED,
        why_control="the best single fixed layer, chosen per seed on the validation split's "
        "fine-grained accuracy: reading one shallower layer for every question is the simplest "
        "way to get the detail back; if it gains as much without losing the semantic control, "
        "routing per instruction adds nothing",
        premises=("deep_layers_drop_detail", "fine_tasks_learnable"),
        threshold="fine_gain",
        ceiling=1.0,
    ),
    ClaimSpec(
        key="beats_blind_mixtures",
        text="MoL-hybrid beats the static learned mixture and the DenseConnector concat on the "
        "fine-grained mean (the instruction is what helps)",
        system=MOL_HYBRID,
        control=UNIFORM,
        why_control="the uniform average of the candidate layers: a parameter-free blend that "
        "reads every layer without the instruction (the claim's references, the static mixture "
        "and the concat, are the other two blind blends)",
        premises=("deep_layers_drop_detail", "fine_tasks_learnable"),
    ),
    ClaimSpec(
        key="routes_shallower_for_detail",
        text="MoL-hybrid's π-weighted layer index is at least {min_depth_shift:g} layer shallower "
        "on fine-grained than on semantic questions",
        system=MOL_HYBRID,
        control=STATIC,
        why_control=STATIC_CONTROL + " (the same π for every question: its shift is 0 by "
        "construction, so it fails whenever the threshold is above 0)",
        premises=("deep_layers_drop_detail",),
        threshold="min_depth_shift",
    ),
)
"""the claims (issue 23), each judged seed by seed against its control"""


def fixed_layer(layer: int) -> str:
    return f"layer {layer}"


def system_mixer(system: str, layers: tuple[int, ...], depth: int) -> dict[str, Any]:
    """How ``system`` reads the encoder: ``{"kind": "fixed", "layer": l}``, ``{"kind": "concat"}``
    or ``{"kind": "mixture", "granularity": g}`` over the candidate ``layers``."""
    if system == LAST:
        return {"kind": "fixed", "layer": depth}
    if system == PENULTIMATE:
        return {"kind": "fixed", "layer": depth - 1}
    if system.startswith("layer "):
        return {"kind": "fixed", "layer": int(system.split()[1])}
    if system == CONCAT:
        return {"kind": "concat"}
    granularity = {UNIFORM: "uniform", STATIC: "static", MOL_IMAGE: "image", MOL_PATCH: "patch",
                   MOL_HYBRID: "hybrid"}[system]  # fmt: skip
    return {"kind": "mixture", "granularity": granularity}


def systems_for(
    layers: tuple[int, ...], depth: int, routed: tuple[str, ...] = ROUTED
) -> tuple[str, ...]:
    """Last, every shallower candidate layer, the penultimate, then the blind blends and the
    ``routed`` MoL granularities."""
    shallow = tuple(fixed_layer(layer) for layer in layers if layer < depth - 1)
    blends = tuple(s for s in BLENDS if s not in ROUTED or s in routed)
    return (LAST, *shallow, PENULTIMATE, *blends)


@dataclass
class Config(ExperimentConfig):
    """Defaults are the quick profile: procedural VQA at 32² (patch 8, 16 visual tokens), a toy
    LLaVA (CLIP encoder of width 64 and depth 6 whose two deepest layers are pulled towards hue
    invariance, Llama of width 64 and depth 2) trained here once; candidate layers 2, 3 and 5
    (LLaVA's -2). Every system fine-tunes mixer, projector and LM from the cached base with the
    same batches and 1,500 steps, 3 seeds. About 10 minutes on 2 cores from an empty cache.
    (Issue 65's pilots: at 64², 64 tokens, no layer's colour answers left chance in 600 steps;
    at 32² with full invariance (weight 1) the base never learns the colour words and 600 steps
    do not either; weight 0.1 and 1,500 steps gave layer 2 0.97 and the penultimate 0.71 on the
    colour question.) Full (one large GPU): 128² with 16-px patches (64 tokens), width 256,
    encoder depth 12, LM depth 4, 5 seeds."""

    size: int = 32
    """image side in pixels of the procedural VQA scenes"""
    patch_size: int = 8
    """side in pixels of the CLIP encoder's patches (one visual token each)"""
    vision_width: int = 64
    """hidden width of the toy CLIP vision encoder"""
    vision_depth: int = 6
    """transformer layers of the toy CLIP vision encoder"""
    lm_width: int = 64
    """hidden width of the toy Llama language model"""
    lm_depth: int = 2
    """transformer layers of the toy Llama language model"""
    encoder_images: int = 6000
    """caption-labelled images the vision encoder is pre-trained on (one-time, cached)"""
    encoder_steps: int = 1500
    """pre-training steps of the vision encoder on the caption labels (one-time, cached)"""
    invariance_weight: float = 0.1
    """weight of the pre-training term that pulls the deepest layers' states of an image and of
    its recoloured view together (1 − cosine per token; 0: no such term, the label head still
    sees both views). 0.1 leaves the
    penultimate some hue, so that the base's stage 1 learns the colour words at all (at 1 it
    did not, and no system learnt them in the cells' budget)"""
    invariant_layers: int = 2
    """the encoder's deepest layers held to hue invariance (2: the penultimate and the last)"""
    base_examples: int = 6000
    """VQA examples of the toy base's stage-1 training (one-time, cached)"""
    base_steps: int = 1000
    """stage-1 steps of the toy base on layer -2 (one-time, cached)"""
    layers: tuple[int, ...] = (2, 3, 5)
    """candidate layers S (indices into the encoder's hidden states; 0 is the embeddings)"""
    routed: tuple[str, ...] = (MOL_HYBRID,)
    """MoL granularities trained (MoL-hybrid, the claims' system, always; quick leaves out the
    image- and patch-level ablations, full runs all three)"""
    n_train: int = 6000
    """VQA training examples of every system's fine-tuning, the question types in turn"""
    n_val: int = 1200
    """VQA validation examples (the best fixed layer is chosen on them), question types in turn"""
    n_test: int = 1200
    """VQA examples of the test split, the question types in turn"""
    steps: int = 1500
    """fine-tuning steps of every system from the cached base (at 600 no layer's colour answers
    beat the penultimate's by the headroom)"""
    batch_size: int = 64
    """examples (or images) per step, in the fine-tuning and in the base's one-time training"""
    lr: float = 2e-3
    """peak AdamW learning rate of every system's fine-tuning (warm-up, then cosine decay)"""
    balance_weight: float = 0.0
    """weight of MoL's balance loss (0: off, as the reconstruction has no evidence for it)"""
    n_seeds: int = 3
    """fine-tuning seeds per system: seed, seed + 1, ..."""
    workers: int = 2
    """processes that train cells side by side (one torch thread each)"""
    min_encoder_accuracy: float = 0.9
    """regime: the encoder's held-out accuracy on its caption labels"""
    min_blind_gap: float = 0.3
    """regime: the base beats the blind model (image zeroed) on the semantic control by this"""
    min_headroom: float = 0.10
    """regime and premise: the best shallow fixed layer beats the penultimate by this on the
    V*-like questions, and the colour probe reads it this much better"""
    min_learnable: float = 0.05
    """premise: the best fixed layer (validation) beats the answer prior by this on each
    fine-grained task (the prior: each question type's most common training answer)"""
    fine_gain: float = 0.03
    """claim 1: MoL-hybrid beats the penultimate on the fine-grained mean by this ..."""
    semantic_loss: float = 0.01
    """... and loses at most this on the semantic control"""
    min_depth_shift: float = 1.0
    """claim 3: the π-weighted layer index is this much shallower on fine-detail questions"""

    SYSTEMS: ClassVar[tuple[str, ...]] = SYSTEMS
    TIMINGS: ClassVar[tuple[str, ...]] = ("prepare_s", "toy_train_s", "train_s", "train_s_std")
    CLAIMS: ClassVar[tuple[ClaimSpec, ...]] = CLAIMS
    ALLOWED_EDGE_VALUES: ClassVar[dict[str, tuple[Any, ...]]] = {
        "seed": (0,),
        "balance_weight": (0, 0.0),
        "fine_gain": (0, 0.0),
        "semantic_loss": (0, 0.0),
        "min_blind_gap": (0, 0.0),
        "min_headroom": (0, 0.0),
        "min_learnable": (0, 0.0),
        "min_depth_shift": (0, 0.0),
        "invariance_weight": (0, 0.0),
    }
    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {},
        "full": {
            "size": 128,
            "patch_size": 16,
            "vision_width": 256,
            "vision_depth": 12,
            "lm_width": 256,
            "lm_depth": 4,
            "encoder_images": 50_000,
            "encoder_steps": 10_000,
            "base_examples": 30_000,
            "base_steps": 10_000,
            "layers": (2, 4, 6, 8, 10, 11),
            "n_train": 30_000,
            "n_val": 6000,
            "n_test": 6000,
            "steps": 4000,
            "routed": ROUTED,
            "n_seeds": 5,
            "workers": 1,
        },
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("size", "patch_size", "vision_width", "vision_depth", "lm_width", "lm_depth",
                     "encoder_images", "encoder_steps", "invariant_layers", "base_examples",
                     "base_steps", "n_train", "n_val", "n_test", "steps", "batch_size", "n_seeds",
                     "workers"):  # fmt: skip
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(self.size >= 32 and self.size % self.patch_size == 0, "size",
                f"an integer >= 32 divisible by patch_size={self.patch_size}", self.size)  # fmt: skip
        require(self.vision_width % 4 == 0 and self.lm_width % 4 == 0, "vision_width",
                "widths divisible by the 4 attention heads", (self.vision_width, self.lm_width))  # fmt: skip
        depth = self.vision_depth
        require(
            isinstance(self.layers, tuple | list) and len(self.layers) > 0
            and all(is_count(i, 0) and i <= depth for i in self.layers)
            and len(set(self.layers)) == len(self.layers) and depth - 1 in self.layers,
            "layers", f"distinct indices in [0, {depth}] including the penultimate {depth - 1}",
            self.layers,
        )  # fmt: skip
        for name in ("n_train", "n_val", "n_test"):
            require(getattr(self, name) >= 12, name,
                    "at least 12 examples (two per question type)", getattr(self, name))  # fmt: skip
        require(self.invariant_layers <= depth, "invariant_layers",
                f"at most vision_depth = {depth}", self.invariant_layers)  # fmt: skip
        require(isinstance(self.lr, numbers.Real) and self.lr > 0, "lr", "a number > 0", self.lr)
        require(
            isinstance(self.routed, tuple | list) and MOL_HYBRID in self.routed
            and set(self.routed) <= set(ROUTED) and len(set(self.routed)) == len(self.routed),
            "routed", f"distinct names from {list(ROUTED)} including {MOL_HYBRID}", self.routed,
        )  # fmt: skip
        for name in ("min_encoder_accuracy", "min_blind_gap", "min_headroom", "min_learnable",
                     "fine_gain", "semantic_loss", "balance_weight"):  # fmt: skip
            value = getattr(self, name)
            require(isinstance(value, numbers.Real) and 0 <= value <= 1, name,
                    "a number in [0, 1]", value)  # fmt: skip
        for name in ("min_depth_shift", "invariance_weight"):
            value = getattr(self, name)
            require(isinstance(value, numbers.Real) and 0 <= value < float("inf"), name,
                    "a finite number >= 0", value)  # fmt: skip

    @property
    def systems(self) -> tuple[str, ...]:
        return systems_for(tuple(self.layers), self.vision_depth, tuple(self.routed))


METHOD = Method(
    name="mol",
    domain="attention-arch",
    paper=(
        "MoL: Mixture of Layers, instruction-conditioned routing over a vision encoder's layers "
        "in an MLLM (paper not found; reconstructed from TGIF, IGVA and DenseConnector)"
    ),
    claim=(
        "Letting the instruction pick a mixture of the frozen vision encoder's layers for the "
        "projector, at the same token count, lifts fine-grained VQA (small objects, charts) over "
        "LLaVA's penultimate layer without losing semantic questions, and beats instruction-blind "
        "mixtures; fine-detail questions route to shallower layers."
    ),
    config=Config,
    run="mixlab.attention_arch.mol.experiment:run",
    headline_plot="task_accuracy.png",
)
