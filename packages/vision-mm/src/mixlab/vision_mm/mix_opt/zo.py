"""MeZO-style zeroth-order steps on a model's trainable parameters (Malladi et al., 2023).

The direction z ~ N(0, I) is never stored: it is regenerated from a seed each time it is
needed, so a step costs two forward passes and no activations, gradients or optimizer state.

    perturb θ ← θ + ε·z;  L₊ = L(θ)   perturb θ ← θ − 2ε·z;  L₋ = L(θ)   perturb θ ← θ + ε·z
    ĝ = (L₊ − L₋) / 2ε                      (the projected gradient, MeZO Alg. 1)
    θ ← θ − η·(ĝ·z + λ·θ)

The +1, −2, +1 order restores θ up to float rounding; with ``exact=True`` (the default) the
trainable tensors are also snapshotted and copied back, so θ is restored bit for bit at the
cost of one copy of the trainable parameters (a LoRA adapter: tens of KiB). Both forwards see the
same batch, noise and timesteps (common random numbers), which the caller's ``loss`` must ensure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def perturb_(params: Sequence[torch.Tensor], seed: int, scale: float) -> None:
    """θ ← θ + scale·z in place, with z ~ N(0, I) drawn from ``seed`` (the same z every call).

    z is drawn on each parameter's device, in its dtype, by a generator of that device (one per
    device, advanced in parameter order; cuda:k's seed is offset by k + 1, so parameters of one
    shape on two GPUs get independent z): nothing is copied from the host, and a given seed gives
    the same z on every call on the same devices (a CUDA z differs from a CPU one)."""
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for p in params:
            if p.device not in generators:
                offset = 0 if p.device.index is None else (p.device.index + 1) * 1_000_003
                generators[p.device] = torch.Generator(device=p.device).manual_seed(seed + offset)
            z = torch.randn(p.shape, generator=generators[p.device], device=p.device, dtype=p.dtype)
            p.add_(z, alpha=scale)


def projected_gradient(
    params: Sequence[torch.Tensor],
    loss: Callable[[], float],
    seed: int,
    eps: float,
    *,
    exact: bool = True,
) -> tuple[float, float]:
    """(ĝ = (L(θ + εz) − L(θ − εz)) / 2ε, (L₊ + L₋) / 2) for the z of ``seed``; θ is restored
    afterwards. The mean is the loss at θ up to O(ε²): the step's loss, with no extra forward."""
    snapshot = [p.detach().clone() for p in params] if exact else None
    perturb_(params, seed, eps)
    loss_plus = loss()
    perturb_(params, seed, -2 * eps)
    loss_minus = loss()
    perturb_(params, seed, eps)
    if snapshot is not None:
        with torch.no_grad():
            for p, saved in zip(params, snapshot, strict=True):
                p.copy_(saved)
    return (loss_plus - loss_minus) / (2 * eps), (loss_plus + loss_minus) / 2


def zo_update_(
    params: Sequence[torch.Tensor],
    seed: int,
    gradient: float,
    lr: float,
    weight_decay: float = 0.0,
) -> None:
    """θ ← θ − lr·(ĝ·z + weight_decay·θ) with the z of ``seed``."""
    with torch.no_grad():
        if weight_decay:
            for p in params:
                p.mul_(1 - lr * weight_decay)
    perturb_(params, seed, -lr * gradient)


def zo_step_(
    params: Sequence[torch.Tensor],
    loss: Callable[[], float],
    seeds: Sequence[int],
    *,
    eps: float,
    lr: float,
    weight_decay: float = 0.0,
    exact: bool = True,
) -> tuple[list[float], float]:
    """One ZO step averaging ``len(seeds)`` directions: θ ← θ − (lr/q)·Σ ĝ_i·z_i, with weight
    decay lr·λ once. Returns the projected gradients and the mean loss at θ. Call ``loss`` under
    ``torch.inference_mode()`` for the memory."""
    estimates = [projected_gradient(params, loss, s, eps, exact=exact) for s in seeds]
    gradients = [gradient for gradient, _ in estimates]
    if weight_decay:
        with torch.no_grad():
            for p in params:
                p.mul_(1 - lr * weight_decay)
    for seed, gradient in zip(seeds, gradients, strict=True):
        zo_update_(params, seed, gradient, lr / len(seeds))
    return gradients, sum(mean for _, mean in estimates) / len(estimates)
