"""The MoBiQuant layer (:class:`MoBiLinear`) and the per-block token router (:class:`MoBiRouter`).

A :class:`MoBiLinear` stores one nested checkpoint (``slices`` bit planes, one scale and zero per
group, see :mod:`.slices`) and reads, for each token, only as many planes as that token's depth.
The depth comes from, in order: the ``precision=`` argument of ``forward``; the layer's
``precision`` attribute (:func:`~.model.set_precision`); the depth its block's router wrote into
``token_depth`` for the current forward; else all slices.

The router (MoBiRoute, paper §4.2) is a 2-layer MLP on the block's input hidden state that
scores each token once per slice. At an average budget of ``base + share`` slices the tokens
scoring above the block's threshold for slice ``base + 1`` read it and the rest read ``base``:
one threshold per block and budget, fitted once (:func:`~.model.fit_thresholds`). (We first let
the router spread tokens over all depths with prefix gating; at the same average that read worse
than uniform precision, see the seed card.)
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mixlab.llm_efficiency.mobiquant.kernel import (
    fixed_matmul,
    int4_applies,
    nested_matmul,
    pack_int4,
)
from mixlab.llm_efficiency.mobiquant.slices import (
    SliceSpec,
    dequantize,
    group_range,
    group_view,
    pack,
    scale_zero,
    slice_codes,
    unpack,
)

DEFAULT_SPEC = SliceSpec()

__all__ = [
    "MoBiLinear",
    "MoBiRouter",
    "as_out_in",
    "budget_grid",
    "budget_index",
    "check_budget",
    "depth_plan",
    "is_linear",
    "upper_threshold",
]


def is_linear(module: nn.Module) -> bool:
    """``nn.Linear`` or GPT-2's ``Conv1D`` (a linear layer storing its weight as [in, out])."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def as_out_in(module: nn.Module, name: str = "module") -> torch.Tensor:
    """The weight of a linear layer as ``[out, in]`` (transposing GPT-2's ``Conv1D``)."""
    if isinstance(module, nn.Linear):
        return module.weight.data
    if type(module).__name__ == "Conv1D":
        return module.weight.data.t()
    raise ValueError(
        f"{name}: unknown layer type {type(module).__name__}; MoBiQuant quantizes nn.Linear "
        "and transformers' Conv1D"
    )


class _Calibration(nn.Module):
    """What a layer holds while it is calibrated: the full-precision weight and the learnable
    weight clipping (LWC, OmniQuant) of each group's range, ``range_e = 2 * sigmoid(theta_e)``
    times the distance of its min / max from the group's middle (1 at theta = 0: unclipped, the
    measured best for the nested ladder, see :mod:`.slices`)."""

    def __init__(self, weight: torch.Tensor, groups: int) -> None:
        super().__init__()
        self.register_buffer("weight", weight.detach().float().clone())
        shape = (weight.shape[0], groups)
        self.theta_low = nn.Parameter(torch.zeros(shape, device=weight.device))
        self.theta_high = nn.Parameter(torch.zeros(shape, device=weight.device))
        self.frozen: list[torch.Tensor] | None = None  # the levels, once the ranges are frozen

    @torch.no_grad()
    def freeze(self, spec: SliceSpec) -> None:
        """Fix the ranges and keep their levels: the router's stage reads them every step, and
        recomputing them (quantizing the whole weight at every depth) was most of its time."""
        self.requires_grad_(False)
        self.frozen = None
        self.frozen = self.levels(spec)

    def range(self, spec: SliceSpec) -> tuple[torch.Tensor, torch.Tensor]:
        groups = group_view(self.weight, spec.group_size)
        low, high = groups.amin(-1), groups.amax(-1)
        middle = (low + high) / 2
        low = middle - (middle - low) * 2 * torch.sigmoid(self.theta_low)
        high = middle + (high - middle) * 2 * torch.sigmoid(self.theta_high)
        return scale_zero(low, high, spec.bits, groups.abs().amax(-1))

    def levels(self, spec: SliceSpec) -> list[torch.Tensor]:
        """``[W_1, ..., W_E]``, differentiable in the range through straight-through floors."""
        if self.frozen is not None:
            return self.frozen
        scale, zero = self.range(spec)
        scale = scale.repeat_interleave(spec.group_size, dim=1)
        zero = zero.repeat_interleave(spec.group_size, dim=1)
        finest = 2.0 ** (spec.bits * (spec.slices - 1))
        u = (self.weight / scale + zero) * finest
        q = (u + (u.floor() - u).detach()).clamp(0, 2**spec.max_bits - 1)  # Q_E, floor-aligned
        out = []
        for depth in range(1, spec.slices + 1):
            drop = 2.0 ** (spec.bits * (spec.slices - depth))
            q_d = q / drop
            q_d = q_d + (q_d.floor() - q_d).detach()  # Q_d = Q_E >> b(E-d), exact in forward
            out.append(scale * ((q_d + 0.5) * drop / finest - zero))
        return out


