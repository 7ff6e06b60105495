"""The MoBiQuant experiment's :class:`Config` and its registry entry :data:`METHOD`.

Light on purpose (standard library and ``mixlab.shared`` only): ``mixlab list`` reads it without
importing torch or transformers; :mod:`.experiment` loads on ``mixlab run mobiquant``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from mixlab.shared.claims import ClaimSpec
from mixlab.shared.config import ExperimentConfig, is_count, require
from mixlab.shared.registry import Method

if TYPE_CHECKING:
    from mixlab.llm_efficiency.lm import LMConfig
    from mixlab.llm_efficiency.mobiquant.model import MoBiQuantConfig

SLICE_BITS = (1, 2, 4, 8)
"""bits per slice the packing supports (they divide a byte)"""
CLAIM_BUDGETS = (2.0, 3.0, 4.0)
"""average bits the claims read: ``budgets`` must contain them"""
CLAIM_PER_BIT = (2, 3, 4)
"""per-bit widths the claims and the regime checks read: ``per_bit`` must contain them"""
WITHIN = 0.05
"""MoBiQuant at 4 bits must be within this fraction of per-bit GPTQ's perplexity"""
TOP_FRACTION = 0.10
"""outlier migration compares the top 10 % of tokens by loss increase"""
CHANCE_JACCARD = TOP_FRACTION / (2 - TOP_FRACTION)
"""the expected Jaccard overlap of two random top-10 % sets: the floor of the migration metric"""
MIGRATION_JACCARD = 0.5
"""outlier migration: the top-10 % sets at 3 and 4 bits overlap by less than this"""
RTN_CONTROL = "round-to-nearest at the same bits: no calibration, no nested slices, no router"

SYSTEMS = ("fp", "rtn", "hqq", "gptq", "matryoshka", "anyprec", "clip_rtn", "nested", "mobiquant")
CLAIMS = (
    ClaimSpec(
        key="within_gptq_at_4_bits",
        text=f"MoBiQuant at 4 average bits is within {WITHIN:.0%} of per-bit GPTQ's perplexity",
        system="mobiquant",
        control="rtn",
        why_control=RTN_CONTROL,
    ),
    *(
        ClaimSpec(
            key=f"beats_matryoshka_at_{bits}_bits",
            text=f"At {bits} average bits MoBiQuant beats Matryoshka-style slicing (MSB slices of "
            "an 8-bit RTN model, rounded) within its budget",
            system="mobiquant",
            control="rtn",
            why_control=RTN_CONTROL,
        )
        for bits in (2, 3)
    ),
    ClaimSpec(
        key="router_beats_random_depths",
        text="The router beats token-agnostic random depths at every fractional budget "
        "({fractional} bits), where only routing differs (one-sided paired t-test over seeds "
        "at 5 %)",
        system="mobiquant",
        control="nested",
        why_control="the same nested slices read at random depths per token: the claim's own "
        "reference, the only system that differs from MoBiQuant by the router alone",
    ),
    ClaimSpec(
        key="beats_upscaling",
        text="MoBiQuant beats Any-Precision-LLM-style upscaling (a 2-bit GPTQ seed, each bin split "
        "for every further bit; also one checkpoint) at 2, 3 and 4 bits",
        system="mobiquant",
        control="rtn",
        why_control=RTN_CONTROL,
    ),
    ClaimSpec(
        key="one_checkpoint_is_smaller",
        text="One nested checkpoint is smaller than the per-bit set ({per_bit_set} bits; by "
        "construction: 8 bits of codes against their sum)",
        system="mobiquant",
        control="matryoshka",
        why_control="one 8-bit RTN checkpoint sliced by its most significant bits: also a single "
        "checkpoint for every precision, without MoBiQuant's residual slices",
        not_per_seed="byte counts of the stored layers: no seed enters them",
    ),
    ClaimSpec(
        key="outliers_migrate",
        text=f"Outlier migration: the top-{TOP_FRACTION:.0%} tokens by loss increase at 3 and at 4 "
        f"bits overlap by less than half (Jaccard < {MIGRATION_JACCARD:g}; chance "
        f"{CHANCE_JACCARD:.3f})",
        system="gptq",
        control="rtn",
        why_control="round-to-nearest at 3 and 4 bits: quantization without calibration; the "
        "noise floor of two calibration seeds (issue 77) is not measured yet",
        threshold=MIGRATION_JACCARD,
        floor=CHANCE_JACCARD,
        ceiling=1.0,
    ),
    ClaimSpec(
        key="cross_calibration_costs",
        text="Calibrating at 3 bits and running at 4 costs perplexity against calibrating at 4",
        system="clip_rtn",
        control="rtn",
        why_control="round-to-nearest calibrates nothing, so a precision-specific calibration "
        "cannot cost it anything",
    ),
)


