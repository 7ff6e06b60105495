"""Block-wise calibration of MoBiQuant (paper Algorithm 1, OmniQuant-style).

Block by block, with the full-precision weights frozen, the quantized block is trained to
reproduce the full-precision block's outputs on calibration tokens:

- stage 1 ("first slice stabilization"): the first ``first_slice_fraction`` of the steps read the
  first slice alone and fit the groups' ranges (learnable weight clipping) to it;
- stage 2: each step draws a target budget ``b* ~ U[bits, bits * slices]``, sends the batch's
  top-scoring tokens one slice deeper than the base depth so that it averages ``b*`` (hard
  gates forward, the sigmoid relaxation's gradient backward: straight-through), and
  minimises ``||F_q(X) - F(X)||^2 / ||F(X)||^2 + lambda ((soft bits - b*) / max_bits)^2``, so the
  ranges serve every precision and the router learns which tokens gain most from more slices.
  Without a router, stage 2 draws one uniform depth per step instead.

Both the quantized and the full-precision block read the full-precision block inputs: an elastic
model runs at many precisions, so no single precision's errors are propagated. LET (OmniQuant's
learnable equivalent transformation) is not implemented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mixlab.llm_efficiency.mobiquant.layer import MoBiLinear, MoBiRouter, as_out_in
from mixlab.llm_efficiency.mobiquant.model import (
    CALIBRATION_BUFFER,
    MoBiQuantConfig,
    _attach,
    _replace,
    block_linears,
    decoder_blocks,
)
from mixlab.shared import progress

__all__ = ["BlockCall", "calibrate_", "capture_block_inputs", "run_block"]

STORED_SEQUENCES = (
    16  # calibration sequences kept in the model, on which set_budget fits thresholds
)


class _Stop(Exception):
    pass


@dataclass(frozen=True)
class BlockCall:
    """What the model passes its decoder blocks besides the hidden state (rotary embeddings,
    masks, ...), positional and keyword, as captured for the calibration batch."""

    args: tuple
    kwargs: dict[str, Any]

    def rows(self, rows: torch.Tensor, total: int) -> BlockCall:
        """The call for the sequences ``rows`` of ``total``: per-sequence tensors (masks, at
        least 2-D with ``total`` rows) are sliced, shared ones (rotary tables) kept."""
        return BlockCall(_rows_of(self.args, rows, total), _rows_of(self.kwargs, rows, total))


@torch.no_grad()
def capture_block_inputs(model: nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, BlockCall]:
    """The first decoder block's hidden-state input ``[sequences, seq_len, hidden]`` for
    ``tokens`` and the rest of the call the model makes (positional arguments included: GPT-2
    passes its mask positionally), captured by a pre-hook that stops the forward there."""
    if tokens.dim() != 2:
        raise ValueError(
            f"calib: token ids must be [sequences, seq_len], got shape {tuple(tokens.shape)}"
        )
    block, captured = decoder_blocks(model)[0], {}

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        kwargs = dict(kwargs)
        captured["hidden"] = args[0] if args else kwargs.pop("hidden_states")
        captured["call"] = BlockCall(tuple(args[1:]), kwargs)
        raise _Stop

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    device = next(model.parameters()).device
    try:
        model(input_ids=tokens.long().to(device), use_cache=False)
    except _Stop:
        pass
    finally:
        handle.remove()
    return captured["hidden"], captured["call"]


def _rows_of(value: Any, rows: torch.Tensor, total: int) -> Any:
    if torch.is_tensor(value) and value.dim() >= 2 and value.shape[0] == total and total > 1:
        return value[rows]
    if isinstance(value, tuple):
        return tuple(_rows_of(v, rows, total) for v in value)
    if isinstance(value, dict):
        return {k: _rows_of(v, rows, total) for k, v in value.items()}
    return value


def run_block(
    block: nn.Module, hidden: torch.Tensor, call: BlockCall, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """``block`` on the sequences ``rows`` of ``hidden`` (all when None); returns the block's
    output hidden state."""
    if rows is not None:
        call = call.rows(rows, hidden.shape[0])
        hidden = hidden[rows]
    out = block(hidden, *call.args, **call.kwargs)
    return out[0] if isinstance(out, tuple) else out


@torch.no_grad()
def run_block_chunked(
    block: nn.Module, hidden: torch.Tensor, call: BlockCall, chunk: int = 16
) -> torch.Tensor:
    outs = [
        run_block(block, hidden, call, torch.arange(start, min(start + chunk, hidden.shape[0])))
        for start in range(0, hidden.shape[0], chunk)
    ]
    return torch.cat(outs)


def calibrate_(model: nn.Module, config: MoBiQuantConfig, calib: torch.Tensor) -> nn.Module:
    """Replace the target layers block by block with calibrated :class:`MoBiLinear` layers (and
    train each block's :class:`MoBiRouter` when ``config.router``)."""
    spec = config.spec()
    blocks = decoder_blocks(model)
    by_block: dict[int, list[tuple[str, nn.Module]]] = {}
    for index, name, module in block_linears(model, config.target_modules):
        by_block.setdefault(index, []).append((name, module))
    trainable = [p for p in model.parameters() if p.requires_grad]
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(config.seed)
    hidden, call = capture_block_inputs(model, calib)
    with progress(len(blocks) * config.calib_steps, "MoBiQuant block-wise calibration") as bar:
        for index, block in enumerate(blocks):
            target = run_block_chunked(block, hidden, call)
            layers = []
            for name, module in by_block.get(index, []):
                layer = MoBiLinear.shaped_like(module, spec, name=name)
                weight = as_out_in(module, name).float()
                layer.start_calibration(weight)
                _replace(block, name, layer)
                layers.append(layer)
            router = None
            if config.router:
                router = MoBiRouter(hidden.shape[-1], spec.slices, config.router_hidden, spec.bits)
                block.mobi_router = router.to(hidden.device)
            state = (block, hidden, call, target)
            _train_block(state, layers, router, config, generator, bar)
            _keep_ranges_if_better(state, layers)
            for layer in layers:
                _set([layer])
                layer.finish_calibration()
            if router is not None:
                router.requires_grad_(False)
            hidden = target  # the next block reads full-precision inputs (see the module doc)
    for parameter in trainable:  # as the caller had them (the quantized layers hold buffers)
        parameter.requires_grad_(True)
    model.register_buffer(CALIBRATION_BUFFER, calib[:STORED_SEQUENCES].long().clone())
    _attach(model, config)
    return model


def _train_block(state, layers, router, config: MoBiQuantConfig, generator, bar) -> None:
    """Stage 1 then stage 2 (see the module doc) on random calibration sequences."""
    block, hidden, call, target = state
    spec = config.spec()
    groups = [
        {
            "params": [p for layer in layers for p in layer.calibration.parameters()],
            "lr": config.lwc_lr,
        }
    ]
    if router is not None:
        groups.append({"params": list(router.parameters()), "lr": config.router_lr})
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
    stage1 = int(config.first_slice_fraction * config.calib_steps)
    for step in range(config.calib_steps):
        rows = torch.randint(hidden.shape[0], (config.calib_batch,), generator=generator)
        budget_loss = torch.zeros(())
        if step < stage1:
            _set(layers, precision=1)
        elif router is None:
            _set(layers, precision=int(torch.randint(1, spec.slices + 1, (), generator=generator)))
        with torch.enable_grad():  # also under a caller's no_grad: the router must learn
            if step >= stage1 and router is not None:
                u = torch.rand((), generator=generator).item()
                target_bits = spec.bits + (spec.max_bits - spec.bits) * u
                gates, soft_bits = router.gates(router(hidden[rows]), target_bits)
                _set(layers, gates=gates)
                budget_loss = (
                    config.budget_weight * ((soft_bits - target_bits) / spec.max_bits) ** 2
                )
            # log-MSE: every budget's step counts by its relative improvement, so the large
            # errors of the 2-bit read do not drown the 8-bit read's
            loss = F.mse_loss(run_block(block, hidden, call, rows), target[rows]).log()
            loss = loss + budget_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        optimizer.step()
        bar.advance(loss=loss.item())
    _set(layers)


@torch.no_grad()
def _depth_error(state, layers: list[MoBiLinear], sequences: int = 16) -> float:
    """Mean over depths of the block's log output MSE on the first calibration sequences."""
    block, hidden, call, target = state
    rows = torch.arange(min(sequences, hidden.shape[0]))
    errors = []
    for depth in range(1, layers[0].spec.slices + 1):
        _set(layers, precision=depth)
        errors.append(F.mse_loss(run_block(block, hidden, call, rows), target[rows]).log().item())
    _set(layers)
    return sum(errors) / len(errors)


@torch.no_grad()
def _keep_ranges_if_better(state, layers: list[MoBiLinear]) -> None:
    """Learnable clipping only where it helps: back to the min-max ranges (theta = 0) when the
    learned ones do not lower the depth-averaged error (clipping for the first slice saturates
    the deeper reads, see .slices)."""
    if not layers:
        return
    learned = _depth_error(state, layers)
    saved = [(p, p.detach().clone()) for layer in layers for p in layer.calibration.parameters()]
    for parameter, _ in saved:
        parameter.zero_()
    if _depth_error(state, layers) > learned:
        for parameter, value in saved:
            parameter.copy_(value)


def _set(
    layers: list[MoBiLinear], precision: int | None = None, gates: torch.Tensor | None = None
) -> None:
    for layer in layers:
        layer.precision = precision
        layer.train_gates = gates