class MoBiLinear(nn.Module):
    """A linear layer whose weight is one nested MoBiSlice checkpoint, read at any depth."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        spec: SliceSpec = DEFAULT_SPEC,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        name: str = "layer",
    ) -> None:
        super().__init__()
        spec.check_width(in_features, name)
        self.in_features, self.out_features, self.spec = in_features, out_features, spec
        groups = in_features // spec.group_size
        packed = in_features * spec.bits // 8
        kw: dict[str, Any] = {"device": device}
        self.register_buffer(
            "planes", torch.zeros(spec.slices, out_features, packed, dtype=torch.uint8, **kw)
        )
        self.register_buffer("scale", torch.ones(out_features, groups, dtype=torch.float16, **kw))
        self.register_buffer("zero", torch.zeros(out_features, groups, dtype=torch.float16, **kw))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, **kw)) if bias else None
        self.compute_dtype = dtype
        self.precision: int | None = None
        self.token_depth: torch.Tensor | int | None = None
        self.token_depths: tuple[int, ...] | None = None  # the depths token_depth can hold
        self.backend = "auto"
        self.calibration: _Calibration | None = None
        # the 4-bit read packed for PyTorch's int4 matmul (kernel.pack_int4), 4 bits per weight,
        # made on the first 4-bit read; keyed by what it was made from, so any change remakes it
        self._int4: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.reset_bit_counts()

    # --- the bits this layer actually read ---------------------------------------------------
    def reset_bit_counts(self) -> None:
        self._last: tuple[torch.Tensor | float, int] = (float("nan"), 1)
        self._total: tuple[torch.Tensor | float, int] = (0.0, 0)

    def _record(self, depth: torch.Tensor | int, tokens: int) -> None:
        # kept as tensors: no host sync per call on a GPU, read only when asked
        bits = (
            depth.sum() * self.spec.bits
            if torch.is_tensor(depth)
            else depth * tokens * self.spec.bits
        )
        self._last = (bits, tokens)
        self._total = (self._total[0] + bits, self._total[1] + tokens)

    @property
    def last_avg_bits(self) -> float:
        """Code bits per weight the last call read, averaged over its tokens."""
        return float(self._last[0]) / self._last[1]

    @property
    def avg_bits(self) -> float:
        """Code bits per weight read since :meth:`reset_bit_counts`, averaged over all tokens."""
        bits, tokens = self._total
        return float(bits) / tokens if tokens else float("nan")

    @classmethod
    def from_linear(
        cls,
        module: nn.Module,
        spec: SliceSpec = DEFAULT_SPEC,
        *,
        clip: float | str = 1.0,
        name: str = "layer",
    ) -> MoBiLinear:
        """Quantize an ``nn.Linear`` or ``Conv1D`` (data-free: min-max range, or ``clip="search"``
        for the per-group ratio that minimises the depth-averaged error)."""
        weight = as_out_in(module, name)
        layer = cls.shaped_like(module, spec, name=name)
        if clip == "search":
            from mixlab.llm_efficiency.mobiquant.slices import search_clip

            clip = search_clip(weight, spec)
        layer.set_weight(weight, *group_range(weight, spec, clip))
        return layer

    @classmethod
    def shaped_like(
        cls, module: nn.Module, spec: SliceSpec = DEFAULT_SPEC, *, name: str = "layer"
    ) -> MoBiLinear:
        """An empty layer of ``module``'s shape, dtype and device, with its bias (not trained)."""
        weight = as_out_in(module, name)
        layer = cls(
            weight.shape[1],
            weight.shape[0],
            module.bias is not None,
            spec,
            dtype=weight.dtype,
            device=weight.device,
            name=name,
        )
        if module.bias is not None:
            layer.bias.data.copy_(module.bias.data)
            layer.bias.requires_grad_(False)
        return layer

    def set_weight(self, weight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> None:
        """Slice ``weight`` with ``scale``/``zero`` (stored as float16) into the bit planes."""
        self.scale.copy_(scale.to(torch.float16))
        self.zero.copy_(zero.to(torch.float16))
        codes = slice_codes(weight, self.scale, self.zero, self.spec)
        self.planes.copy_(pack(codes, self.spec.bits))
        self._int4.clear()

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._int4.clear()  # new planes: the packed 4-bit read is stale
        super()._load_from_state_dict(*args, **kwargs)

    def _fixed_read(self, x: torch.Tensor, depth: int) -> torch.Tensor:
        """``x @ W_depth^T`` by :func:`.kernel.fixed_matmul`: the packed int4 CPU matmul for a
        4-bit read, the Triton kernel on CUDA, a vectorised unpack otherwise."""
        int4 = None
        if self.backend == "auto" and int4_applies(self.spec, depth, x.device, self.out_features):
            if torch.compiler.is_compiling():  # made by an eager call (no version checks here)
                int4 = next(iter(self._int4.values()), None)
            else:
                key = (x.device, x.dtype, self.planes.data_ptr(), self.scale.dtype)
                key += tuple(t._version for t in (self.planes, self.scale, self.zero))
                if key not in self._int4:
                    self._int4.clear()  # one packed copy: on this device, of these planes
                    self._int4[key] = pack_int4(
                        self.planes, self.scale, self.zero, self.spec, depth, x.dtype
                    )
                int4 = self._int4[key]
        return fixed_matmul(
            x, self.planes, self.scale, self.zero, depth, self.spec, int4=int4,
            backend=self.backend,
        )  # fmt: skip

    def weight_at(self, depth: int) -> torch.Tensor:
        """The dense weight ``[out, in]`` this layer reads at ``depth`` slices."""
        codes = unpack(self.planes[:depth], self.spec.bits)
        return dequantize(codes, self.scale, self.zero, self.spec, depth, self.compute_dtype)

    # --- calibration (see .calibrate) -------------------------------------------------------
    def start_calibration(self, weight: torch.Tensor) -> _Calibration:
        """Hold the full-precision ``weight`` [out, in] and learnable ranges until
        :meth:`finish_calibration`; forward then reads the differentiable levels."""
        self.calibration = _Calibration(weight, self.scale.shape[1])
        return self.calibration

    @torch.no_grad()
    def finish_calibration(self) -> None:
        """Slice the full-precision weight with the learned ranges and drop the float copy."""
        assert self.calibration is not None
        self.set_weight(self.calibration.weight, *self.calibration.range(self.spec))
        self.calibration = None

    # --- forward ----------------------------------------------------------------------------
    def _depths(
        self, tokens: int, precision: int | None, device: torch.device
    ) -> torch.Tensor | int:
        depth = precision if precision is not None else self.precision
        if depth is not None:
            if not 1 <= depth <= self.spec.slices:
                raise ValueError(
                    f"precision must be a depth in 1..{self.spec.slices}, got {depth!r}"
                )
            return depth
        if isinstance(self.token_depth, int):  # the router sends every token to one depth
            return self.token_depth
        if self.token_depth is not None:
            if self.token_depth.numel() != tokens:
                raise ValueError(
                    f"the router set {self.token_depth.numel()} token depths for a call with "
                    f"{tokens} tokens (a layer inside a per-token sub-module, e.g. an MoE expert, "
                    "cannot be routed: use set_precision)"
                )
            return self.token_depth.to(device)
        return self.spec.slices

    def forward(self, x: torch.Tensor, precision: int | None = None) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        if self.calibration is not None:
            y = self._calibration_forward(x2, precision)
        else:
            depth = self._depths(x2.shape[0], precision, x.device)
            self._record(depth, x2.shape[0])
            depths = self.token_depths
            if not isinstance(depth, int) and not torch.compiler.is_compiling():
                # eager: read only the planes of the depths present (one host read; a compiled
                # graph keeps the depths it can hold and no sync); one depth: the fixed read
                depths = tuple(depth.unique().tolist()) or (self.spec.slices,)  # () if empty
                depth = depths[0] if len(depths) == 1 else depth
            if isinstance(depth, int):
                y = self._fixed_read(x2, depth)
            else:
                y = nested_matmul(
                    x2, self.planes, self.scale, self.zero, depth, self.spec, self.backend, depths
                )
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def _calibration_forward(self, x: torch.Tensor, precision: int | None) -> torch.Tensor:
        """``x @ W_d^T`` with the differentiable levels of the ranges being learned."""
        levels = self.calibration.levels(self.spec)
        depth = precision if precision is not None else self.precision
        depth = depth or self.spec.slices
        self._record(depth, x.shape[0])
        return F.linear(x, levels[depth - 1].to(x.dtype))

    def extra_repr(self) -> str:
        s = self.spec
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"bits={s.bits}x{s.slices}, group_size={s.group_size}"
        )


