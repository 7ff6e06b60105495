"""POMO training (REINFORCE with the mean over starts as a shared baseline) and evaluation
(greedy multi-start, ×8 augmentation)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from mixlab.rl.mixroute.instances import RoutingInstances, generate
from mixlab.rl.mixroute.norms import MixNorm
from mixlab.rl.mixroute.pomo import POMOModel, RoutingBatch, augment_8, rollout
from mixlab.shared import progress
from mixlab.shared.checkpoint import load_state, save_state
from mixlab.shared.checks import check_count

__all__ = ["evaluate", "optimizer_groups", "train_policy", "train_pomo"]


def optimizer_groups(
    model: torch.nn.Module, lr: float, weight_decay: float, mix_lr: float | None = None
) -> list[dict]:
    """Adam's parameter groups: every weight at ``lr`` with ``weight_decay``, and MixNorm's
    static mixing logits λ, λ′ at ``mix_lr`` without weight decay (decay would pull them back to
    the uniform mix they start from). ``mix_lr=None`` trains the logits at ``lr`` too."""
    logits = [
        parameter
        for module in model.modules()
        if isinstance(module, MixNorm)
        for name, parameter in module.named_parameters(recurse=False)
        if name in MixNorm.LOGITS
    ]
    chosen = {id(p) for p in logits}
    rest = [p for p in model.parameters() if id(p) not in chosen]
    groups = [{"params": rest, "lr": lr, "weight_decay": weight_decay}]
    if logits:
        groups.append({"params": logits, "lr": lr if mix_lr is None else mix_lr,
                       "weight_decay": 0.0})  # fmt: skip
    return groups


def train_pomo(
    model: POMOModel,
    steps: int,
    *,
    n: int = 20,
    batch_size: int = 64,
    lr: float = 1e-4,
    mix_lr: float | None = None,
    weight_decay: float = 1e-6,
    families: Sequence[str] = ("uniform",),
    seed: int = 0,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 100,
) -> list[dict[str, float]]:
    """``steps`` Adam steps (POMO: lr 1e-4, weight decay 1e-6; MixNorm's mixing logits at
    ``mix_lr``, :func:`optimizer_groups`) on fresh batches of ``n``-node instances of
    ``model.problem``, each batch from one of ``families`` in turn (one family:
    single-distribution training; several: the multi-distribution reference), on the model's
    device. POMO's loss is mean((L − mean_starts L) · log p). With ``checkpoint`` the model,
    optimiser and random states are saved every ``checkpoint_every`` steps (``checkpoint`` with
    the suffixes .json and .safetensors) and a killed run resumes from there.
    Returns the per-step mean tour length and seconds (of this call's steps)."""
    check_count(steps, "steps", minimum=0)
    if not families:
        raise ValueError("families must name at least one instance family")
    optimizer = torch.optim.Adam(optimizer_groups(model, lr, weight_decay, mix_lr))
    device = next(model.parameters()).device
    rng = np.random.default_rng(seed)
    generator = torch.Generator(device).manual_seed(seed)
    done = 0
    if checkpoint is not None and Path(checkpoint).with_suffix(".json").exists():
        state = load_state(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        rng.bit_generator.state = state["numpy"]
        generator.set_state(state["torch"])
        done = int(state["step"])
    history = []
    model.train()
    with progress(steps, "pomo train", completed=done) as bar:
        for step in range(done, steps):
            started = time.perf_counter()
            instances = generate(model.problem, families[step % len(families)], batch_size, n, rng)
            lengths, log_prob, _ = rollout(
                model,
                RoutingBatch.from_instances(instances, device),
                greedy=False,
                generator=generator,
            )
            advantage = lengths - lengths.mean(1, keepdim=True)  # shared baseline over the N starts
            loss = (advantage.detach() * log_prob).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            length = float(lengths.mean())
            history.append({"length": length, "seconds": time.perf_counter() - started})
            if checkpoint is not None and ((step + 1) % checkpoint_every == 0 or step + 1 == steps):
                save_state(
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "numpy": rng.bit_generator.state,
                        "torch": generator.get_state(),
                        "step": step + 1,
                    },
                    checkpoint,
                )
            bar.advance(loss=loss.item(), length=length)
    return history


def train_policy(
    problem: str,
    norm: str,
    *,
    dim: int,
    layers: int,
    heads: int,
    hidden: int,
    steps: int,
    n: int,
    batch_size: int,
    lr: float,
    mix_lr: float | None = None,
    families: Sequence[str] = ("uniform",),
    seed: int = 0,
    checkpoint: str | Path | None = None,
    device: str | torch.device = "cpu",
) -> tuple[POMOModel, float]:
    """A POMO policy of ``problem`` with ``norm`` in its encoder, initialised under
    ``torch.manual_seed(seed)`` and trained on ``device`` by :func:`train_pomo` (``families`` in
    turn, ``checkpoint`` to resume a killed training); also its training seconds (of this call's
    steps). The experiment's cached policies are made here."""
    torch.manual_seed(seed)
    model = POMOModel(problem, dim, layers, heads, hidden, norm).to(device)
    started = time.perf_counter()
    history = train_pomo(
        model, steps, n=n, batch_size=batch_size, lr=lr, mix_lr=mix_lr, families=families,
        seed=seed, checkpoint=checkpoint,
    )  # fmt: skip
    return model.eval(), sum(h["seconds"] for h in history) or time.perf_counter() - started


@torch.no_grad()
def evaluate(
    model: POMOModel, instances: RoutingInstances, *, augment: bool = True, batch_size: int = 100
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Greedy multi-start (over the 8 augmentations too): the best tour length per instance and
    its tour (node indices, padded by the depot for VRPs), in chunks of ``batch_size``."""
    model.eval()
    lengths, tours = [], []
    for start in range(0, len(instances), batch_size):
        chunk = instances[np.arange(start, min(start + batch_size, len(instances)))]
        batch = RoutingBatch.from_instances(chunk, next(model.parameters()).device)
        if augment:
            batch = augment_8(batch)
        length, _, tour = rollout(model, batch, greedy=True)
        views = 8 if augment else 1
        length = length.reshape(views, len(chunk), -1).permute(1, 0, 2).reshape(len(chunk), -1)
        tour = tour.reshape(views, len(chunk), *tour.shape[1:]).transpose(0, 1)
        tour = tour.reshape(len(chunk), -1, tour.shape[-1])
        best = length.argmin(1)
        rows = torch.arange(len(chunk))
        lengths.append(length[rows, best].cpu().numpy())
        tours += list(tour[rows, best].cpu().numpy())
    return np.concatenate(lengths), tours
