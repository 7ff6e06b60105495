"""Training and scoring of any :mod:`~.model` detector on uint8 clips, with accelerate.

Every system trains the same way: ``steps`` AdamW steps on batches of ``batch_size`` clips drawn
from (seed, step), so systems and a resumed run see the same clips in the same order; the loss is
:class:`~.blend.BlendInvarianceLoss` on the detector's training views (plain BCE when its weights
are 0). A checkpoint folder makes the run resumable (``Accelerator.save_state``).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import torch

from mixlab.shared import progress
from mixlab.shared.checks import check_count, check_number
from mixlab.shared.device import resolve_device
from mixlab.vision_mm.mixforensics.blend import BlendInvarianceLoss
from mixlab.vision_mm.mixforensics.model import unit_range


def batch_rows(count: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    """The clip rows of training step ``step`` (the same for every system)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(count, (batch_size,), generator=generator)


def train_detector(
    detector: torch.nn.Module, clips: torch.Tensor, labels: torch.Tensor, steps: int, *,
    batch_size: int = 64, lr: float = 2e-3, weight_decay: float = 1e-4, seed: int = 0,
    loss: BlendInvarianceLoss | None = None, checkpoint: str | Path | None = None, checkpoint_every: int = 100,
    device: str | torch.device = "auto",
) -> list[dict[str, float]]:  # fmt: skip
    """Train ``detector`` on ``clips`` (N, T, C, H, W uint8 or floats in [0, 1]) with ``labels``
    (N,) in {0, 1} (1: fake) on ``device`` (``auto``: a GPU when there is one); AdamW with a
    cosine schedule. Returns each step's logged losses."""
    from accelerate import Accelerator

    check_count(steps, "steps", minimum=0)
    check_count(batch_size, "batch_size")
    check_number(lr, "lr", lr > 0, "a finite number > 0")
    if len(clips) != len(labels):
        raise ValueError(f"labels must have one entry per clip ({len(clips)}), got {len(labels)}")
    loss = loss if loss is not None else BlendInvarianceLoss(consistency=0.0)
    accelerator = Accelerator(cpu=resolve_device(device).type == "cpu")
    parameters = [p for p in detector.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, steps) / max(1, steps)))
    )
    detector, optimizer, schedule = accelerator.prepare(detector, optimizer, schedule)
    done, history = 0, []
    marker = None if checkpoint is None else Path(checkpoint) / "step.txt"
    if marker is not None and marker.is_file():
        accelerator.load_state(str(checkpoint))
        done = int(marker.read_text())
    labels = torch.as_tensor(labels).float()
    detector.train()
    with progress(steps, "detector steps", completed=done) as bar:
        for step in range(done, steps):
            rows = batch_rows(len(clips), batch_size, seed, step)
            video = unit_range(clips[rows].to(accelerator.device))
            rng = np.random.default_rng([seed, step])  # the blends, frames and differences drawn
            logits, embeddings = accelerator.unwrap_model(detector).training_logits(video, rng)
            value, logs = loss(logits, labels[rows].to(logits.device), embeddings)
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(value)
            optimizer.step()
            schedule.step()
            history.append({"loss": float(value.detach()), **logs})
            bar.advance(loss=history[-1]["loss"])
            if marker is not None and ((step + 1) % checkpoint_every == 0 or step + 1 == steps):
                _save(accelerator, Path(checkpoint), step + 1)
    detector.eval()
    return history


def _save(accelerator, folder: Path, step: int) -> None:
    """``Accelerator.save_state`` into a fresh folder renamed over the last one: a kill while
    saving leaves the previous checkpoint (or none), never a mix of two."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    accelerator.save_state(str(partial))
    (partial / "step.txt").write_text(str(step))
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)


@torch.no_grad()
def _in_batches(
    score, detector: torch.nn.Module, clips: torch.Tensor, batch_size: int
) -> np.ndarray:
    detector.eval()
    device = next(detector.parameters()).device
    out = [score(unit_range(clips[start : start + batch_size].to(device))).float().cpu()
           for start in range(0, len(clips), batch_size)]  # fmt: skip
    return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.float32)


def predict(detector: torch.nn.Module, clips: torch.Tensor, *, batch_size: int = 128) -> np.ndarray:
    """p(fake) per clip (N,), in eval mode and in batches."""
    return _in_batches(detector.scores, detector, clips, batch_size)


def frame_probabilities(
    detector: torch.nn.Module, clips: torch.Tensor, *, batch_size: int = 128
) -> np.ndarray:
    """(N, T) per-frame p(fake) of a :class:`~.model.FrameVoting` detector: every vote and frame
    budget of the clips follows from these without encoding a frame twice."""
    probabilities = _in_batches(detector.frame_probabilities, detector, clips, batch_size)
    detector.passes = clips.shape[1]
    return probabilities
