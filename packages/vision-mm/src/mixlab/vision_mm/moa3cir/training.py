"""Two-phase training with InfoNCE over in-batch negatives (spec §5a).

- Phase 1 (:func:`train_towers`): the towers, on alternate steps CLIP's symmetric contrastive
  loss between item images and their descriptions (scale ``logit_scale``) and CLIP4Cir's sum
  fine-tuning, CE(100·normalize(f_ref + f_text)·normalize(f_target)ᵀ).
- Phase 2 (:func:`train_head`): a fusion head on frozen towers, from their outputs computed once
  (:func:`encode_triplets`); CE with scale 100 as CLIP4Cir, plus ``balance`` × the router's
  load-balance loss and, where a triplet's edited attribute is known (controlled edits and
  single-attribute modifications), ``route_supervision`` × the router's NLL of that attribute's
  group (:func:`route_supervision_loss`: the attribute-aware routing).
- One phase (:func:`train_end_to_end`, the ablation): towers and head together from the start,
  the CIR loss plus the contrastive one on every step.

Batches are drawn from (seed, step), so every system and a resumed run see the same rows; a
``checkpoint`` folder keeps the last state and resumes from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mixlab.shared import Checkpointer, progress, warmup_cosine
from mixlab.vision_mm.moa3cir.attention import balance_loss
from mixlab.vision_mm.moa3cir.model import CIRModel, QueryFeatures, check_same_count
from mixlab.vision_mm.moa3cir.towers import ClipTowers, Encoded

CIR_SCALE = 100.0
"""CLIP4Cir's fixed logit scale"""

__all__ = [
    "CIR_SCALE",
    "TripletData",
    "TripletFeatures",
    "concat_features",
    "encode_triplets",
    "fit_two_phase",
    "info_nce",
    "route_supervision_loss",
    "train_end_to_end",
    "train_head",
    "train_towers",
]


def info_nce(
    queries: torch.Tensor, targets: torch.Tensor, scale: float | torch.Tensor = CIR_SCALE
) -> torch.Tensor:
    """CE over in-batch targets: row i's positive is target i."""
    logits = scale * queries @ targets.T
    return F.cross_entropy(logits, torch.arange(len(queries), device=queries.device))