def lm_heads(hidden_size: int) -> int:
    """Attention heads of the tiny LM: one per 32 channels."""
    return max(1, hidden_size // 32)


@dataclass
class Config(ExperimentConfig):
    """Defaults are the quick profile, one seed (the tiny LM trains once into the cache, about
    10 minutes on 2 CPU cores); full is the same testbed with 3 seeds, which the router claim
    needs."""

    hidden_size: int = 128
    """width of the tiny Llama (one attention head per 32 channels)"""
    layers: int = 4
    """decoder blocks of the tiny Llama"""
    intermediate_size: int = 384
    """MLP width of the tiny Llama"""
    seq_len: int = 128
    """tokens per window, for training, calibration and evaluation"""
    lm_steps: int = 4000
    """training steps of the tiny Llama (cached by its config; about 10 minutes on 2 cores). At
    300 steps 2-bit RTN cost +2 % perplexity and 3-bit GPTQ nothing, at 1500 +18 % and +1.5 %:
    too little for the regime checks; at 4000 +49 % and +3.7 % (8192 test tokens, group 64)"""
    lm_batch: int = 16
    """sequences per training step of the tiny Llama"""
    slice_bits: int = 2
    """bits per slice (1, 2, 4 or 8)"""
    slices: int = 4
    """slices of the nested checkpoint (depth d reads d * slice_bits bits); >= 2 for the router"""
    group_size: int = 64
    """columns per group with one float16 scale and zero (all systems)"""
    calib_sequences: int = 32
    """calibration sequences of seq_len tokens, drawn from the validation files"""
    calib_steps: int = 150
    """block-wise calibration steps of the ranges per block (MoBiQuant and the router-free nested
    slices, which share their slices); MoBiQuant's router then trains as many steps"""
    eval_tokens: int = 32768
    """test tokens scored per system and budget (at least seq_len)"""
    budgets: tuple[float, ...] = (2.0, 2.5, 3.0, 3.5, 4.0, 6.0)
    """average code bits the nested systems are read at; within [slice_bits, slice_bits * slices]
    and containing 2, 3 and 4"""
    per_bit: tuple[int, ...] = (2, 3, 4, 6)
    """widths of the per-bit baselines, in 1..8 and containing 2, 3 and 4"""
    n_seeds: int = 1
    """seeds (calibration draws) of GPTQ, the nested systems and the migration runs (the router
    claim needs at least 2: it is judged against the spread over seeds)"""

    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {},
        "full": {"n_seeds": 3},
    }
    SYSTEMS: ClassVar[tuple[str, ...]] = SYSTEMS
    CLAIMS: ClassVar[tuple[ClaimSpec, ...]] = CLAIMS

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in (
            "hidden_size",
            "layers",
            "intermediate_size",
            "seq_len",
            "lm_steps",
            "lm_batch",
            "slices",
            "group_size",
            "calib_sequences",
            "calib_steps",
            "eval_tokens",
            "n_seeds",
        ):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        heads = lm_heads(self.hidden_size)
        require(
            self.hidden_size % heads == 0,
            "hidden_size",
            f"a multiple of its {heads} heads (one per 32 channels)",
            self.hidden_size,
        )
        require(
            is_count(self.slice_bits) and self.slice_bits in SLICE_BITS,
            "slice_bits",
            f"one of {list(SLICE_BITS)}",
            self.slice_bits,
        )
        require(
            self.slices >= 2 and self.slice_bits * self.slices <= 16,
            "slices",
            "an integer >= 2 (the router needs two depths) with slice_bits * slices <= 16",
            self.slices,
        )
        for width in ("hidden_size", "intermediate_size"):
            require(
                getattr(self, width) % self.group_size == 0,
                "group_size",
                f"a divisor of {width} ({getattr(self, width)})",
                self.group_size,
            )
            require(
                getattr(self, width) * self.slice_bits % 8 == 0,
                width,
                "a width whose codes fill whole bytes (width * slice_bits divisible by 8)",
                getattr(self, width),
            )
        require(
            self.eval_tokens >= self.seq_len,
            "eval_tokens",
            f"at least seq_len ({self.seq_len})",
            self.eval_tokens,
        )
        top = self.slice_bits * self.slices
        require(
            isinstance(self.budgets, tuple | list)
            and len(self.budgets) > 0
            and all(
                isinstance(b, numbers.Real)
                and not isinstance(b, bool)
                and math.isfinite(b)
                and self.slice_bits <= b <= top
                for b in self.budgets
            ),
            "budgets",
            f"a tuple of average bits in [{self.slice_bits}, {top}]",
            self.budgets,
        )
        require(
            all(float(b / self.slice_bits * 8).is_integer() for b in self.budgets),
            "budgets",
            f"multiples of {self.slice_bits / 8:g} bits (1/8 slice: the routers' threshold grid)",
            self.budgets,
        )
        require(
            all(needed in self.budgets for needed in CLAIM_BUDGETS),
            "budgets",
            "a tuple containing 2, 3 and 4 (the claims)",
            self.budgets,
        )
        require(
            isinstance(self.per_bit, tuple | list)
            and all(is_count(b) and b <= 8 for b in self.per_bit)
            and set(CLAIM_PER_BIT) <= set(self.per_bit),
            "per_bit",
            "bits in 1..8 including 2, 3 and 4",
            self.per_bit,
        )

    def lm_config(self) -> LMConfig:
        from mixlab.llm_efficiency.lm import LMConfig

        return LMConfig(
            hidden_size=self.hidden_size,
            layers=self.layers,
            heads=lm_heads(self.hidden_size),
            intermediate_size=self.intermediate_size,
            seq_len=self.seq_len,
            steps=self.lm_steps,
            batch_size=self.lm_batch,
        )

    def quant_config(self, *, router: bool, seed: int = 0) -> MoBiQuantConfig:
        from mixlab.llm_efficiency.mobiquant.model import MoBiQuantConfig

        return MoBiQuantConfig(
            bits=self.slice_bits,
            slices=self.slices,
            group_size=self.group_size,
            router=router,
            calib_steps=self.calib_steps,
            router_steps=self.calib_steps,
            seed=seed,
        )


METHOD = Method(
    name="mobiquant",
    domain="llm-efficiency",
    paper=(
        "MoBiQuant: Mixture-of-Bits Quantization for Token-Adaptive Any-Precision LLM "
        "(Wang et al., arXiv 2602.20191)"
    ),
    claim=(
        "One nested checkpoint of recursive residual bit slices, read per token to the depth a "
        "learned router picks, matches per-bit calibrated PTQ at each precision and beats "
        "Matryoshka slicing and uniform nested precision at low average bits."
    ),
    config=Config,
    run="mixlab.llm_efficiency.mobiquant.experiment:run",
    headline_plot="perplexity_vs_bits.png",
)
