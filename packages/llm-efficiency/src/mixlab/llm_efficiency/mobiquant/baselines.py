"""The baselines MoBiQuant is measured against, on the same layers, groups and calibration data.

Each function quantizes the linear layers inside the decoder blocks of ``model`` IN PLACE to
``bits`` and writes back the dequantized weights (fake quantization: the perplexity is the
quantized model's; storage is counted separately by :func:`per_bit_storage_bits`). All use
asymmetric per-group quantization with ``group_size`` input columns per scale and zero.

- :func:`rtn_`: round to nearest on the min-max grid (integer zero point).
- :func:`gptq_`: GPTQ (Frantar et al. 2023), our own implementation: columns quantized in order,
  each one's error spread over the columns still to come with the inverse Hessian of the
  layer's calibration inputs; blocks quantized in sequence on the quantized model's inputs.
- :func:`hqq_`: HQQ-style calibration-free quantization (Badri & Shaji 2023): the zero point is
  fitted by half-quadratic splitting of a sparsity-promoting l_p (p < 1) weight error.
- :func:`matryoshka_`: Matryoshka-style slicing (MatQuant): an 8-bit model whose ``bits`` most
  significant bits are kept, ROUNDING when slicing (MoBiSlice truncates).
- :func:`clip_rtn_`: round to nearest with per-group clipping fitted at ``calibrate_bits`` on the
  layer's input statistics (OmniQuant's learnable clipping, by grid search): run at another
  precision, it measures the cost of calibrating at one precision and running at another.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mixlab.llm_efficiency.mobiquant.calibrate import (
    BlockCall,
    capture_block_inputs,
    run_block_chunked,
)
from mixlab.llm_efficiency.mobiquant.layer import as_out_in
from mixlab.llm_efficiency.mobiquant.model import block_linears, decoder_blocks
from mixlab.llm_efficiency.mobiquant.slices import group_view
from mixlab.shared import progress

__all__ = [
    "BASELINES",
    "clip_rtn_",
    "gptq_",
    "gptq_weight",
    "hqq_",
    "matryoshka_",
    "minmax_affine",
    "per_bit_storage_bits",
    "rtn_",
    "upscale",
]


def _check(bits: int, group_size: int, model: nn.Module) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an integer in 1..8, got {bits!r}")
    for _, name, module in block_linears(model):
        width = as_out_in(module, name).shape[1]
        if width % group_size:
            raise ValueError(
                f"group_size={group_size} must divide the input width of {name} ({width})"
            )


def _grouped_float(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    return group_view(weight.float(), group_size)


def _set_out_in(module: nn.Module, weight: torch.Tensor) -> None:
    target = module.weight.data
    target.copy_(weight.t() if type(module).__name__ == "Conv1D" else weight)


def minmax_affine(
    weight: torch.Tensor, bits: int, group_size: int, clip: torch.Tensor | float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and INTEGER zero ``[out, groups]`` of the ``2^bits``-level grid over each group's
    (clipped) range, the GPTQ / AWQ / RTN convention."""
    grouped = _grouped_float(weight, group_size)
    low, high = grouped.amin(-1), grouped.amax(-1)
    middle, half = (high + low) / 2, (high - low) / 2 * clip
    low, high = middle - half, middle + half
    scale = ((high - low) / (2**bits - 1)).clamp_min(1e-8)
    return scale, (-low / scale).round()


def _fake_quant(
    weight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int
) -> torch.Tensor:
    """Round to the grid of ``scale``/``zero`` (per group, broadcast over ``weight`` [out, groups, g])."""
    q = (weight / scale[..., None] + zero[..., None]).round().clamp(0, 2**bits - 1)
    return scale[..., None] * (q - zero[..., None])