def _rows(count: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randperm(count, generator=generator)[:batch_size]


def _clip_loss(
    towers: ClipTowers, images: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """CLIP's symmetric InfoNCE between item images and their descriptions, at the model's
    learned ``logit_scale``."""
    image = F.normalize(towers.image(images[rows], "target_image").pooled, dim=-1)
    text = F.normalize(towers.text(ids[rows], "target_description").pooled, dim=-1)
    scale = towers.model("target_image").logit_scale.exp()
    return (info_nce(image, text, scale) + info_nce(text, image, scale)) / 2


def _loop(
    module: nn.Module,
    loss_of_step: Callable[[int], torch.Tensor],
    steps: int,
    *,
    lr: float,
    checkpoint: Path | None,
    every: int = 100,
    weight_decay: float = 0.01,
    description: str = "steps",
) -> list[float]:
    """AdamW with warm-up and cosine decay over ``module``'s trainable parameters; resumes from
    ``checkpoint`` (the module, optimiser and schedule) when it holds a state; its progress
    shows as ``description``."""
    parameters = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    schedule = warmup_cosine(optimizer, steps)
    keeper = None if checkpoint is None else Checkpointer(checkpoint, resume=True, keep_last=1)
    start, losses = 0, []
    last = None if keeper is None else keeper.load_latest()
    if last is not None:
        start, state = last
        module.load_state_dict(state["module"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        losses = list(state["losses"])
    module.train()
    with progress(steps, description, completed=start) as bar:
        for step in range(start, steps):
            loss = loss_of_step(step)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(float(loss.detach()))
            bar.advance(loss=losses[-1])
            if keeper is not None and ((step + 1) % every == 0 or step + 1 == steps):
                keeper.save(step + 1, {"module": module.state_dict(), "optimizer": optimizer.state_dict(),
                                       "schedule": schedule.state_dict(), "losses": losses})  # fmt: skip
    module.eval()
    return losses


# ---------------------------------------------------------------------------------- phase 1
@dataclass
class TripletData:
    """Raw triplets: reference and target images ``[N, 3, S, S]`` in [0, 1] (a tensor, or
    :class:`~.data.ImageFiles` that reads them per batch), modification texts, and the items'
    descriptions (None where there are none)."""

    reference: torch.Tensor
    target: torch.Tensor
    texts: list[str]
    reference_descriptions: list[str] | None = None
    target_descriptions: list[str] | None = None

    def __post_init__(self) -> None:
        counts = {len(self.reference), len(self.target), len(self.texts)}
        for extra in (self.reference_descriptions, self.target_descriptions):
            if extra is not None:
                counts.add(len(extra))
        if len(counts) != 1:
            raise ValueError("references, targets, texts and descriptions must have the same count")
        if any(not t.strip() for t in self.texts):
            raise ValueError("every modification text must be non-empty")

    def __len__(self) -> int:
        return len(self.texts)


def train_towers(
    towers: ClipTowers,
    images: torch.Tensor | None,
    descriptions: list[str] | None,
    triplets: TripletData,
    steps: int,
    *,
    batch_size: int = 64,
    lr: float = 5e-4,
    seed: int = 0,
    checkpoint: Path | None = None,
    checkpoint_every: int = 100,
) -> list[float]:
    """Phase 1, in turn (every other step the first): CLIP's loss between item ``images`` and
    their ``descriptions``; CLIP4Cir's sum fine-tuning on ``triplets``, normalize(f_ref + f_text) against
    normalize(f_target); and, when the triplets carry descriptions, its five-tower form,
    normalize(f_ref + f_ref_description + f_text) against normalize(f_target + f_target_description),
    which is what teaches the text towers the attributes pixels do not show (CLIP's loss pairs
    every material of a garment with the same image). Without descriptions every step is sum
    fine-tuning."""
    aligned = images is not None and descriptions is not None
    if aligned:
        check_same_count("descriptions", descriptions, images)
    ids = towers.tokenize(descriptions) if aligned else None
    text_ids = towers.tokenize(triplets.texts)
    described = (
        triplets.reference_descriptions is not None and triplets.target_descriptions is not None
    )
    if described:
        reference_ids = towers.tokenize(triplets.reference_descriptions)
        target_ids = towers.tokenize(triplets.target_descriptions)
    # half the steps on CLIP's loss, as many on the sum fine-tuning (three towers and five in turn)
    objectives = {(True, True): ["clip", "sum", "clip", "five"], (True, False): ["clip", "sum"],
                  (False, True): ["sum", "five"], (False, False): ["sum"]}[aligned, described]  # fmt: skip

    def loss_of_step(step: int) -> torch.Tensor:
        objective = objectives[step % len(objectives)]
        if objective == "clip":
            return _clip_loss(towers, images, ids, _rows(len(images), batch_size, seed, step))
        rows = _rows(len(triplets), batch_size, seed, step)
        query = towers.image(triplets.reference[rows], "reference_image").pooled
        query = query + towers.text(text_ids[rows], "modification").pooled
        target = towers.image(triplets.target[rows], "target_image").pooled
        if objective == "five":
            query = query + towers.text(reference_ids[rows], "reference_description").pooled
            target = target + towers.text(target_ids[rows], "target_description").pooled
        return info_nce(F.normalize(query, dim=-1), F.normalize(target, dim=-1))

    return _loop(
        towers,
        loss_of_step,
        steps,
        lr=lr,
        checkpoint=checkpoint,
        every=checkpoint_every,
        weight_decay=0.1,
        description="phase 1: towers",
    )


def fit_two_phase(
    model: CIRModel,
    triplets: TripletData,
    tower_steps: int,
    steps: int,
    *,
    batch_size: int = 64,
    tower_lr: float = 5e-4,
    lr: float = 1e-3,
    seed: int = 0,
    balance: float = 0.01,
    checkpoint: Path | None = None,
) -> dict[str, list[float]]:
    """Both phases on one triplet set: the towers (aligned on the targets' descriptions when
    there are any), then, frozen, the head; the losses of each phase."""
    towers = model.towers
    torch.manual_seed(seed)
    phase1 = []
    if tower_steps > 0:
        phase1 = train_towers(towers, triplets.target, triplets.target_descriptions, triplets, tower_steps,
                              batch_size=batch_size, lr=tower_lr, seed=seed,
                              checkpoint=None if checkpoint is None else checkpoint / "towers")  # fmt: skip
    towers.requires_grad_(False)
    features = encode_triplets(towers, triplets)
    phase2 = train_head(model.head, features, steps, batch_size=batch_size, lr=lr, seed=seed, balance=balance,
                        checkpoint=None if checkpoint is None else checkpoint / "head")  # fmt: skip
    return {"towers": phase1, "head": phase2}


# ---------------------------------------------------------------------------------- phase 2
@dataclass
class TripletFeatures:
    """Frozen tower outputs of a triplet set: the query features and the targets' pooled
    image (and description) embeddings."""

    query: QueryFeatures
    target_image: torch.Tensor
    target_description: torch.Tensor | None = None
    attribute: torch.Tensor | None = None
    """``[N]`` long: the edited attribute's index per triplet, −1 where it is not known (None:
    unknown for every row)"""

    def __len__(self) -> int:
        return len(self.target_image)

    def rows(self, index) -> TripletFeatures:
        description = None if self.target_description is None else self.target_description[index]
        attribute = None if self.attribute is None else self.attribute[index]
        return TripletFeatures(
            self.query.rows(index), self.target_image[index], description, attribute
        )


def _cat(parts: list[Encoded | None], dtype: torch.dtype | None) -> Encoded | None:
    if parts[0] is None:
        return None
    padding = None if parts[0].padding is None else torch.cat([p.padding for p in parts])
    tokens = torch.cat([p.tokens for p in parts])
    return Encoded(
        torch.cat([p.pooled for p in parts]), tokens if dtype is None else tokens.to(dtype), padding
    )


def concat_features(
    parts: list[TripletFeatures], dtype: torch.dtype | None = None
) -> TripletFeatures:
    """Feature sets joined row-wise (tokens cast to ``dtype`` when given)."""
    query = QueryFeatures(_cat([p.query.image for p in parts], dtype), _cat([p.query.text for p in parts], dtype),
                          _cat([p.query.description for p in parts], dtype))  # fmt: skip
    description = None
    if parts[0].target_description is not None:
        description = torch.cat([p.target_description for p in parts])
    attribute = None
    if any(p.attribute is not None for p in parts):
        attribute = torch.cat([torch.full((len(p),), -1, dtype=torch.long) if p.attribute is None
                               else p.attribute for p in parts])  # fmt: skip
    return TripletFeatures(
        query, torch.cat([p.target_image for p in parts]), description, attribute
    )


def _slice(data: TripletData, rows) -> TripletData:
    def pick(values):
        return None if values is None else [values[i] for i in rows]

    return TripletData(data.reference[rows], data.target[rows], pick(data.texts),
                       pick(data.reference_descriptions), pick(data.target_descriptions))  # fmt: skip


def _encode(towers: ClipTowers, data: TripletData) -> TripletFeatures:
    """The towers' outputs on ``data`` (with gradients when enabled)."""
    description = target_description = None
    if data.reference_descriptions is not None:
        ids = towers.tokenize(data.reference_descriptions)
        description = towers.text(ids, "reference_description")
    if data.target_descriptions is not None:
        ids = towers.tokenize(data.target_descriptions)
        target_description = towers.text(ids, "target_description").pooled
    query = QueryFeatures(towers.image(data.reference, "reference_image"),
                          towers.text(towers.tokenize(data.texts), "modification"), description)  # fmt: skip
    return TripletFeatures(
        query, towers.image(data.target, "target_image").pooled, target_description
    )


@torch.no_grad()
def encode_triplets(
    towers: ClipTowers, data: TripletData, batch_size: int = 256, dtype: torch.dtype = torch.float32
) -> TripletFeatures:
    """Every tower's output on ``data`` once, in batches (tokens stored in ``dtype``)."""
    if len(data) == 0:
        raise ValueError("no triplets to encode")
    towers.eval()
    parts = [_encode(towers, _slice(data, range(start, min(start + batch_size, len(data)))))
             for start in range(0, len(data), batch_size)]  # fmt: skip
    return concat_features(parts, dtype)


def route_supervision_loss(weights: torch.Tensor, attribute: torch.Tensor) -> torch.Tensor:
    """−log w_a, the router's NLL of the edited attribute's group a (group a routes attribute
    a), averaged over the rows whose attribute is known (``attribute`` >= 0); per-token
    weights ``[B, L, G]`` are averaged over tokens first. 0 when no row is known."""
    if weights.ndim == 3:
        weights = weights.mean(1)
    known = attribute >= 0
    if not known.any():
        return weights.new_zeros(())
    picked = weights[known].gather(1, attribute[known, None]).squeeze(1)
    return -picked.clamp_min(1e-9).log().mean()


def _cir_loss(
    head: nn.Module, batch: TripletFeatures, balance: float, route_supervision: float = 0.0
) -> torch.Tensor:
    queries = head.query(batch.query.float())
    targets = head.target(batch.target_image, batch.target_description)
    loss = info_nce(queries, targets)
    if getattr(head, "routed", False):
        blocks = len(head.last_weights)
        if balance > 0:
            loss = loss + balance * sum(balance_loss(w) for w in head.last_weights) / blocks
        if route_supervision > 0 and batch.attribute is not None:
            supervised = sum(route_supervision_loss(w, batch.attribute) for w in head.last_weights)
            loss = loss + route_supervision * supervised / blocks
    return loss


def train_head(
    head: nn.Module,
    features: TripletFeatures,
    steps: int,
    *,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    balance: float = 0.01,
    route_supervision: float = 0.0,
    checkpoint: Path | None = None,
    checkpoint_every: int = 100,
) -> list[float]:
    """Phase 2: the fusion head on frozen towers' ``features``; a routed head's router is
    supervised with ``features.attribute`` at weight ``route_supervision`` (0: not at all)."""
    if not route_supervision >= 0:
        raise ValueError(f"route_supervision must be a number >= 0, got {route_supervision!r}")
    supervised = route_supervision > 0 and features.attribute is not None
    if supervised and getattr(head, "routed", False) and features.attribute.max() >= head.groups:
        raise ValueError(
            f"route_supervision needs a router group per attribute: the features name attribute "
            f"{int(features.attribute.max())}, the head has groups = {head.groups}"
        )
    if not any(p.requires_grad for p in head.parameters()):
        return []  # a parameter-free baseline

    def loss_of_step(step: int) -> torch.Tensor:
        batch = features.rows(_rows(len(features), batch_size, seed, step))
        return _cir_loss(head, batch, balance, route_supervision)

    return _loop(head, loss_of_step, steps, lr=lr, checkpoint=checkpoint, every=checkpoint_every,
                 description="phase 2: head")  # fmt: skip


def train_end_to_end(
    model: CIRModel,
    images: torch.Tensor,
    descriptions: list[str],
    triplets: TripletData,
    steps: int,
    *,
    batch_size: int = 64,
    lr: float = 5e-4,
    seed: int = 0,
    balance: float = 0.01,
    checkpoint: Path | None = None,
    checkpoint_every: int = 100,
) -> list[float]:
    """The one-phase ablation: towers and head trained together on the CIR loss plus CLIP's
    image–description loss, every step."""
    towers = model.towers
    ids = towers.tokenize(descriptions)

    def loss_of_step(step: int) -> torch.Tensor:
        batch = _slice(triplets, _rows(len(triplets), batch_size, seed, step).tolist())
        features = _encode(towers, batch)
        loss = _cir_loss(model.head, features, balance)
        return loss + _clip_loss(
            towers, images, ids, _rows(len(images), batch_size, seed + 1, step)
        )

    return _loop(
        model,
        loss_of_step,
        steps,
        lr=lr,
        checkpoint=checkpoint,
        every=checkpoint_every,
        weight_decay=0.1,
        description="one phase: towers and head",
    )
