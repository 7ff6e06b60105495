"""Block-wise calibration of MoBiQuant (paper Algorithm 1, OmniQuant-style).

Block by block, with the full-precision weights frozen, the quantized block is trained to
reproduce the full-precision block's outputs on calibration tokens:

- stage 1 ("first slice stabilization"): the first ``first_slice_fraction`` of the steps read the
  first slice alone and fit the groups' ranges (learnable weight clipping) to it;
- stage 2: the ranges again, each step at a uniform depth drawn from 1..slices, so that they
  serve every precision; the learned ranges are then kept only if they beat the min-max ranges
  on held-out calibration sequences (:func:`_keep_ranges_if_better`);
- stage 3 (with a router): the ranges frozen (their levels computed once), the block runs every
  calibration token at each uniform depth; a token's gain from slice ``d + 1`` is how much its
  block-output error ``||F_d(x) - F(x)||^2`` falls, and the router's score column ``d`` regresses
  that gain (standardised). At a budget the tokens above the threshold are then the ones the next
  slice helps most, the allocation that minimises the block's summed error if tokens did not
  interact. (Our first router trained end to end through straight-through hard gates at a random
  budget, with one score for every slice; on the 4,000-step quick model it gained 0.014, 0.024
  and -0.008 perplexity over random depths at 2.5, 3 and 3.5 bits, and this one 0.087, 0.114 and
  0.044 on the same seed, calibrating in a fifth of the time. Training ranges and router
  together, the version before, let the ranges follow the routed mix of depths; staged, the
  router-free ablation has the very same slices.)

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
    MoBiQuantConfig,
    _attach,
    _replace,
    block_linears,
    decoder_blocks,
    fit_thresholds,
)
from mixlab.shared import progress

__all__ = ["BlockCall", "calibrate_", "capture_block_inputs", "run_block"]


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
    router_generator = torch.Generator().manual_seed(config.seed + 1)
    hidden, call = capture_block_inputs(model, calib)
    steps = config.calib_steps + (config.router_steps if config.router else 0)
    with progress(len(blocks) * steps, "MoBiQuant block-wise calibration") as bar:
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
            _train_ranges(state, layers, config, generator, bar)
            _keep_ranges_if_better(state, layers)
            if router is not None:  # its own random stream: the slices match the router-free run's
                _train_router(state, layers, router, config, router_generator, bar)
            for layer in layers:
                _set([layer])
                layer.finish_calibration()
            if router is not None:
                router.requires_grad_(False)
            hidden = target  # the next block reads full-precision inputs (see the module doc)
    for parameter in trainable:  # as the caller had them (the quantized layers hold buffers)
        parameter.requires_grad_(True)
    _attach(model, config)
    if config.router:  # every budget's thresholds, from these tokens; the tokens are not kept
        fit_thresholds(model, calib)
    return model


def _calibration_step(state, rows, optimizer, bar) -> None:
    """One AdamW step of the ranges on the block's log output MSE."""
    block, hidden, call, target = state
    with torch.enable_grad():  # also under a caller's no_grad
        # log-MSE: every budget's step counts by its relative improvement, so the large errors of
        # the 2-bit read do not drown the 8-bit read's
        loss = F.mse_loss(run_block(block, hidden, call, rows), target[rows]).log()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
    optimizer.step()
    bar.advance(loss=loss.item())


def _train_ranges(state, layers, config: MoBiQuantConfig, generator, bar) -> None:
    """Stages 1 and 2 (see the module doc): the groups' ranges, at the first slice, then at a
    uniform depth drawn per step."""
    hidden = state[1]
    parameters = [p for layer in layers for p in layer.calibration.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=config.lwc_lr, weight_decay=0.0)
    stage1 = int(config.first_slice_fraction * config.calib_steps)
    for step in range(config.calib_steps):
        rows = torch.randint(_trained(hidden.shape[0]), (config.calib_batch,), generator=generator)
        depth = (
            1
            if step < stage1
            else int(torch.randint(1, config.slices + 1, (), generator=generator))
        )
        _set(layers, precision=depth)
        _calibration_step(state, rows, optimizer, bar)
    _set(layers)


@torch.no_grad()
def _slice_gains(state, layers: list[MoBiLinear]) -> torch.Tensor:
    """``[tokens, slices - 1]``: how much each token's block-output error falls when every token
    reads slice ``d + 1`` on top of ``d`` (column ``d - 1``), ``||F_d - F||^2 - ||F_{d+1} - F||^2``."""
    block, hidden, call, target = state
    errors = []
    for depth in range(1, layers[0].spec.slices + 1):
        _set(layers, precision=depth)
        errors.append((run_block_chunked(block, hidden, call) - target).pow(2).sum(-1).flatten())
    _set(layers)
    return torch.stack([errors[d] - errors[d + 1] for d in range(len(errors) - 1)], dim=1)


def _train_router(
    state, layers, router: MoBiRouter, config: MoBiQuantConfig, generator, bar
) -> None:
    """Stage 3 (see the module doc): each score column regresses the standardised gain of its slice
    (:func:`_slice_gains`), so at any budget the tokens above the threshold are those whose
    block error the next slice lowers most (the allocation that minimises the block's summed
    error when tokens did not interact)."""
    hidden = state[1]
    for layer in layers:
        layer.calibration.freeze(config.spec())
    gains = _slice_gains(state, layers)
    targets = (gains - gains.mean(0)) / gains.std(0).clamp_min(1e-12)
    inputs = hidden.flatten(0, -2)
    optimizer = torch.optim.AdamW(router.parameters(), lr=config.router_lr, weight_decay=0.0)
    batch = config.calib_batch * hidden.shape[1]  # as many tokens as a range step sees
    for _ in range(config.router_steps):
        rows = torch.randint(len(inputs), (batch,), generator=generator)
        with torch.enable_grad():
            loss = F.mse_loss(router(inputs[rows]), targets[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        optimizer.step()
        bar.advance(loss=loss.item())


def _trained(sequences: int) -> int:
    """The first 3/4 of the calibration sequences train; the rest (at least one, when there are
    two or more) judge the learned ranges in :func:`_keep_ranges_if_better`."""
    return max(1, sequences - max(1, sequences // 4)) if sequences > 1 else 1


@torch.no_grad()
def _depth_error(state, layers: list[MoBiLinear]) -> float:
    """Mean over depths of the block's log output MSE on the held-out calibration sequences."""
    block, hidden, call, target = state
    sequences = hidden.shape[0]
    rows = torch.arange(_trained(sequences), sequences) if sequences > 1 else torch.arange(1)
    errors = []
    for depth in range(1, layers[0].spec.slices + 1):
        _set(layers, precision=depth)
        errors.append(F.mse_loss(run_block(block, hidden, call, rows), target[rows]).log().item())
    _set(layers)
    return sum(errors) / len(errors)


@torch.no_grad()
def _keep_ranges_if_better(state, layers: list[MoBiLinear]) -> None:
    """Learnable clipping only where it helps: back to the min-max ranges (theta = 0) unless the
    learned ones lower the depth-averaged error on calibration sequences the training did not see
    (clipping for the first slice saturates the deeper reads, see .slices)."""
    if not layers:
        return
    learned = _depth_error(state, layers)
    saved = [(p, p.detach().clone()) for layer in layers for p in layer.calibration.parameters()]
    for parameter, _ in saved:
        parameter.zero_()
    if _depth_error(state, layers) > learned:
        for parameter, value in saved:
            parameter.copy_(value)


def _set(layers: list[MoBiLinear], precision: int | None = None) -> None:
    for layer in layers:
        layer.precision = precision