def check_budget(avg_bits: float, bits: int, slices: int) -> None:
    if not bits <= avg_bits <= bits * slices:
        raise ValueError(f"avg_bits must be in [{bits}, {bits * slices}], got {avg_bits!r}")


BUDGETS_PER_SLICE = 8
"""the routers' thresholds are fitted at every 1/8 slice of average depth (:func:`budget_grid`)"""


def budget_grid(bits: int, slices: int) -> list[float]:
    """The average code bits a router serves: ``bits`` to ``bits * slices`` in steps of
    ``bits / BUDGETS_PER_SLICE`` (2, 2.25, ..., 8 for four 2-bit slices)."""
    return [bits * (1 + k / BUDGETS_PER_SLICE) for k in range(BUDGETS_PER_SLICE * (slices - 1) + 1)]


def budget_index(avg_bits: float, bits: int, slices: int) -> int:
    """The position of ``avg_bits`` in :func:`budget_grid` (a ValueError naming the grid if off it)."""
    check_budget(avg_bits, bits, slices)
    position = (avg_bits / bits - 1) * BUDGETS_PER_SLICE
    if abs(position - round(position)) > 1e-6:
        raise ValueError(
            f"avg_bits must be a multiple of {bits / BUDGETS_PER_SLICE:g} bits (1/"
            f"{BUDGETS_PER_SLICE} slice, where the routers' thresholds were fitted), got "
            f"{avg_bits!r}"
        )
    return round(position)