def _each_layer(model: nn.Module, quantize: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    with torch.no_grad():
        for _, name, module in block_linears(model):
            weight = as_out_in(module, name)
            _set_out_in(module, quantize(weight.float()).reshape(weight.shape).to(weight.dtype))
    return model


def rtn_(model: nn.Module, bits: int, group_size: int) -> nn.Module:
    _check(bits, group_size, model)

    def quantize(w: torch.Tensor) -> torch.Tensor:
        return _fake_quant(_grouped_float(w, group_size), *minmax_affine(w, bits, group_size), bits)

    return _each_layer(model, quantize)


def _shrink_lp(x: torch.Tensor, beta: float, p: float) -> torch.Tensor:
    """The proximal operator of the l_p "norm" (p < 1): generalised soft thresholding."""
    return torch.sign(x) * torch.relu(x.abs() - x.abs().clamp_min(1e-12).pow(p - 1) / beta)


def hqq_(
    model: nn.Module, bits: int, group_size: int, *, iterations: int = 20, p: float = 0.7
) -> nn.Module:
    """HQQ: alternate W_e = shrink_lp(W - dequant(Q(W))) and the zero that best explains
    ``Q(W) - (W - W_e) / s``; beta grows by 1% per step; the best zero seen is kept."""
    _check(bits, group_size, model)

    def quantize(w: torch.Tensor) -> torch.Tensor:
        grouped = _grouped_float(w, group_size)
        scale, zero = minmax_affine(w, bits, group_size)
        zero = zero.clone()
        beta, best, best_zero = 10.0, float("inf"), zero.clone()
        for _ in range(iterations):
            codes = (grouped / scale[..., None] + zero[..., None]).round().clamp(0, 2**bits - 1)
            approx = scale[..., None] * (codes - zero[..., None])
            error = (grouped - approx).abs().mean().item()
            if error >= best:
                break
            best, best_zero = error, zero.clone()
            sparse_error = _shrink_lp(grouped - approx, beta, p)
            zero = (codes - (grouped - sparse_error) / scale[..., None]).mean(-1)
            beta *= 1.01
        return _fake_quant(grouped, scale, best_zero, bits)

    return _each_layer(model, quantize)


def matryoshka_(model: nn.Module, bits: int, group_size: int, parent_bits: int = 8) -> nn.Module:
    """Keep the ``bits`` most significant bits of an ``parent_bits`` min-max model, rounding:
    ``q_k = clamp((q + 2^{drop-1}) >> drop)`` with the parent's scale times ``2^drop``."""
    _check(bits, group_size, model)
    if bits > parent_bits:
        raise ValueError(f"bits must be <= parent_bits={parent_bits}, got {bits}")
    drop = parent_bits - bits

    def quantize(w: torch.Tensor) -> torch.Tensor:
        grouped = _grouped_float(w, group_size)
        scale, zero = minmax_affine(w, parent_bits, group_size)
        parent = (grouped / scale[..., None] + zero[..., None]).round().clamp(0, 2**parent_bits - 1)
        if drop:
            parent = ((parent + 2 ** (drop - 1)) / 2**drop).floor().clamp(0, 2**bits - 1) * 2**drop
        return scale[..., None] * (parent - zero[..., None])

    return _each_layer(model, quantize)


def _input_statistics(
    model: nn.Module, calib: torch.Tensor, statistic: Callable[[torch.Tensor], torch.Tensor]
) -> dict[int, torch.Tensor]:
    """Sum of ``statistic(x)`` over the inputs ``x`` [tokens, in] of every target layer, keyed
    by ``id(module)``, from one full-precision forward pass."""
    sums: dict[int, torch.Tensor] = {}
    handles = []

    def hook(module: nn.Module, args: tuple) -> None:
        x = args[0].reshape(-1, args[0].shape[-1]).float()
        sums[id(module)] = sums.get(id(module), 0) + statistic(x)

    for _, _, module in block_linears(model):
        handles.append(module.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            model(input_ids=calib.long().to(next(model.parameters()).device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return sums


def clip_rtn_(
    model: nn.Module,
    bits: int,
    group_size: int,
    calib: torch.Tensor,
    *,
    calibrate_bits: int | None = None,
    ratios: tuple[float, ...] = tuple(1.0 - 0.05 * i for i in range(11)),
) -> nn.Module:
    """Round to nearest at ``bits`` with the per-group clip ratio that minimises the layer's
    output error ``sum_k E[x_k^2] (W - Q(W))_k^2`` at ``calibrate_bits`` (default ``bits``)."""
    _check(bits, group_size, model)
    calibrate_bits = calibrate_bits or bits
    second_moments = _input_statistics(model, calib, lambda x: x.pow(2).sum(0))
    with torch.no_grad():
        for _, name, module in block_linears(model):
            weight = as_out_in(module, name)
            grouped = _grouped_float(weight, group_size)
            importance = _grouped_float(second_moments[id(module)][None, :], group_size)
            errors = []
            for ratio in ratios:
                approx = _fake_quant(
                    grouped,
                    *minmax_affine(weight, calibrate_bits, group_size, ratio),
                    calibrate_bits,
                )
                errors.append(((grouped - approx).pow(2) * importance).sum(-1))
            best = torch.tensor(ratios, device=weight.device)[torch.stack(errors).argmin(0)]
            approx = _fake_quant(grouped, *minmax_affine(weight, bits, group_size, best), bits)
            _set_out_in(module, approx.reshape(weight.shape).to(weight.dtype))
    return model


def gptq_weight(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    bits: int,
    group_size: int,
    *,
    damp: float = 0.01,
    block_size: int = 128,
    scales: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """GPTQ of one weight ``[out, in]`` with ``hessian`` = 2 E[x x^T] ``[in, in]``; returns the
    dequantized weight. Group scales/zeros are min-max of the group's columns when the sweep
    reaches them (already updated by earlier columns' errors), as in the reference algorithm.
    ``scales``: a list that gets each group's scale ``[out]``, in order."""
    w = weight.float().clone()
    h = hessian.float().clone()
    dead = h.diagonal() == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += damp * h.diagonal().mean() * torch.eye(len(h), device=h.device)
    # the upper Cholesky factor of H^-1 gives each column's update row (GPTQ Eq. 4 and §4 "Step 3")
    h_inv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    columns = w.shape[1]
    block_size = max(group_size, block_size // group_size * group_size)
    out = torch.zeros_like(w)
    for start in range(0, columns, block_size):
        end = min(start + block_size, columns)
        block, errors = (
            w[:, start:end].clone(),
            torch.zeros(w.shape[0], end - start, device=w.device),
        )
        h_block = h_inv[start:end, start:end]
        for i in range(end - start):
            if i % group_size == 0:
                scale, zero = minmax_affine(block[:, i : i + group_size], bits, group_size)
                scale, zero = scale[:, 0], zero[:, 0]
                if scales is not None:
                    scales.append(scale)
            q = ((block[:, i] / scale + zero).round().clamp(0, 2**bits - 1) - zero) * scale
            out[:, start + i] = q
            error = (block[:, i] - q) / h_block[i, i]
            block[:, i:] -= error[:, None] * h_block[i, i:][None, :]
            errors[:, i] = error
        w[:, end:] -= errors @ h_inv[start:end, end:]
    return out


def _block_hessians(
    block: nn.Module, hidden: torch.Tensor, call: BlockCall, modules: list[nn.Module]
) -> dict[int, torch.Tensor]:
    """``2 E[x x^T]`` of each module's inputs while ``block`` runs on ``hidden``."""
    sums: dict[int, torch.Tensor] = {}
    counts: dict[int, int] = {}

    def hook(module: nn.Module, args: tuple) -> None:
        x = args[0].reshape(-1, args[0].shape[-1]).float()
        sums[id(module)] = sums.get(id(module), 0) + 2 * x.t() @ x
        counts[id(module)] = counts.get(id(module), 0) + len(x)

    handles = [module.register_forward_pre_hook(hook) for module in modules]
    try:
        run_block_chunked(block, hidden, call)
    finally:
        for handle in handles:
            handle.remove()
    return {key: total / counts[key] for key, total in sums.items()}


def gptq_(
    model: nn.Module,
    bits: int,
    group_size: int,
    calib: torch.Tensor,
    *,
    damp: float = 0.01,
    upscale_to: int | None = None,
) -> nn.Module:
    """GPTQ every target layer, block after block, each block's Hessians taken on the outputs
    of the blocks quantized before it. ``upscale_to``: then read the ``bits``-bit GPTQ model as
    the seed of Any-Precision-LLM-style upscaling (:func:`upscale`) at ``upscale_to`` bits."""
    _check(bits, group_size, model)
    if upscale_to is not None and not bits <= upscale_to <= 8:
        raise ValueError(
            f"upscale_to must be in {bits}..8 (the seed's bits up), got {upscale_to!r}"
        )
    hidden, call = capture_block_inputs(model, calib)
    layers = block_linears(model)
    blocks = decoder_blocks(model)
    with progress(len(blocks), "GPTQ blocks") as bar:
        for index, block in enumerate(blocks):
            targets = [(name, module) for i, name, module in layers if i == index]
            hessians = _block_hessians(block, hidden, call, [module for _, module in targets])
            with torch.no_grad():
                for name, module in targets:
                    weight = as_out_in(module, name)
                    scales: list[torch.Tensor] = []
                    seed = gptq_weight(weight, hessians[id(module)], bits, group_size, damp=damp,
                                       scales=scales)  # fmt: skip
                    if upscale_to is not None:
                        step = torch.stack(scales, 1).repeat_interleave(group_size, 1)
                        seed = upscale(weight.float(), seed, step, upscale_to - bits)
                    _set_out_in(module, seed.to(weight.dtype))
            hidden = run_block_chunked(block, hidden, call)
            bar.advance()
    return model


def upscale(
    weight: torch.Tensor, seed: torch.Tensor, step: torch.Tensor, extra_bits: int
) -> torch.Tensor:
    """Any-Precision LLM's incremental upscaling (Park et al. 2024), on a uniform grid: each seed
    level ``L`` (bin ``[L - step/2, L + step/2)``) is split into ``2^extra_bits`` equal sub-bins
    and the original ``weight`` picks its sub-bin (clamped: GPTQ may have sent it to a
    neighbouring level), read at the sub-bin's middle. The seed's codes are the top bits of every
    upscaled code, so one checkpoint of the highest width serves each width below it. (The
    paper's seed is SqueezeLLM's non-uniform levels, refined by weighted k-means per split.)"""
    parts = 2**extra_bits
    low = seed - step / 2
    sub = ((weight - low) / step * parts).floor().clamp(0, parts - 1)
    return low + step * (sub + 0.5) / parts


BASELINES = {"rtn": rtn_, "hqq": hqq_, "matryoshka": matryoshka_, "gptq": gptq_}


def per_bit_storage_bits(weights: int, bits: int, group_size: int, scale_bits: int = 16) -> int:
    """Bits of one per-bit checkpoint of ``weights`` quantized weights: codes plus a scale and a
    zero of ``scale_bits`` each per group."""
    return weights * bits + 2 * scale_bits * weights // group_size
