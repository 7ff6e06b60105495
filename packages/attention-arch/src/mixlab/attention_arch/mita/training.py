"""A small timm ViT on the experiment's canvases: build, train (resumable), evaluate."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from mixlab.attention_arch.mita.config import ViTShape
from mixlab.attention_arch.mita.data import ClutteredDigits
from mixlab.attention_arch.mita.swap import replace_attention
from mixlab.shared import load_state, progress, save_state, warmup_cosine
from mixlab.shared.files import CheckpointError, checkpoint_errors


def build_vit(shape: ViTShape, attention: str = "full", **attention_config: Any) -> nn.Module:
    """A timm ``VisionTransformer`` for 1-channel ``shape.canvas`` images and 10 classes, its
    attention swapped for ``attention`` (a name in ``ATTENTION_KINDS``)."""
    model = VisionTransformer(
        img_size=shape.canvas,
        patch_size=shape.patch_size,
        in_chans=1,
        num_classes=10,
        embed_dim=shape.embed_dim,
        depth=shape.depth,
        num_heads=shape.num_heads,
        mlp_ratio=shape.mlp_ratio,
        global_pool=shape.global_pool,
        class_token=shape.class_token,
    )
    return replace_attention(model, attention, **attention_config)


@dataclass(frozen=True)
class TrainSpec:
    """AdamW with linear warm-up (5 % of the steps) and cosine decay; batches drawn with a
    generator seeded by (seed, step), so a resumed run draws what the uninterrupted one would."""

    steps: int
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.05
    seed: int = 0


def train(
    model: nn.Module,
    data: ClutteredDigits,
    spec: TrainSpec,
    *,
    device: torch.device | str = "cpu",
    checkpoint: Path | None = None,
    checkpoint_every: int = 200,
    on_step: Callable[[int, nn.Module], None] | None = None,
    description: str = "train",
) -> list[float]:
    """Train ``model`` on ``data`` for ``spec.steps`` steps; return the loss of each step.

    With ``checkpoint`` the model, optimiser and losses are saved there every
    ``checkpoint_every`` steps and a killed run resumes from the last save (the file is removed
    at the end). ``on_step(step, model)`` is called after every step (step counts from 1). The
    steps show as :func:`mixlab.shared.progress` named ``description``.
    """
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    schedule = warmup_cosine(optimizer, spec.steps)
    losses: list[float] = []
    if checkpoint is not None and checkpoint.with_suffix(".json").exists():
        state = load_training_checkpoint(checkpoint, model, spec, map_location=device)
        with _as_checkpoint_error(checkpoint.with_suffix(".json"), "training checkpoint"):
            optimizer.load_state_dict(state["optimizer"])
            schedule.load_state_dict(state["schedule"])
            losses = [float(loss) for loss in state["losses"]]
    with progress(spec.steps, description, completed=len(losses)) as bar:
        for step in range(len(losses), spec.steps):
            generator = torch.Generator().manual_seed(spec.seed * 1_000_003 + step)
            batch = torch.randint(len(data), (spec.batch_size,), generator=generator)
            images, labels = data.images[batch].to(device), data.labels[batch].to(device)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            bar.advance(loss=losses[-1])
            if on_step is not None:
                on_step(step + 1, model)
            if (
                checkpoint is not None
                and (step + 1) % checkpoint_every == 0
                and step + 1 < spec.steps
            ):
                save_state(
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "schedule": schedule.state_dict(),
                        "losses": losses,
                        "spec": asdict(spec),
                    },
                    checkpoint,
                )
    if checkpoint is not None:
        for suffix in (".json", ".safetensors"):
            checkpoint.with_suffix(suffix).unlink(missing_ok=True)
    return losses


@contextlib.contextmanager
def _as_checkpoint_error(path: Path, what: str) -> Iterator[None]:
    """:func:`checkpoint_errors`, plus the RuntimeError ``load_state_dict`` raises when the saved
    tensors do not fit the model (another architecture's file)."""
    with checkpoint_errors(path, what):
        try:
            yield
        except RuntimeError as error:
            detail = " ".join(str(error).split())[:300]
            raise CheckpointError(
                f"{path}: not a {what} of this model ({type(error).__name__}: {detail})"
            ) from error


def load_training_checkpoint(
    checkpoint: Path, model: nn.Module, spec: TrainSpec, *, map_location: torch.device | str = "cpu"
) -> dict[str, Any]:
    """Load the resumable checkpoint :func:`train` saves at ``checkpoint`` (.json + .safetensors)
    into ``model`` and return its state; a damaged, edited or foreign file raises
    :class:`CheckpointError` naming it, one saved by a run with another ``spec`` a ValueError."""
    state = load_state(checkpoint, map_location=map_location)
    json_file = checkpoint.with_suffix(".json")
    if not isinstance(state, dict) or not {"model", "optimizer", "schedule", "losses"} <= set(
        state
    ):
        raise CheckpointError(f"{json_file}: not a mita training checkpoint")
    if state.get("spec") != asdict(spec):
        raise ValueError(
            f"checkpoint {json_file} was saved by a run with {state.get('spec')}, not "
            f"{asdict(spec)}: delete it or use a fresh folder"
        )
    with _as_checkpoint_error(json_file, "mita training checkpoint"):
        model.load_state_dict(state["model"])
    return state


@torch.no_grad()
def predict(
    model: nn.Module,
    images: torch.Tensor,
    *,
    batch_size: int = 256,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Predicted classes; ``keep`` ((n, N) bool, optional) drops the tokens where it is False
    (see :func:`~mixlab.attention_arch.mita.pruned_logits`)."""
    from mixlab.attention_arch.mita.introspection import pruned_logits

    model.eval()
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(images), batch_size):
        batch = images[start : start + batch_size].to(device)
        if keep is None:
            out.append(model(batch).argmax(-1).cpu())
            continue
        mask = keep[start : start + batch_size].to(device)
        out.append(pruned_logits(model, batch, mask).argmax(-1).cpu())
    return torch.cat(out)


def accuracy(model: nn.Module, data: ClutteredDigits, **kwargs: Any) -> float:
    return (predict(model, data.images, **kwargs) == data.labels).float().mean().item()