def depth_plan(avg_bits: float, bits: int, slices: int) -> tuple[int, float]:
    """``(base depth, share of tokens one slice deeper)`` averaging ``avg_bits`` code bits: only
    the two depths next to the average are used, since the error falls ~4x per slice (convex),
    so spreading tokens wider costs more on the starved tokens than it gains on the others."""
    check_budget(avg_bits, bits, slices)
    depth = avg_bits / bits
    base = min(int(depth), slices - 1)
    return base, depth - base


def upper_threshold(scores: torch.Tensor, share: float) -> float:
    """The score above which the top ``share`` of ``scores`` lie (+inf for none, -inf for all)."""
    scores = scores.detach().flatten().float()
    count = round(share * len(scores))
    if count <= 0:
        return math.inf
    if count >= len(scores):
        return -math.inf
    return scores.sort().values[len(scores) - count - 1].item()


class MoBiRouter(nn.Module):
    """MoBiRoute: per-token scores from the block's input hidden state, one per slice (how much a
    token gains from slice ``d + 1`` on top of ``d``, :func:`~.calibrate._train_router`); at an
    average of ``base + share`` slices, the tokens whose score for slice ``base + 1`` is above
    the budget's threshold read ``base + 1`` slices and the others ``base``.

    The thresholds of every budget in :func:`budget_grid` are fitted once, after calibration
    (:func:`~.model.fit_thresholds`), and stored in the ``thresholds`` buffer: switching budgets
    (:meth:`use_budget`) runs nothing. A budget guard keeps what the router reads on budget on
    any text: it counts the tokens sent deeper since the budget was set against ``share`` of all
    tokens, and when a call would take that excess past ``GUARD_TOKENS`` it sends the number of
    top-scoring tokens that keeps it within (fewer, or more when under budget) (an exact quantile at large calls; one token either way
    at decoding). Without it, text unlike the calibration text shifts the scores and the bits read.

    Always float32, whatever the model's dtype or torch's default dtype, so that a bf16 model
    rebuilt by ``from_pretrained`` (which builds under the model's dtype) gets the router it saved.
    """

    GUARD_TOKENS = 4.0

    def __init__(self, hidden_size: int, slices: int, hidden: int = 32, bits: int = 2) -> None:
        super().__init__()
        if slices < 2:
            raise ValueError(f"a router needs slices >= 2 to choose from, got {slices}")
        self.slices, self.bits = slices, bits
        self.up = nn.Linear(hidden_size, hidden, dtype=torch.float32)
        self.down = nn.Linear(hidden, slices - 1, dtype=torch.float32)  # one score per slice
        grid = len(budget_grid(bits, slices))
        self.register_buffer("thresholds", torch.full((grid,), math.inf, dtype=torch.float32))
        # tokens sent deeper minus share * tokens, since the budget was set (the guard)
        self.register_buffer("excess", torch.zeros((), dtype=torch.float32), persistent=False)
        self.base, self.share, self.threshold = slices, 0.0, math.inf  # all slices until set
        self.budget_index: int | None = None
        self.fit_to: float | None = None  # fit_thresholds: place the threshold on this batch

    def forward(self, hidden: torch.Tensor, base: int | None = None) -> torch.Tensor:
        """Scores ``[tokens, slices - 1]``: column ``d - 1`` says how much a token gains from
        slice ``d + 1`` when it reads ``d``; with ``base``, that column ``[tokens]`` alone."""
        h = F.rms_norm(hidden.to(self.up.weight.dtype), (hidden.shape[-1],))
        scores = self.down(F.gelu(self.up(h))).flatten(0, -2)
        return scores if base is None else scores[:, min(base, self.slices - 1) - 1]

    def use_budget(self, avg_bits: float) -> None:
        """Read ``avg_bits`` on average from now on, with the stored threshold (no forward)."""
        self.base, self.share = depth_plan(avg_bits, self.bits, self.slices)
        self.budget_index = budget_index(avg_bits, self.bits, self.slices)
        self.threshold = float(self.thresholds[self.budget_index])
        self.excess.zero_()

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        if self.budget_index is not None:  # the current budget's threshold from the new buffer
            self.threshold = float(self.thresholds[self.budget_index])
            self.excess.zero_()

    def depths(self) -> tuple[int, ...]:
        """The depths the router's tokens read at the current budget."""
        return (self.base,) if self.share == 0 else (self.base, self.base + 1)

    def depth(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each token's depth at the current budget (no host sync)."""
        if self.fit_to is not None:
            self.base, self.share = depth_plan(self.fit_to, self.bits, self.slices)
            scores = self(hidden, self.base)
            self.threshold = upper_threshold(scores, self.share)
            return self.base + (scores > self.threshold).long()
        scores = self(hidden, self.base)
        deeper = scores > self.threshold
        # the guard: the count this call may send deeper keeps |excess| <= GUARD_TOKENS
        wanted = self.share * scores.numel() - self.excess
        count = deeper.sum().clamp(wanted - self.GUARD_TOKENS, wanted + self.GUARD_TOKENS)
        count = count.round().clamp(0, scores.numel())
        rank = scores.argsort(descending=True).argsort()  # 0 for the highest score
        deeper = rank < count  # the top `count` by score: the same tokens when none is forced
        self.excess += deeper.sum() - self.share * scores.numel()
        return self.base + deeper.long()

    def parameter_bits(self) -> int:
        """Storage of the router in bits (fp16 weights and biases, float32 thresholds)."""
        return 16 * sum(p.numel() for p in self.parameters()) + 32 * self.thresholds.numel()
